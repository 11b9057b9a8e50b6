"""Every rejection of docs/op-contract.md#rejections that applies to the CPU kernels: each case trips the rule it is
meant for, its message fills that rule's template in contract.MESSAGES, and an ORT session reports exactly the
message the contract's checks give for the same input (the library's shape checks, reached through ctypes: the
session path adds ORT's glue, which must hand them the same shapes)."""

import re

import numpy as np
import pytest

from native_util import CONV, GDN
from onnx_hybrid.ops import contract, reference
from onnx_hybrid_testing.single_op import make_session, run_single_op, single_op_model
from onnx_hybrid_testing.cases import DTYPES, random_conv_case, random_gdn_case, random_paged_attention_case


def gdn_base(**kw):
    return random_gdn_case(np.random.default_rng(0), kw.pop("lengths", [3, 5]), num_heads_q=2, num_heads_v=4,
                           head_size_k=16, head_size_v=8, **kw)


def with_(case, **changes):
    feeds = dict(case.feeds)
    feeds.update(changes)
    return feeds


def _gdn_cases():
    c = gdn_base()
    f = c.feeds
    t = f["query"].shape[0]
    packed = gdn_base(layout="packed")
    rank4 = gdn_base(lengths=[4, 4], layout="rank4")
    uniform = gdn_base(lengths=[4, 4], layout="uniform")
    per_key = gdn_base(per_key_decay=True)
    cap = gdn_base(capacity=2, capture=[1, 2])
    a = c.attributes
    none_gate = {**a, "gate_activation": "none"}
    return {
        "gdn_kv_presence": (with_(c, value=None), a),
        "gdn_rank": (with_(c, query=f["query"].reshape(t, -1), key=f["key"].reshape(t, -1),
                           value=f["value"].reshape(t, -1)), a),
        "gdn_packed_rank": (with_(packed, query=packed.feeds["query"][None, None]), a),
        "gdn_same_rank": (with_(c, key=f["key"][None]), a),
        "gdn_tokens_agree": (with_(c, key=f["key"][:-1]), a),
        "gdn_total_tokens": (with_(c, query=f["query"][:0], key=f["key"][:0], value=f["value"][:0],
                                   decay=f["decay"][:0], beta=f["beta"][:0],
                                   cu_seqlens=np.zeros(3, np.int32)), a),
        "gdn_head_size": (with_(c, key=f["key"][..., :8]), a),
        "gdn_heads_qk": (with_(c, key=np.concatenate([f["key"], f["key"][:, :1]], axis=1)), a),
        "gdn_heads_v": (with_(c, value=f["value"][:, :3], decay=f["decay"][:, :3], beta=f["beta"][:, :3],
                              a_log=f["a_log"][:3], dt_bias=f["dt_bias"][:3],
                              initial_state=f["initial_state"][:, :3]), a),
        "gdn_packed_needs_state": (with_(packed, initial_state=None), a),
        "gdn_packed_width": (with_(packed, query=packed.feeds["query"][:, :-3]), a),
        "gdn_cu_rank4": (with_(rank4, cu_seqlens=np.array([0, 4, 8], np.int32)), a),
        "gdn_cu_shape": (with_(c, cu_seqlens=np.array([0], np.int32)), a),
        "gdn_uniform_needs_state": (with_(uniform, initial_state=None), a),
        "gdn_uniform_divisible": (with_(uniform, initial_state=np.zeros((3, 4, 8, 16), np.float32)), a),
        "gdn_state_rank": (with_(c, initial_state=f["initial_state"][0]), a),
        "gdn_state_shape": (with_(c, initial_state=f["initial_state"][:, :, :4]), a),
        "gdn_decay_presence": (with_(c, decay=None), a),
        "gdn_beta_presence": (with_(c, beta=None), a),
        "gdn_decay_shape": (with_(c, decay=f["decay"][:, :3]), a),
        "gdn_decay_perkey": (with_(per_key, decay=per_key.feeds["decay"][..., :5]), a),
        "gdn_beta_shape": (with_(c, beta=f["beta"][:, :3]), a),
        "gdn_qwen_needs_gates": (with_(c, a_log=None), a),
        "gdn_gates_need_qwen": (f, none_gate),
        "gdn_a_log_shape": (with_(c, a_log=f["a_log"][:2]), a),
        "gdn_dt_bias_shape": (with_(c, dt_bias=np.zeros((4, 16), np.float32)), a),  # per-key dt_bias
        "capture_presence": (with_(cap, capture_count=None), cap.attributes),
        "gdn_capture_shape": (with_(cap, capture_count=np.zeros(3, np.int32)), cap.attributes),
        "gdn_capture_perkey": (with_(per_key, capture_count=np.ones(2, np.int32)),
                               {**per_key.attributes, "state_update_capacity": 2}),
        "gdn_active_shape": (with_(cap, state_update_active=np.ones(2, np.int32)), cap.attributes),
        "gdn_cu_bounds": (with_(c, cu_seqlens=np.array([1, 3, 8], np.int32)), a),
        "gdn_cu_order": (with_(c, cu_seqlens=np.array([0, 6, 3, 8], np.int32), initial_state=None), a),
    }


