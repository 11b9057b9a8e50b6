"""The operator contract module: attribute rules, shape resolution, capsule layout, node builders."""

import re

import numpy as np
import pytest

from onnx_hybrid.ops import contract as C


def test_every_message_formats_with_its_placeholders():
    for key, template in C.MESSAGES.items():
        fields = {int(i) for i in re.findall(r"{(\d+)}", template)}
        assert fields == set(range(len(fields))), f"{key}: placeholders must be {{0}}..{{n-1}}"
        text = C.format_message("Op", key, *[f"<{i}>" for i in range(len(fields))])
        assert text.startswith("Op: ") and "{" not in text


@pytest.mark.parametrize("op", [C.GATED_DELTA_NET, C.VARLEN_CAUSAL_CONV])
def test_capacity_range(op):
    assert C.resolve_attributes(op, {"state_update_capacity": 8})["state_update_capacity"] == 8
    with pytest.raises(C.ContractError, match=r"state_update_capacity must be in \[0, 8\], got 9"):
        C.resolve_attributes(op, {"state_update_capacity": 9})
    with pytest.raises(C.ContractError, match="got -1"):
        C.resolve_attributes(op, {"state_update_capacity": -1})


@pytest.mark.parametrize(
    "op, attrs, pattern",
    [
        (C.GATED_DELTA_NET, {"update_rule": "delta2"}, "update_rule must be one of: linear, gated, delta, gated_delta; got 'delta2'"),
        (C.GATED_DELTA_NET, {"gate_activation": "softplus"}, "gate_activation must be one of: none, qwen"),
        (C.GATED_DELTA_NET, {"beta_activation": "tanh"}, "beta_activation must be one of: none, sigmoid"),
        (C.GATED_DELTA_NET, {"chunk_size": 0}, "chunk_size must be positive and fit in int32, got 0"),
        (C.VARLEN_CAUSAL_CONV, {"activation": "gelu"}, "activation must be one of: none, silu, swish"),
        (C.VARLEN_CAUSAL_CONV, {"dilation": 0}, "dilation must be >= 1, got 0"),
    ],
)
def test_bad_attributes(op, attrs, pattern):
    with pytest.raises(C.ContractError, match=re.escape(pattern)):
        C.resolve_attributes(op, attrs)


def test_defaults_match_spec():
    gdn = C.resolve_attributes(C.GATED_DELTA_NET, {})
    assert gdn == {"update_rule": "gated_delta", "scale": 0.0, "gate_activation": "none", "beta_activation": "none",
                   "qk_l2_norm": 0, "chunk_size": 64, "state_update_capacity": 0}
    assert C.resolve_attributes(C.VARLEN_CAUSAL_CONV, {}) == {"activation": "none", "dilation": 1,
                                                               "state_update_capacity": 0}
    assert [p.name for p in C.GATED_DELTA_NET.inputs] == [
        "query", "key", "value", "cu_seqlens", "decay", "beta", "initial_state", "a_log", "dt_bias",
        "capture_count", "state_update_active"]
    assert C.GATED_DELTA_NET.input("state_update_active").host_memory


def test_capsule_layout_worked_example():
    # The example of docs/op-contract.md#capsule-layout: 27B geometry, C = 7.
    layout = C.GdnCapsuleLayout(capacity=7, num_heads_v=48, num_heads_k=16, head_size_k=128, head_size_v=128)
    assert (layout.key_offset, layout.delta_offset, layout.width) == (336, 14672, 57680)
    row = np.arange(layout.width, dtype=np.float32)
    decay, key, delta = layout.split(row)
    assert decay.shape == (7, 48) and key.shape == (7, 16, 128) and delta.shape == (7, 48, 128)
    assert key[1, 2, 3] == 336 + (1 * 16 + 2) * 128 + 3
    assert delta[2, 5, 7] == 14672 + (2 * 48 + 5) * 128 + 7


@pytest.mark.parametrize("count, capacity, length, expected", [(-1, 4, 3, 0), (9, 4, 5, 4), (2, 4, 1, 1), (3, 4, 9, 3)])
def test_captured_prefix(count, capacity, length, expected):
    assert C.captured_prefix(count, capacity, length) == expected


GDN_ATTRS = C.resolve_attributes(C.GATED_DELTA_NET, {"gate_activation": "qwen", "state_update_capacity": 2})
GOOD = {"query": (10, 2, 16), "key": (10, 2, 16), "value": (10, 6, 8), "cu_seqlens": (3,), "decay": (10, 6),
        "beta": (10, 6), "a_log": (6,), "dt_bias": (6,), "capture_count": (2,)}


