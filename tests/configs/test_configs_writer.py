"""The state_groups writer against the example configs (fixtures/genai_configs: builder_paged_released,
builder_paged_bindings; docs/genai-config.md#released-form, #bindings-form)."""

from __future__ import annotations

import json

import pytest
from configs_helpers import load_fixture

from onnx_hybrid.configs import validate_config
from onnx_hybrid.configs.state_groups import (
    BINDINGS, EXPORTER_NAMES, FULL_ATTENTION as FULL, LINEAR_ATTENTION as LINEAR, RELEASED, DecoderStates,
    NotExpressible, StateGroup, StateManifest, Binding, manifest_for, write_state_groups,
)

BUILDER_LAYERS = (LINEAR, LINEAR, LINEAR, FULL)


def bare_decoder() -> dict:
    """The builder fixture's decoder with everything the writer owns removed."""
    decoder = load_fixture("builder_paged_released")["model"]["decoder"]
    for key in ("state_groups", "state_update_capacity"):
        decoder.pop(key)
    for key in ("past_conv_names", "past_recurrent_names", "past_key_names", "past_value_names",
                "state_update_capture_count", "state_update_active"):
        decoder["inputs"].pop(key)
    for key in ("present_conv_names", "present_recurrent_names", "present_key_names", "present_value_names",
                "state_update_conv_value_names", "state_update_recurrent_capsule_names"):
        decoder["outputs"].pop(key)
    return decoder


def test_released_form_is_the_0_18_builders_output():
    decoder = write_state_groups(bare_decoder(), manifest_for(
        DecoderStates(BUILDER_LAYERS, key_head_count=2, capacity=3, paged=True)), RELEASED)
    assert decoder == load_fixture("builder_paged_released")["model"]["decoder"]


def test_bindings_form_is_the_2453_builders_output():
    decoder = write_state_groups(bare_decoder(), manifest_for(
        DecoderStates(BUILDER_LAYERS, key_head_count=2, capacity=3, paged=True)), BINDINGS)
    expected = load_fixture("builder_paged_bindings")["model"]["decoder"]
    assert decoder["state_groups"] == expected["state_groups"]
    assert "state_update_capacity" not in decoder
    assert not {"state_update_capture_count", "state_update_active"} & set(decoder["inputs"])


def test_capacity_zero_writes_no_update_contract():
    decoder = write_state_groups(bare_decoder(), manifest_for(
        DecoderStates(BUILDER_LAYERS, key_head_count=2, capacity=0, paged=True)), RELEASED)
    assert decoder["state_groups"] == [
        {"kind": "paged_kv", "layer_ids": [3]},
        {"kind": "fixed_conv", "layer_ids": [0, 1, 2]},
        {"kind": "fixed_recurrent", "layer_ids": [0, 1, 2]},
    ]
    assert "state_update_capacity" not in decoder
    names = set(decoder["inputs"]) | set(decoder["outputs"])
    assert not {"state_update_capture_count", "state_update_active", "state_update_conv_value_names",
                "state_update_recurrent_capsule_names"} & names
    assert validate_config({"model": {"decoder": decoder}}).ok


def test_non_paged_export_has_only_fixed_groups_with_exporter_names():
    layers = (LINEAR, FULL, LINEAR, FULL)
    decoder = write_state_groups({"num_hidden_layers": 4}, manifest_for(
        DecoderStates(layers, key_head_count=2, capacity=2)), RELEASED)
    assert [g["kind"] for g in decoder["state_groups"]] == ["fixed_conv", "fixed_recurrent"]
    assert all(g["layer_ids"] == [0, 2] for g in decoder["state_groups"])
    assert decoder["inputs"]["past_conv_names"] == EXPORTER_NAMES.past_conv_names == "past.%d.conv"
    assert decoder["outputs"]["state_update_recurrent_capsule_names"] == "state_update.%d.recurrent_capsule"
    assert decoder["state_update_capacity"] == 2
    assert validate_config({"model": {"decoder": decoder}}).ok


def test_rewriting_replaces_the_previous_contract():
    decoder = bare_decoder()
    write_state_groups(decoder, manifest_for(DecoderStates(BUILDER_LAYERS, 2, capacity=3, paged=True)), BINDINGS)
    write_state_groups(decoder, manifest_for(DecoderStates(BUILDER_LAYERS, 2, capacity=0, paged=True)), RELEASED)
    assert "state_update" not in json.dumps(decoder["state_groups"])
    assert "state_update_capacity" not in decoder


def test_released_form_cannot_hold_two_templates_for_one_role():
    conv = {"state": Binding("a.%d", "b.%d")}
    other = {"state": Binding("c.%d", "d.%d")}
    manifest = StateManifest((StateGroup("fixed_conv", (0,), conv), StateGroup("fixed_conv", (1,), other)))
    with pytest.raises(NotExpressible, match="past_conv_names"):
        write_state_groups({}, manifest, RELEASED)
    assert len(write_state_groups({}, manifest, BINDINGS)["state_groups"]) == 2


@pytest.mark.parametrize("kwargs, message", [
    ({"layer_types": ("linear_attention", "mamba"), "key_head_count": 2}, "mamba"),
    ({"layer_types": (LINEAR,), "key_head_count": 2, "capacity": 9}, r"\[0, 8\]"),
    ({"layer_types": (LINEAR,), "key_head_count": 0}, "key_head_count"),
])
def test_bad_descriptions_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DecoderStates(**kwargs)
