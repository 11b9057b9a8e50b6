#!/usr/bin/env python
"""End-to-end CPU speed through onnxruntime-genai: our export against onnxruntime-genai's builder export.

Both models come from the same synthetic checkpoint (real Qwen3.5-0.8B geometry, random bf16 weights,
see onnx_hybrid_testing.synthetic) and run in the same process with ``intra_op_num_threads`` set in
session_options. Measured: prefill of a P-token prompt (append_tokens, which includes the first logits) and
greedy decode of N tokens. Every model runs once to warm up, then R rounds run each model once in turn, so a
load that comes and goes on a shared machine falls on all of them alike; the table gives the median of the
rounds (the best in parentheses).

    python scripts/bench_e2e_cpu.py --work /tmp/bench            # creates what is missing
"""

from __future__ import annotations

import argparse
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import numpy as np

from onnx_hybrid.ops import contract


def ensure_exports(work: Path, our_domains: list[str], weights: list[str], blocks: list[int]) -> dict[str, Path]:
    """The builder's fp32 export first (the baseline of the ratios), then its exports and ours with each of
    ``weights`` (fp32, int8, int4; ours with fp32 weights once per kernel domain; quantized ones with each of
    ``blocks``, the builder's at its default block of 32; ours at int4 also with ORT's MatMulNBits instead of our
    QuantizedLinear)."""
    from onnx_hybrid.exporter import export
    from onnx_hybrid_testing.e2e import builder_export, synthetic_checkpoint
    from onnx_hybrid_testing.synthetic import QWEN3_5_0_8B

    checkpoint = synthetic_checkpoint(work / "checkpoint_0.8b", QWEN3_5_0_8B)
    models = {"builder fp32 (LinearAttention, all logits)":
              builder_export(checkpoint, work / "builder_0.8b_fp32", "fp32", "cpu", work / "cache")}
    for kind in weights:
        if kind != "fp32":
            models[f"builder {kind} (MatMulNBits, all logits)"] = builder_export(
                checkpoint, work / f"builder_0.8b_{kind}", kind, "cpu", work / "cache")
        if kind == "fp32":
            for domain in our_domains:
                out = work / f"ours_0.8b_{kind}_{domain}"  # re-exported every run (seconds): the current library
                export(checkpoint, out, op_domain=domain, overwrite=True, progress=False)
                models[f"ours {kind} weights ({domain} kernels, last-token logits)"] = out
            continue
        for block in blocks:
            tag = "" if block == 32 else f", block {block}"
            out = work / f"ours_0.8b_{kind}_b{block}"
            export(checkpoint, out, overwrite=True, progress=False, weights=kind, weight_block=block)
            models[f"ours {kind} weights{tag} (last-token logits)"] = out
            # the builder quantizes its lm_head by default; ours on request
            out = work / f"ours_0.8b_{kind}_b{block}_lm_head"
            export(checkpoint, out, overwrite=True, progress=False, weights=kind, weight_block=block,
                   quantize_lm_head=True)
            models[f"ours {kind} weights and lm_head{tag} (--quantize-lm-head)"] = out
            if kind == "int4":  # the default writes QuantizedLinear (int8 rows); ORT's MatMulNBits beside it
                out = work / f"ours_0.8b_{kind}_b{block}_lm_head_matmul_nbits"
                export(checkpoint, out, overwrite=True, progress=False, weights=kind, weight_block=block,
                       quantize_lm_head=True, linear_op=False)
                models[f"ours {kind} weights and lm_head{tag} as MatMulNBits (--no-linear-op)"] = out
    return models


def run_rounds(models: dict[str, Path], threads: int, prompt_len: int, new_tokens: int, rounds: int) -> dict:
    """Per model: the median and best prefill (ms) and decode rate (tok/s) over ``rounds`` interleaved runs, and
    the first row's tokens."""
    from onnx_hybrid_testing.e2e import generator_run, load_model

    prompt = np.random.default_rng(0).integers(1000, 200000, (1, prompt_len), dtype=np.int32)
    loaded = {label: load_model(path, threads=threads) for label, path in models.items()}
    runs = {label: [generator_run(model, prompt, new_tokens, 1)] for label, model in loaded.items()}
    for _ in range(rounds - 1):
        for label, model in loaded.items():
            runs[label].append(generator_run(model, prompt, new_tokens, 1, warm_up=False))
    return {label: {"prefill_ms": float(np.median([r["prefill_ms"] for r in rs])),
                    "prefill_best_ms": min(r["prefill_ms"] for r in rs),
                    "decode_tok_s": float(np.median([r["decode_tok_s"] for r in rs])),
                    "decode_best_tok_s": max(r["decode_tok_s"] for r in rs), "tokens": rs[0]["tokens"]}
            for label, rs in runs.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--prompt", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds (every model once per round)")
    parser.add_argument("--domains", nargs="+", default=[contract.DOMAIN, contract.MS_DOMAIN])
    parser.add_argument("--weights", nargs="+", default=["fp32"], choices=["fp32", "int8", "int4"],
                        help="weight types to compare (int4/int8: MatMulNBits exports of both exporters)")
    parser.add_argument("--weight-block", type=int, nargs="+", default=[32], choices=[32, 64, 128],
                        help="block sizes of our quantized exports (the builder's stays at its default, 32)")
    parser.add_argument("--json", type=Path, help="also write the rows here (with date, commit, CPU, command)")
    args = parser.parse_args()
    from onnx_hybrid_testing.e2e import cpu_model
    from onnx_hybrid_testing.results import write_json

    print(f"CPU: {cpu_model()}; {args.threads} intra-op threads, prompt {args.prompt}, {args.new_tokens} new tokens, "
          f"median (best) of {args.repeats} interleaved rounds", flush=True)
    models = ensure_exports(args.work, args.domains, args.weights, args.weight_block)
    results = run_rounds(models, args.threads, args.prompt, args.new_tokens, args.repeats)
    base_label = next(iter(models))
    base = results[base_label]
    print(f"\n| export | prefill {args.prompt} tokens ms | decode tok/s | prefill vs {base_label} | decode vs "
          f"{base_label} | first greedy tokens equal to its |\n|---|---|---|---|---|---|")
    rows = []
    for label, r in results.items():
        same = next((i for i, (a, b) in enumerate(zip(r["tokens"], base["tokens"])) if a != b), len(r["tokens"]))
        rows.append({**{k: v for k, v in r.items() if k != "tokens"}, "export": label,
                     "prefill_speed_up": base["prefill_ms"] / r["prefill_ms"],
                     "decode_speed_up": r["decode_tok_s"] / base["decode_tok_s"], "same_tokens": same})
        print(f"| {label} | {r['prefill_ms']:.0f} ({r['prefill_best_ms']:.0f}) | {r['decode_tok_s']:.2f} "
              f"({r['decode_best_tok_s']:.2f}) | {rows[-1]['prefill_speed_up']:.2f}x | "
              f"{rows[-1]['decode_speed_up']:.2f}x | {same} |")
    write_json(args.json, "bench_e2e_cpu", cpu_model(), rows, threads=args.threads, prompt=args.prompt,
               new_tokens=args.new_tokens, repeats=args.repeats)


if __name__ == "__main__":
    main()
