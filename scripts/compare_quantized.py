#!/usr/bin/env python
"""Quantized exports against their fp32 export: ours (``--weights int8|int4``) and onnxruntime-genai's builder
(``-p int8|int4``), one checkpoint, through onnxruntime-genai 0.18's og.Generator on CPU.

Every model reads the same random prompt of P tokens in one prefill and returns logits for every position.
Per exporter, against that exporter's own fp32 export: the relative RMS of the logits
(||L - L_fp32|| / ||L_fp32|| over all positions), the mean KL(p_fp32 || p) of the next-token distributions
and the share of positions whose top-1 token is unchanged. Both exporters quantize the same way by default
(block-wise round-to-nearest, symmetric, block 32, accuracy_level 4 on CPU, lm_head quantized: ours with
``--quantize-lm-head``, which the builder does by itself); ``--block`` and ``--asymmetric`` change both.

    python scripts/compare_quantized.py --work /tmp/cmpq                    # tiny checkpoint (multimodal layout)
    python scripts/compare_quantized.py --work /tmp/cmpq --synthetic 0.8b   # real 0.8B geometry, random weights
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import numpy as np

PRECISIONS = ("fp32", "int8", "int4")


def checkpoint(work: Path, synthetic: str | None) -> Path:
    """The builder reads the multimodal wrapper layout only, so both checkpoints use it."""
    if synthetic:
        from onnx_hybrid_testing.e2e import synthetic_checkpoint
        from onnx_hybrid_testing.synthetic import GEOMETRIES

        return synthetic_checkpoint(work / f"checkpoint_{synthetic}", GEOMETRIES[synthetic])
    from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint

    path = work / "checkpoint_tiny"
    if not (path / "config.json").is_file():
        make_tiny_checkpoint(path, "qwen3_5_multimodal", tied=False, seed=1)
    return path


def ours(source: Path, out: Path, precision: str, block: int, asymmetric: bool) -> float:
    from onnx_hybrid.exporter import export

    start = time.perf_counter()
    quantized = dict(weights=precision, weight_block=block, weight_asymmetric=asymmetric, quantize_lm_head=True)
    export(source, out, all_logits=True, overwrite=True, progress=False, **(quantized if precision != "fp32" else {}))
    return time.perf_counter() - start


def builder(source: Path, out: Path, precision: str, block: int, asymmetric: bool, cache: Path) -> float:
    from onnx_hybrid_testing.e2e import builder_command

    shutil.rmtree(out, ignore_errors=True)
    extra = {"block_size": block, "is_symmetric": str(not asymmetric).lower(), "accuracy_level": 4}
    command = builder_command(source, out, precision, "cpu", cache, extra if precision != "fp32" else None)
    start = time.perf_counter()
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{run.stdout[-2000:]}\n{run.stderr[-4000:]}")
    return time.perf_counter() - start


def prefill_logits(model_dir: Path, prompt: list[int], threads: int) -> np.ndarray:
    """float64 [P, V]: the logits of every prompt position from one og.Generator prefill."""
    import onnxruntime_genai as og

    from onnx_hybrid_testing.e2e import load_model

    model = load_model(model_dir, threads=threads)
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + 1)
    generator = og.Generator(model, params)
    generator.append_tokens(prompt)
    logits = np.asarray(generator.get_output("logits"), np.float64)
    if logits.shape[-2] != len(prompt):
        sys.exit(f"{model_dir}: logits {list(logits.shape)} do not cover the {len(prompt)} prompt positions")
    return logits.reshape(len(prompt), -1)


def compare(reference: np.ndarray, logits: np.ndarray) -> dict[str, float]:
    def log_softmax(x):
        x = x - x.max(-1, keepdims=True)
        return x - np.log(np.exp(x).sum(-1, keepdims=True))

    p_ref, p = log_softmax(reference), log_softmax(logits)
    return {"rel_rms": float(np.linalg.norm(logits - reference) / np.linalg.norm(reference)),
            "mean_kl": float((np.exp(p_ref) * (p_ref - p)).sum(-1).mean()),
            "top1": float((reference.argmax(-1) == logits.argmax(-1)).mean())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--work", type=Path, default=Path("/tmp/compare_quantized"))
    parser.add_argument("--synthetic", choices=["0.8b"], default=None,
                        help="a synthetic checkpoint of this geometry instead of the tiny one")
    parser.add_argument("--positions", type=int, default=256, help="prompt length P (positions compared)")
    parser.add_argument("--block", type=int, default=32, choices=[32, 64, 128])
    parser.add_argument("--asymmetric", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cleanup", action="store_true", help="delete the exports at the end")
    args = parser.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    source = checkpoint(args.work, args.synthetic)
    vocab = json.loads((source / "config.json").read_text())["text_config"]["vocab_size"]
    prompt = np.random.default_rng(0).integers(1, vocab, args.positions).tolist()
    results, ours_fp32 = {}, None
    for name, exporter in (("ours", ours), ("builder", builder)):
        logits = {}
        for precision in PRECISIONS:
            out = args.work / f"{name}_{precision}"
            extra = (args.work / "cache",) if name == "builder" else ()
            seconds = exporter(source, out, precision, args.block, args.asymmetric, *extra)
            logits[precision] = prefill_logits(out, prompt, args.threads)
            print(f"{name:8} {precision}: exported in {seconds:.1f} s", flush=True)
            if args.cleanup:
                shutil.rmtree(out)
        results[name] = {p: compare(logits["fp32"], logits[p]) for p in PRECISIONS[1:]}
        if ours_fp32 is None:
            ours_fp32 = logits["fp32"]
        else:  # the two fp32 exports against each other: how far apart the baselines are
            results[name]["fp32 vs ours fp32"] = compare(ours_fp32, logits["fp32"])
    print(f"\n{source.name}, {args.positions} positions, block {args.block}, "
          f"{'asymmetric' if args.asymmetric else 'symmetric'}; each exporter against its own fp32 export")
    print(f"{'exporter':10} {'weights':18} {'rel RMS logits':>15} {'mean KL':>10} {'top-1 same':>11}")
    for name, rows in results.items():
        for precision, row in rows.items():
            print(f"{name:10} {precision:18} {row['rel_rms']:15.3e} {row['mean_kl']:10.3e} {row['top1']:11.1%}")


if __name__ == "__main__":
    main()