def test_resolve_ragged_geometry():
    geo = C.resolve_gdn(GOOD, GDN_ATTRS)
    assert (geo.layout, geo.batch, geo.total_tokens, geo.group) == ("ragged", 2, 10, 3)
    assert geo.output_shape == (10, 6, 8) and geo.state_shape == (2, 6, 8, 16)
    assert geo.capsule_width == 2 * (6 + 2 * 16 + 6 * 8)


def test_resolve_packed_geometry():
    shapes = dict(GOOD, query=(5, 2, 2 * 2 * 16 + 6 * 8), key=None, value=None, cu_seqlens=None,
                  decay=(5, 2, 6), beta=(5, 2, 6), initial_state=(5, 6, 8, 16), capture_count=(5,))
    geo = C.resolve_gdn(shapes, GDN_ATTRS)
    assert (geo.layout, geo.num_heads_q, geo.output_shape) == ("packed_rank3", 2, (5, 2, 6, 8))


@pytest.mark.parametrize(
    "change, pattern",
    [
        ({"key": (10, 3, 16)}, "num_heads_q (2) must equal num_heads_k (3)"),
        ({"value": (10, 5, 8)}, "num_heads_v (5) must be a positive multiple of num_heads_q (2)"),
        ({"key": (10, 2, 8)}, "key head_size must equal query head_size: expected 16, got 8"),
        ({"value": None}, "key and value must be both present or both absent; got key present, value absent"),
        ({"query": (10, 2, 16, 1)}, "query, key and value must have the same rank; got query 4, key 3, value 3"),
        ({"value": (11, 6, 8)}, "query, key and value must agree on total_tokens; got query [10], key [10], value [11]"),
        ({"cu_seqlens": (1,)}, "cu_seqlens must be rank 1 with at least 2 elements; got shape [1]"),
        ({"decay": None}, "decay input presence must match update_rule: update_rule 'gated_delta' requires decay"),
        ({"decay": (10, 6, 15)}, "per-key-dim decay last axis must be head_size_qk: expected 16, got 15"),
        ({"beta": (10, 2)}, "beta must be [...tokens, num_heads_v]: expected [10, 6], got [10, 2]"),
        ({"dt_bias": None}, "gate_activation=qwen requires a_log and dt_bias; got a_log present, dt_bias absent"),
        ({"dt_bias": (6, 16)}, "dt_bias must be [num_heads_v]: expected [6], got [6, 16]"),
        ({"capture_count": None}, "capture_count must be present exactly when state_update_capacity is positive"),
        ({"capture_count": (3,)}, "capture_count must be [batch]: expected [2], got [3]"),
        ({"decay": (10, 6, 16)}, "transition capture does not support per-key-dimension decay"),
        ({"state_update_active": (2,)}, "state_update_active must be [1], got [2]"),
        ({"initial_state": (2, 6, 16, 8)}, "initial_state must be [batch, num_heads_v, head_size_v, head_size_qk] (V-major): expected [2, 6, 8, 16], got [2, 6, 16, 8]"),
        ({"cu_seqlens": None}, "cu_seqlens is absent, so initial_state is required to determine batch size"),
        ({"cu_seqlens": None, "initial_state": (3, 6, 8, 16), "capture_count": (3,)}, "total_tokens (10) must be divisible by batch (3)"),
    ],
)
def test_gdn_shape_rejections(change, pattern):
    with pytest.raises(C.ContractError, match=re.escape(pattern)):
        C.resolve_gdn(dict(GOOD, **change), GDN_ATTRS)


def test_offsets():
    assert C.check_offsets("GatedDeltaNet", [0, 3, 3, 8], 8) == [(0, 3), (3, 0), (3, 5)]
    with pytest.raises(C.ContractError, match=re.escape("cu_seqlens must be non-decreasing: cu_seqlens[2] = 2 follows cu_seqlens[1] = 5")):
        C.check_offsets("GatedDeltaNet", [0, 5, 2, 8], 8)
    with pytest.raises(C.ContractError, match=re.escape("expected cu_seqlens[0] = 0 and cu_seqlens[2] = 8, got 0 and 9")):
        C.check_offsets("GatedDeltaNet", [0, 5, 9], 8)
    with pytest.raises(C.ContractError, match="cumulative_sequence_length must start at 0"):
        C.check_offsets("VarlenCausalConvWithState", [-1, 5, 8], 8)


