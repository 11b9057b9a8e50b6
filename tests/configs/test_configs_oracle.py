"""Our validator against onnxruntime-genai 0.18.0 itself.

* Config level: for each mutation of a valid released-form config, ``og.Config`` (parse + ValidateConfig)
  and our parse/config findings must agree on accept/reject, and when og rejects, its message must be
  one of ours (verbatim). Where we are deliberately stricter, the mutation says so and our rule id.
* Graph level: ``og.Model`` applies ValidateSession to the declared graph I/O (it runs on CPU for these
  I/O-only graphs). For each graph mutation, og.Model and our session findings must agree, with og's
  message among ours; ``og.Config`` accepts every one of them (it cannot see the graph).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import pytest
from configs_helpers import (
    F16, F32, I32, I64, builder_paged_io, load_fixture, mutated, synthetic_hybrid_io, synthetic_paged_io,
    write_export,
)

from onnx_hybrid.configs import validate, validate_config
from onnx_hybrid.configs.findings import CONFIG, PARSE, SESSION

og = pytest.importorskip("onnxruntime_genai")


def og_config_error(directory) -> str | None:
    try:
        og.Config(str(directory))
    except Exception as error:  # og raises RuntimeError with the runtime's message
        return str(error)
    return None


def og_model_error(directory) -> str | None:
    try:
        config = og.Config(str(directory))
        config.clear_providers()  # CPU: the builder fixture names the CUDA provider
        og.Model(config)
    except Exception as error:
        return str(error)
    return None


def runtime_findings(report, *stages):
    """Findings of rules the runtime also has (ours are prefixed ``x.`` and excluded)."""
    return [f for f in report.errors_at(*stages) if not f.rule.startswith("x.")]


# --------------------------------------------------------------------------------------------------
# Config-level mutations of the 0.18.0 builder's paged config (docs/genai-config.md#config-rules)
# --------------------------------------------------------------------------------------------------


def dec(c):
    return c["model"]["decoder"]


def grp(c, i):
    return dec(c)["state_groups"][i]


def upd(c, i):
    return grp(c, i)["state_update"]


@dataclass(frozen=True)
class Mutation:
    name: str
    edit: Callable[[dict], None]
    og_accepts: bool
    ours_only: str | None = None  # our rule that rejects what 0.18.0 accepts


CONFIG_MUTATIONS = [
    Mutation("as generated", lambda c: None, True),
    Mutation("bindings-form groups", lambda c: dec(c).update(
        state_groups=load_fixture("builder_paged_bindings")["model"]["decoder"]["state_groups"]), False),
    Mutation("kind fixed without bindings", lambda c: grp(c, 1).update(kind="fixed"), False),
    Mutation("kind unknown", lambda c: grp(c, 1).update(kind="unknown"), False),
    Mutation("kind not a string", lambda c: grp(c, 1).update(kind=3), False),
    Mutation("kind removed", lambda c: grp(c, 1).pop("kind"), False),
    Mutation("state_groups empty", lambda c: dec(c).update(state_groups=[]), False),
    Mutation("state_groups not an array", lambda c: dec(c).update(state_groups={}), False),
    Mutation("group not an object", lambda c: dec(c)["state_groups"].append(3), False),
    Mutation("layer_ids empty", lambda c: grp(c, 0).update(layer_ids=[]), False),
    Mutation("layer_ids not an array", lambda c: grp(c, 0).update(layer_ids=3), False),
    Mutation("layer id not an integer", lambda c: grp(c, 1).update(layer_ids=[0, 1.5]), False),
    Mutation("layer id out of range", lambda c: grp(c, 1).update(layer_ids=[0, 1, 7]), False),
    Mutation("layer id negative", lambda c: grp(c, 0).update(layer_ids=[-1]), False),
    Mutation("num_hidden_layers missing", lambda c: dec(c).pop("num_hidden_layers"), False),
    Mutation("duplicate layer id", lambda c: grp(c, 1).update(layer_ids=[0, 1, 1]), False),
    Mutation("unsorted layer ids", lambda c: [grp(c, i).update(layer_ids=[2, 0, 1]) for i in (1, 2)], True),
    Mutation("overlapping paged_kv groups", lambda c: dec(c)["state_groups"].append(
        {"kind": "paged_kv", "layer_ids": [3]}), False),
    Mutation("two disjoint paged_kv groups (the Engine rejects)", lambda c: dec(c)["state_groups"].append(
        {"kind": "paged_kv", "layer_ids": [2]}), True),
    Mutation("fixed_conv on the attention layer (og.Model rejects)",
             lambda c: grp(c, 1).update(layer_ids=[0, 1, 2, 3]), True),
    Mutation("capacity 9", lambda c: upd(c, 1).update(capacity=9), False),
    Mutation("capacity 0", lambda c: upd(c, 1).update(capacity=0), False),
    Mutation("capacity not an integer", lambda c: upd(c, 1).update(capacity=2.5), False),
    Mutation("capacity a bool", lambda c: upd(c, 1).update(capacity=True), False),
    Mutation("capacity omitted", lambda c: upd(c, 1).pop("capacity"), False),
    Mutation("capacities 3 vs 2", lambda c: upd(c, 2).update(capacity=2), False),
    Mutation("fixed_recurrent without key_head_count", lambda c: upd(c, 2).pop("key_head_count"), False),
    Mutation("key_head_count 0", lambda c: upd(c, 2).update(key_head_count=0), False),
    Mutation("fixed_conv with key_head_count", lambda c: upd(c, 1).update(key_head_count=2), False),
    Mutation("only one fixed group has state_update", lambda c: grp(c, 1).pop("state_update"), False),
    Mutation("state_update on paged_kv", lambda c: grp(c, 0).update(state_update={"capacity": 3}), False),
    Mutation("state_update not an object", lambda c: grp(c, 1).update(state_update=3), False),
    Mutation("enabled false on one group", lambda c: upd(c, 2).update(enabled=False), False),
    Mutation("enabled false on both", lambda c: [upd(c, i).update(enabled=False) for i in (1, 2)], True),
    Mutation("enabled a string", lambda c: upd(c, 1).update(enabled="yes"), False),
    Mutation("capture_count a template", lambda c: dec(c)["inputs"].update(state_update_capture_count="x.%d"),
             False),
    Mutation("capture_count empty", lambda c: dec(c)["inputs"].update(state_update_capture_count=""), False),
    Mutation("active a template", lambda c: dec(c)["inputs"].update(state_update_active="a.%d"), False),
    Mutation("active declared absent", lambda c: dec(c)["inputs"].update(state_update_active=""), True),
    Mutation("capture keys removed (defaults)", lambda c: [dec(c)["inputs"].pop(k) for k in (
        "state_update_capture_count", "state_update_active")], True),
    Mutation("conv template without %d", lambda c: dec(c)["inputs"].update(past_conv_names="past.conv"), False),
    Mutation("template with two %d", lambda c: dec(c)["outputs"].update(present_conv_names="present.%d.%d"),
             False),
    Mutation("template with %s", lambda c: dec(c)["outputs"].update(present_conv_names="present.%d.conv%s"),
             False),
    Mutation("template empty", lambda c: dec(c)["outputs"].update(present_conv_names=""), False),
    Mutation("template not a string", lambda c: dec(c)["inputs"].update(past_conv_names=5), False),
    Mutation("capsule template without %d", lambda c: dec(c)["outputs"].update(
        state_update_recurrent_capsule_names="caps"), False),
    Mutation("update output equal to a state output", lambda c: dec(c)["outputs"].update(
        state_update_recurrent_capsule_names="present.%d.recurrent"), False),
    Mutation("expanded names collide across kinds", lambda c: dec(c)["inputs"].update(
        past_recurrent_names="past.%d.conv"), False),
    *[Mutation(f"legacy state_update field {field}", lambda c, f=field: upd(c, 1).update({f: "x.%d"}), False)
      for field in ("kind", "value", "capsule", "active", "capture_count")],
    Mutation("legacy bindings in one group", lambda c: grp(c, 0).update(
        bindings={"key": {"input": "a.%d", "output": "b.%d"}}), False),
    Mutation("checkpoint_count in a group", lambda c: grp(c, 1).update(checkpoint_count=2), False),
    Mutation("unknown group key", lambda c: grp(c, 1).update(foo=1), False),
    Mutation("unknown state_update key", lambda c: upd(c, 1).update(foo=1), False),
    Mutation("decoder state_update_capacity 9", lambda c: dec(c).update(state_update_capacity=9), False),
    Mutation("decoder state_update_capacity 0 while groups have 3",
             lambda c: dec(c).update(state_update_capacity=0), True, ours_only="x.decoder_capacity"),
    Mutation("decoder state_update_capacity without state_groups",
             lambda c: dec(c).pop("state_groups"), True, ours_only="x.decoder_capacity"),
]


def test_at_least_25_config_mutations():
    assert len(CONFIG_MUTATIONS) >= 25


@pytest.mark.parametrize("mutation", CONFIG_MUTATIONS, ids=lambda m: m.name)
def test_config_mutation_agrees_with_og_config(mutation, tmp_path):
    config = mutated(load_fixture("builder_paged_released"), mutation.edit)
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    og_error = og_config_error(tmp_path)
    assert (og_error is None) == mutation.og_accepts, og_error

    report = validate_config(config, form="released")
    ours = runtime_findings(report, PARSE, CONFIG)
    assert (not ours) == mutation.og_accepts, report.format()
    if og_error is not None:
        assert any(f.message in og_error for f in ours), f"og: {og_error}\nours:\n{report.format()}"
    stricter = [f.rule for f in report.errors if f.rule.startswith("x.")]
    assert stricter == ([mutation.ours_only] if mutation.ours_only else []), report.format()


def test_repeated_state_update_key_agrees_with_og_config(tmp_path):
    """JSON with a repeated key cannot be built from a dict; edit the text."""
    text = json.dumps(load_fixture("builder_paged_released")).replace(
        '"state_update": {"capacity": 3}}', '"state_update": {"capacity": 3}, "state_update": {"capacity": 3}}', 1)
    (tmp_path / "genai_config.json").write_text(text)
    og_error = og_config_error(tmp_path)
    assert og_error is not None
    report = validate(tmp_path, form="released")
    assert any(f.message in og_error for f in runtime_findings(report, PARSE, CONFIG)), report.format()


@pytest.mark.parametrize("name", ["synthetic_paged_released", "synthetic_hybrid_released",
                                  "synthetic_composite_released", "builder_paged_released"])
def test_released_fixtures_accepted_by_og_and_by_us(name, tmp_path):
    config = load_fixture(name)
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    assert og_config_error(tmp_path) is None
    assert validate_config(config).ok


@pytest.mark.parametrize("name", ["synthetic_paged_bindings", "synthetic_hybrid_bindings",
                                  "synthetic_composite_bindings", "builder_paged_bindings"])
def test_bindings_fixtures_rejected_by_og_and_by_our_released_parser(name, tmp_path):
    config = load_fixture(name)
    (tmp_path / "genai_config.json").write_text(json.dumps(config))
    og_error = og_config_error(tmp_path)
    assert og_error is not None
    report = validate_config(config, form="released")
    assert any(f.message in og_error for f in report.errors_at(PARSE)), report.format()
    assert validate_config(config).ok  # as the bindings form it is valid


# --------------------------------------------------------------------------------------------------
# Graph-level mutations: og.Model's ValidateSession against ours
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GraphMutation:
    name: str
    edit: Callable[[dict, dict], None]  # (inputs, outputs) -> None
    og_accepts: bool


def rename(table, old, new):
    table[new] = table.pop(old)


HYBRID_MUTATIONS = [
    GraphMutation("as declared", lambda i, o: None, True),
    GraphMutation("renamed state input", lambda i, o: rename(i, "past_conv.3", "past_conv_3"), False),
    GraphMutation("renamed state output", lambda i, o: rename(o, "present_recurrent.5", "present.5.recurrent"),
                  False),
    GraphMutation("state dtypes differ", lambda i, o: o.update({"present_recurrent.2": (F16, ["batch_size", 2, 2, 2])}),
                  False),
    GraphMutation("state shapes differ", lambda i, o: o.update({"present_conv.0": (F32, ["batch_size", 2, 4])}),
                  False),
    GraphMutation("recurrent state rank 3 (in and out)", lambda i, o: [
        t.update({f"{p}_recurrent.2": (F32, ["batch_size", 2, 4])}) for t, p in ((i, "past"), (o, "present"))], False),
    GraphMutation("recurrent state fp16 (in and out)", lambda i, o: [
        t.update({f"{p}_recurrent.2": (F16, ["batch_size", 2, 2, 2])}) for t, p in ((i, "past"), (o, "present"))],
        False),
    GraphMutation("capsule width 25 instead of 24",
                  lambda i, o: o.update({"state_update.2.recurrent_capsule": (F32, ["batch_size", 25])}), False),
    GraphMutation("capsule fp16", lambda i, o: o.update({"state_update.5.recurrent_capsule": (F16, ["batch_size", 24])}),
                  False),
    GraphMutation("capsule rank 3", lambda i, o: o.update({"state_update.5.recurrent_capsule": (F32, ["batch_size", 3, 8])}),
                  False),
    GraphMutation("capsule missing", lambda i, o: o.pop("state_update.5.recurrent_capsule"), False),
    GraphMutation("conv value capacity 2", lambda i, o: o.update({"state_update.0.conv_value": (F32, ["batch_size", 2, 2])}),
                  False),
    GraphMutation("conv value channels 3", lambda i, o: o.update({"state_update.0.conv_value": (F32, ["batch_size", 3, 3])}),
                  False),
    GraphMutation("conv value fp16", lambda i, o: o.update({"state_update.3.conv_value": (F16, ["batch_size", 3, 2])}),
                  False),
    GraphMutation("conv value missing", lambda i, o: o.pop("state_update.3.conv_value"), False),
    GraphMutation("capture_count int64", lambda i, o: i.update(state_update_capture_count=(I64, ["batch_size"])), False),
    GraphMutation("capture_count rank 2", lambda i, o: i.update(state_update_capture_count=(I32, ["batch_size", 1])),
                  False),
    GraphMutation("capture_count missing", lambda i, o: i.pop("state_update_capture_count"), False),
    GraphMutation("active missing", lambda i, o: i.pop("state_update_active"), False),
    GraphMutation("active [2]", lambda i, o: i.update(state_update_active=(I32, [2])), False),
    GraphMutation("active rank 2", lambda i, o: i.update(state_update_active=(I32, [1, 1])), False),
    GraphMutation("active int64", lambda i, o: i.update(state_update_active=(I64, [1])), False),
]


@pytest.mark.parametrize("mutation", HYBRID_MUTATIONS, ids=lambda m: m.name)
def test_graph_mutation_agrees_with_og_model(mutation, tmp_path):
    inputs, outputs = synthetic_hybrid_io()
    mutation.edit(inputs, outputs)
    write_export(tmp_path, load_fixture("synthetic_hybrid_released"), inputs, outputs)
    assert og_config_error(tmp_path) is None  # og.Config cannot see the graph
    og_error = og_model_error(tmp_path)
    assert (og_error is None) == mutation.og_accepts, og_error
    report = validate(tmp_path)
    ours = runtime_findings(report, SESSION)
    assert (not ours) == mutation.og_accepts, report.format()
    if og_error is not None:
        assert any(f.message in og_error for f in ours), f"og: {og_error}\nours:\n{report.format()}"


PAGED_MUTATIONS = [
    GraphMutation("as declared", lambda i, o: None, True),
    GraphMutation("paged key rank 3", lambda i, o: [t.update({n: (F32, ["num_blocks", 4, 1])}) for t, n in (
        (i, "past_key_values.1.key"), (o, "present.1.key"))], False),
    GraphMutation("key and value geometries differ", lambda i, o: [t.update({n: (F32, ["num_blocks", 4, 1, 2])}) for t, n in (
        (i, "past_key_values.4.value"), (o, "present.4.value"))], False),
    GraphMutation("renamed present key", lambda i, o: rename(o, "present.4.key", "present_4_key"), False),
]


@pytest.mark.parametrize("mutation", PAGED_MUTATIONS, ids=lambda m: m.name)
def test_paged_graph_mutation_agrees_with_og_model(mutation, tmp_path):
    inputs, outputs = synthetic_paged_io()
    mutation.edit(inputs, outputs)
    write_export(tmp_path, load_fixture("synthetic_paged_released"), inputs, outputs)
    og_error = og_model_error(tmp_path)
    assert (og_error is None) == mutation.og_accepts, og_error
    ours = runtime_findings(validate(tmp_path), SESSION)
    assert (not ours) == mutation.og_accepts
    if og_error is not None:
        assert any(f.message in og_error for f in ours), og_error


def test_builder_capsule_width_300_agrees_with_og_model(tmp_path):
    """A worked width (S9): Hv 4, Hk 2, Dk = Dv 16, capacity 3 -> 3 * (4 + 32 + 64) = 300."""
    inputs, outputs = builder_paged_io()
    write_export(tmp_path / "ok", load_fixture("builder_paged_released"), inputs, outputs)
    assert og_model_error(tmp_path / "ok") is None and validate(tmp_path / "ok").ok
    outputs["state_update.1.recurrent_capsule"] = (F32, ["batch_size", 299])
    write_export(tmp_path / "bad", load_fixture("builder_paged_released"), inputs, outputs)
    og_error = og_model_error(tmp_path / "bad")
    assert og_error is not None and "width must be 300" in og_error
    [finding] = validate(tmp_path / "bad").errors
    assert finding.message in og_error and finding.tensor == "state_update.1.recurrent_capsule"
    assert finding.actual == "float[batch_size, 299]" and "= 300" in finding.expected
