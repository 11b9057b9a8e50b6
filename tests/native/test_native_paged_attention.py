"""Our CPU PagedAttention (onnx_hybrid domain) against the float64 reference (docs/op-contract.md#pagedattention):
geometries, element types, the pool updated in place through one bound buffer, thread-count
independence, and clean rejections of malformed metadata. ORT's own com.microsoft::PagedAttention has no
CPU kernel, so the model-level peers are transformers (tests/configs/test_configs_paged_export.py) and the Engine
(tests/genai/test_engine_speculative_cpu.py)."""

from __future__ import annotations

import numpy as np
import pytest

from onnx_hybrid.ops import contract, reference
from onnx_hybrid_testing.single_op import make_session, run_single_op, single_op_model, to_ort_value
from onnx_hybrid_testing.cases import random_paged_attention_case

OP = contract.PAGED_ATTENTION.name
OUTPUTS = [p.name for p in contract.PAGED_ATTENTION.outputs]
# Output: fp32 softmax and accumulation against float64 (1e-5, the project rule), then one rounding to T:
# half an ulp of an output of magnitude <= 4 (fp16 2e-3, bf16 1.6e-2). The pools are bit copies.
TOLERANCE = {"float": 1e-5, "float16": 2e-3, "bfloat16": 1.6e-2}


def check(case, dtype="float", **run_options):
    got = run_single_op(OP, case.feeds, case.attributes, **run_options)
    want = reference.paged_attention(case.feeds, **case.attributes)
    np.testing.assert_allclose(got["output"].astype(np.float64), want[0], rtol=0, atol=TOLERANCE[dtype],
                               err_msg=case.describe())
    for name, expected in zip(OUTPUTS[1:], want[1:]):
        np.testing.assert_array_equal(got[name].astype(np.float64), expected, err_msg=name)
    return got


@pytest.mark.parametrize("lengths, past", [
    ([7], [0]),                         # prefill of one request inside one block
    ([40, 3], [0, 0]),                  # prefills crossing blocks
    ([1] * 8, [5, 16, 31, 0, 47, 2, 64, 15]),  # decode, some at block boundaries
    ([4, 0, 2, 1], [29, 9, 14, 0]),     # verify steps, a request with no tokens this step
])
@pytest.mark.parametrize("dtype", ["float", "float16", "bfloat16"])
def test_against_reference(lengths, past, dtype):
    check(random_paged_attention_case(np.random.default_rng(len(lengths)), lengths, past, dtype=dtype), dtype)


@pytest.mark.parametrize("num_heads, kv_num_heads, head_size, block_size", [
    (4, 4, 17, 16), (8, 2, 256, 16), (6, 1, 64, 32), (2, 2, 1, 64)])
def test_geometries(num_heads, kv_num_heads, head_size, block_size):
    case = random_paged_attention_case(np.random.default_rng(head_size), [9, 1, 3], [70, 0, 33], num_heads=num_heads,
                                       kv_num_heads=kv_num_heads, head_size=head_size, block_size=block_size)
    check(case)


def test_scale_attribute():
    check(random_paged_attention_case(np.random.default_rng(3), [5, 2], [3, 11], scale=0.3))


def test_thread_counts_agree_bit_for_bit():
    case = random_paged_attention_case(np.random.default_rng(4), [30, 1, 6], [0, 50, 17], head_size=64)
    one = run_single_op(OP, case.feeds, case.attributes, intra_op_threads=1)
    two = run_single_op(OP, case.feeds, case.attributes, intra_op_threads=2)
    for name in OUTPUTS:
        np.testing.assert_array_equal(one[name], two[name], err_msg=name)


@pytest.mark.parametrize("dtype", ["float", "float16"])
def test_pool_updated_in_place_through_one_bound_buffer(dtype):
    """onnxruntime-genai binds one pool buffer as key_cache and key_cache_out (docs/genai-config.md#state-groups)."""
    case = random_paged_attention_case(np.random.default_rng(5), [6, 1], [13, 40], dtype=dtype)
    want = reference.paged_attention(case.feeds, **case.attributes)
    session = make_session(single_op_model(OP, case.feeds, case.attributes))
    binding = session.io_binding()
    binding.bind_output("output")  # get_outputs() lists the bound outputs in binding order
    pools = {}
    for name, value in case.feeds.items():
        ort_value = to_ort_value(value)
        binding.bind_ortvalue_input(name, ort_value)
        if name in ("key_cache", "value_cache"):
            pools[name] = ort_value
            binding.bind_ortvalue_output(name + "_out", ort_value)
    session.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.get_outputs()[0].numpy().astype(np.float64), want[0], rtol=0,
                               atol=TOLERANCE[dtype])
    np.testing.assert_array_equal(pools["key_cache"].numpy().astype(np.float64), want[1])
    np.testing.assert_array_equal(pools["value_cache"].numpy().astype(np.float64), want[2])