def test_node_builder_positions_and_defaults():
    node = C.make_onnx_node(
        "GatedDeltaNet",
        {"query": "q", "key": "k", "value": "v", "decay": "a", "beta": "b", "initial_state": "s", "a_log": "al",
         "dt_bias": "dt", "capture_count": "cc", "state_update_active": "act"},
        ["o", "s_out", "cap"],
        {"gate_activation": "qwen", "beta_activation": "sigmoid", "qk_l2_norm": 1, "update_rule": "gated_delta",
         "scale": 0.0, "chunk_size": 64, "state_update_capacity": 3},
    )
    assert list(node.input) == ["q", "k", "v", "", "a", "b", "s", "al", "dt", "cc", "act"]
    assert {a.name for a in node.attribute} == {"gate_activation", "beta_activation", "qk_l2_norm",
                                                "state_update_capacity"}
    assert node.domain == C.DOMAIN
    conv = C.make_onnx_node("VarlenCausalConvWithState",
                            {"input": "x", "weight": "w", "cumulative_sequence_length": "cu", "initial_state": "s"},
                            {"output": "y", "final_state": "s2"}, {"activation": "silu"}, domain=C.MS_DOMAIN)
    assert list(conv.input) == ["x", "w", "cu", "", "s"] and list(conv.output) == ["y", "s2"]
    assert conv.domain == C.MS_DOMAIN


@pytest.mark.parametrize(
    "inputs, attrs, pattern",
    [
        ({"query": "q", "key": "k", "value": "v"}, {}, "update_rule 'gated_delta' requires decay"),
        ({"query": "q", "key": "k", "value": "v", "decay": "d", "beta": "b"}, {"state_update_capacity": 2},
         "capture_count must be present exactly when state_update_capacity is positive"),
        ({"query": "q", "key": "k", "value": "v", "decay": "d", "beta": "b", "a_log": "a"}, {},
         "a_log and dt_bias require gate_activation=qwen"),
        ({"query": "q", "key": "k", "decay": "d", "beta": "b"}, {}, "key and value must be both present or both absent"),
    ],
)
def test_node_builder_rejects_inconsistent_nodes(inputs, attrs, pattern):
    with pytest.raises(C.ContractError, match=re.escape(pattern)):
        C.make_onnx_node("GatedDeltaNet", inputs, ["o"], attrs)


def test_ir_node_builder():
    import onnx_ir as ir

    vals = {n: ir.Value(name=n) for n in ("x", "w", "cu", "s")}
    y, s2 = ir.Value(name="y"), ir.Value(name="s2")
    node = C.make_ir_node("VarlenCausalConvWithState",
                          {"input": vals["x"], "weight": vals["w"], "cumulative_sequence_length": vals["cu"],
                           "initial_state": vals["s"]}, [y, s2], {"activation": "silu"})
    assert node.op_type == "VarlenCausalConvWithState" and node.domain == C.DOMAIN
    assert [v.name if v is not None else None for v in node.inputs] == ["x", "w", "cu", None, "s"]
    assert list(node.outputs) == [y, s2] and node.attributes["activation"].value == "silu"


GDN_INPUTS = {"query": "q", "key": "k", "value": "v", "decay": "d", "beta": "b", "initial_state": "s"}
GDN_TYPES = {"query": "float16", "key": "float16", "value": "float16", "decay": "float", "beta": "float",
             "initial_state": "float"}


