"""Our CPU VarlenCausalConvWithState against the float64 reference and against itself
(docs/op-contract.md#tolerances)."""

import numpy as np
import pytest

from native_util import CONV, check_conv, check_state_aliasing, run_conv
from onnx_hybrid.ops import replay
from onnx_hybrid_testing import single_op
from onnx_hybrid_testing.cases import random_conv_case


@pytest.mark.parametrize("kernel", [1, 2, 3, 4, 5, 7])
@pytest.mark.parametrize("dilation", [1, 2])
def test_kernel_sizes_and_dilation(kernel, dilation):
    # lengths {10, 5, 1, 8}: with K >= 3 and dilation 2 several rows are shorter than the state (n_b < SL)
    check_conv(random_conv_case(np.random.default_rng(kernel * 10 + dilation), [10, 5, 1, 8], kernel_size=kernel,
                                dilation=dilation))


@pytest.mark.parametrize("activation", ["none", "silu", "swish"])
@pytest.mark.parametrize("with_bias", [True, False])
def test_activation_and_bias(activation, with_bias):
    check_conv(random_conv_case(np.random.default_rng(1), [10, 5, 1, 8], activation=activation, with_bias=with_bias))


@pytest.mark.parametrize("lengths,channels,kernel", [
    ([300], 16, 4),            # a single long prefill
    ([1] * 6, 24, 4),          # all-ones decode (T == B)
    ([7, 9], 513, 4),          # wide
    ([20, 3], 225, 50),        # deep kernel
    ([400, 2], 33, 386),       # deeper than most rows
])
def test_shapes(lengths, channels, kernel):
    check_conv(random_conv_case(np.random.default_rng(2), lengths, channels=channels, kernel_size=kernel))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_types(dtype):
    check_conv(random_conv_case(np.random.default_rng(3), [10, 5, 1, 8], dtype=dtype, capacity=4,
                                capture=[4, 1, 0, 9]))


def test_capsule_prefixes_zeros_and_replay():
    case = random_conv_case(np.random.default_rng(4), [10, 5, 1, 8], capacity=8, capture=[-1, 0, 3, 9])
    out = check_conv(case)
    prefixes = [0, 0, 1, 8]
    starts = np.concatenate([[0], np.cumsum(case.lengths)])
    for b, m in enumerate(prefixes):
        np.testing.assert_array_equal(out["state_update"][b, :m], case.feeds["input"][starts[b]:starts[b] + m])
        assert not out["state_update"][b, m:].any()
    # replay of every accepted prefix equals the state of a run over just that prefix
    for b, m in enumerate(prefixes):
        for n in range(1, m + 1):
            feeds = dict(case.feeds, input=case.feeds["input"][starts[b]:starts[b] + n],
                         cumulative_sequence_length=np.array([0, n], np.int32),
                         initial_state=case.feeds["initial_state"][b:b + 1])
            del feeds["capture_count"]
            attrs = {k: v for k, v in case.attributes.items() if k != "state_update_capacity"}
            want = single_op.run_single_op(CONV, feeds, attrs)["final_state"]
            state = case.feeds["initial_state"][b:b + 1].copy()
            replay.replay_conv(state, out["state_update"][b:b + 1], n)
            np.testing.assert_array_equal(state, want)


def test_capacity_0_output_2_requested_and_omitted():
    case = random_conv_case(np.random.default_rng(5), [3, 4])
    assert run_conv(case)["state_update"].shape == (2, 0, 12)
    assert set(run_conv(case, outputs=["output", "final_state"])) == {"output", "final_state"}


@pytest.mark.parametrize("capacity", [0, 4])
def test_no_leakage_across_request_boundaries(capacity):
    case = random_conv_case(np.random.default_rng(6), [6, 7, 5], kernel_size=4, capacity=capacity,
                            capture=[4, 4, 4] if capacity else None)
    x = case.feeds["input"]
    x[:6], x[6:13], x[13:] = 1000.0, -1000.0, 1000.0
    with np.errstate(over="ignore"):  # the float64 reference's sigmoid saturates exp(-z) at z = -1000s
        check_conv(case)


def test_zero_length_request_keeps_state():
    case = random_conv_case(np.random.default_rng(7), [4, 0, 5], capacity=2, capture=[2, 2, 2])
    out = check_conv(case)
    np.testing.assert_array_equal(out["final_state"][1], case.feeds["initial_state"][1])


@pytest.mark.parametrize("kernel", [1, 2, 3, 4])
@pytest.mark.parametrize("lengths", [[5, 1, 9], [1, 1, 1]])
def test_aliased_state_and_two_calls(kernel, lengths):
    """The general and the all-decode case, K in {1, 2, 3, 4}."""
    check_state_aliasing(CONV, random_conv_case(np.random.default_rng(8), lengths, kernel_size=kernel))