GDN_CASES = _gdn_cases()


def expected_error(function, feeds, attributes) -> contract.ContractError:
    with pytest.raises(contract.ContractError) as info:
        function({k: v for k, v in feeds.items() if v is not None}, **attributes)
    return info.value


def ours_error(op, feeds, attributes) -> str:
    with pytest.raises(Exception) as info:
        run_single_op(op, feeds, attributes, validate=False)
    return str(info.value)


MORE_GDN = {
    "decay given to a rule without decay": (lambda c: with_(c), {"update_rule": "delta"}),
    "capture_count with capacity 0": (lambda c: with_(c, capture_count=np.ones(2, np.int32)), {}),
    "negative offset": (lambda c: with_(c, cu_seqlens=np.array([0, -1, 8], np.int32)), {}),
    "offset past the end": (lambda c: with_(c, cu_seqlens=np.array([0, 9, 8], np.int32)), {}),
    "last offset short of T": (lambda c: with_(c, cu_seqlens=np.array([0, 3, 7], np.int32)), {}),
    # three rows against a two-row initial_state
    "cu_seqlens of the wrong length": (lambda c: with_(c, cu_seqlens=np.array([0, 3, 5, 8], np.int32)), {}),
}


@pytest.mark.parametrize("name", sorted(MORE_GDN))
def test_gdn_more_run_errors(name):
    make, extra = MORE_GDN[name]
    c = gdn_base()
    feeds, attributes = make(c), {**c.attributes, **extra}
    if extra.get("update_rule") == "delta":
        feeds = with_(c, a_log=None, dt_bias=None)
        attributes["gate_activation"] = "none"
    want = expected_error(reference.gated_delta_net, feeds, attributes)
    assert str(want) in ours_error(GDN, feeds, attributes)


@pytest.mark.parametrize("activation,decay,beta", [("float", "float16", "float16"), ("float16", "bfloat16", "bfloat16"),
                                                   ("float16", "float16", "float"), ("bfloat16", "float", "bfloat16")])
def test_gates_of_another_type_are_refused_with_the_contracts_message(activation, decay, beta):
    """decay and beta: float, or both of the activation type; the kernel checks it (ORT lets any type through to it)
    with the node builders' message."""
    case = random_gdn_case(np.random.default_rng(4), [3, 2], dtype=activation)
    feeds = {**case.feeds, "decay": case.feeds["decay"].astype(DTYPES[decay]),
             "beta": case.feeds["beta"].astype(DTYPES[beta])}
    names = {name: name for name in feeds}
    with pytest.raises(contract.ContractError) as want:
        contract.make_onnx_node(contract.GATED_DELTA_NET, names, ["output"], case.attributes,
                                types={"query": activation, "decay": decay, "beta": beta})
    assert want.value.key == "gate_type"
    assert str(want.value) in ours_error(GDN, feeds, case.attributes)


def _conv_cases():
    c = random_conv_case(np.random.default_rng(0), [3, 5], channels=6, kernel_size=4)
    f, a = c.feeds, c.attributes
    x = f["input"]
    cap = random_conv_case(np.random.default_rng(0), [3, 5], channels=6, kernel_size=4, capacity=2, capture=[1, 1])
    return {
        "conv_input_rank": (with_(c, input=x[None]), a),
        "conv_cu_rank": (with_(c, cumulative_sequence_length=f["cumulative_sequence_length"][None]), a),
        "conv_weight_rank": (with_(c, weight=f["weight"][:, 0]), a),
        "conv_cu_size": (with_(c, cumulative_sequence_length=np.array([0], np.int32)), a),
        "conv_channels": (with_(c, input=x[:, :0]), a),
        "conv_kernel_size": (with_(c, weight=f["weight"][..., :0]), a),
        "conv_weight_channels": (with_(c, weight=f["weight"][:5]), a),
        "conv_weight_middle": (with_(c, weight=np.concatenate([f["weight"]] * 2, axis=1)), a),
        "conv_bias_shape": (with_(c, bias=f["bias"][:5]), a),
        "conv_state_shape": (with_(c, initial_state=f["initial_state"][..., :2]), a),
        "conv_tokens_vs_batch": (with_(c, input=x[:1], cumulative_sequence_length=np.array([0, 1, 1], np.int32)), a),
        "capture_presence": (with_(cap, capture_count=None), cap.attributes),
        "conv_capture_shape": (with_(cap, capture_count=np.zeros(3, np.int32)), cap.attributes),
        "conv_cu_bounds": (with_(c, cumulative_sequence_length=np.array([0, 3, 9], np.int32)), a),
        "conv_cu_order": (with_(c, cumulative_sequence_length=np.array([0, 9, 8], np.int32)), a),
    }


