#!/usr/bin/env python
"""Write a tiny random hybrid checkpoint with transformers' save_pretrained (see onnx_hybrid_testing.checkpoints)."""

import argparse

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
from onnx_hybrid_testing.checkpoints import LAYOUTS, make_tiny_checkpoint


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("output", help="folder to write")
    parser.add_argument("--layout", choices=list(LAYOUTS), default="qwen3_5_text")
    parser.add_argument("--untied", action="store_true", help="separate lm_head.weight")
    parser.add_argument("--fused-experts", action="store_true", help="MoE: keep fused [E, 2F, H] expert tensors")
    parser.add_argument("--shard-size", help="write sharded safetensors with an index, e.g. 100KB")
    parser.add_argument("--layers", type=int, help="number of decoder layers (every third is attention)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    path = make_tiny_checkpoint(args.output, args.layout, tied=not args.untied, seed=args.seed,
                                shard_size=args.shard_size, fused_experts=args.fused_experts, layers=args.layers)
    print(path)


if __name__ == "__main__":
    main()
