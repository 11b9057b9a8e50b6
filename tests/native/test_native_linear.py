"""Our CPU Linear (onnx_hybrid domain) against the float64 reference and ORT's own Gemm(transB=1) on the same inputs
(docs/op-contract.md#linear): odd shapes, the three element types, a row's result independent of the rows beside
it and of the thread count, the swiglu activation against float64 and the separate nodes it replaces, and clean
rejections of mismatched shapes and attributes. The CUDA kernel: tests/cuda/test_cuda_linear.py.
"""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from onnx_hybrid.ops import contract, reference
from onnx_hybrid_testing.single_op import (AI_ONNX_OPSET, IR_VERSION, make_session, run_session, run_single_op,
                                           single_op_model)

OP = contract.LINEAR.name
DTYPES = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}
# fp32 dot products against float64, relative to the largest |output| (1e-5, the project rule), then one rounding
# to T: half an ulp (fp16 2^-11, bf16 2^-8) of that magnitude.
TOLERANCE = {"float": 1e-5, "float16": 1e-3, "bfloat16": 8e-3}


def random_feeds(rng, rows, in_features, out_features, dtype):
    return {"input": rng.standard_normal((rows, in_features)).astype(DTYPES[dtype]),
            "weight": rng.standard_normal((out_features, in_features)).astype(DTYPES[dtype])}


def relative_error(got, want):
    return float(np.abs(got.astype(np.float64) - want).max() / max(np.abs(want).max(), 1.0)) if want.size else 0.0


