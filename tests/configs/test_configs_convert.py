"""Lossless conversion between the released and the bindings forms
(docs/genai-config.md#converting-between-the-forms)."""

from __future__ import annotations

import json

import pytest
from configs_helpers import BINDINGS_FIXTURES, RELEASED_FIXTURES, fixture_export, load_fixture, mutated

from onnx_hybrid.cli import main as onnx_hybrid_main
from onnx_hybrid.configs import ConversionError, convert_config, validate, validate_config
from onnx_hybrid.configs.findings import Report
from onnx_hybrid.configs.graph_io import GraphIO
from onnx_hybrid.configs.parse import detect_form, parse_state_groups

og = pytest.importorskip("onnxruntime_genai")


def manifest(config: dict):
    decoder = config["model"]["decoder"]
    report = Report("test")
    result = parse_state_groups(decoder, detect_form(decoder), report)
    assert report.ok, report.format()
    return result


@pytest.mark.parametrize("name", RELEASED_FIXTURES)
def test_released_to_bindings_and_back_is_identity(name, tmp_path):
    """A bindings-form fixed group without state_update does not name its flavour (synthetic_composite):
    the way back then reads the state rank from the graph, as `convert-config OUT_DIR` does."""
    original = load_fixture(name)
    bindings = convert_config(original, "bindings")
    assert detect_form(bindings["model"]["decoder"]) == "bindings"
    assert validate_config(bindings).ok
    graph = GraphIO.load(fixture_export(tmp_path, name) / original["model"]["decoder"]["filename"])
    assert convert_config(bindings, "released", graph=graph) == original


@pytest.mark.parametrize("name", BINDINGS_FIXTURES)
def test_bindings_to_released_and_back_keeps_the_groups(name, tmp_path):
    original = load_fixture(name)
    released = convert_config(original, "released", drop_checkpoints=True)
    back = convert_config(released, "bindings")
    strip_v2 = lambda groups: [  # noqa: E731 - V2 leftovers are the one thing dropped (on request)
        {k: ({s: {"input": b["input"], "output": b["output"]} for s, b in v.items()} if k == "bindings" else v)
         for k, v in g.items() if not k.startswith("checkpoint_")} for g in groups]
    assert back["model"]["decoder"]["state_groups"] == strip_v2(original["model"]["decoder"]["state_groups"])
    assert manifest(back).groups == manifest(original).groups == manifest(released).groups
    # And 0.18.0 accepts the converted file.
    (tmp_path / "genai_config.json").write_text(json.dumps(released))
    og.Config(str(tmp_path))


def test_synthetic_hybrid_translation_matches_the_spec():
    converted = convert_config(load_fixture("synthetic_hybrid_bindings"), "released", drop_checkpoints=True)
    assert converted == load_fixture("synthetic_hybrid_released")


def test_v2_checkpoint_fields_are_not_dropped_silently():
    with pytest.raises(ConversionError, match=r"checkpoint_count.*--drop-checkpoints"):
        convert_config(load_fixture("synthetic_hybrid_bindings"), "released")


def test_fixed_group_without_update_kind_needs_the_graph(tmp_path):
    """The V1 composite file: fixed groups with bindings only. The state rank in the graph decides."""
    v1 = mutated(load_fixture("synthetic_composite_bindings"),
                 lambda c: [g.pop("state_update", None) for g in c["model"]["decoder"]["state_groups"]])
    with pytest.raises(ConversionError, match=r"state_groups\[0\].*graph"):
        convert_config(v1, "released")
    graph = GraphIO.load(fixture_export(tmp_path, "synthetic_composite_bindings") / "decoder.onnx")
    released = convert_config(v1, "released", graph=graph)
    assert [g["kind"] for g in released["model"]["decoder"]["state_groups"]] == [
        "fixed_conv", "paged_kv", "fixed_recurrent"]
    assert released["model"]["decoder"]["inputs"]["past_recurrent_names"] == "past_recurrent.%d"


def test_one_template_per_role_is_enforced():
    def split_conv_templates(c):
        groups = c["model"]["decoder"]["state_groups"]
        second = json.loads(json.dumps(groups[0]))
        groups[0]["layer_ids"], second["layer_ids"] = [0], [3]
        second["bindings"]["state"] = {"input": "conv_in.%d", "output": "conv_out.%d"}
        groups.append(second)

    with pytest.raises(ConversionError, match="one template per role"):
        convert_config(mutated(load_fixture("synthetic_composite_bindings"), split_conv_templates), "released")


def test_decoder_capacity_that_differs_from_the_groups_is_not_expressible():
    config = mutated(load_fixture("builder_paged_released"),
                     lambda c: c["model"]["decoder"].update(state_update_capacity=2))
    with pytest.raises(ConversionError, match="state_update_capacity is 2"):
        convert_config(config, "bindings")


def test_convert_command_in_place_and_to_a_file(tmp_path, capsys):
    out = fixture_export(tmp_path / "export", "builder_paged_bindings")
    released = str(tmp_path / "released.json")
    assert onnx_hybrid_main(["convert-config", str(out), "--to", "released", "-o", released]) == 0
    assert json.loads((tmp_path / "released.json").read_text()) == load_fixture("builder_paged_released")
    assert onnx_hybrid_main(["convert-config", str(out), "--to", "released"]) == 0
    assert validate(out).ok and json.loads((out / "genai_config.json").read_text()) == load_fixture(
        "builder_paged_released")
    og.Config(str(out))


def test_convert_command_reports_what_cannot_be_converted(tmp_path, capsys):
    out = fixture_export(tmp_path / "export", "synthetic_hybrid_bindings")
    before = (out / "genai_config.json").read_text()
    assert onnx_hybrid_main(["convert-config", str(out), "--to", "released"]) == 2
    assert "checkpoint" in capsys.readouterr().err
    assert (out / "genai_config.json").read_text() == before


def test_convert_command_reports_an_unreadable_config(tmp_path, capsys):
    assert onnx_hybrid_main(["convert-config", str(tmp_path), "--to", "released"]) == 2
    assert "cannot read" in capsys.readouterr().err
    (tmp_path / "genai_config.json").write_text("{")
    assert onnx_hybrid_main(["convert-config", str(tmp_path), "--to", "released"]) == 2
    assert "cannot read" in capsys.readouterr().err
    assert (tmp_path / "genai_config.json").read_text() == "{"
    (tmp_path / "genai_config.json").write_text('{"model": []}')  # nothing to convert: written unchanged
    assert onnx_hybrid_main(["convert-config", str(tmp_path), "--to", "released"]) == 0
    (tmp_path / "genai_config.json").write_text('{"model": {"decoder": {"filename": "model.onnx"}}}')
    (tmp_path / "model.onnx").write_bytes(b"not a model")
    assert onnx_hybrid_main(["convert-config", str(tmp_path), "--to", "released"]) == 2
    assert "cannot read the decoder graph" in capsys.readouterr().err
