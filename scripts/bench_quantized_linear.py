"""QuantizedLinear against ORT's own CUDA MatMulNBits on the same 4-bit initializers, inside ONNX Runtime sessions.

Per case, two models of ``--layers`` independent projections of one input (each its own weight, so the weights are
read from memory, not from L2): onnx_hybrid::QuantizedLinear nodes (our library) and com.microsoft::MatMulNBits
nodes (onnxruntime-gpu's kernel). Both run with ``enable_cuda_graph`` and IOBinding on CuPy buffers; a run's time
(the median of ``--runs``, each ending with a stream synchronisation) over the weight bytes is the read rate, next
to the device's copy rate measured in the same run. 9B geometry, fp16, block 32, symmetric; batch rows 1, 16, 32.
"""

from __future__ import annotations

import argparse
import datetime

import _checkout  # noqa: F401  (the test helpers beside the package are not installed)
import cupy
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from onnx_hybrid.exporter.quantize import QuantSpec, quantize
from onnx_hybrid.ops import contract, library
from onnx_hybrid_testing import single_op
from onnx_hybrid_testing.device_rates import copy_rate, device_name
from onnx_hybrid_testing.results import write_json

from bench_cuda_ep import median_run_time  # scripts/ is this process's first import path

# (name, output features, in_features, activation): a 9B layer's projections (swiglu: gate|up packed).
CASES = [("o_proj", 4096, 4096, "none"), ("qkv", 20480, 4096, "none"), ("gate_up", 12288, 4096, "swiglu"),
         ("down", 4096, 12288, "none")]


def model(kind: str, layers: int, n: int, k: int, activation: str, block: int, weights) -> bytes:
    """``layers`` products of input [rows, k]: ours (QuantizedLinear) or ORT's (MatMulNBits)."""
    rows_out = n * 2 if activation == "swiglu" else n
    nodes, inits, outputs = [], [], []
    for i, (codes, scales) in enumerate(weights):
        inits += [helper.make_tensor(f"w{i}", TensorProto.UINT8, codes.shape, codes.tobytes(), raw=True),
                  helper.make_tensor(f"s{i}", TensorProto.FLOAT16, scales.shape, scales.tobytes(), raw=True)]
        if kind == "ours":
            attrs = {"block_size": block, **({"activation": activation} if activation != "none" else {})}
            nodes.append(helper.make_node(contract.QUANTIZED_LINEAR.name, ["x", f"w{i}", f"s{i}"], [f"y{i}"],
                                          domain=contract.DOMAIN, **attrs))
        else:  # the product; the swiglu epilogue is not part of the comparison
            nodes.append(helper.make_node("MatMulNBits", ["x", f"w{i}", f"s{i}"], [f"y{i}"], domain=contract.MS_DOMAIN,
                                          K=k, N=rows_out, bits=4, block_size=block))
        outputs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT16, None))
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", TensorProto.FLOAT16, ["rows", k])],
                              outputs, inits)
    opsets = [helper.make_opsetid("", single_op.AI_ONNX_OPSET), helper.make_opsetid(contract.MS_DOMAIN, 1),
              helper.make_opsetid(contract.DOMAIN, contract.OPSET_VERSION)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=single_op.IR_VERSION).SerializeToString()


def time_model(data: bytes, ours: bool, x: cupy.ndarray, out_shapes: list, runs: int) -> float:
    so = ort.SessionOptions()
    if ours:
        library.register(so)
    session = ort.InferenceSession(data, so, providers=[("CUDAExecutionProvider", {"enable_cuda_graph": "1"})])
    io = session.io_binding()
    io.bind_input("x", "cuda", 0, np.float16, list(x.shape), x.data.ptr)
    outs = [cupy.empty(shape, dtype=np.float16) for shape in out_shapes]
    for i, o in enumerate(outs):
        io.bind_output(f"y{i}", "cuda", 0, np.float16, list(o.shape), o.data.ptr)
    return median_run_time(session, io, runs, warmup=3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=8, help="independent projections per model")
    ap.add_argument("--rows", default="1,16,32")
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--block", type=int, default=32)
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--json", help="also write the rows here (with date, commit, GPU, command)")
    args = ap.parse_args()
    rate = copy_rate()
    device = device_name()
    print(f"# {datetime.date.today()} {device}, copy rate "
          f"{rate / 1e12:.2f} TB/s (read + write); {args.layers} projections a model, median of {args.runs} runs")
    print(f"{'case':9s} {'rows':>4s} {'ours us':>9s} {'ORT us':>9s} {'ours TB/s':>9s} {'ORT TB/s':>9s} {'ORT/ours':>8s}")
    rng = np.random.default_rng(0)
    rows_out = []
    for name, n, k, activation in CASES:
        if args.cases and name not in args.cases.split(","):
            continue
        weight_rows = 2 * n if activation == "swiglu" else n
        weights = []
        for _ in range(args.layers):
            q = quantize(rng.standard_normal((weight_rows, k)).astype(np.float32) * 0.02, QuantSpec(4, args.block),
                         scale_dtype=np.float16)
            weights.append((q.codes, q.scales))
        nbytes = sum(c.nbytes + s.nbytes for c, s in weights)
        ours_model = model("ours", args.layers, n, k, activation, args.block, weights)
        ort_model = model("ort", args.layers, n, k, activation, args.block, weights)
        for rows in map(int, args.rows.split(",")):
            x = cupy.asarray(rng.standard_normal((rows, k)).astype(np.float16))
            ours = time_model(ours_model, True, x, [(rows, n)] * args.layers, args.runs)
            theirs = time_model(ort_model, False, x, [(rows, weight_rows)] * args.layers, args.runs)
            row = dict(case=name, rows=rows, ours_us=ours * 1e6, ort_us=theirs * 1e6, bytes=nbytes,
                       ours_tbps=nbytes / ours / 1e12, ort_tbps=nbytes / theirs / 1e12, copy_tbps=rate / 1e12)
            rows_out.append(row)
            print(f"{name:9s} {rows:4d} {row['ours_us']:9.1f} {row['ort_us']:9.1f} {row['ours_tbps']:9.2f} "
                  f"{row['ort_tbps']:9.2f} {theirs / ours:8.2f}", flush=True)
    if args.json:
        write_json(args.json, "bench_quantized_linear", device, rows_out)


if __name__ == "__main__":
    main()
