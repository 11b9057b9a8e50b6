"""Exporter behaviour around the happy path: imports, unsupported input, bad tensors, atomic output, CLI."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from safetensors.numpy import load_file, save_file

from onnx_hybrid.cli import export_main
from onnx_hybrid.exporter import SUPPORTED_ARCHITECTURES, ExportError, export
from onnx_hybrid_testing.checkpoints import TEXT
from file_modules import ROOT



def test_exporter_imports_neither_torch_nor_transformers():
    code = ("import sys, onnx_hybrid.exporter, onnx_hybrid.cli; "
            "print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "hf", "qwen3_5_text", tied=True)


def _copy_with(src: Path, dst: Path, edit) -> Path:
    dst.mkdir()
    config = json.loads((src / "config.json").read_text())
    tensors = load_file(src / "model.safetensors")
    config, tensors = edit(config, tensors)
    (dst / "config.json").write_text(json.dumps(config))
    save_file(tensors, dst / "model.safetensors")
    return dst


def test_unsupported_architecture_lists_supported(tiny, tmp_path):
    bad = _copy_with(tiny, tmp_path / "bad", lambda c, t: ({**c, "architectures": ["LlamaForCausalLM"]}, t))
    with pytest.raises(ExportError) as err:
        export(bad, tmp_path / "out", progress=False)
    assert "LlamaForCausalLM" in str(err.value)
    assert all(arch in str(err.value) for arch in SUPPORTED_ARCHITECTURES)


def test_misshaped_tensor_names_tensor_and_shapes(tiny, tmp_path):
    name = "model.layers.0.linear_attn.in_proj_z.weight"

    def shrink(config, tensors):
        tensors[name] = tensors[name][:-1]
        return config, tensors

    bad = _copy_with(tiny, tmp_path / "bad", shrink)
    rows, hidden = TEXT["linear_num_value_heads"] * TEXT["linear_value_head_dim"], TEXT["hidden_size"]
    with pytest.raises(ExportError, match=rf"{name}.*\[{rows - 1}, {hidden}\].*expected \[{rows}, {hidden}\]"):
        export(bad, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_missing_tensor_is_named(tiny, tmp_path):
    name = "model.layers.2.self_attn.k_norm.weight"
    bad = _copy_with(tiny, tmp_path / "bad", lambda c, t: (c, {k: v for k, v in t.items() if k != name}))
    with pytest.raises(ExportError, match=name):
        export(bad, tmp_path / "out", progress=False)


def test_a_graph_with_mixed_types_is_refused_while_it_is_built(tiny, tmp_path, monkeypatch):
    from onnx_hybrid.exporter.graph import gated_deltanet
    from onnx_hybrid.ops.contract import ContractError

    # A builder bug: the gates of an fp32 graph cast to fp16. ORT would run the node and the kernel refuse it; the
    # node builder names the inputs while the graph is built.
    def fp16_gates(ctx, a, b):
        return {"decay": ctx.op("Cast", a, to=ir.DataType.FLOAT16), "beta": ctx.op("Cast", b, to=ir.DataType.FLOAT16)}

    monkeypatch.setattr(gated_deltanet, "gate_inputs", fp16_gates)
    with pytest.raises(ContractError, match=re.escape("GatedDeltaNet: decay and beta must be float, or both of the "
                                                      "activation type float: got decay float16, beta float16")):
        export(tiny, tmp_path / "out", progress=False)
    assert list(tmp_path.iterdir()) == []


def test_truncated_weights_or_bad_json_are_export_errors(tiny, tmp_path):
    truncated = _copy_with(tiny, tmp_path / "truncated", lambda c, t: (c, t))
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    with pytest.raises(ExportError, match="model.safetensors is not a readable safetensors file.*outside"):
        export(truncated, tmp_path / "out", progress=False)
    (truncated / "config.json").write_text("{")
    with pytest.raises(ExportError, match="config.json is not valid JSON"):
        export(truncated, tmp_path / "out", progress=False)
    assert not (tmp_path / "out").exists()


def test_failed_export_leaves_no_partial_output_and_keeps_existing(tiny, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    with pytest.raises(ExportError, match="already exists"):
        export(tiny, out, progress=False)

    def fail(*args, **kwargs):
        raise OSError("disk full")

    # The package re-exports the function export(), which hides the module of the same name.
    monkeypatch.setattr(sys.modules["onnx_hybrid.exporter.export"], "write_external_data", fail)
    with pytest.raises(OSError):
        export(tiny, out, overwrite=True, progress=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert (out / "keep.txt").read_text() == "old"
    with pytest.raises(OSError):
        export(tiny, tmp_path / "new", progress=False)
    assert not (tmp_path / "new").exists()


def test_a_failed_swap_puts_the_old_output_back(tmp_path, monkeypatch):
    from onnx_hybrid.exporter.output_dir import staged_output

    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("old")
    real_rename = Path.rename

    def rename(self, target):
        if self.name.endswith(".partial"):
            raise OSError("rename of the staged folder failed")
        return real_rename(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError, match="staged folder"):
        with staged_output(out, overwrite=True) as stage:
            (stage / "new.txt").write_text("new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_overwrite_replaces_output(tiny, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("x")
    export(tiny, out, overwrite=True, progress=False)
    assert sorted(p.name for p in out.iterdir() if not p.name.endswith(".so")) == [
        "genai_config.json", "generation_config.json", "model.onnx", "model.onnx.data"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_mtp_and_vision_tensors_are_skipped_with_a_note(tiny, tmp_path, caplog):
    def add_heads(config, tensors):
        tensors["mtp.fc.weight"] = np.zeros((64, 128), np.float32)
        tensors["model.visual.patch_embed.proj.weight"] = np.zeros((8, 3), np.float32)
        return config, tensors

    src = _copy_with(tiny, tmp_path / "hf", add_heads)
    with pytest.raises(ExportError, match="MTP head is incomplete, missing mtp.norm.weight.*--no-mtp"):
        export(src, tmp_path / "o", progress=False)
    with caplog.at_level("WARNING", logger="onnx_hybrid.exporter"):
        export(src, tmp_path / "o", progress=False, mtp=False)
    notes = " ".join(r.getMessage() for r in caplog.records)
    assert "multi-token-prediction head" in notes and "vision tower" in notes
    assert not (tmp_path / "o" / "mtp.onnx").exists()


def test_tokenizer_files_are_copied(tiny, tmp_path):
    src = tmp_path / "hf"
    src.mkdir()
    for f in tiny.iterdir():
        (src / f.name).symlink_to(f)
    (src / "tokenizer.json").write_text("{}")
    (src / "tokenizer_config.json").write_text("{}")
    out = export(src, tmp_path / "o", progress=False)
    assert (out / "tokenizer.json").read_text() == (out / "tokenizer_config.json").read_text() == "{}"


def test_cli_user_error_exits_2_without_traceback(tmp_path):
    code = "import sys; from onnx_hybrid.cli import export_main; sys.exit(export_main(sys.argv[1:]))"
    proc = subprocess.run([sys.executable, "-c", code, str(tmp_path / "missing"), "-o", str(tmp_path / "o")],
                          cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.startswith("export-hybrid: error:") and "Traceback" not in proc.stderr
    assert export_main([str(tmp_path), "-o", str(tmp_path / "o"), "--state-update-capacity", "9"]) == 2


def test_cli_refuses_paged_options_without_paged(tmp_path, capsys):
    assert export_main([str(tmp_path), "-o", str(tmp_path / "o"), "--num-blocks", "64", "--block-size", "16"]) == 2
    assert "--block-size, --num-blocks: options of the paged export, which needs --paged" in capsys.readouterr().err


def test_cli_output_under_a_file_is_a_user_error(tiny, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    assert export_main([str(tiny), "-o", str(tmp_path / "file" / "sub" / "out"), "-q"]) == 2  # NotADirectoryError
    assert capsys.readouterr().err.startswith("export-hybrid: error:")


def test_cli_reports_an_unbuilt_library_before_writing(tiny, tmp_path, monkeypatch, capsys):
    from onnx_hybrid.ops import library

    monkeypatch.setattr(library, "_LIBRARY", tmp_path / "missing.so")
    assert export_main([str(tiny), "-o", str(tmp_path / "o"), "-q"]) == 2
    assert "custom-op library is not built" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # not even a staging folder


def test_cli_exports(tiny, tmp_path):
    assert export_main([str(tiny), "-o", str(tmp_path / "o"), "--state-update-capacity", "2", "-q"]) == 0
    decoder = json.loads((tmp_path / "o" / "genai_config.json").read_text())["model"]["decoder"]
    assert decoder["state_update_capacity"] == 2
    assert decoder["session_options"]["custom_ops_library"] == "libonnx_hybrid_ortops.so"
    assert (tmp_path / "o" / "libonnx_hybrid_ortops.so").is_file()


def test_genai_config_parses_in_onnxruntime_genai(tiny, tmp_path):
    og = pytest.importorskip("onnxruntime_genai")
    for capacity in (0, 3):
        out = export(tiny, tmp_path / f"c{capacity}", state_update_capacity=capacity, progress=False)
        og.Config(str(out))  # raises on anything 0.18.0 rejects (docs/genai-config.md#parse-rules, #config-rules)


def test_tied_embedding_is_stored_once(tiny, tmp_path):
    import onnx

    out = export(tiny, tmp_path / "o", progress=False)
    graph = onnx.load(out / "model.onnx", load_external_data=False).graph
    names = [i.name for i in graph.initializer]
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    embedding = [TEXT["vocab_size"], TEXT["hidden_size"]]
    assert [i.name for i in graph.initializer if list(i.dims) == embedding] == ["model.embed_tokens.weight"]
