"""The float64 reference against itself: chunked form vs recurrence, layouts, capture rules, replay.

The reference is the oracle for every kernel, so it is checked here from independent angles: the chunked
algebra (a different formulation) must agree with the recurrence to float64 rounding; equivalent packings
must give identical numbers; the capsule must replay to the state of a shorter run.
"""

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from onnx_hybrid.ops import contract, reference, replay
from onnx_hybrid_testing.cases import random_conv_case, random_gdn_case

# float64 throughout: disagreement beyond ~1e-12 means an algebra error, not rounding.
F64_TOL = 1e-10


def assert_close(a, b, tol=F64_TOL):
    np.testing.assert_allclose(a, b, rtol=tol, atol=tol)


@settings(max_examples=25, deadline=None)
@given(
    lengths=st.lists(st.integers(0, 140), min_size=1, max_size=3).filter(lambda xs: sum(xs) > 0),
    ratio=st.sampled_from([1, 2, 3]),
    dims=st.sampled_from([(16, 8), (8, 16), (16, 1), (32, 32)]),
    rule=st.sampled_from(list(contract.UPDATE_RULES)),
    qwen=st.booleans(),
    sigmoid=st.booleans(),
    l2=st.sampled_from([0, 1]),
    chunk=st.sampled_from([16, 32, 64]),
    capacity=st.integers(0, 8),
    seed=st.integers(0, 2**31),
)
# A strong qwen gate over a 64-token chunk: e^{γ_t − γ_s} above the diagonal overflows (it once gave nan there).
@example(lengths=[140], ratio=2, dims=(16, 8), rule="gated", qwen=True, sigmoid=False, l2=0, chunk=64, capacity=0,
         seed=1_073_741_823)
def test_chunked_matches_recurrence(lengths, ratio, dims, rule, qwen, sigmoid, l2, chunk, capacity, seed):
    has_decay, _ = contract.UPDATE_RULES[rule]
    rng = np.random.default_rng(seed)
    case = random_gdn_case(
        rng, lengths, num_heads_q=2, num_heads_v=2 * ratio, head_size_k=dims[0], head_size_v=dims[1],
        update_rule=rule, gate_activation="qwen" if qwen and has_decay else "none",
        beta_activation="sigmoid" if sigmoid else "none", qk_l2_norm=l2, chunk_size=chunk, capacity=capacity,
        capture=rng.integers(-2, 10, len(lengths)).tolist(),
    )
    seq = reference.gated_delta_net(case.feeds, **case.attributes)
    chunked = reference.gated_delta_net_chunked(case.feeds, **case.attributes)
    for a, b in zip(seq, chunked):
        assert_close(a, b, 1e-9)


@pytest.mark.parametrize("length, chunk", [(63, 64), (64, 64), (65, 64), (130, 64), (65, 32), (128, 32), (200, 32)])
def test_chunk_boundaries(length, chunk):
    case = random_gdn_case(np.random.default_rng(length), [length], chunk_size=chunk)
    for a, b in zip(reference.gated_delta_net(case.feeds, **case.attributes),
                    reference.gated_delta_net_chunked(case.feeds, **case.attributes)):
        assert_close(a, b)


def test_per_key_decay_chunked():
    case = random_gdn_case(np.random.default_rng(3), [70, 5], update_rule="gated_delta", gate_activation="qwen",
                           per_key_decay=True)
    for a, b in zip(reference.gated_delta_net(case.feeds, **case.attributes),
                    reference.gated_delta_net_chunked(case.feeds, **case.attributes)):
        assert_close(a, b)


def test_layouts_agree_exactly():
    rng = np.random.default_rng(7)
    base = random_gdn_case(rng, [6, 6], layout="ragged")
    rng = np.random.default_rng(7)
    out_r, state_r, _ = reference.gated_delta_net(base.feeds, **base.attributes)
    for layout in ("uniform", "rank4", "packed", "packed_uniform", "packed_rank3"):
        case = random_gdn_case(np.random.default_rng(7), [6, 6], layout=layout)
        out, state, _ = reference.gated_delta_net(case.feeds, **case.attributes)
        np.testing.assert_array_equal(out.reshape(out_r.shape), out_r, err_msg=layout)
        np.testing.assert_array_equal(state, state_r, err_msg=layout)


