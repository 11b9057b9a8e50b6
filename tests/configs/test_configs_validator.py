"""Validator rules that onnxruntime-genai 0.18.0 cannot check for us: the bindings form, the Engine's
dynamic-batching rules, our own export rules; and the report / command-line surface."""

from __future__ import annotations

import json

import onnx
import pytest
from configs_helpers import GRAPHS, F32, I64, builder_paged_io, fixture_export, load_fixture, mutated, write_export

from onnx_hybrid.cli import main as onnx_hybrid_main
from onnx_hybrid.configs import validate, validate_config
from onnx_hybrid.configs.findings import ENGINE, SESSION


def rules(report):
    return sorted({f.rule for f in report.errors})


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_every_fixture_with_its_graph_is_valid(name, tmp_path):
    report = validate(fixture_export(tmp_path, name))
    assert report.ok, report.format()
    assert report.form == ("bindings" if name.endswith("_bindings") else "released")
    if report.form == "bindings":
        assert any(f.rule == "form" for f in report.warnings)  # 0.18.0 would not parse it


# --- bindings form (#2454): rules og 0.18 cannot run -----------------------------------------------


def v3(edit):
    return mutated(load_fixture("synthetic_composite_bindings"), lambda c: edit(c["model"]["decoder"]["state_groups"]))


@pytest.mark.parametrize("edit, rule, message", [
    (lambda g: g[1]["bindings"].pop("value"), "C4",
     "state_groups[1] (paged_kv) requires exactly key and value bindings"),
    (lambda g: g[0]["bindings"].update(key={"input": "k.%d", "output": "kk.%d"}), "C4",
     "state_groups[0] (fixed) requires exactly one state binding"),
    (lambda g: g[0]["state_update"].pop("kind"), "C6", "state_groups[0] (fixed) state_update is missing kind"),
    (lambda g: g[0]["state_update"].update(kind="mamba"), "parse", "Unsupported decoder state update kind 'mamba'"),
    (lambda g: g[0]["state_update"].update(capsule="c.%d"), "C10",
     "state_groups[0] (fixed) causal_conv state_update requires only value"),
    (lambda g: g[2]["state_update"].pop("key_head_count"), "C10",
     "state_groups[2] (fixed) gated_delta_net state_update requires capsule and key_head_count"),
    (lambda g: g[2]["state_update"].update(capture_count="other_count"), "C11",
     "All fixed state_update groups must use the same capacity and capture_count input, and the same active input"),
    (lambda g: g[0].update(kind="fixed_conv"), "parse", "Unsupported decoder state group kind 'fixed_conv'"),
    (lambda g: g[0]["bindings"]["state"].update(output="present_conv"), "C15",
     "binding 'state' has malformed output template 'present_conv'"),
    (lambda g: g[2]["state_update"].update(capsule="present_recurrent.%d"), "C16",
     "state_groups[2] (fixed) resolves more than one binding to 'present_recurrent.2'"),
])
def test_bindings_form_rules(edit, rule, message):
    report = validate_config(v3(edit))
    assert rule in rules(report), report.format()
    assert any(message in f.message for f in report.errors), report.format()


def test_bindings_form_repeated_semantic_is_an_error(tmp_path):
    text = json.dumps(load_fixture("synthetic_composite_bindings")).replace(
        '"bindings": {"state": {"input": "past_conv.%d", "output": "present_conv.%d"}}',
        '"bindings": {"state": {"input": "past_conv.%d", "output": "present_conv.%d"}, '
        '"state": {"input": "a.%d", "output": "b.%d"}}', 1)
    write_export(tmp_path, json.loads(text), *GRAPHS["synthetic_composite_bindings"]())
    (tmp_path / "genai_config.json").write_text(text)
    report = validate(tmp_path)
    assert any(f.message == "Duplicate decoder state binding semantic 'state'" for f in report.errors)


def test_bindings_form_graph_rules_use_group_names(tmp_path):
    inputs, outputs = GRAPHS["synthetic_composite_bindings"]()
    outputs["state_update.5.recurrent_capsule"] = (F32, ["batch_size", 23])
    report = validate(write_export(tmp_path, load_fixture("synthetic_composite_bindings"), inputs, outputs))
    [finding] = report.errors
    assert (finding.rule, finding.path) == ("S9", "model.decoder.state_groups[2].state_update.capsule")
    assert finding.message.endswith("width must be 24")


# --- Engine (dynamic batching) ------------------------------------------------------------------


def builder(tmp_path, edit_config=lambda c: None, edit_graph=lambda i, o: None):
    inputs, outputs = builder_paged_io()
    edit_graph(inputs, outputs)
    return validate(write_export(tmp_path, mutated(load_fixture("builder_paged_released"), edit_config),
                                 inputs, outputs))


def test_engine_block_size_must_match_the_pool(tmp_path):
    report = builder(tmp_path, lambda c: c["engine"]["dynamic_batching"].update(block_size=32))
    messages = [f.message for f in report.errors if f.stage == ENGINE]
    assert len(messages) == 4  # key and value, in and out, of layer 3
    assert {f.path for f in report.errors} == {"engine.dynamic_batching.block_size"}
    assert messages[0] == ("Paged cache tensor 'past_key_values.3.key' for layer 3 has incompatible axis 1 "
                           "(block_size): graph dimension 16; expected 32 from engine.dynamic_batching.block_size.")


