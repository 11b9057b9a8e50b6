"""Host time per call of ``onnx_hybrid.cuda_ops.gated_delta_net`` against FLA's recurrent kernel, same inputs.

What a PyTorch caller pays on the CPU for each decode call (the launch is asynchronous): the median over
``--reps`` loops of ``--calls`` back-to-back calls, each loop started on an idle GPU and timed on the host
without waiting for the kernels; the loops of all cases and callers take turns, round after round. 27B geometry as
in bench_gpu.py; decode rows (one token each) at batch 1 and 32.
"ours" is a gated_delta_net call with torch tensors, outputs given and the stream's handle taken once (a decode
loop runs on one stream); "bound" is the same call bound once with bind_gated_delta_net and then called.
"""

from __future__ import annotations

import datetime
import statistics
import time

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import torch
from bench_gpu import ATTRS, benchmark_arguments, benchmark_dtypes, fla_fn, make_inputs

from onnx_hybrid import cuda_ops
from onnx_hybrid_testing.results import write_json

CASES = [("decode B=1", [1]), ("decode B=32", [1] * 32)]


def host_times(fns: dict, calls: int, reps: int) -> dict:
    """Median host seconds per call of each function over ``reps`` rounds; each round times a loop of ``calls``
    calls of every function in turn, so that a host slow at first (clocks, other work) weighs on all of them alike
    instead of on whichever case ran first."""
    for fn in fns.values():
        fn()
    torch.cuda.synchronize()
    times = {key: [] for key in fns}
    for _ in range(reps):
        for key, fn in fns.items():
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[key].append((time.perf_counter() - start) / calls)
    torch.cuda.synchronize()
    return {key: statistics.median(t) for key, t in times.items()}


def main() -> None:
    ap = benchmark_arguments()
    ap.description = __doc__
    ap.add_argument("--calls", type=int, default=200, help="calls per timed loop")
    ap.add_argument("--reps", type=int, default=15, help="timed loops (the median is reported)")
    args = ap.parse_args()
    print(f"# {datetime.date.today()} {torch.cuda.get_device_name()}  host time per call, "
          f"{args.calls} calls x {args.reps} loops")
    print(f"{'case':16s} {'dtype':9s} {'ours us':>9s} {'bound us':>9s} {'FLA us':>9s} {'FLA/ours':>9s} "
          f"{'FLA/bound':>9s}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    fns = {}  # each keeps its arrays alive: the lambda's defaults, the bound call, FLA's closure
    for dtype_name in benchmark_dtypes(args.dtype):
        for name, lengths in CASES:
            if args.cases and not any(c in name for c in args.cases.split(",")):
                continue
            feeds, outs, fla = make_inputs(lengths, getattr(torch, dtype_name), 0, gen)
            fns[name, dtype_name, "ours"] = (lambda feeds=feeds, outs=outs: cuda_ops.gated_delta_net(
                feeds, outputs=outs, stream=stream, **ATTRS))
            fns[name, dtype_name, "bound"] = cuda_ops.bind_gated_delta_net(feeds, outputs=outs, stream=stream, **ATTRS)
            if not args.no_fla:
                fns[name, dtype_name, "fla"] = fla_fn(fla, 1)
    times = host_times(fns, args.calls, args.reps)
    rows = []
    for name, dtype_name in dict.fromkeys(key[:2] for key in fns):
        ours, bound = times[name, dtype_name, "ours"], times[name, dtype_name, "bound"]
        theirs = times.get((name, dtype_name, "fla"))
        ratios = f"{theirs / ours:9.2f} {theirs / bound:9.2f}" if theirs else f"{'':>9s} {'':>9s}"
        fla_us = f"{theirs * 1e6:9.1f}" if theirs else f"{'':>9s}"
        print(f"{name:16s} {dtype_name:9s} {ours * 1e6:9.1f} {bound * 1e6:9.1f} {fla_us} {ratios}")
        rows.append({"case": name, "dtype": dtype_name, "ours_us": ours * 1e6, "bound_us": bound * 1e6,
                     "fla_us": theirs * 1e6 if theirs else None})
    write_json(args.json, "bench_gpu_host", torch.cuda.get_device_name(), rows, calls=args.calls, reps=args.reps)


if __name__ == "__main__":
    main()
