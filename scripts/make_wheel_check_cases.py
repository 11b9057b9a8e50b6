#!/usr/bin/env python
"""Tiny checkpoints and transformers' greedy tokens for tests/native/test_wheel_gpu.py, written where torch and
transformers are installed, so the installed wheel's check needs neither (nor CuPy, nor a compiler).

    python scripts/make_wheel_check_cases.py CASES_DIR
    ONNX_HYBRID_WHEEL_CASES=CASES_DIR/cases.json scripts/check_wheel_gpu.sh WHEEL WHEELHOUSE tests/native/test_wheel_gpu.py
"""

import argparse
import json
from pathlib import Path

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import torch

from onnx_hybrid_testing.checkpoints import load_reference, make_tiny_checkpoint

LAYOUTS = {"dense": ("qwen3_5_text", {}), "multimodal": ("qwen3_5_multimodal", {}), "moe": ("qwen3_5_moe_text", {}),
           "moe_fused": ("qwen3_5_moe_text", {"fused_experts": True}), "next": ("qwen3_next", {})}
PROMPTS = [[5, 17, 33, 2, 99, 64, 7, 120, 11, 3, 150, 8], [44, 3, 150, 12], [77]]
NEW_TOKENS = 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output", type=Path, help="folder for the checkpoints and cases.json")
    args = parser.parse_args()
    cases = []
    for name, (layout, options) in LAYOUTS.items():
        checkpoint = make_tiny_checkpoint(args.output / name, layout, seed=7, **options)
        hf = load_reference(checkpoint)
        with torch.no_grad():
            tokens = [hf.generate(torch.tensor([p]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                                  do_sample=False)[0, len(p):].tolist() for p in PROMPTS]
        vocab = hf.config.get_text_config().vocab_size
        eos = max(set(range(vocab)) - {t for seq in PROMPTS + tokens for t in seq})
        cases.append({"name": name, "checkpoint": str(checkpoint.resolve()), "prompts": PROMPTS, "tokens": tokens,
                      "eos": eos})
    (args.output / "cases.json").write_text(json.dumps(cases, indent=1))
    print(args.output / "cases.json")


if __name__ == "__main__":
    main()
