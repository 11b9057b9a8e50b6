"""Are the state ops lossless under speculative decoding? Ours (onnx_hybrid) and ORT's own (com.microsoft).

For GatedDeltaNet and VarlenCausalConvWithState, each implementation and dtype, at the 0.8B model's geometry with
several concurrent requests (each with its own initial state): a verify call of C + 1 tokens per request with
capture against C + 1 plain one-token steps (outputs, final state, capsule replay for every accepted prefix), and
the probes that locate a difference (token count per row, chunk_size, capture on/off, the request alone or next to
a long prefill row, the capsule's contents against one-token steps'). See onnx_hybrid_testing/lossless.py.

    python scripts/check_lossless.py --provider cpu --json /tmp/lossless_cpu.json
    python scripts/check_lossless.py --provider cuda --dtypes fp32,fp16,bf16 --json lossless_cuda.json

Prints one line per (op, implementation, dtype, check): bitwise-equal items / items, the largest absolute
difference, that relative to the tensor's largest magnitude, the largest ulp distance, the largest fraction of an
item's elements whose bits differ, and the worst item. ``--all`` prints every item. Exit status 0 whatever the
findings (it is a probe).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
from onnx_hybrid_testing import lossless
from onnx_hybrid_testing.e2e import cpu_model


def environment(provider: str) -> dict:
    import onnxruntime as ort

    env = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "onnxruntime": ort.__version__, "provider": provider, "python": platform.python_version(),
           "cpu": cpu_model()}
    if provider == "cuda":
        try:
            from onnx_hybrid_testing.device_rates import device_name

            env["gpu"] = device_name()
        except Exception as error:  # the GPU's name is informative only
            env["gpu"] = f"unknown ({type(error).__name__})"
    return env


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--provider", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--ops", default="GatedDeltaNet,VarlenCausalConvWithState",
                        help="comma-separated: GatedDeltaNet, VarlenCausalConvWithState")
    parser.add_argument("--impls", default="ours,ort", help="comma-separated: ours (onnx_hybrid), ort (com.microsoft)")
    parser.add_argument("--dtypes", default=None, help="comma-separated fp32, fp16, bf16 (default: fp32,fp16 on "
                                                       "cpu; fp32,fp16,bf16 on cuda)")
    parser.add_argument("--geometry", choices=sorted(lossless.GEOMETRIES), default="0.8b")
    parser.add_argument("--requests", type=int, default=4, help="concurrent requests (default 4)")
    parser.add_argument("--tokens", type=int, default=4, help="C + 1 tokens per request in the verify call (default 4)")
    parser.add_argument("--prefill-tokens", default=",".join(map(str, lossless.PREFILL_TOKENS)),
                        help="comma-separated lengths of the prefill row that shares a call with the decode/verify "
                             "rows (default %(default)s; empty: skip)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ort-gdn-plan", choices=("chunked", "chunked_split", "recurrent"),
                        help="set ORT_GDN_PLAN (ORT CUDA's engine override) for this process")
    parser.add_argument("--all", action="store_true", help="print every item, not one line per check")
    parser.add_argument("--json", type=Path, help="write the environment, the summary and every item here")
    args = parser.parse_args(argv)

    ops = [o for o in args.ops.split(",") if o]
    impls = [i for i in args.impls.split(",") if i]
    dtypes = (args.dtypes or ("fp32,fp16,bf16" if args.provider == "cuda" else "fp32,fp16")).split(",")
    for name, values, known in (("--ops", ops, (lossless.GDN, lossless.CONV)),
                                ("--impls", impls, tuple(lossless.IMPLEMENTATIONS)),
                                ("--dtypes", dtypes, tuple(lossless.DTYPE_NAMES))):
        bad = [v for v in values if v not in known]
        if bad:
            parser.error(f"{name}: unknown {', '.join(bad)}; known: {', '.join(known)}")
    if args.requests < 1 or args.tokens < 2 or args.tokens > 8:
        parser.error(f"--requests must be >= 1 and --tokens in [2, 8] (the capacity is at most 8); got "
                     f"{args.requests} and {args.tokens}")

    if args.ort_gdn_plan:
        os.environ["ORT_GDN_PLAN"] = args.ort_gdn_plan
    try:
        prefill = [int(n) for n in args.prefill_tokens.split(",") if n.strip()]
    except ValueError:
        parser.error(f"--prefill-tokens: comma-separated token counts expected, got {args.prefill_tokens!r}")
    if any(n < 1 for n in prefill):
        parser.error(f"--prefill-tokens: lengths must be positive, got {prefill}")
    env = environment(args.provider) | {"ORT_GDN_PLAN": os.environ.get("ORT_GDN_PLAN", "")}
    print(" ".join(f"{k}={v}" for k, v in env.items()))
    checks, failures = [], []
    for impl in impls:
        run = lossless.Runner(impl, args.provider)
        for op in ops:
            for dtype in dtypes:
                begin = time.perf_counter()
                try:
                    found = lossless.run_experiments(
                        op, run, lossless.DTYPE_NAMES[dtype], geometry=lossless.GEOMETRIES[args.geometry],
                        requests=args.requests, tokens=args.tokens, seed=args.seed,
                        prefill_tokens=prefill)
                except Exception as error:  # an implementation without this op/dtype: report it, go on
                    failures.append(dict(op=op, impl=impl, dtype=dtype, error=f"{type(error).__name__}: {error}"))
                    print(f"{op} {impl} {dtype}: FAILED {type(error).__name__}: {str(error).splitlines()[0]}")
                    continue
                checks += found
                print(f"# {op} {impl} {dtype}: {len(found)} items in {time.perf_counter() - begin:.1f} s",
                      file=sys.stderr)

    summary = lossless.summarize(checks)
    header = (f"{'op':<8} {'impl':<5} {'dtype':<8} {'check':<58} {'equal':>9} {'max_abs':>10} {'max_rel':>9} "
              f"{'max_ulp':>8} {'differ':>7}  worst")
    print(header)
    print("-" * len(header))
    rows = [c.as_dict() for c in checks] if args.all else summary
    for r in rows:
        equal = ("yes" if r["equal"] else "NO") if args.all else f"{r['equal']}/{r['items']}"
        detail = r["item"] if args.all else r["worst"]
        print(f"{r['op'][:8]:<8} {r['impl']:<5} {r['dtype']:<8} {r['check']:<58} {equal:>9} {r['max_abs']:>10.3g} "
              f"{r['max_rel']:>9.2g} {r['max_ulp']:>8} {r['differing']:>7.2%}  {detail}")
    if args.json:
        args.json.write_text(json.dumps(dict(environment=env, arguments=vars(args) | {"json": str(args.json)},
                                             summary=summary, failures=failures,
                                             items=[c.as_dict() for c in checks]), indent=1))
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