def test_zero_length_row_keeps_state_and_absent_state_is_zero():
    case = random_gdn_case(np.random.default_rng(1), [3, 0, 5], capacity=2)
    _, final, capsule = reference.gated_delta_net(case.feeds, **case.attributes)
    np.testing.assert_array_equal(final[1], case.feeds["initial_state"][1])
    assert not capsule[1].any()
    no_state = random_gdn_case(np.random.default_rng(1), [4, 0], with_state=False)
    _, final, _ = reference.gated_delta_net(no_state.feeds, **no_state.attributes)
    assert not final[1].any() and final[0].any()


def test_capture_rules():
    # docs/op-contract.md#capture-rules: C = 4, lengths {3, 5, 1}, capture {-1, 9, 2} => m = {0, 4, 1}.
    case = random_gdn_case(np.random.default_rng(2), [3, 5, 1], capacity=4, capture=[-1, 9, 2])
    out, final, capsule = reference.gated_delta_net(case.feeds, **case.attributes)
    layout = contract.GdnCapsuleLayout(4, 4, 2, 16, 8)
    for b, m in enumerate([0, 4, 1]):
        decay, key, delta = layout.split(capsule[b])
        assert decay[:m].all() and not decay[m:].any()
        assert not key[m:].any() and not delta[m:].any()
        # Stored keys are unit vectors (after qk_l2_norm); decays are exp(g) in (0, 1].
        np.testing.assert_allclose(np.linalg.norm(key[:m], axis=-1), 1.0, rtol=1e-9)
        assert ((decay[:m] > 0) & (decay[:m] <= 1)).all()
    for active, expect_zero in ((1, False), (0, True)):
        on = random_gdn_case(np.random.default_rng(2), [3, 5, 1], capacity=4, capture=[-1, 9, 2], active=active)
        out2, final2, capsule2 = reference.gated_delta_net(on.feeds, **on.attributes)
        np.testing.assert_array_equal(out2, out)
        np.testing.assert_array_equal(final2, final)
        assert (not capsule2.any()) == expect_zero


def test_two_calls_equal_one():
    rng = np.random.default_rng(11)
    case = random_gdn_case(rng, [128])
    out, final, _ = reference.gated_delta_net(case.feeds, **case.attributes)
    first = {k: (v[:64] if k in ("query", "key", "value", "decay", "beta") else v) for k, v in case.feeds.items()}
    first["cu_seqlens"] = np.array([0, 64], np.int32)
    out1, mid, _ = reference.gated_delta_net(first, **case.attributes)
    second = {k: (v[64:] if k in ("query", "key", "value", "decay", "beta") else v) for k, v in case.feeds.items()}
    second.update(cu_seqlens=np.array([0, 64], np.int32), initial_state=mid)
    out2, final2, _ = reference.gated_delta_net(second, **case.attributes)
    assert_close(np.concatenate([out1, out2]), out)
    assert_close(final2, final)


def _prefix_feeds(feeds, lengths, keep):
    """Feeds of the same call truncated to the first ``keep[b]`` tokens of each row."""
    starts = np.concatenate([[0], np.cumsum(lengths)])
    idx = np.concatenate([np.arange(starts[b], starts[b] + keep[b]) for b in range(len(lengths))]).astype(int)
    out = {k: (v[idx] if k in ("query", "key", "value", "decay", "beta", "input") else v) for k, v in feeds.items()}
    cu = np.concatenate([[0], np.cumsum(keep)]).astype(np.int32)
    out["cu_seqlens" if "query" in feeds else "cumulative_sequence_length"] = cu
    return out


@pytest.mark.parametrize("ratio", [1, 3])
def test_gdn_replay_reproduces_prefix_state(ratio):
    lengths, capture = [8, 6, 8], [8, 4, 0]
    case = random_gdn_case(np.random.default_rng(5), lengths, num_heads_v=2 * ratio, capacity=8, capture=capture)
    _, _, capsule = reference.gated_delta_net(case.feeds, **case.attributes)
    for n in range(1, 9):
        accepted = [min(n, c) for c in capture]
        state = case.feeds["initial_state"].copy()
        replay.replay_gdn(state, capsule.astype(np.float32), accepted, capacity=8)
        attrs = dict(case.attributes, state_update_capacity=0)
        prefix = _prefix_feeds({k: v for k, v in case.feeds.items() if k != "capture_count"}, lengths, accepted)
        _, expected, _ = reference.gated_delta_net(prefix, **attrs)
        # float32 replay of float64 transitions: rounding only.
        np.testing.assert_allclose(state, expected, rtol=1e-5, atol=1e-6)


