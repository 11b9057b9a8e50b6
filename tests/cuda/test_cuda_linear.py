"""Our CUDA Linear inside ONNX Runtime sessions on the CUDA EP (docs/op-contract.md#linear): LinearRows for one-row
calls, cuBLAS (ORT's handle) for more rows and wherever LinearRows does not apply (fp32, in_features not a multiple
of 8), each against the float64 reference and ORT's own CUDA Gemm(transB=1) on the same inputs; a CUDA-graph replay
with new inputs (LinearRows and cuBLAS inside the captured graph); the swiglu activation and outputs split by
output_features the same ways; and the CPU kernel's rejections.
"""

import numpy as np
import pytest
from onnx import TensorProto, helper

from onnx_hybrid.ops import contract, reference
from onnx_hybrid_testing import single_op
from test_cuda_ep import SKIP

pytestmark = pytest.mark.skipif(SKIP is not None, reason=SKIP or "")

if SKIP is None:
    import cupy
    import ml_dtypes

    from test_cuda_ep import bind_inputs, cuda_and_cpu_errors, cuda_session, to_device

    DTYPES = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
    ONNX_TYPES = {"float": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
else:
    DTYPES = {}

OP = contract.LINEAR.name
# fp32 accumulation against float64, relative to the largest |output|, then one rounding to T (half an ulp:
# fp16 2^-11, bf16 2^-8); cuBLAS's fp32 may run on TF32 tensor cores, whose 10-bit operands leave ~1e-3.
TOLERANCE = {"float": 2e-3, "float16": 1e-3, "bfloat16": 8e-3}
# (rows, in_features, out_features): LinearRows at one row with K % 8 == 0, one to eight warps per feature (few
# features with a long K get more); cuBLAS from two rows on and at K % 8 != 0.
SHAPES = [(1, 64, 3), (1, 1032, 4099), (1, 4096, 130), (1, 12288, 64), (1, 4104, 20000), (1, 100, 77),
          (2, 136, 257), (5, 520, 33), (9, 256, 129), (17, 96, 1000)]


def random_feeds(rng, rows, in_features, out_features, dtype):
    return {"input": rng.standard_normal((rows, in_features)).astype(DTYPES[dtype]),
            "weight": (rng.standard_normal((out_features, in_features)) / np.sqrt(in_features)).astype(DTYPES[dtype])}


def relative_error(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1.0))


def run_linear(feeds, attributes=None):
    model = single_op.single_op_model(OP, feeds, attributes)
    return single_op.run_session(cuda_session(model), feeds)["output"]


