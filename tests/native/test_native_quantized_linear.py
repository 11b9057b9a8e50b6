"""Our CPU QuantizedLinear (4-bit block-quantized weights in MatMulNBits' layout) against the float64 reference and
ORT's own com.microsoft::MatMulNBits on the same initializers (docs/op-contract.md#quantizedlinear): odd shapes,
block sizes, symmetric and asymmetric weights, the three element types, swiglu and output_features, a row's result
independent of the rows beside it, and clean rejections; at accuracy level 4 the int8 products the same way, and
the same bits from every instruction-set variant. The CUDA kernels: tests/cuda/test_cuda_quantized_linear.py.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnx_hybrid.exporter.quantize import QuantSpec, quantize
from onnx_hybrid.ops import contract, reference
from onnx_hybrid_testing import single_op
from onnx_hybrid_testing.single_op import (AI_ONNX_OPSET, IR_VERSION, MS_DOMAIN, make_session, run_session, run_single_op,
                                           single_op_model)

OP = contract.QUANTIZED_LINEAR.name
DTYPES = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# As Linear's: fp32 sums against float64 relative to the largest |output|, then one rounding to T.
TOLERANCE = {"float": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def quantized_feeds(rng, rows, in_features, weight_rows, dtype, block_size=32, asymmetric=False):
    """Random input and a random weight quantized by the exporter's quantizer, scales in the activation type."""
    t = DTYPES[dtype]
    w = rng.standard_normal((weight_rows, in_features)).astype(np.float32)
    q = quantize(w, QuantSpec(4, block_size, symmetric=not asymmetric), scale_dtype=t)
    feeds = {"input": rng.standard_normal((rows, in_features)).astype(t), "weight": q.codes, "scales": q.scales}
    if asymmetric:
        feeds["zero_points"] = q.zero_points
    return feeds


def relative_error(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1.0)) if want.size else 0.0


