"""Nodes per decode step of a tiny 24-layer Qwen3.5 (multimodal layout, every third layer full attention: the
0.8B's depth) exported three ways on CPU: ours with --kv-cache concat, ours with --kv-cache shared, and
onnxruntime-genai's builder (issue 30, point 2). With ``--cuda`` the GPU exports instead, in fp16: ours with
``-e cuda`` and the builder's ``-e cuda -p fp16`` (written on any host; the counts are of the saved graph and of
ORT's CPU optimization of it, which fuses less than its CUDA provider would).

    python scripts/count_decode_nodes.py [--cuda] [WORK_DIR]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
from onnx_hybrid.exporter import export
from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint
from onnx_hybrid_testing.e2e import builder_export
from onnx_hybrid_testing.graph_count import decode_step_nodes


def main(work: Path, cuda: bool) -> None:
    checkpoint = work / "hf"
    if not (checkpoint / "config.json").is_file():
        make_tiny_checkpoint(checkpoint, "qwen3_5_multimodal", tied=False, seed=1, layers=24)
    if cuda:
        exports = {"ours_cuda": export(checkpoint, work / "ours_cuda", execution_provider="cuda", mtp=False,
                                       overwrite=True, progress=False),
                   "builder": builder_export(checkpoint, work / "builder_cuda", "fp16", "cuda", work / "builder_cache")}
    else:
        exports = {kv: export(checkpoint, work / f"ours_{kv}", kv_cache=kv, overwrite=True, progress=False)
                   for kv in ("concat", "shared")}
        exports["builder"] = builder_export(checkpoint, work / "builder", "fp32", "cpu", work / "builder_cache")
    print(f"{'export':10} {'graph':>6} {'optimized':>9}  optimized ops")
    for name, out in exports.items():
        counts = decode_step_nodes(out / "model.onnx", work / f"{name}.optimized.onnx")
        ops = ", ".join(f"{op} {n}" for op, n in counts["optimized_ops"].most_common())
        print(f"{name:10} {counts['graph']:6} {counts['optimized']:9}  {ops}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("work", nargs="?", type=Path, help="folder for the checkpoint and exports (default: temporary)")
    parser.add_argument("--cuda", action="store_true", help="the fp16 -e cuda exports, ours and the builder's")
    args = parser.parse_args()
    if args.work:
        main(args.work, args.cuda)
    else:
        with tempfile.TemporaryDirectory() as work:
            main(Path(work), args.cuda)