@pytest.mark.parametrize(
    "op, inputs, types, pattern",
    [
        ("GatedDeltaNet", GDN_INPUTS, {**GDN_TYPES, "key": "float"},
         "GatedDeltaNet: key must have the activation type T of query: expected float16, got float"),
        ("GatedDeltaNet", GDN_INPUTS, {**GDN_TYPES, "decay": "bfloat16"},
         "GatedDeltaNet: decay and beta must be float, or both of the activation type float16: got decay bfloat16, "
         "beta float"),
        ("GatedDeltaNet", GDN_INPUTS, {**GDN_TYPES, "decay": "float16"},
         "GatedDeltaNet: decay and beta must be float, or both of the activation type float16: got decay float16, "
         "beta float"),
        ("GatedDeltaNet", GDN_INPUTS, {**GDN_TYPES, "query": "float", "key": "float", "value": "float",
                                       "decay": "float16", "beta": "float16"},
         "GatedDeltaNet: decay and beta must be float, or both of the activation type float: got decay float16, "
         "beta float16"),
        ("GatedDeltaNet", GDN_INPUTS, {**GDN_TYPES, "query": "double", "key": "double", "value": "double"},
         "GatedDeltaNet: query must be one of float, float16, bfloat16 (the activation type T), got double"),
        ("VarlenCausalConvWithState", {"input": "x", "weight": "w", "cumulative_sequence_length": "cu", "initial_state": "s"},
         {"input": "bfloat16", "weight": "bfloat16", "cumulative_sequence_length": "int64", "initial_state": "bfloat16"},
         "VarlenCausalConvWithState: cumulative_sequence_length must be int32, got int64"),
        ("VarlenCausalConvWithState", {"input": "x", "weight": "w", "cumulative_sequence_length": "cu", "initial_state": "s"},
         {"input": "float16", "weight": "float16", "initial_state": "float"},
         "VarlenCausalConvWithState: initial_state must have the activation type T of input: expected float16, got float"),
        ("PagedAttention", {p.name: p.name for p in C.PAGED_ATTENTION.inputs},
         {"query": "float", "key": "float", "value": "float", "key_cache": "float16"},
         "PagedAttention: key_cache must have the activation type T of query: expected float, got float16"),
    ],
)
def test_node_builders_name_the_input_of_the_wrong_type(op, inputs, types, pattern):
    attrs = {"num_heads": 2, "kv_num_heads": 1} if op == "PagedAttention" else {}
    with pytest.raises(C.ContractError, match=re.escape(pattern)):
        C.make_onnx_node(op, inputs, ["o", "s2", "s3"], attrs, types=types)


def test_node_builders_accept_agreeing_and_unknown_types():
    C.make_onnx_node("GatedDeltaNet", GDN_INPUTS, ["o"], types=GDN_TYPES)
    C.make_onnx_node("GatedDeltaNet", GDN_INPUTS, ["o"], types={**GDN_TYPES, "decay": "float16", "beta": "float16"})
    C.make_onnx_node("GatedDeltaNet", GDN_INPUTS, ["o"], types={"query": "bfloat16", "key": None, "decay": "float"})
    # A type given for an omitted input is not the node's business.
    C.make_onnx_node("GatedDeltaNet", GDN_INPUTS, ["o"], types={**GDN_TYPES, "cu_seqlens": "int64"})


def test_ir_node_builder_checks_the_types_its_values_carry():
    import onnx_ir as ir

    def value(name, dtype=None):
        return ir.Value(name=name, type=ir.TensorType(dtype) if dtype else None)

    inputs = {"input": value("x", ir.DataType.FLOAT16), "weight": value("w", ir.DataType.FLOAT16),
              "cumulative_sequence_length": value("cu", ir.DataType.INT32), "initial_state": value("s")}
    C.make_ir_node("VarlenCausalConvWithState", inputs, [value("y"), value("s2")])  # untyped state: unchecked
    inputs["initial_state"] = value("s", ir.DataType.FLOAT)
    with pytest.raises(C.ContractError, match=re.escape(
            "initial_state must have the activation type T of input: expected float16, got float")):
        C.make_ir_node("VarlenCausalConvWithState", inputs, [value("y"), value("s2")])
    # Untyped values are followed back through their producers: here a Reshape of a Cast to fp32.
    tape = ir.tape.Tape()
    shape = ir.Value(name="shape", type=ir.TensorType(ir.DataType.INT64))
    inputs.update(input=tape.op("Reshape", [tape.op("Cast", [value("raw")], {"to": ir.DataType.FLOAT}), shape]),
                  initial_state=value("s", ir.DataType.FLOAT16))
    with pytest.raises(C.ContractError, match=re.escape(
            "weight must have the activation type T of input: expected float, got float16")):
        C.make_ir_node("VarlenCausalConvWithState", inputs, [value("y"), value("s2")])


def test_single_op_model_rejects_mixed_types_before_onnx_runtime():
    """ORT's own answer to fp16 query with fp32 key is `no kernel def matches node`, naming no tensor."""
    from onnx_hybrid_testing.single_op import single_op_model

    f16, f32 = np.float16, np.float32
    feeds = {"query": np.zeros((1, 2, 2, 4), f16), "key": np.zeros((1, 2, 2, 4), f32),
             "value": np.zeros((1, 2, 2, 4), f16), "decay": np.zeros((1, 2, 2), f32), "beta": np.zeros((1, 2, 2), f32),
             "initial_state": np.zeros((1, 2, 4, 4), f32)}
    with pytest.raises(C.ContractError, match=re.escape(
            "GatedDeltaNet: key must have the activation type T of query: expected float16, got float")):
        single_op_model("GatedDeltaNet", feeds)
    single_op_model("GatedDeltaNet", {**feeds, "key": feeds["key"].astype(f16)})
