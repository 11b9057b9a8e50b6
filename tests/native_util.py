"""Helpers shared by the native-library tests: run a case through our kernels and compare with the
float64 reference under the tolerances of docs/op-contract.md#tolerances."""

from __future__ import annotations

import numpy as np

from onnx_hybrid.ops import contract, reference, replay
from onnx_hybrid_testing.single_op import make_session, run_session, run_single_op, single_op_model, to_ort_value
from onnx_hybrid_testing.cases import random_gdn_case

# fp32: the project rule (≤ 1e-5 against float64). fp16/bf16: ORT's chunked GDN calibration (3e-2),
# which also covers bf16's coarser output rounding (2^-9 relative) for unit-scale outputs.
TOLERANCE = {"float": 1e-5, "float16": 3e-2, "bfloat16": 3e-2}
GDN = contract.GATED_DELTA_NET.name
CONV = contract.VARLEN_CAUSAL_CONV.name
GDN_OUTPUTS = [p.name for p in contract.GATED_DELTA_NET.outputs]
TOKEN_INPUTS = ("query", "key", "value", "decay", "beta")  # GDN inputs with one row per token
FLT_MIN = np.finfo(np.float32).tiny
CONV_OUTPUTS = [p.name for p in contract.VARLEN_CAUSAL_CONV.outputs]


def dtype_name(array) -> str:
    return {"float32": "float", "float16": "float16", "bfloat16": "bfloat16"}[np.asarray(array).dtype.name]


def run_gdn(case, **kw) -> dict:
    return run_single_op(GDN, case.feeds, case.attributes, **kw)


def run_conv(case, **kw) -> dict:
    return run_single_op(CONV, case.feeds, case.attributes, **kw)


def assert_close(actual, expected, tol, what=""):
    actual = np.asarray(actual).astype(np.float64)
    assert actual.shape == np.shape(expected), f"{what}: shape {actual.shape} != {np.shape(expected)}"
    np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol, err_msg=what)


def gdn_capsule_masks(case, capacity):
    """Per row: a boolean mask of the capsule entries our kernels must leave at exactly zero."""
    geo = contract.resolve_gdn({k: np.shape(v) for k, v in case.feeds.items() if v is not None},
                               contract.resolve_attributes(contract.GATED_DELTA_NET, case.attributes))
    layout = geo.capsule_layout()
    active = case.feeds.get("state_update_active")
    on = active is None or int(np.asarray(active)[0]) != 0
    masks = np.ones((geo.batch, geo.capsule_width), dtype=bool)
    for b, n in enumerate(case.lengths):
        m = contract.captured_prefix(case.feeds["capture_count"][b], capacity, n) if on else 0
        decay, key, delta = layout.split(masks[b])
        decay[:m] = key[:m] = delta[:m] = False
    return masks


def check_gdn(case, results=None, **kw):
    """Our GatedDeltaNet against the float64 reference; uncaptured capsule slots exactly zero."""
    results = results or run_gdn(case, **kw)
    expected = reference.gated_delta_net(case.feeds, **case.attributes)
    tol = TOLERANCE[dtype_name(case.feeds["query"])]
    for name, want in zip(GDN_OUTPUTS, expected):
        # final state and capsule are fp32 whatever T is (the reference reads the same rounded inputs)
        assert_close(results[name], want, tol if name == "output" else TOLERANCE["float"], f"{name} ({case.describe()})")
    capacity = case.attributes.get("state_update_capacity", 0)
    if capacity:
        zeros = gdn_capsule_masks(case, capacity)
        assert np.all(results["state_update"][zeros] == 0), "uncaptured capsule slots must be exactly zero"
    return results


def check_conv(case, results=None):
    results = results or run_conv(case)
    expected = reference.varlen_causal_conv(case.feeds, **case.attributes)
    tol = TOLERANCE[dtype_name(case.feeds["input"])]
    assert_close(results["output"], expected[0], max(tol, 1e-5), f"output ({case.describe()})")
    # state and capsule are raw input samples: bit copies
    assert_close(results["final_state"], expected[1], 0.0, "final_state")
    assert_close(results["state_update"], expected[2], 0.0, "state_update")
    return results


def check_state_aliasing(op: str, case, rounds: int = 2):
    """initial_state and final_state bound to one OrtValue through IOBinding: each call advances the state
    in place and must equal, bitwise, separate calls that feed the previous final_state back."""
    model = single_op_model(op, case.feeds, case.attributes, outputs=["output", "final_state"])
    session = make_session(model)
    state = to_ort_value(case.feeds["initial_state"].copy())
    expected_state = case.feeds["initial_state"]
    for _ in range(rounds):
        expected = run_session(session, {**case.feeds, "initial_state": expected_state})
        binding = session.io_binding()
        for name, value in case.feeds.items():
            if name != "initial_state":
                binding.bind_ortvalue_input(name, to_ort_value(value))
        binding.bind_ortvalue_input("initial_state", state)
        binding.bind_output("output")
        binding.bind_ortvalue_output("final_state", state)
        session.run_with_iobinding(binding)
        np.testing.assert_array_equal(binding.get_outputs()[0].numpy(), expected["output"])
        np.testing.assert_array_equal(state.numpy(), expected["final_state"])
        expected_state = expected["final_state"]