def run_gemm(feeds, dtype):
    t = ONNX_TYPES[dtype]
    graph = helper.make_graph([helper.make_node("Gemm", ["input", "weight"], ["output"], transB=1)], "gemm",
                              [helper.make_tensor_value_info(n, t, list(feeds[n].shape)) for n in ("input", "weight")],
                              [helper.make_tensor_value_info("output", t, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", single_op.AI_ONNX_OPSET)],
                              ir_version=single_op.IR_VERSION)
    return single_op.run_session(cuda_session(model, with_library=False), feeds)["output"]


@pytest.mark.parametrize("rows, in_features, out_features", SHAPES)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float"])
def test_against_reference_and_ort_gemm(rows, in_features, out_features, dtype):
    feeds = random_feeds(np.random.default_rng(rows + in_features), rows, in_features, out_features, dtype)
    got = run_linear(feeds)
    want = reference.linear(feeds)
    assert got.shape == (rows, out_features) and got.dtype == DTYPES[dtype]
    assert relative_error(got, want) <= TOLERANCE[dtype], relative_error(got, want)
    assert relative_error(got, run_gemm(feeds, dtype).astype(np.float64)) <= 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("rows, in_features, features", [(1, 64, 3), (1, 4096, 6144), (1, 1032, 4099), (1, 100, 77),
                                                        (4, 520, 33), (16, 1024, 700)])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float"])
def test_swiglu_against_reference_and_separate_products(rows, in_features, features, dtype):
    """activation swiglu (LinearRows' swiglu kernel at one row, cuBLAS into fp32 scratch then linear_swiglu_*
    otherwise) against float64, and against the plain op's products with SiLU and the product taken after them."""
    feeds = random_feeds(np.random.default_rng(rows * 3 + features), rows, in_features, 2 * features, dtype)
    got = run_linear(feeds, {"activation": "swiglu"})
    want = reference.linear(feeds, "swiglu")
    assert got.shape == (rows, features) and got.dtype == DTYPES[dtype]
    assert relative_error(got, want) <= TOLERANCE[dtype], relative_error(got, want)
    gate, up = np.split(run_linear(feeds).astype(np.float64), 2, axis=1)
    assert relative_error(got, gate / (1 + np.exp(-gate)) * up) <= 2 * TOLERANCE[dtype]


@pytest.mark.parametrize("rows, in_features, parts", [(1, 4096, (8192, 2048, 2048)), (1, 1032, (3, 4099, 64, 1)),
                                                     (1, 100, (40, 37)), (5, 520, (33, 7)), (16, 1024, (700, 64, 2))])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float"])
def test_output_features_against_reference_and_the_whole_product(rows, in_features, parts, dtype):
    """output_features: LinearRows writes each feature to its part's output (bit for bit the one-output call's
    columns), cuBLAS runs one product per part; both against float64."""
    feeds = random_feeds(np.random.default_rng(rows + len(parts)), rows, in_features, sum(parts), dtype)
    model = single_op.single_op_model(OP, feeds, {"output_features": list(parts)})
    got = single_op.run_session(cuda_session(model), feeds)
    whole = run_linear(feeds)
    start = 0
    for name, size, want in zip(got, parts, reference.linear(feeds, output_features=parts)):
        assert got[name].shape == (rows, size)
        assert relative_error(got[name], want) <= TOLERANCE[dtype], (name, relative_error(got[name], want))
        if rows == 1 and dtype != "float" and in_features % 8 == 0:  # LinearRows either way
            np.testing.assert_array_equal(got[name].view(np.uint8), whole[:, start:start + size].view(np.uint8))
        start += size


def check_graph_replay(op: str, make_feeds, width: int, attributes: dict, want, tolerance: float) -> None:
    """A session of one ``op`` node with CUDA graphs, replayed four times with new inputs written into its bound
    buffers: each step's output against ``want(feeds)``. ``make_feeds()`` gives a step's fp16 inputs."""
    feeds = make_feeds()
    rows = feeds["input"].shape[0]
    session = cuda_session(single_op.single_op_model(op, feeds, attributes), graph=True)
    io = session.io_binding()
    arrays = bind_inputs(io, feeds)
    out = cupy.empty((rows, width), dtype=np.float16)
    io.bind_output("output", "cuda", 0, np.float16, [rows, width], out.data.ptr)
    for step in range(4):
        step_feeds = feeds if step == 0 else make_feeds()
        for name, array in arrays.items():
            array[...] = to_device(step_feeds[name])
        cupy.cuda.runtime.deviceSynchronize()
        session.run_with_iobinding(io)
        assert relative_error(cupy.asnumpy(out), want(step_feeds)) <= tolerance, step


@pytest.mark.parametrize("rows", [1, 4, 16])  # LinearRows, and cuBLAS inside the captured graph
@pytest.mark.parametrize("activation", ["none", "swiglu"])
def test_cuda_graph_replays_a_step_with_new_inputs(rows, activation):
    rng = np.random.default_rng(rows)
    check_graph_replay(OP, lambda: random_feeds(rng, rows, 1024, 384, "float16"), 384 if activation == "none" else 192,
                       {"activation": activation}, lambda feeds: reference.linear(feeds, activation),
                       TOLERANCE["float16"])


def test_errors_match_the_cpu_kernel():
    feeds = {"input": np.zeros((2, 8), np.float16), "weight": np.zeros((4, 16), np.float16)}
    on_cuda, on_cpu = cuda_and_cpu_errors(single_op.single_op_model(OP, feeds, validate=False), feeds)
    assert on_cuda == on_cpu == "weight in_features must equal input's: expected 8, got 16"
    feeds = {"input": np.zeros((1, 8), np.float16), "weight": np.zeros((5, 8), np.float16)}
    model = single_op.single_op_model(OP, feeds, {"activation": "swiglu"})
    with pytest.raises(Exception, match="activation swiglu needs an even number of weight rows"):
        single_op.run_session(cuda_session(model), feeds)