def matmul_nbits(feeds, block_size):
    """ORT's own MatMulNBits (CPU, accuracy_level 0: float arithmetic) on the same initializers."""
    x = feeds["input"]
    names = [name for name in ("input", "weight", "scales", "zero_points") if feeds.get(name) is not None]
    types = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float16): TensorProto.FLOAT16,
             np.dtype(np.uint8): TensorProto.UINT8}
    node = helper.make_node("MatMulNBits", names, ["output"], domain=MS_DOMAIN, K=x.shape[1],
                            N=feeds["weight"].shape[0], bits=4, block_size=block_size)
    graph = helper.make_graph([node], "matmul_nbits",
                              [helper.make_tensor_value_info(n, types[feeds[n].dtype], list(feeds[n].shape))
                               for n in names],
                              [helper.make_tensor_value_info("output", types[x.dtype], None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", AI_ONNX_OPSET),
                                                    helper.make_opsetid(MS_DOMAIN, 1)], ir_version=IR_VERSION)
    return run_session(make_session(model, with_library=False), {n: feeds[n] for n in names})["output"]


@pytest.mark.parametrize("rows, in_features, weight_rows, block_size", [
    (1, 64, 3, 32), (2, 37, 130, 16), (5, 100, 257, 64), (33, 256, 65, 128), (0, 32, 4, 32), (7, 1, 1, 16)])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("asymmetric", [False, True])
def test_against_reference_and_matmul_nbits(rows, in_features, weight_rows, block_size, dtype, asymmetric):
    feeds = quantized_feeds(np.random.default_rng(rows * 1000 + in_features), rows, in_features, weight_rows, dtype,
                            block_size, asymmetric)
    got = run_single_op(OP, feeds, {"block_size": block_size})["output"]
    want = reference.quantized_linear(feeds, block_size=block_size)
    assert got.shape == (rows, weight_rows) and got.dtype == DTYPES[dtype]
    assert relative_error(got, want) <= TOLERANCE[dtype]
    if dtype != "bfloat16" and rows > 0:  # ORT's CPU MatMulNBits takes float and float16
        assert relative_error(got, matmul_nbits(feeds, block_size).astype(np.float64)) <= 2 * TOLERANCE[dtype]


def test_the_reference_dequantizes_as_the_quantizer_meant():
    """The reference's unpacking against the quantizer's own float64 inverse, rounded once to fp32."""
    from onnx_hybrid.exporter.quantize import dequantize

    rng = np.random.default_rng(3)
    w = rng.standard_normal((9, 100)).astype(np.float32)
    for symmetric in (True, False):
        spec = QuantSpec(4, 32, symmetric=symmetric)
        q = quantize(w, spec)
        ours = reference.quantized_linear_weight(q.codes, q.scales, q.zero_points, 100, np.float32)
        np.testing.assert_array_equal(ours, dequantize(q, spec, 100).astype(np.float32))


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 12), in_features=st.integers(1, 300), weight_rows=st.integers(1, 200),
       block_size=st.sampled_from([16, 32, 64, 128]), dtype=st.sampled_from(list(DTYPES)),
       asymmetric=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_random_shapes(rows, in_features, weight_rows, block_size, dtype, asymmetric, seed):
    feeds = quantized_feeds(np.random.default_rng(seed), rows, in_features, weight_rows, dtype, block_size, asymmetric)
    got = run_single_op(OP, feeds, {"block_size": block_size})["output"]
    assert relative_error(got, reference.quantized_linear(feeds, block_size=block_size)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("attributes", [{}, {"activation": "swiglu"}])
def test_a_row_alone_equals_the_row_among_others(dtype, attributes):
    feeds = quantized_feeds(np.random.default_rng(9), 12, 200, 140, dtype)
    together = run_single_op(OP, feeds, attributes)["output"]
    for i in range(12):
        alone = run_single_op(OP, {**feeds, "input": feeds["input"][i:i + 1]}, attributes)["output"]
        np.testing.assert_array_equal(alone.view(np.uint8), together[i:i + 1].view(np.uint8))


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_swiglu_and_output_features(dtype):
    """swiglu over packed gate|up rows and output_features' column ranges, against float64 and, bit for bit, the
    one-output product's columns."""
    feeds = quantized_feeds(np.random.default_rng(4), 5, 96, 2 * 70, dtype, 32, asymmetric=True)
    got = run_single_op(OP, feeds, {"activation": "swiglu"})["output"]
    assert got.shape == (5, 70)
    assert relative_error(got, reference.quantized_linear(feeds, "swiglu")) <= TOLERANCE[dtype]
    parts = (3, 61, 70, 6)
    split = run_single_op(OP, feeds, {"output_features": list(parts)})
    whole = run_single_op(OP, feeds)["output"]
    assert list(split) == contract.linear_output_names(parts)
    start = 0
    for name, size in zip(split, parts):
        np.testing.assert_array_equal(split[name].view(np.uint8), whole[:, start:start + size].view(np.uint8))
        start += size


def _shaped(input_shape, weight_shape, scales_shape, zero_points_shape=None):
    feeds = {"input": np.zeros(input_shape, np.float32), "weight": np.zeros(weight_shape, np.uint8),
             "scales": np.zeros(scales_shape, np.float32)}
    if zero_points_shape is not None:
        feeds["zero_points"] = np.zeros(zero_points_shape, np.uint8)
    return feeds


@pytest.mark.parametrize("feeds, message", [
    (_shaped((2, 40), (4, 2, 16), (4, 1)), "QuantizedLinear: scales must have shape [4, 2] (weight rows, blocks); "
                                           "got [4, 1]"),
    (_shaped((2, 40), (4, 1, 16), (4, 1)), "QuantizedLinear: weight must have shape [weight rows, 2, 16] for "
                                           "in_features 40 and block_size 32; got [4, 1, 16]"),
    (_shaped((2, 40), (4, 2, 16), (4, 2), (4, 2)), "QuantizedLinear: zero_points must have shape [4, 1] (weight "
                                                   "rows, ceil(blocks / 2)); got [4, 2]"),
    (_shaped((2, 3, 40), (4, 2, 16), (4, 2)), "QuantizedLinear: input must be rank 2 [rows, in_features] and weight "
                                              "rank 3 [weight rows, blocks, block_size / 2]; got input shape "
                                              "[2, 3, 40], weight shape [4, 2, 16]"),
])
def test_rejections_name_the_tensor(feeds, message):
    session = make_session(single_op_model(OP, feeds))
    with pytest.raises(Exception) as raised:
        run_session(session, feeds)
    assert message in str(raised.value)


@pytest.mark.parametrize("attributes, message", [
    ({"block_size": 48}, "QuantizedLinear: block_size must be a power of two of at least 16; got 48"),
    ({"bits": 8}, "QuantizedLinear: bits must be 4; got 8"),
    ({"accuracy_level": 5}, "QuantizedLinear: accuracy_level must be 0 to 4; got 5"),
])
def test_attribute_rejections(attributes, message):
    feeds = _shaped((2, 48), (4, 1, 24), (4, 1))
    model = single_op_model(OP, feeds, attributes, validate=False)  # the kernel's own check
    with pytest.raises(Exception, match=re.escape(message)):
        make_session(model)


# --------------------------------------------------------------------------------------------------
# Accuracy level 4: int8 input rows (docs/op-contract.md#quantizedlinear)
# --------------------------------------------------------------------------------------------------

INT8 = {"accuracy_level": contract.QUANTIZED_LINEAR_INT8_LEVEL}


def run_constant_weight(feeds, attributes):
    """The op with its weight, scales and zero points as initializers; returns the output."""
    model = single_op_model(OP, feeds, attributes, initializers=("weight", "scales", "zero_points"))
    return run_session(make_session(model), {"input": feeds["input"]})["output"]


@pytest.mark.parametrize("rows, in_features, weight_rows, block_size", [
    (1, 64, 3, 32), (2, 37, 130, 32), (5, 100, 257, 64), (33, 256, 65, 128), (0, 32, 4, 32), (7, 1, 1, 32),
    (130, 1024, 70, 32)])
@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("asymmetric", [False, True])
def test_int8_rows_against_reference(rows, in_features, weight_rows, block_size, dtype, asymmetric):
    """Against the float64 reference of the int8 products, with the weight packed per call and, bit for bit, packed
    once as initializers; and within the input rounding of the exact (level 0) product."""
    feeds = quantized_feeds(np.random.default_rng(rows * 7 + in_features), rows, in_features, weight_rows, dtype,
                            block_size, asymmetric)
    attributes = {"block_size": block_size, **INT8}
    got = run_single_op(OP, feeds, attributes)["output"]
    assert got.shape == (rows, weight_rows) and got.dtype == DTYPES[dtype]
    assert relative_error(got, reference.quantized_linear(feeds, block_size=block_size, **INT8)) <= TOLERANCE[dtype]
    np.testing.assert_array_equal(run_constant_weight(feeds, attributes).view(np.uint8), got.view(np.uint8))
    # int8 rows: each element within half a step of 1/127 of its chunk's largest magnitude
    assert relative_error(got, reference.quantized_linear(feeds, block_size=block_size)) <= 0.02


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 9), in_features=st.integers(1, 300), weight_rows=st.integers(1, 90),
       block_size=st.sampled_from([32, 64, 128]), dtype=st.sampled_from(list(DTYPES)),
       activation=st.sampled_from(["none", "swiglu"]), asymmetric=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_int8_random_shapes(rows, in_features, weight_rows, block_size, dtype, activation, asymmetric, seed):
    weight_rows += weight_rows % 2 if activation == "swiglu" else 0
    feeds = quantized_feeds(np.random.default_rng(seed), rows, in_features, weight_rows, dtype, block_size, asymmetric)
    attributes = {"block_size": block_size, "activation": activation, **INT8}
    got = run_constant_weight(feeds, attributes)
    want = reference.quantized_linear(feeds, activation, block_size=block_size, **INT8)
    assert relative_error(got, want) <= TOLERANCE[dtype]


