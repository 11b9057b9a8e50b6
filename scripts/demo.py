"""The main job, end to end on a tiny checkpoint that this script builds itself.

1. write a tiny random Qwen3.5 checkpoint (multimodal wrapper, as the official releases) with transformers'
   ``save_pretrained``;
2. ``export-hybrid`` it to ONNX (GatedDeltaNet and VarlenCausalConvWithState in domain ``onnx_hybrid``,
   with compact state updates);
3. ``onnx-hybrid validate`` the genai_config.json against the graph;
4. generate greedily through ONNX Runtime with our custom-op library, and through onnxruntime-genai 0.18;
5. print those tokens next to transformers' greedy tokens.

Usage: python scripts/demo.py [--workdir DIR] [--layout LAYOUT] [--new-tokens N]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
from onnx_hybrid.cli import export_main, main as onnx_hybrid_main
from onnx_hybrid.ops import contract
from onnx_hybrid_testing.checkpoints import LAYOUTS, load_reference, make_tiny_checkpoint
from onnx_hybrid_testing.greedy import GreedyDriver, make_session
from onnx_hybrid_testing.genai_driver import greedy_tokens  # noqa: E402

PROMPT = [5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150]


def transformers_tokens(model_dir: Path, new_tokens: int) -> list[int]:
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # the kernel-fallback notices are noise here
    model = load_reference(model_dir)
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False)
    return out[0, len(PROMPT):].tolist()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, help="keep the checkpoint and the export here (default: temporary)")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="qwen3_5_multimodal")
    parser.add_argument("--new-tokens", type=int, default=16)
    args = parser.parse_args()

    with contextlib.nullcontext(args.workdir) if args.workdir else tempfile.TemporaryDirectory() as work:
        work = Path(work)
        hf_dir, onnx_dir = work / "hf", work / "onnx"
        print(f"[1/5] tiny {args.layout} checkpoint -> {hf_dir}")
        make_tiny_checkpoint(hf_dir, args.layout, tied=False, seed=1)

        print(f"[2/5] export-hybrid {hf_dir} -o {onnx_dir} --state-update-capacity 3")
        status = export_main([str(hf_dir), "-o", str(onnx_dir), "--state-update-capacity", "3", "--overwrite"])
        if status:
            return status

        print(f"[3/5] onnx-hybrid validate {onnx_dir}")
        status = onnx_hybrid_main(["validate", str(onnx_dir)])
        if status:
            return status

        print("[4/5] greedy generation: ONNX Runtime + our library, onnxruntime-genai, transformers")
        driver = GreedyDriver(make_session(onnx_dir, contract.DOMAIN))
        ours = driver.generate([PROMPT], args.new_tokens, capture_count=3).tokens[0]
        # onnxruntime-genai's non-paged Generator does not feed the capture inputs: give it a capacity-0 export.
        plain_dir = work / "onnx-plain"
        status = export_main([str(hf_dir), "-o", str(plain_dir), "--overwrite", "--quiet"])
        if status:
            return status
        import onnxruntime_genai as og

        genai = greedy_tokens(og.Model(str(plain_dir)), PROMPT, args.new_tokens)
        reference = transformers_tokens(hf_dir, args.new_tokens)

        print("[5/5] tokens")
        width = len("onnxruntime-genai 0.18")
        for name, tokens in (("transformers", reference), ("ORT + onnx_hybrid ops", ours),
                             ("onnxruntime-genai 0.18", genai)):
            print(f"  {name:<{width}}  {tokens}")
        # genai stops at the tiny tokenizer's EOS/pad id; compare the tokens it produced.
        same = ours == reference and genai == reference[:len(genai)] and len(genai) > 0
        print("  match: " + ("yes, token for token" if same else "NO"))
        return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