def gemm(feeds):
    """ORT's own Gemm(transB=1) on the same inputs: the node Linear stands for in our exports."""
    t = {np.dtype(v): k for k, v in {TensorProto.FLOAT: np.float32, TensorProto.FLOAT16: np.float16,
                                     TensorProto.BFLOAT16: ml_dtypes.bfloat16}.items()}[feeds["input"].dtype]
    x, w = feeds["input"], feeds["weight"]
    graph = helper.make_graph([helper.make_node("Gemm", ["input", "weight"], ["output"], transB=1)], "gemm",
                              [helper.make_tensor_value_info("input", t, list(x.shape)),
                               helper.make_tensor_value_info("weight", t, list(w.shape))],
                              [helper.make_tensor_value_info("output", t, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", AI_ONNX_OPSET)], ir_version=IR_VERSION)
    return run_session(make_session(model, with_library=False), feeds)["output"]


@pytest.mark.parametrize("rows, in_features, out_features", [
    (1, 64, 3), (2, 37, 130), (5, 100, 257), (33, 136, 65), (0, 8, 4), (7, 1, 1)])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_against_reference_and_gemm(rows, in_features, out_features, dtype):
    feeds = random_feeds(np.random.default_rng(rows * 1000 + in_features), rows, in_features, out_features, dtype)
    got = run_single_op(OP, feeds)["output"]
    want = reference.linear(feeds)
    assert got.shape == (rows, out_features) and got.dtype == DTYPES[dtype]
    assert relative_error(got, want) <= TOLERANCE[dtype]
    if dtype != "bfloat16":  # ORT's CPU Gemm has no bfloat16 kernel
        assert relative_error(got, gemm(feeds).astype(np.float64)) <= 2 * TOLERANCE[dtype]


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 12), in_features=st.integers(1, 300), out_features=st.integers(1, 200),
       dtype=st.sampled_from(list(DTYPES)), seed=st.integers(0, 2**32 - 1))
def test_random_shapes(rows, in_features, out_features, dtype, seed):
    feeds = random_feeds(np.random.default_rng(seed), rows, in_features, out_features, dtype)
    assert relative_error(run_single_op(OP, feeds)["output"], reference.linear(feeds)) <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_row_alone_equals_the_row_among_others(dtype):
    """A decode step (one row) and a verify or prompt step (several) give a row the same bits."""
    feeds = random_feeds(np.random.default_rng(9), 12, 200, 70, dtype)
    together = run_single_op(OP, feeds)["output"]
    for i in range(12):
        alone = run_single_op(OP, {"input": feeds["input"][i:i + 1], "weight": feeds["weight"]})["output"]
        np.testing.assert_array_equal(alone.view(np.uint8), together[i:i + 1].view(np.uint8))
    one = run_single_op(OP, feeds, intra_op_threads=1)["output"]
    np.testing.assert_array_equal(one.view(np.uint8), together.view(np.uint8))


@pytest.mark.parametrize("rows, in_features, features", [(1, 64, 3), (3, 37, 130), (9, 136, 65), (0, 8, 4), (2, 1, 1)])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_swiglu_against_reference_and_separate_nodes(rows, in_features, features, dtype):
    """activation swiglu: SiLU(gate) * up of the packed [gate; up] rows, against float64 and against the nodes it
    replaces (a plain Linear's products, then SiLU and the product in float64)."""
    feeds = random_feeds(np.random.default_rng(rows * 7 + features), rows, in_features, 2 * features, dtype)
    got = run_single_op(OP, feeds, {"activation": "swiglu"})["output"]
    want = reference.linear(feeds, "swiglu")
    assert got.shape == (rows, features) and got.dtype == DTYPES[dtype]
    assert relative_error(got, want) <= TOLERANCE[dtype]
    gate, up = np.split(run_single_op(OP, feeds)["output"].astype(np.float64), 2, axis=1)
    # the separate nodes round the products to T first: twice the tolerance
    assert relative_error(got, gate / (1 + np.exp(-gate)) * up) <= 2 * TOLERANCE[dtype]


def swiglu_sensitivity(feeds) -> float:
    """The largest |d out / d gate| or |d out / d up| of SiLU(gate) * up over the float64 products: how far the
    epilogue carries an error of the two products (SiLU(g) = 8.5 times an error of u where g = 8.5)."""
    gate, up = np.split(reference.linear(feeds), 2, axis=1)
    sigmoid = 1 / (1 + np.exp(-gate))
    return float(max(np.abs(gate * sigmoid).max(), np.abs(up * sigmoid * (1 + gate * (1 - sigmoid))).max()))


@settings(max_examples=15, deadline=None)
@given(rows=st.integers(1, 9), in_features=st.integers(1, 200), features=st.integers(1, 150),
       dtype=st.sampled_from(list(DTYPES)), seed=st.integers(0, 2**32 - 1))
def test_swiglu_random_shapes(rows, in_features, features, dtype, seed):
    """Against float64 within TOLERANCE of the larger of the output and what the epilogue makes of a unit error of
    the products: with few features the output can be small while SiLU(g) is not (found: 180 in_features, one
    feature, g = 8.5, u = -0.013, an fp32 error of 1.8e-5 on an output of 0.38)."""
    feeds = random_feeds(np.random.default_rng(seed), rows, in_features, 2 * features, dtype)
    got = run_single_op(OP, feeds, {"activation": "swiglu"})["output"].astype(np.float64)
    want = reference.linear(feeds, "swiglu")
    scale = max(np.abs(want).max(), 1.0, swiglu_sensitivity(feeds))
    assert np.abs(got - want).max() / scale <= TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_swiglu_row_alone_equals_the_row_among_others(dtype):
    feeds = random_feeds(np.random.default_rng(5), 6, 96, 2 * 70, dtype)
    together = run_single_op(OP, feeds, {"activation": "swiglu"})["output"]
    for i in range(6):
        alone = run_single_op(OP, {"input": feeds["input"][i:i + 1], "weight": feeds["weight"]},
                              {"activation": "swiglu"})["output"]
        np.testing.assert_array_equal(alone.view(np.uint8), together[i:i + 1].view(np.uint8))


def test_swiglu_rejects_an_odd_number_of_weight_rows_and_unknown_activations():
    feeds = {"input": np.zeros((2, 8), np.float32), "weight": np.zeros((5, 8), np.float32)}
    session = make_session(single_op_model(OP, feeds, {"activation": "swiglu"}))
    with pytest.raises(Exception, match=re.escape("Linear: activation swiglu needs an even number of weight rows "
                                                  "(gate rows, then up rows); got 5")):
        run_session(session, feeds)
    with pytest.raises(contract.ContractError, match=re.escape("Linear: activation must be one of: none, swiglu; "
                                                               "got 'gelu'")):
        single_op_model(OP, feeds, {"activation": "gelu"})
    model = single_op_model(OP, feeds, {"activation": "gelu"}, validate=False)  # the kernel's own check
    with pytest.raises(Exception, match=re.escape("Linear: activation must be one of: none, swiglu; got 'gelu'")):
        make_session(model)


@pytest.mark.parametrize("rows, parts", [(1, (3, 61, 70)), (4, (64, 1, 65, 2)), (7, (5, 128)), (0, (2, 2))])
@pytest.mark.parametrize("dtype", list(DTYPES))
def test_output_features_split_the_columns(rows, parts, dtype):
    """output_features: each output is its columns of the one-output product, bit for bit (tiles of 64 features
    straddle the parts here), and the float64 reference's part."""
    feeds = random_feeds(np.random.default_rng(rows + len(parts)), rows, 40, sum(parts), dtype)
    got = run_single_op(OP, feeds, {"output_features": list(parts)})
    whole = run_single_op(OP, feeds)["output"]
    want = reference.linear(feeds, output_features=parts)
    assert list(got) == contract.linear_output_names(parts)
    start = 0
    for name, size, part in zip(got, parts, want):
        assert got[name].shape == (rows, size)
        np.testing.assert_array_equal(got[name].view(np.uint8), whole[:, start:start + size].view(np.uint8))
        assert relative_error(got[name], part) <= TOLERANCE[dtype]
        start += size


@pytest.mark.parametrize("attributes, outputs, message", [
    ({"output_features": [4, 5]}, None, "Linear: output_features must sum to the weight's rows: expected 8, got [4, 5] "
                                        "(sum 9)"),
    ({"output_features": [4, 4]}, ["output"], "Linear: the node's outputs must be output, output_1, ... in order, one "
                                              "for each size of output_features (output alone without them); got 1 "
                                              "leading outputs (-1: not in order) for output_features [4, 4]"),
    ({"output_features": [2, 2, 4]}, ["output", "output_2"], "got -1 leading outputs"),
    ({"output_features": [4, 4], "activation": "swiglu"}, None, "Linear: activation swiglu gives one output; got "
                                                                "output_features [4, 4]"),
    ({"output_features": [4, 0, 4]}, None, "Linear: output_features must hold at most 4 positive sizes; got [4, 0, 4]"),
])
def test_output_features_rejections(attributes, outputs, message):
    """Sizes that do not add up fail when the node runs; outputs that do not match them, or swiglu with them, when
    the session is made, by the kernel (the node builder checks the sizes themselves too)."""
    feeds = {"input": np.zeros((2, 8), np.float32), "weight": np.zeros((8, 8), np.float32)}
    with pytest.raises(Exception, match=re.escape(message)):
        session = make_session(single_op_model(OP, feeds, attributes, outputs=outputs, validate=False))
        run_session(session, feeds)
    if "positive" in message:
        with pytest.raises(contract.ContractError, match=re.escape(message)):
            single_op_model(OP, feeds, attributes)


@pytest.mark.parametrize("input_shape, weight_shape, message", [
    ((2, 8), (4, 9), "Linear: weight in_features must equal input's: expected 8, got 9"),
    ((2, 3, 8), (4, 8), "Linear: input must be rank 2 [rows, in_features] and weight rank 2 [out_features, "
                        "in_features]; got input shape [2, 3, 8], weight shape [4, 8]"),
    ((2, 0), (4, 0), "Linear: in_features must be positive, got 0"),
])
def test_rejections_name_the_tensor(input_shape, weight_shape, message):
    feeds = {"input": np.zeros(input_shape, np.float32), "weight": np.zeros(weight_shape, np.float32)}
    session = make_session(single_op_model(OP, feeds))
    with pytest.raises(Exception) as raised:
        run_session(session, feeds)
    assert message in str(raised.value)