def test_int8_rows_quantize_as_the_contract_says():
    """The reference's int8 rows against float64: each code within half a step of x / scale, the largest magnitude
    of a chunk at +-127, zero padding past in_features, tiny chunks as zeros, non-finite chunks with a NaN scale."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 70)).astype(np.float32) * np.float32(3)
    x[1, 32:64] = 1e-35
    x[2, 5] = np.inf
    codes, scales = reference.int8_rows(x, 96)
    assert codes.shape == (4, 96) and scales.shape == (4, 3) and not codes[:, 70:].any()
    assert np.abs(codes).max() == 127 and np.isnan(scales[2, 0]) and not codes[2, :32].any()
    assert scales[1, 1] == 0 and not codes[1, 32:64].any()
    finite = np.isfinite(scales) & (scales > 0)
    step = np.repeat(np.where(finite, scales, 0).astype(np.float64), 32, axis=1)[:, :70]
    error = np.abs(codes[:, :70] * step - np.where(np.repeat(finite, 32, axis=1)[:, :70], x, 0))
    assert (error <= step * (0.5 + 1e-6)).all()


def test_int8_rows_of_a_row_alone_and_non_finite_inputs():
    """A row's bits whatever the rows beside it (a row with an infinity among them: its outputs NaN, the others'
    unchanged); a row of tiny values gives zeros."""
    feeds = quantized_feeds(np.random.default_rng(11), 13, 200, 2 * 45, "float", 64)
    feeds["input"][3, 17] = np.inf
    feeds["input"][5] = 1e-35
    for attributes in ({**INT8, "block_size": 64}, {**INT8, "block_size": 64, "activation": "swiglu"}):
        together = run_constant_weight(feeds, attributes)
        assert np.isnan(together[3]).all() and not together[5].any()
        assert np.isfinite(np.delete(together, 3, axis=0)).all()
        for i in range(13):
            alone = run_constant_weight({**feeds, "input": feeds["input"][i:i + 1]}, attributes)
            np.testing.assert_array_equal(alone.view(np.uint8), together[i:i + 1].view(np.uint8))


def test_int8_rows_against_matmul_nbits_level_4():
    """ORT's MatMulNBits at accuracy_level 4 also rounds the input to int8 per block of 32: the two agree to that
    rounding (not bit for bit: the peer's scale and rounding rules are its own)."""
    feeds = quantized_feeds(np.random.default_rng(8), 17, 512, 96, "float", 32)
    got = run_single_op(OP, feeds, INT8)["output"]
    model = single_op.matmul_nbits_model(feeds["weight"], feeds["scales"], 512, bits=4, block_size=32,
                                         accuracy_level=4)
    peer = run_session(make_session(model, with_library=False), {"A": feeds["input"]})["Y"]
    assert relative_error(got, peer.astype(np.float64)) <= 0.01


def test_level_4_with_blocks_of_16_is_the_exact_product():
    feeds = quantized_feeds(np.random.default_rng(2), 6, 80, 20, "float", 16)
    exact = run_single_op(OP, feeds, {"block_size": 16})["output"]
    np.testing.assert_array_equal(run_single_op(OP, feeds, {"block_size": 16, **INT8})["output"], exact)


ISA_FLAGS = {"avx512": {"avx512f", "avx512dq"}, "avx2": {"avx2", "fma"}, "generic": set()}


@pytest.mark.parametrize("isa", list(ISA_FLAGS))
def test_int8_products_are_the_same_on_every_isa(isa, tmp_path):
    """The int8 products (integer sums, then the same fp32 steps) give the same bits with the AVX-512 (without
    VNNI), AVX2 and portable kernels (forced through ONNX_HYBRID_CPU_ISA in a child) as with this process's, which
    is the VNNI one on CPUs with AVX-512 VNNI."""
    import os
    import subprocess
    import sys

    from file_modules import ROOT
    from onnx_hybrid.ops import library
    from onnx_hybrid_testing.host import cpu_flags

    if not ISA_FLAGS[isa] <= cpu_flags():
        pytest.skip(f"this CPU lacks {' + '.join(sorted(ISA_FLAGS[isa] - cpu_flags()))}, so the {isa} variant cannot "
                    "run here")
    shapes = [(9, 200, 140, 32, True), (130, 1024, 300, 64, False), (3, 33, 17, 32, False), (1, 4096, 64, 128, True)]
    code = (
        "import sys, numpy as np\n"
        "sys.path[:0] = ['tests', 'tests/native']\n"
        "from onnx_hybrid.ops import library\n"
        "from test_native_quantized_linear import INT8, OP, quantized_feeds\n"
        "from onnx_hybrid_testing.single_op import run_single_op\n"
        f"assert library.cpu_isa() == {isa!r}, library.cpu_isa()\n"
        "outs = []\n"
        f"for rows, k, n, block, asym in {shapes!r}:\n"
        "    feeds = quantized_feeds(np.random.default_rng(rows), rows, k, n, 'float', block, asym)\n"
        "    outs.append(run_single_op(OP, feeds, {'block_size': block, **INT8})['output'])\n"
        f"np.savez({str(tmp_path / 'out.npz')!r}, *outs)\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, env={**os.environ, "ONNX_HYBRID_CPU_ISA": isa}, cwd=ROOT)
    theirs = np.load(tmp_path / "out.npz")
    for i, (rows, k, n, block, asym) in enumerate(shapes):
        feeds = quantized_feeds(np.random.default_rng(rows), rows, k, n, "float", block, asym)
        ours = run_single_op(OP, feeds, {"block_size": block, **INT8})["output"]
        np.testing.assert_array_equal(theirs[f"arr_{i}"].view(np.uint32), ours.view(np.uint32),
                                      err_msg=f"{isa} against {library.cpu_isa()}, case {i}")