def test_conv_replay_is_exact():
    lengths, capture = [10, 5, 1, 8], [-1, 0, 3, 9]
    case = random_conv_case(np.random.default_rng(4), lengths, kernel_size=4, dilation=2, capacity=8, capture=capture)
    _, _, capsule = reference.varlen_causal_conv(case.feeds, **case.attributes)
    prefixes = [0, 0, 1, 8]
    assert not capsule[0].any() and not capsule[1].any() and not capsule[2, 1:].any()
    for n in range(0, 9):
        accepted = [min(n, p) for p in prefixes]
        state = case.feeds["initial_state"].copy()
        replay.replay_conv(state, capsule.astype(np.float32), accepted)
        # Expected per row (ORT's T >= B rule forbids a batch of mostly empty prefixes).
        for b, keep in enumerate(accepted):
            expected = case.feeds["initial_state"][b]
            if keep:
                row = _prefix_feeds({k: v for k, v in case.feeds.items() if k != "capture_count"}, lengths,
                                    [keep if i == b else 0 for i in range(len(lengths))])
                row["initial_state"] = row["initial_state"][b:b + 1]
                row["cumulative_sequence_length"] = np.array([0, keep], np.int32)
                attrs = dict(case.attributes, state_update_capacity=0)
                expected = reference.varlen_causal_conv(row, **attrs)[1][0].astype(np.float32)
            np.testing.assert_array_equal(state[b], expected)


def _conv_by_numpy_convolve(x, w, state, bias, dilation, silu):
    """An independent per-channel formulation: dilate the kernel and use np.convolve."""
    k = w.shape[-1]
    dense = np.zeros((w.shape[0], (k - 1) * dilation + 1))
    dense[:, ::dilation] = w[:, 0, :]
    hist = np.concatenate([state, x.T], axis=1)
    y = np.stack([np.convolve(hist[c], dense[c, ::-1], mode="valid") for c in range(x.shape[1])], axis=1) + bias
    return y / (1 + np.exp(-y)) if silu else y


@pytest.mark.parametrize("kernel, dilation", [(1, 1), (2, 1), (3, 2), (4, 1), (5, 2), (7, 1)])
def test_conv_matches_np_convolve(kernel, dilation):
    lengths = [10, 5, 1, 2]
    case = random_conv_case(np.random.default_rng(kernel), lengths, kernel_size=kernel, dilation=dilation)
    out, final, _ = reference.varlen_causal_conv(case.feeds, **case.attributes)
    f = {k: np.asarray(v, np.float64) for k, v in case.feeds.items()}
    starts = np.concatenate([[0], np.cumsum(lengths)])
    sl = (kernel - 1) * dilation
    for b, n in enumerate(lengths):
        x = f["input"][starts[b]:starts[b] + n]
        expected = _conv_by_numpy_convolve(x, f["weight"], f["initial_state"][b], f["bias"], dilation, True)
        assert_close(out[starts[b]:starts[b] + n], expected)
        hist = np.concatenate([f["initial_state"][b], x.T], axis=1)
        assert_close(final[b], hist[:, hist.shape[1] - sl:] if sl else hist[:, :0])


def test_replay_rejects_bad_arguments():
    state = np.zeros((1, 4, 8, 16), np.float32)
    with pytest.raises(ValueError, match="accepted\\[0\\] must be in \\[0, capacity=2\\], got 3"):
        replay.replay_gdn(state, np.zeros((1, contract.gdn_capsule_width(2, 4, 2, 16, 8)), np.float32), [3], 2)
    with pytest.raises(ValueError, match="does not fit capacity"):
        replay.replay_gdn(state, np.zeros((1, 2 * 37), np.float32), [1], 2)
