"""Memory safety of the native library under AddressSanitizer (marker ``asan``; run by ``make asan``).

``make asan`` builds the library with -fsanitize=address (build/asan/), then runs these tests in a pytest
process with libasan preloaded and ONNX_HYBRID_LIBRARY naming that copy: every malformed-offset case
(negative, decreasing, past the end, wrong length, cu[0] != 0, last offset != T) and every shape rejection of the
state ops, PagedAttention's malformed metadata, and valid calls at the edges of each engine (ragged with
zero-length rows, capture, chunk tails, gates in the activation type, wide and deep convs, pools in every element
type, Linear's feature tiles, swiglu and split outputs). An out-of-bounds access aborts the process with an ASan
report; a rejection must come back as an ORT error naming the op.
Without that set-up (a plain ``pytest`` run) the marker deselects them; tests/native/test_native_library.py runs the
``quick`` ones this way in the normal suite.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from onnx_hybrid.ops import library
from onnx_hybrid_testing.single_op import run_single_op
from onnx_hybrid_testing.cases import random_conv_case, random_gdn_case, random_paged_attention_case

import test_native_errors as errors

pytestmark = pytest.mark.asan


@pytest.fixture(scope="module", autouse=True)
def asan_library():
    """The tests mean nothing on the plain library: insist on the sanitized copy being the one loaded."""
    path = os.environ.get("ONNX_HYBRID_LIBRARY", "")
    if "libasan" not in os.environ.get("LD_PRELOAD", "") or not path:
        pytest.fail("run through `make asan` (libasan preloaded, ONNX_HYBRID_LIBRARY = the ASan build)")
    assert library.library_path() == os.path.realpath(path)


def reject(op, feeds, attributes):
    with pytest.raises(Exception, match=op):
        run_single_op(op, feeds, attributes, validate=False)


BAD_OFFSETS = [[0, -1, 5, 8], [0, 6, 3, 8], [0, 9, 5, 8], [1, 3, 5, 8], [0, 3, 5, 7], [0, 3, 5, 100],
               [-5, 3, 5, 8], [0, 2**31 - 1, 5, 8], [0, 3, 5, -2**31],
               [0, 3, 8], [0, 3, 5, 6, 8]]  # the last two: wrong length against three-row states


@pytest.mark.parametrize("cu", BAD_OFFSETS, ids=str)
def test_quick_malformed_offsets_are_rejected(cu):
    cu = np.array(cu, np.int32)
    gdn = random_gdn_case(np.random.default_rng(0), [3, 2, 3])
    conv = random_conv_case(np.random.default_rng(0), [3, 2, 3])
    paged = random_paged_attention_case(np.random.default_rng(0), [3, 2, 3], [20, 0, 31], spare_blocks=0)
    reject("GatedDeltaNet", dict(gdn.feeds, cu_seqlens=cu), gdn.attributes)
    reject("VarlenCausalConvWithState", dict(conv.feeds, cumulative_sequence_length=cu), conv.attributes)
    reject("PagedAttention", dict(paged.feeds, cumulative_sequence_lengths=cu), paged.attributes)


@pytest.mark.parametrize("op, key", [("GatedDeltaNet", k) for k in errors.GDN_CASES]
                         + [("VarlenCausalConvWithState", k) for k in errors.CONV_CASES])
def test_shape_rejections(op, key):
    feeds, attributes = (errors.GDN_CASES if op == "GatedDeltaNet" else errors.CONV_CASES)[key]
    reject(op, feeds, attributes)


def _bad_paged_metadata():
    paged = random_paged_attention_case(np.random.default_rng(0), [3, 2, 3], [20, 0, 31], spare_blocks=0)
    blocks, columns = paged.feeds["key_cache"].shape[0], paged.feeds["block_table"].shape[1]
    changes = [dict(block_table=np.full_like(paged.feeds["block_table"], v)) for v in (-1, blocks, 2**31 - 1, -2**31)]
    changes += [dict(block_table=paged.feeds["block_table"][:, :1]),  # positions past the table
                dict(past_sequence_lengths=np.array([20, 0, 16 * columns], np.int32)),
                dict(past_sequence_lengths=np.array([20, -1, 31], np.int32)),
                dict(past_sequence_lengths=np.array([20, 0, 2**31 - 2], np.int32)),
                dict(block_table=paged.feeds["block_table"][:2])]  # wrong batch
    return paged, changes


@pytest.mark.parametrize("index", range(len(_bad_paged_metadata()[1])))
def test_quick_malformed_paged_metadata_is_rejected(index):
    paged, changes = _bad_paged_metadata()
    reject("PagedAttention", dict(paged.feeds, **changes[index]), paged.attributes)


VALID_GDN = [dict(lengths=[1, 0, 70, 33], capacity=4, capture=[1, 0, 4, 9]),
             dict(lengths=[65, 130], chunk_size=32, head_size_k=128, head_size_v=24),
             dict(lengths=[40, 3], layout="packed"),
             dict(lengths=[6, 40], per_key_decay=True, head_size_k=33, head_size_v=7),
             dict(lengths=[3, 40], head_size_k=0, head_size_v=4, qk_l2_norm=0, capacity=2, capture=[2, 2]),
             dict(lengths=[3, 40], head_size_k=4, head_size_v=0, capacity=2, capture=[2, 2]),
             # decay and beta in the activation type (widened into a buffer of the call's own)
             dict(lengths=[6, 0, 40], per_key_decay=True, dtype="float16", gates_in_activation_type=True),
             dict(lengths=[1, 3], dtype="bfloat16", capacity=2, capture=[1, 2], gates_in_activation_type=True)]
VALID_CONV = [dict(lengths=[10, 0, 1, 8], capacity=8, capture=[9, 1, 1, 3]),
              dict(lengths=[7, 9], channels=513), dict(lengths=[20, 3], channels=225, kernel_size=50),
              dict(lengths=[400, 2], channels=33, kernel_size=386, dilation=1),
              dict(lengths=[3, 4], channels=5, kernel_size=1, capacity=2, capture=[2, 2])]
VALID_PAGED = [dict(lengths=[1, 0, 40, 16], past=[15, 9, 0, 16], spare_blocks=0, spare_columns=0),
               dict(lengths=[5, 1], past=[27, 63], dtype="float16", head_size=17, block_size=32),
               dict(lengths=[2, 3], past=[0, 14], dtype="bfloat16", num_heads=8, kv_num_heads=1)]

# Linear (rows, in_features, out_features, dtype): no rows, one feature, a partial last tile of 64 features.
# (rows, in_features, weight rows, dtype, attributes): feature tiles, swiglu's gate and up tiles, parts that
# straddle tiles
VALID_LINEAR = [(0, 8, 3, "float", {}), (1, 1, 1, "float16", {}), (5, 33, 129, "bfloat16", {}),
                (2, 640, 65, "float", {}), (3, 17, 130, "float16", {"activation": "swiglu"}),
                (1, 9, 2, "float", {"activation": "swiglu"}),
                (4, 40, 131, "bfloat16", {"output_features": [1, 64, 66]}),
                (2, 12, 70, "float", {"output_features": [3, 64, 2, 1]})]


def _valid(cases, quick):  # the first cases also run in the quick selection
    return [pytest.param(c, id=f"{'quick-' if i < quick else ''}{i}") for i, c in enumerate(cases)]


@pytest.mark.parametrize("case", _valid(VALID_GDN, 2))
def test_valid_gated_delta_net_edges(case):
    case = dict(case)
    narrow = case.pop("gates_in_activation_type", False)
    gdn = random_gdn_case(np.random.default_rng(1), case.pop("lengths"), **case)
    feeds = dict(gdn.feeds)
    if narrow:
        feeds.update({k: feeds[k].astype(feeds["query"].dtype) for k in ("decay", "beta")})
    run_single_op("GatedDeltaNet", feeds, gdn.attributes)


@pytest.mark.parametrize("case", _valid(VALID_CONV, 2))
def test_valid_conv_edges(case):
    case = dict(case)
    conv = random_conv_case(np.random.default_rng(1), case.pop("lengths"), **case)
    run_single_op("VarlenCausalConvWithState", conv.feeds, conv.attributes)


@pytest.mark.parametrize("case", _valid(VALID_PAGED, 1))
def test_valid_paged_attention_edges(case):
    case = dict(case)
    paged = random_paged_attention_case(np.random.default_rng(1), case.pop("lengths"), case.pop("past"), **case)
    run_single_op("PagedAttention", paged.feeds, paged.attributes)


@pytest.mark.parametrize("case", _valid(VALID_LINEAR, 1))
def test_valid_linear_edges(case):
    import ml_dtypes

    rows, in_features, out_features, dtype, attributes = case
    np_type = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(1)
    run_single_op("Linear", {"input": rng.standard_normal((rows, in_features)).astype(np_type),
                             "weight": rng.standard_normal((out_features, in_features)).astype(np_type)}, attributes)


# QuantizedLinear (rows, in_features, weight rows, dtype, block size, zero points, attributes): a partial last
# block, an odd block count (zero points' last byte half used), swiglu and parts over the dequantized tiles; at
# accuracy level 4 (int8 rows) partial groups of 8 weight rows, a partial last chunk, row tiles of 1-4.
VALID_QUANTIZED_LINEAR = [(1, 40, 3, "float16", 32, True, {}), (0, 16, 2, "float", 16, False, {}),
                          (3, 100, 130, "bfloat16", 64, True, {"activation": "swiglu"}),
                          (2, 33, 131, "float", 16, True, {"output_features": [1, 64, 66]}),
                          (1, 40, 3, "float16", 32, True, {"accuracy_level": 4}),
                          (7, 100, 130, "bfloat16", 64, True, {"activation": "swiglu", "accuracy_level": 4}),
                          (6, 33, 131, "float", 32, False, {"output_features": [1, 64, 66], "accuracy_level": 4}),
                          (0, 64, 2, "float", 128, False, {"accuracy_level": 4})]


@pytest.mark.parametrize("case", _valid(VALID_QUANTIZED_LINEAR, 1))
def test_valid_quantized_linear_edges(case):
    import ml_dtypes

    from onnx_hybrid.exporter.quantize import QuantSpec, quantize

    rows, in_features, weight_rows, dtype, block_size, zero_points, attributes = case
    np_type = {"float": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}[dtype]
    rng = np.random.default_rng(1)
    q = quantize(rng.standard_normal((weight_rows, in_features)).astype(np.float32),
                 QuantSpec(4, block_size, symmetric=not zero_points), scale_dtype=np_type)
    run_single_op("QuantizedLinear", {"input": rng.standard_normal((rows, in_features)).astype(np_type),
                                      "weight": q.codes, "scales": q.scales, "zero_points": q.zero_points},
                  {"block_size": block_size, **attributes})
