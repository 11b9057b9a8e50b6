"""Helpers shared by the native-library tests: run a case through our kernels and compare with the
float64 reference under the tolerances of spec/ops.md §5."""

from __future__ import annotations

import numpy as np

from onnx_hybrid.ops import contract, reference
from onnx_hybrid.ops.single_op import make_session, run_session, run_single_op, single_op_model, to_ort_value

# fp32: the project rule (≤ 1e-5 against float64). fp16/bf16: ORT's chunked GDN calibration (3e-2),
# which also covers bf16's coarser output rounding (2^-9 relative) for unit-scale outputs.
TOLERANCE = {"float": 1e-5, "float16": 3e-2, "bfloat16": 3e-2}
GDN = contract.GATED_DELTA_NET.name
CONV = contract.VARLEN_CAUSAL_CONV.name
GDN_OUTPUTS = [p.name for p in contract.GATED_DELTA_NET.outputs]
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