def test_engine_needs_exactly_one_paged_group_and_dynamic_fixed_batch(tmp_path):
    def static_batch(i, o):
        i["past.0.conv"] = (i["past.0.conv"][0], [1, 128, 3])

    report = builder(tmp_path, lambda c: c["model"]["decoder"]["state_groups"].append(
        {"kind": "paged_kv", "layer_ids": [2]}), static_batch)
    assert {"engine.paged_groups", "engine.fixed_batch"} <= set(rules(report))


def test_engine_packed_position_ids(tmp_path):
    report = builder(tmp_path / "a", edit_graph=lambda i, o: i.update(position_ids=(I64, ["batch_size", "seq"])))
    assert rules(report) == ["engine.position_ids"]
    report = builder(tmp_path / "b", edit_graph=lambda i, o: i.update(position_ids=(I64, ["num_tokens"])))
    assert report.ok


def test_engine_pool_needs_num_blocks_or_a_utilization_factor(tmp_path):
    """The builder's paged export writes with ORT's CUDA PagedAttention: without num_blocks the runtime may size the
    pool, but only from gpu_utilization_factor (og.Engine 0.18 fails without either: test_export_cuda.py)."""
    report = builder(tmp_path / "a", lambda c: c["engine"]["dynamic_batching"].pop("num_blocks"))
    assert rules(report) == ["engine.num_blocks"]
    report = builder(tmp_path / "b", lambda c: c["engine"]["dynamic_batching"].update(
        num_blocks=None, gpu_utilization_factor=0.5) or c["engine"]["dynamic_batching"].pop("num_blocks"))
    assert report.ok and not report.warnings, report.format()
    report = builder(tmp_path / "c", lambda c: c["engine"]["dynamic_batching"].update(
        num_blocks=None, gpu_utilization_factor=1.5) or c["engine"]["dynamic_batching"].pop("num_blocks"))
    assert rules(report) == ["engine.gpu_utilization_factor"]


def test_fixed_groups_without_engine_section_are_noted_for_plain_ort(tmp_path):
    """Not a fault: such an export is for plain ONNX Runtime (og.Generator fails on it: test_configs_load)."""
    report = validate(fixture_export(tmp_path, "synthetic_hybrid_released"))
    assert report.ok and not report.warnings, report.format()
    [note] = report.notes
    assert note.rule == "runtime.plain_ort" and "og.Generator does not feed the capture inputs" in note.message


# --- our own export rules --------------------------------------------------------------------


def test_update_operator_capacity_must_match_the_config(tmp_path):
    out = fixture_export(tmp_path, "builder_paged_released")
    model = onnx.load(str(out / "model.onnx"))
    for node in model.graph.node:
        if node.output[0] == "state_update.1.recurrent_capsule":
            node.op_type, node.domain = "GatedDeltaNet", "onnx_hybrid"
            node.attribute.append(onnx.helper.make_attribute("state_update_capacity", 2))
    onnx.save(model, str(out / "model.onnx"))
    finding, unloadable = validate(out).errors
    assert (finding.rule, finding.stage, finding.expected, finding.actual) == ("x.op_capacity", SESSION, 3, 2)
    assert unloadable.rule == "load.op_library"  # the I/O-only graph names no library for the onnx_hybrid node


def test_missing_graph_and_broken_json_are_findings(tmp_path):
    (tmp_path / "genai_config.json").write_text(json.dumps(load_fixture("synthetic_paged_released")))
    assert rules(validate(tmp_path)) == ["x.graph"]
    (tmp_path / "genai_config.json").write_text("{")
    assert rules(validate(tmp_path)) == ["parse.json"]


def test_findings_name_path_tensor_expected_and_actual(tmp_path):
    inputs, outputs = GRAPHS["synthetic_hybrid_released"]()
    outputs["present_conv.3_renamed"] = outputs.pop("present_conv.3")
    [finding] = validate(write_export(tmp_path, load_fixture("synthetic_hybrid_released"), inputs, outputs)).errors
    assert finding.rule == "S1" and finding.path == "model.decoder.outputs.present_conv_names"
    assert finding.tensor == "present_conv.3" and finding.actual == "absent"
    assert "output was not found: present_conv.3" in finding.message


# --- command line ---------------------------------------------------------------------------


def test_validate_command_exit_status_and_json(tmp_path, capsys):
    good = fixture_export(tmp_path / "good", "builder_paged_released")
    assert onnx_hybrid_main(["validate", str(good)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK")
    bad = fixture_export(tmp_path / "bad", "builder_paged_bindings")
    assert onnx_hybrid_main(["validate", str(bad), "--form", "released", "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is False and report["form"] == "released"
    assert report["findings"][0]["stage"] == "parse" and report["findings"][0]["path"].endswith(".bindings")


def test_state_inputs_of_layers_outside_every_group_are_found(tmp_path):
    """0.18.0 binds only the listed layers: og.Model accepts a group that forgets one (checked here)."""
    og = pytest.importorskip("onnxruntime_genai")
    config = mutated(load_fixture("synthetic_hybrid_released"),
                     lambda c: c["model"]["decoder"]["state_groups"][0].update(layer_ids=[0]))
    out = write_export(tmp_path, config, *GRAPHS["synthetic_hybrid_released"]())
    og.Model(str(out))
    [finding] = validate(out).errors
    assert (finding.rule, finding.tensor) == ("x.unbound_state", "past_conv.3")
