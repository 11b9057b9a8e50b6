#!/usr/bin/env python
"""Speculative decoding on CPU through onnxruntime-genai's Engine: our paged export with its MTP head drafting,
against the same export without the head, on a checkpoint with the real Qwen3.5-0.8B geometry.

The checkpoint is synthetic (random bf16 weights, onnx_hybrid_testing.synthetic) with an MTP head added. A
random head never drafts right, so the head is fitted to the main model's own greedy runs through our ORT
export (onnx_hybrid_testing.mtp.fit_drafting_head): on the first ``--fit-tokens`` greedy tokens of each
benchmark prompt and of as many other prompts. The runs generate ``--new-tokens`` > ``--fit-tokens``, so
the head drafts well early and worse later; the acceptance reported is that of this head, not of a
trained one. Both runs use one package (C = ``--capacity``), ``intra_op_num_threads`` in the session
options of the decoder and the head; "without" is the same folder with ``model.mtp`` removed.

Also printed: the rollback data per request and verify step, compact capsules (conv values + recurrent
capsule per GDN layer, contract.gdn_capsule_width) against dense per-token state copies (conv + recurrent
state per GDN layer per drafted token).

    python scripts/bench_speculative_cpu.py --work /tmp/bench          # creates what is missing
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import numpy as np


def mtp_checkpoint(work: Path) -> Path:
    """The synthetic 0.8B checkpoint (shared with bench_e2e_cpu.py, left untouched) plus a random MTP head in
    a folder of its own whose shards are links."""
    from onnx_hybrid_testing.e2e import synthetic_checkpoint, with_mtp_head
    from onnx_hybrid_testing.synthetic import QWEN3_5_0_8B

    return with_mtp_head(synthetic_checkpoint(work / "checkpoint_0.8b", QWEN3_5_0_8B), work / "checkpoint_0.8b_mtp")


def fit_head(checkpoint: Path, work: Path, prompts: list[list[int]], fit_tokens: int, threads: int) -> None:
    from onnx_hybrid.exporter import export
    from onnx_hybrid.ops import contract
    from onnx_hybrid_testing.mtp import add_mtp_head, fit_drafting_head, greedy_runs

    out = export(checkpoint, work / "fit_0.8b", overwrite=True, progress=False)
    t0 = time.perf_counter()
    runs = greedy_runs(out, prompts, fit_tokens, contract.DOMAIN, threads)
    print(f"collected {sum(len(h) - 1 for _, h in runs)} (token, hidden) pairs in {time.perf_counter() - t0:.0f} s",
          flush=True)
    add_mtp_head(checkpoint, fit_drafting_head(checkpoint, runs))
    shutil.rmtree(out)


def packages(checkpoint: Path, work: Path, capacity: int, max_draft: int, num_blocks: int, block_size: int
             ) -> dict[str, Path]:
    from onnx_hybrid.exporter import export
    from onnx_hybrid_testing.e2e import without_mtp

    spec = export(checkpoint, work / "paged_0.8b_mtp", paged=True, state_update_capacity=capacity,
                  block_size=block_size, num_blocks=num_blocks, max_draft_tokens=max_draft, overwrite=True,
                  progress=False)
    plain = without_mtp(spec, work / "paged_0.8b_plain")
    return {"without speculation": plain, "MTP head drafting": spec}


def best_runs(models: dict, prompts: list[list[int]], new_tokens: int, repeats: int) -> dict:
    """Per model, the best of ``repeats`` timed runs (``testing.engine.EngineRun``), the models taking turns,
    after a warm-up run each (prepacking, first allocations): the box is shared, and interference only ever
    adds time."""
    from onnx_hybrid_testing.genai_driver import run_engine

    for model in models.values():
        run_engine(model, prompts, 4)
    best = {}
    for _ in range(repeats):
        for label, model in models.items():
            run = run_engine(model, prompts, new_tokens)
            if label not in best or run.seconds < best[label].seconds:
                best[label] = run
    return best


def rollback_bytes(checkpoint: Path, capacity: int) -> tuple[int, int]:
    """(capsule bytes, dense per-token state-copy bytes) per request and verify step with ``capacity`` drafts."""
    from onnx_hybrid.exporter.model_config import load_model_config
    from onnx_hybrid.ops import contract

    cfg = load_model_config(checkpoint)
    layers = len(cfg.linear_layers)
    conv_values = capacity * cfg.conv_channels * 4  # fp32 export: conv values in the activation type
    capsule = contract.gdn_capsule_width(capacity, cfg.gdn_value_heads, cfg.gdn_key_heads, cfg.gdn_key_dim,
                                         cfg.gdn_value_dim) * 4
    conv_state = cfg.conv_channels * (cfg.conv_kernel - 1) * 4
    recurrent_state = cfg.gdn_value_heads * cfg.gdn_value_dim * cfg.gdn_key_dim * 4
    return layers * (conv_values + capsule), layers * capacity * (conv_state + recurrent_state)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/bench"))
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--capacity", type=int, default=3)
    parser.add_argument("--max-draft-tokens", type=int, default=3)
    parser.add_argument("--prompt-lengths", type=int, nargs="+", default=[48, 12, 96, 4])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--fit-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--refit", action="store_true", help="fit the head again even if the folder has one")
    parser.add_argument("--json", type=Path, help="also write the rows here (with date, commit, CPU, command)")
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    prompts = [rng.integers(1000, 200000, n).tolist() for n in args.prompt_lengths]
    others = [rng.integers(1000, 200000, n).tolist() for n in args.prompt_lengths]
    checkpoint = mtp_checkpoint(args.work)
    if args.refit or not (args.work / "paged_0.8b_mtp" / "mtp.onnx").is_file():
        fit_head(checkpoint, args.work, prompts + others, args.fit_tokens, args.threads)
    runs = packages(checkpoint, args.work, args.capacity, args.max_draft_tokens, num_blocks=256, block_size=16)

    from onnx_hybrid_testing.e2e import cpu_model, load_model
    from onnx_hybrid_testing.results import write_json

    models = {label: load_model(package, threads=args.threads, spinning=False) for label, package in runs.items()}
    rows = []
    for batch in (prompts[:1], prompts):
        results = best_runs(models, batch, args.new_tokens, args.repeats)
        for label, r in results.items():
            s = r.stats
            generated = sum(map(len, r.tokens))
            rows.append({"requests": len(batch), "run": label, "tokens": generated, "seconds": r.seconds,
                         "stats": {k: v for k, v in s.items() if isinstance(v, (int, float))}})
            line = (f"{len(batch)} request(s), {label}: {generated} tokens in {r.seconds:.1f} s = "
                    f"{generated / r.seconds:.2f} tok/s")
            if s.get("rounds"):
                line += (f", {s['target_forward_passes']} target steps; rounds {s['rounds']} (full "
                         f"{s['full_accept_rounds']} / partial {s['partial_accept_rounds']} / zero "
                         f"{s['zero_accept_rounds']}), accepted {s['draft_tokens_accepted']} / evaluated "
                         f"{s['draft_tokens_evaluated']} (proposed {s['draft_tokens_proposed']}), rate "
                         f"{s['acceptance_rate']:.2f}, head runs {s['draft_forward_passes']}, histogram "
                         f"{s['acceptance_length_histogram'][:4]}")
            print(line, flush=True)
        plain, spec = results["without speculation"], results["MTP head drafting"]
        print(f"{len(batch)} request(s): speed-up {plain.seconds / spec.seconds:.2f}x, tokens identical: "
              f"{plain.tokens == spec.tokens}", flush=True)
    capsules, dense = rollback_bytes(checkpoint, args.capacity)
    print(f"rollback data per request per verify step (C = {args.capacity}): capsules {capsules / 2**20:.2f} MiB, "
          f"dense per-token state copies {dense / 2**20:.2f} MiB ({dense / capsules:.1f}x)")
    print("\n| requests | run | tokens/s |\n|---|---|---|")
    for row in rows:
        print(f"| {row['requests']} | {row['run']} | {row['tokens'] / row['seconds']:.2f} |")
    write_json(args.json, "bench_speculative_cpu", cpu_model(), rows, threads=args.threads, capacity=args.capacity,
               rollback_bytes={"capsules": capsules, "dense_state_copies": dense})


if __name__ == "__main__":
    main()
