"""Our CUDA QuantizedLinear inside ONNX Runtime sessions on the CUDA EP (docs/op-contract.md#quantizedlinear): the
tensor-core kernel up to 64 rows and the dequantize + cuBLAS path beyond, each against the float64 reference and
ORT's own CUDA MatMulNBits on the same initializers; fp16 and bf16, block sizes, zero points, swiglu and
output_features; a row's bits the same alone and among up to 64 rows; a CUDA-graph replay with new inputs; and the
CPU kernel's rejections.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_hybrid.exporter.quantize import QuantSpec, quantize
from onnx_hybrid.ops import contract, reference
from onnx_hybrid_testing import single_op
from test_cuda_ep import SKIP

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

if SKIP is None:
    import ml_dtypes

    from test_cuda_ep import cuda_and_cpu_errors, cuda_session
    from test_cuda_linear import check_graph_replay

    DTYPES = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
else:
    DTYPES = {}

OP = contract.QUANTIZED_LINEAR.name
# fp32 sums against float64 relative to the largest |output|, then one rounding to T; cuBLAS (more than 64 rows) may
# run its fp32 on TF32 tensor cores (~1e-3).
TOLERANCE = {"float16": 2e-3, "bfloat16": 8e-3}
# (rows, in_features, weight rows, block size): the tensor-core kernel (tiles of 8 rows, in_features not a multiple
# of 128, 9 segments of 128 that four warps of a row tile would not share evenly), and cuBLAS over the dequantized
# weight (65+ rows, or a block of 16).
SHAPES = [(1, 4096, 130, 32), (3, 96, 1000, 64), (9, 2048, 257, 128), (64, 512, 64, 32), (1, 1152, 64, 32),
          (65, 256, 33, 32), (2, 48, 40, 16), (200, 1024, 100, 64)]


def quantized_feeds(rng, rows, in_features, weight_rows, dtype, block_size=32, asymmetric=False):
    w = (rng.standard_normal((weight_rows, in_features)) / np.sqrt(in_features)).astype(np.float32)
    q = quantize(w, QuantSpec(4, block_size, symmetric=not asymmetric), scale_dtype=DTYPES[dtype])
    feeds = {"input": rng.standard_normal((rows, in_features)).astype(DTYPES[dtype]), "weight": q.codes,
             "scales": q.scales}
    if asymmetric:
        feeds["zero_points"] = q.zero_points
    return feeds


def relative_error(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1.0))


def run(feeds, attributes=None):
    model = single_op.single_op_model(OP, feeds, attributes)
    return single_op.run_session(cuda_session(model), feeds)


def run_matmul_nbits(feeds, block_size):
    x = feeds["input"]
    names = [n for n in ("input", "weight", "scales", "zero_points") if feeds.get(n) is not None]
    types = {np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(ml_dtypes.bfloat16): TensorProto.BFLOAT16,
             np.dtype(np.uint8): TensorProto.UINT8}
    node = helper.make_node("MatMulNBits", names, ["output"], domain=contract.MS_DOMAIN, K=x.shape[1],
                            N=feeds["weight"].shape[0], bits=4, block_size=block_size)
    graph = helper.make_graph([node], "matmul_nbits",
                              [helper.make_tensor_value_info(n, types[feeds[n].dtype], list(feeds[n].shape))
                               for n in names], [helper.make_tensor_value_info("output", types[x.dtype], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", single_op.AI_ONNX_OPSET),
                                                    helper.make_opsetid(contract.MS_DOMAIN, 1)],
                              ir_version=single_op.IR_VERSION)
    return single_op.run_session(cuda_session(model, with_library=False), {n: feeds[n] for n in names})["output"]


@pytest.mark.parametrize("rows, in_features, weight_rows, block_size", SHAPES)
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("asymmetric", [False, True])
def test_against_reference_and_ort_matmul_nbits(rows, in_features, weight_rows, block_size, dtype, asymmetric):
    feeds = quantized_feeds(np.random.default_rng(rows + in_features), rows, in_features, weight_rows, dtype,
                            block_size, asymmetric)
    got = run(feeds, {"block_size": block_size})["output"]
    want = reference.quantized_linear(feeds, block_size=block_size)
    assert got.shape == (rows, weight_rows) and relative_error(got, want) <= TOLERANCE[dtype]
    if dtype == "float16":  # ORT's CUDA MatMulNBits: fp16
        assert relative_error(got, run_matmul_nbits(feeds, block_size).astype(np.float64)) <= 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("attributes", [{}, {"activation": "swiglu"}, {"output_features": [3, 61, 200, 6]}])
@pytest.mark.parametrize("asymmetric", [False, True])  # the kernel without selects (no zero points), and the general
# k split 4 ways into 2 segments of 128 each, 8 ways into 4, and 4 ways unevenly (1152: 9 segments, 3 + 2 + 2 + 2)
@pytest.mark.parametrize("in_features, weight_rows", [(1024, 270), (4096, 40), (1152, 70)])
def test_a_row_has_the_same_bits_alone_and_among_64(dtype, attributes, asymmetric, in_features, weight_rows):
    """What makes a verify step's rows the decode steps they stand for: the kernels' per-row sums do not depend on
    the rows beside them (one row goes to qlinear_row_*, more to row tiles of 1, 2, 4 and 8 x 8 rows)."""
    if "output_features" in attributes and weight_rows != 270:
        attributes = {"output_features": [3, weight_rows - 13, 4, 6]}
    feeds = quantized_feeds(np.random.default_rng(7), 64, in_features, weight_rows, dtype, asymmetric=asymmetric)
    together = run(feeds, attributes)
    for rows in (1, 5, 9, 17, 33):
        part = run({**feeds, "input": feeds["input"][:rows]}, attributes)
        for name in together:
            np.testing.assert_array_equal(part[name].view(np.uint8), together[name][:rows].view(np.uint8))
    want = reference.quantized_linear(feeds, **attributes)
    for got, expected in zip(together.values(), want if isinstance(want, tuple) else (want,)):
        assert relative_error(got, expected) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_lanes_past_in_features_read_nothing_of_the_next_row(dtype):
    """in_features 96: a lane's share of the 128-element segment lies past each row, on the next row's first values;
    it must count as zeros even where those are infinite (0 * inf is NaN)."""
    feeds = quantized_feeds(np.random.default_rng(3), 9, 96, 64, dtype, asymmetric=True)
    feeds["input"][4, :32] = np.inf
    got, want = run(feeds)["output"], reference.quantized_linear(feeds)
    rows = [r for r in range(9) if r != 4]
    assert np.isfinite(got[rows].astype(np.float64)).all()
    assert relative_error(got[rows], want[rows]) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("rows", [1, 9, 64])
def test_the_aligned_kernel_equals_the_general_one(dtype, rows):
    """Symmetric weights take the kernel without per-piece selects; the same weights with explicit zero points of 8
    take the general one: the products are the same numbers, so the bits must be too."""
    feeds = quantized_feeds(np.random.default_rng(rows), rows, 2048, 300, dtype)
    explicit = {**feeds, "zero_points": np.full((300, 32), 0x88, np.uint8)}  # 64 blocks, two a byte
    for attributes in ({}, {"activation": "swiglu"}):
        aligned, general = run(feeds, attributes), run(explicit, attributes)
        for name in aligned:
            np.testing.assert_array_equal(aligned[name].view(np.uint8), general[name].view(np.uint8))


@pytest.mark.parametrize("rows", [1, 16, 100])  # the tensor-core kernel, and dequantize + cuBLAS, in the graph
@pytest.mark.parametrize("activation", ["none", "swiglu"])
def test_cuda_graph_replays_a_step_with_new_inputs(rows, activation):
    rng = np.random.default_rng(rows)
    check_graph_replay(OP, lambda: quantized_feeds(rng, rows, 1024, 384, "float16"),
                       384 if activation == "none" else 192, {"activation": activation},
                       lambda feeds: reference.quantized_linear(feeds, activation), TOLERANCE["float16"])


def test_in_features_the_cuda_kernels_cannot_take_is_refused_with_the_reason():
    """in_features 44 (blocks of 16): not the tensor-core kernel's, nor a multiple of 8 for the dequantized weight's
    rows; the CPU kernel takes it, the CUDA one says why not."""
    feeds = quantized_feeds(np.random.default_rng(5), 2, 44, 8, "float16", block_size=16)
    assert reference.quantized_linear(feeds, block_size=16).shape == (2, 8)
    with pytest.raises(Exception, match="need in_features a multiple of 8 .*; got 44"):
        run(feeds, {"block_size": 16})


def test_errors_match_the_cpu_kernel():
    feeds = {"input": np.zeros((2, 40), np.float16), "weight": np.zeros((4, 2, 16), np.uint8),
             "scales": np.zeros((4, 1), np.float16)}
    on_cuda, on_cpu = cuda_and_cpu_errors(single_op.single_op_model(OP, feeds, validate=False), feeds)
    assert on_cuda == on_cpu == "scales must have shape [4, 2] (weight rows, blocks); got [4, 1]"