def subnormal_gdn_case(rng, lengths, *, head_size_k=64, **kw):
    """A qwen-gated case whose decays and states fall below FLT_MIN (4 value heads, float32):
    head 0 ordinary; heads 1 and 2 decay fast (exp(-60 softplus(x)) spans 3e-4 down past the underflow
    threshold: subnormal and zero decays); head 2 also has values and an initial state around 1e-37, so
    its state lives near and below FLT_MIN; head 3 has an ordinary gate and a subnormal initial state (~1e-39)."""
    case = random_gdn_case(rng, lengths, head_size_k=head_size_k, num_heads_q=2, num_heads_v=4, **kw)
    f = case.feeds
    f["a_log"][1:3] = np.log(np.float32(60.0))
    f["dt_bias"][1:3] = 0.0
    f["value"][:, 2] *= np.float32(1e-37)
    f["initial_state"][:, 2] *= np.float32(1e-37)
    f["initial_state"][:, 3] *= np.float32(1e-38)
    return case


def is_subnormal(x) -> np.ndarray:
    x = np.asarray(x)
    return (x != 0) & (np.abs(x) < FLT_MIN)


def _row_prefix(case, row, n, initial_state):
    """Request `row`'s first n tokens as a one-row call without capture."""
    start = int(np.sum(case.lengths[:row]))
    feeds = {name: value for name, value in case.feeds.items() if name not in ("capture_count", "state_update_active")}
    for name in TOKEN_INPUTS:
        if name in feeds:
            feeds[name] = case.feeds[name][start:start + n]
    feeds["cu_seqlens"] = np.array([0, n], np.int32)
    feeds["initial_state"] = initial_state
    attrs = {k: v for k, v in case.attributes.items() if k != "state_update_capacity"}
    return feeds, attrs


def check_capsule_replay(case, results=None):
    """replay_gdn of each row's capsule, for every captured prefix n, equals bitwise the op's final_state on
    those n tokens alone (the contract's replay rule)."""
    results = results or run_gdn(case)
    capacity = case.attributes["state_update_capacity"]
    for row, captured in enumerate(case.feeds["capture_count"]):
        initial = case.feeds["initial_state"][row:row + 1]
        for n in range(1, contract.captured_prefix(captured, capacity, case.lengths[row]) + 1):
            want = run_single_op(GDN, *_row_prefix(case, row, n, initial))["final_state"]
            state = initial.copy()
            replay.replay_gdn(state, results["state_update"][row:row + 1].copy(), n, capacity)
            np.testing.assert_array_equal(state, want, err_msg=f"row {row}, prefix {n}")


def check_decode_equals_verify(case, row=0):
    """Request `row` token by token (decode calls, each feeding back the previous final_state) equals, bit
    for bit, its outputs and final state in the whole call."""
    whole = run_gdn(case)
    start = int(np.sum(case.lengths[:row]))
    state = case.feeds["initial_state"][row:row + 1]
    for t in range(case.lengths[row]):
        feeds, attrs = _row_prefix(case, row, 1, state)
        for name in TOKEN_INPUTS:
            if name in feeds:
                feeds[name] = case.feeds[name][start + t:start + t + 1]
        step = run_single_op(GDN, feeds, attrs)
        np.testing.assert_array_equal(step["output"][0], whole["output"][start + t], err_msg=f"token {t}")
        state = step["final_state"]
    np.testing.assert_array_equal(state[0], whole["final_state"][row])


def check_subnormal_gdn(head_size_k: int, seed: int = 0):
    """A subnormal_gdn_case with a chunked row and three recurrent ones (captured): the float64 reference
    within tolerance, gradual underflow kept in the recurrent rows' states (the kernels flush subnormals
    while they run), bit-exact capsule replay, and decode == verify."""
    case = subnormal_gdn_case(np.random.default_rng(seed), [40, 6, 5, 1], head_size_k=head_size_k, capacity=6,
                              capture=[0, 6, 3, 1])
    results = check_gdn(case)
    assert is_subnormal(results["final_state"][1:, 2]).any(), "the recurrent rows' tiny head lost its subnormals"
    check_capsule_replay(case, results)
    check_decode_equals_verify(case, row=1)
