#!/usr/bin/env python
"""The GatedDeltaNet output norm two ways in onnxruntime: one com.microsoft::GatedRMSNorm node against the separate
nodes a CPU export writes (RMSNormalization per value head, Sigmoid, two Mul, Reshapes), same inputs, one session
each, interleaved rounds, median host time per run (docs/model.md#gated-rmsnorm says which exports use which).

    python scripts/bench_gated_norm.py                      # CPU, 0.8B geometry (16 value heads of 128), 2 threads
    python scripts/bench_gated_norm.py --provider cuda --dtype fp16 --heads 32
"""

from __future__ import annotations

import argparse
import statistics
import time

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from onnx_hybrid_testing.e2e import cpu_model
from onnx_hybrid_testing.results import write_json
from onnx_hybrid_testing.single_op import IR_VERSION

TYPES = {"fp32": (TensorProto.FLOAT, np.float32), "fp16": (TensorProto.FLOAT16, np.float16)}
PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider"}


def session(nodes, heads: int, head_size: int, elem: int, provider: str, threads: int,
            initializers=()) -> ort.InferenceSession:
    width = heads * head_size
    inputs = [helper.make_tensor_value_info("x", elem, ["n", width]),
              helper.make_tensor_value_info("s", elem, [head_size]),
              helper.make_tensor_value_info("z", elem, ["n", width])]
    graph = helper.make_graph(nodes, "gated_norm", inputs, [helper.make_tensor_value_info("y", elem, None)],
                              initializer=list(initializers))
    opsets = [helper.make_opsetid("", 23), helper.make_opsetid("com.microsoft", 1)]  # 23: RMSNormalization
    model = helper.make_model(graph, opset_imports=opsets, ir_version=IR_VERSION)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    return ort.InferenceSession(model.SerializeToString(), options, providers=[PROVIDERS[provider]])


def fused(heads, head_size, elem, provider, threads, eps):
    node = helper.make_node("GatedRMSNorm", ["x", "s", "z"], ["y"], domain="com.microsoft", epsilon=eps)
    return session([node], heads, head_size, elem, provider, threads)


def separate(heads, head_size, elem, provider, threads, eps):
    per_head = helper.make_tensor("per_head", TensorProto.INT64, [3], [0, heads, head_size])
    packed = helper.make_tensor("packed", TensorProto.INT64, [2], [0, heads * head_size])
    nodes = [helper.make_node("Reshape", ["x", "per_head"], ["x3"]),
             helper.make_node("Reshape", ["z", "per_head"], ["z3"]),
             helper.make_node("RMSNormalization", ["x3", "s"], ["normed"], axis=-1, epsilon=eps, stash_type=1),
             helper.make_node("Sigmoid", ["z3"], ["sigmoid"]), helper.make_node("Mul", ["z3", "sigmoid"], ["silu"]),
             helper.make_node("Mul", ["normed", "silu"], ["gated"]),
             helper.make_node("Reshape", ["gated", "packed"], ["y"])]
    return session(nodes, heads, head_size, elem, provider, threads, [per_head, packed])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--provider", choices=list(PROVIDERS), default="cpu")
    parser.add_argument("--dtype", choices=list(TYPES), default="fp32")
    parser.add_argument("--heads", type=int, default=16, help="value heads (0.8B: 16, 9B: 32)")
    parser.add_argument("--head-size", type=int, default=128)
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 128])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=200, help="runs per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", help="also write the rows here (with date, commit, device, command)")
    args = parser.parse_args()
    elem, np_type = TYPES[args.dtype]
    eps = 1e-6
    ways = {name: make(args.heads, args.head_size, elem, args.provider, args.threads, eps)
            for name, make in (("GatedRMSNorm", fused), ("separate nodes", separate))}
    rng = np.random.default_rng(0)
    device = cpu_model() if args.provider == "cpu" else args.provider
    print(f"# {device}, {args.provider}, {args.dtype}, {args.heads} x {args.head_size}, {args.threads} threads")
    print("| tokens | GatedRMSNorm us | separate nodes us | separate / GatedRMSNorm | max abs difference |")
    print("|---|---|---|---|---|")
    rows = []
    for n in args.tokens:
        width = args.heads * args.head_size
        feeds = {"x": rng.standard_normal((n, width)).astype(np_type),
                 "s": rng.standard_normal(args.head_size).astype(np_type),
                 "z": rng.standard_normal((n, width)).astype(np_type)}
        outputs = [s.run(None, feeds)[0].astype(np.float64) for s in ways.values()]  # also the warm-up
        times = {name: [] for name in ways}
        for _ in range(args.rounds):
            for name, s in ways.items():
                start = time.perf_counter()
                for _ in range(args.runs):
                    s.run(None, feeds)
                times[name].append((time.perf_counter() - start) / args.runs * 1e6)
        fused_us, separate_us = (statistics.median(times[name]) for name in ways)
        difference = float(np.abs(outputs[0] - outputs[1]).max())
        print(f"| {n} | {fused_us:.1f} | {separate_us:.1f} | {separate_us / fused_us:.2f} | {difference:.2e} |")
        rows.append({"tokens": n, "gated_rms_norm_us": fused_us, "separate_us": separate_us,
                     "max_abs_difference": difference})
    write_json(args.json, "bench_gated_norm", device, rows, provider=args.provider, dtype=args.dtype,
               heads=args.heads, head_size=args.head_size, threads=args.threads)


if __name__ == "__main__":
    main()