def _expect_error(case, message):
    expected = contract.format_message(OP, *message)
    with pytest.raises(contract.ContractError) as python:
        reference.paged_attention(case.feeds, **case.attributes)
    assert str(python.value) == expected
    with pytest.raises(Exception) as native:
        run_single_op(OP, case.feeds, case.attributes, validate=False)
    assert expected in str(native.value)


def test_block_table_entry_outside_the_pool():
    case = random_paged_attention_case(np.random.default_rng(6), [3, 2], [20, 0], spare_blocks=0)
    num_blocks = case.feeds["key_cache"].shape[0]
    case.feeds["block_table"][0, 1] = num_blocks
    _expect_error(case, ("pa_block_index", 0, 1, num_blocks, num_blocks))
    case.feeds["block_table"][0, 1] = -1
    _expect_error(case, ("pa_block_index", 0, 1, -1, num_blocks))


def test_positions_past_the_block_table():
    case = random_paged_attention_case(np.random.default_rng(7), [3, 2], [20, 0], spare_columns=0)
    case.feeds["past_sequence_lengths"][1] = 31  # positions 31, 32 need 3 columns
    _expect_error(case, ("pa_block_columns", 1, 32, 3, 2))


@pytest.mark.parametrize("field, values, message", [
    ("cumulative_sequence_lengths", [0, 3, 4, 6], ("pa_cu_bounds", 3, 5, 0, 6)),
    ("cumulative_sequence_lengths", [0, 4, 3, 5], ("pa_cu_order", 2, 3, 1, 4)),
    ("past_sequence_lengths", [20, -1, 0], ("pa_past_range", 1, contract.INT32_MAX - 1, -1)),
])
def test_malformed_offsets(field, values, message):
    case = random_paged_attention_case(np.random.default_rng(8), [3, 1, 1], [20, 0, 0])
    case.feeds[field] = np.array(values, np.int32)
    _expect_error(case, message)


def test_shape_errors():
    case = random_paged_attention_case(np.random.default_rng(9), [3, 2], [5, 0])
    case.feeds["value"] = case.feeds["value"][:, :-1]
    _expect_error(case, ("pa_tensor_shape", "value", "kv_num_heads * head_size", 5, 64, [5, 63]))
    case = random_paged_attention_case(np.random.default_rng(9), [3, 2], [5, 0])
    case.feeds["value_cache"] = case.feeds["value_cache"][:-1]
    _expect_error(case, ("pa_cache_same", list(case.feeds["key_cache"].shape), list(case.feeds["value_cache"].shape)))
    case.feeds["block_table"] = case.feeds["block_table"][:1]
    case.feeds["value_cache"] = case.feeds["key_cache"]
    _expect_error(case, ("pa_block_table_shape", 2, list(case.feeds["block_table"].shape)))


def test_head_ratio_rejected_by_the_node_builder_and_at_session_creation():
    case = random_paged_attention_case(np.random.default_rng(10), [2], [0], num_heads=4, kv_num_heads=2)
    with pytest.raises(contract.ContractError, match="num_heads \\(3\\) must be a multiple of kv_num_heads \\(2\\)"):
        contract.make_onnx_node(OP, {p.name: p.name for p in contract.PAGED_ATTENTION.inputs}, OUTPUTS,
                                dict(num_heads=3, kv_num_heads=2))
    model = single_op_model(OP, case.feeds, dict(num_heads=3, kv_num_heads=2), validate=False)
    with pytest.raises(Exception, match="PagedAttention: num_heads \\(3\\) must be a multiple of kv_num_heads \\(2\\)"):
        make_session(model)
    with pytest.raises(Exception, match="PagedAttention: num_heads must be a positive int32, got 0"):
        make_session(single_op_model(OP, case.feeds, dict(kv_num_heads=2), validate=False))


@pytest.mark.parametrize("num_heads, kv_num_heads", [(4, 2), (8, 1)])
def test_a_token_gets_the_same_bits_whatever_the_call_holds(num_heads, kv_num_heads):
    """A verify step's rows equal one-token calls bit for bit (the tiles differ, the arithmetic per score and
    per output element does not), so speculative decoding reproduces plain decoding exactly."""
    case = random_paged_attention_case(np.random.default_rng(11), [7, 2], [21, 40], num_heads=num_heads,
                                       kv_num_heads=kv_num_heads, head_size=48)
    full = run_single_op(OP, case.feeds, case.attributes)
    starts = case.feeds["cumulative_sequence_lengths"]
    for b, past in enumerate(case.feeds["past_sequence_lengths"]):
        for j in range(starts[b], starts[b + 1]):
            token = {name: case.feeds[name][j:j + 1] for name in ("query", "key", "value")}
            single = run_single_op(OP, dict(case.feeds, **token, key_cache=full["key_cache_out"],
                                            value_cache=full["value_cache_out"],
                                            cumulative_sequence_lengths=np.array([0, 1], np.int32),
                                            past_sequence_lengths=np.array([past + j - starts[b]], np.int32),
                                            block_table=case.feeds["block_table"][b:b + 1]), case.attributes)
            np.testing.assert_array_equal(single["output"], full["output"][j:j + 1], err_msg=f"token {j}")
