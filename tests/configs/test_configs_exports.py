"""The validator on our own exports: every supported checkpoint layout, with and without compact updates,
in both state_groups forms; 0.18.0's og.Config accepts every released-form config we write."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")
og = pytest.importorskip("onnxruntime_genai")

from onnx_hybrid.cli import main as cli_main  # noqa: E402
from onnx_hybrid.configs import convert_config, validate  # noqa: E402
from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402
from onnx_hybrid_testing.checkpoints import LAYOUTS, make_tiny_checkpoint  # noqa: E402


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("checkpoints")
    return {layout: make_tiny_checkpoint(root / layout, layout, seed=3) for layout in LAYOUTS}


def read_config(out):
    return json.loads((out / "genai_config.json").read_text())


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("capacity", [0, 3])
def test_non_paged_exports_validate_and_parse_in_og(layout, capacity, checkpoints, tmp_path):
    out = export(checkpoints[layout], tmp_path / "out", state_update_capacity=capacity, progress=False,
                 op_domain=contract.MS_DOMAIN)
    report = validate(out)
    assert report.ok and not report.warnings, report.format()  # the README demo's export among them
    assert ("state_groups" in read_config(out)["model"]["decoder"]) == bool(capacity)
    og.Config(str(out))


def test_bindings_form_export_converts_to_the_released_export(checkpoints, tmp_path):
    released = export(checkpoints["qwen3_5_text"], tmp_path / "released", state_update_capacity=2,
                      progress=False, op_domain=contract.MS_DOMAIN)
    bindings = export(checkpoints["qwen3_5_text"], tmp_path / "bindings", state_update_capacity=2,
                      progress=False, op_domain=contract.MS_DOMAIN, manifest_format="bindings")
    assert validate(bindings).ok and validate(bindings).form == "bindings"
    assert convert_config(read_config(bindings), "released") == read_config(released)
    assert cli_main(["convert-config", str(bindings), "--to", "released"]) == 0
    assert read_config(bindings) == read_config(released)  # rewritten in place
    og.Config(str(bindings))


def test_cli_validate_fails_on_a_broken_export(checkpoints, tmp_path, capsys):
    out = export(checkpoints["qwen3_5_text"], tmp_path / "out", state_update_capacity=3, progress=False,
                 op_domain=contract.MS_DOMAIN)
    assert cli_main(["validate", str(out)]) == 0
    assert capsys.readouterr().out.rstrip().endswith("OK")
    config = read_config(out)
    config["model"]["decoder"]["outputs"]["state_update_recurrent_capsule_names"] = "capsule.%d"
    (out / "genai_config.json").write_text(json.dumps(config))
    assert cli_main(["validate", str(out), "--json"]) == 1
    report = json.loads(capsys.readouterr().out)
    assert {f["rule"] for f in report["findings"] if f["severity"] == "error"} == {"S9"}