CONV_CASES = _conv_cases()


@pytest.mark.parametrize("op,key", [(GDN, k) for k in sorted(GDN_CASES)] + [(CONV, k) for k in sorted(CONV_CASES)])
def test_run_errors(op, key):
    cases, oracle = (GDN_CASES, reference.gated_delta_net) if op == GDN else (CONV_CASES, reference.varlen_causal_conv)
    feeds, attributes = cases[key]
    want = expected_error(oracle, feeds, attributes)
    assert want.key == key, f"the case meant for {key} trips {want.key} in the contract"
    assert fills_template(str(want), op, key), str(want)
    assert str(want) in ours_error(op, feeds, attributes)


def fills_template(message: str, op: str, key: str) -> bool:
    """``message`` is "op: " + MESSAGES[key] with each {n} filled by some text."""
    parts = re.split(r"\{\d+\}", contract.MESSAGES[key])
    return re.fullmatch(re.escape(f"{op}: ") + ".+?".join(re.escape(p) for p in parts), message, re.S) is not None


@pytest.mark.parametrize("name", ["cumulative_sequence_length", "initial_state"])
def test_conv_required_inputs_rejected_at_load(name):
    """Required in the op declaration (contract ports), so ORT refuses the node before any kernel runs."""
    c = random_conv_case(np.random.default_rng(0), [3, 5])
    model = single_op_model(CONV, with_(c, **{name: None}), c.attributes, validate=False)
    with pytest.raises(Exception, match=CONV):
        make_session(model)


ATTRIBUTE_CASES = [
    (GDN, "update_rule", "fancy", "gdn_update_rule"),
    (GDN, "gate_activation", "softplus", "gdn_gate_activation"),
    (GDN, "beta_activation", "tanh", "gdn_beta_activation"),
    (GDN, "chunk_size", 0, "chunk_size"),
    (GDN, "state_update_capacity", 9, "capacity"),
    (GDN, "state_update_capacity", -1, "capacity"),
    (CONV, "activation", "relu", "conv_activation"),
    (CONV, "dilation", 0, "conv_dilation"),
    (CONV, "state_update_capacity", 9, "capacity"),
]


@pytest.mark.parametrize("op,name,value,key", ATTRIBUTE_CASES)
def test_attribute_errors_at_session_creation(op, name, value, key):
    case = gdn_base() if op == GDN else random_conv_case(np.random.default_rng(0), [3, 5])
    attributes = {**case.attributes, name: value}
    with pytest.raises(contract.ContractError) as want:
        contract.resolve_attributes(contract.OPS[op], attributes)
    assert want.value.key == key
    model = single_op_model(op, case.feeds, attributes, validate=False)
    with pytest.raises(Exception) as got:
        make_session(model)  # kernel creation happens while the session is created
    assert str(want.value) in str(got.value)
    assert contract.format_message(op, key, value) in str(got.value)


@pytest.mark.parametrize("value", [float("inf"), float("nan")])
@pytest.mark.parametrize("op", [GDN, contract.PAGED_ATTENTION.name])
def test_non_finite_scale_rejected_at_session_creation(op, value):
    if op == GDN:
        case = gdn_base()
    else:
        case = random_paged_attention_case(np.random.default_rng(0), [2], [0], num_heads=4, kv_num_heads=2)
    attributes = {**case.attributes, "scale": value}
    with pytest.raises(ValueError) as want:
        contract.resolve_attributes(contract.OPS[op], attributes)
    model = single_op_model(op, case.feeds, attributes, validate=False)
    with pytest.raises(Exception) as got:
        make_session(model)
    assert str(want.value) in str(got.value)


@pytest.mark.parametrize("op,name", [(GDN, "query"), (GDN, "cu_seqlens"), (CONV, "weight")])
def test_rank_beyond_the_inline_shape_is_named(op, name):
    """The library reads shapes into an inline array of 8 dims (no heap on the per-call path); a deeper input
    is refused by name before any contract check, with its rank."""
    case = gdn_base() if op == GDN else random_conv_case(np.random.default_rng(0), [3, 5])
    feeds = with_(case, **{name: case.feeds[name].reshape((1,) * 8 + case.feeds[name].shape)})
    message = ours_error(op, feeds, case.attributes)
    rank = 8 + case.feeds[name].ndim
    assert f"{op}: input '{name}' has rank {rank}; the contract's tensors have rank 4 at most" in message
