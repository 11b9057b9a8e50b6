"""The output folder (never the checkpoint, nothing left behind by a signal or a kill, errors name the user's
path) and what the CLI reports about it."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from onnx_hybrid import __version__
from onnx_hybrid.cli import export_main, main
from onnx_hybrid.exporter import ExportError, export
from onnx_hybrid.exporter.output_dir import MARKER, remove_leftovers
from onnx_hybrid.exporter.summary import ExportSummary, summarize
from file_modules import ROOT



@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("ck") / "hf", "qwen3_5_text", tied=True)


def _copy(tiny: Path, dst: Path) -> Path:
    shutil.copytree(tiny, dst)
    return dst


def _files(folder: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in folder.iterdir()}


def _refused(model_dir: Path, out: Path, overwrite: bool, relation: str) -> None:
    with pytest.raises(ExportError, match=f"{relation} the input checkpoint"):
        export(model_dir, out, overwrite=overwrite, progress=False)


@pytest.mark.parametrize("overwrite", [False, True])
def test_output_that_is_contains_or_lies_inside_the_checkpoint_is_refused(tiny, tmp_path, overwrite):
    ck = _copy(tiny, tmp_path / "parent" / "ck")
    before = _files(ck)
    _refused(ck, ck, overwrite, "is")
    _refused(ck, tmp_path / "parent", overwrite, "contains")
    _refused(ck, tmp_path, overwrite, "contains")
    _refused(ck, ck / "onnx", overwrite, "lies inside")
    (tmp_path / "link").symlink_to(ck, target_is_directory=True)
    _refused(ck, tmp_path / "link", overwrite, "is")  # the output named through a symlink
    _refused(tmp_path / "link", ck, overwrite, "is")  # the checkpoint named through a symlink
    _refused(ck, tmp_path / "link" / "onnx", overwrite, "lies inside")
    assert _files(ck) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "parent"]
    assert sorted(p.name for p in (tmp_path / "parent").iterdir()) == ["ck"]


def test_output_holding_the_files_a_checkpoint_of_symlinks_points_to_is_refused(tiny, tmp_path):
    blobs = _copy(tiny, tmp_path / "cache" / "blobs")
    ck = tmp_path / "snapshot"
    ck.mkdir()
    for f in blobs.iterdir():
        (ck / f.name).symlink_to(f)
    before = _files(blobs)
    with pytest.raises(ExportError, match="which the input checkpoint's .* points to"):
        export(ck, tmp_path / "cache", overwrite=True, progress=False)
    assert _files(blobs) == before


def test_cli_refuses_the_checkpoint_as_output(tiny, tmp_path, capsys):
    ck = _copy(tiny, tmp_path / "ck")
    before = _files(ck)
    assert export_main([str(ck), "-o", str(ck), "--overwrite", "-q"]) == 2
    assert "is the input checkpoint" in capsys.readouterr().err
    assert _files(ck) == before


def _marker(folder: Path, pid: int) -> Path:
    folder.mkdir()
    (folder / MARKER).write_text(json.dumps({"host": socket.gethostname(), "pid": pid}))
    (folder / "model.onnx.data").write_bytes(b"x" * 100)
    return folder


def _dead_pid() -> int:
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                           check=True)
    return int(child.stdout)


def test_leftovers_are_removed_only_when_ours_and_their_writer_is_gone(tmp_path, caplog):
    out, dead = tmp_path / "o", _dead_pid()
    killed = _marker(tmp_path / ".o.abcd1234.partial", dead)
    running = _marker(tmp_path / ".o.efgh5678.partial", os.getpid())  # a concurrent export, still alive
    lookalike = tmp_path / ".o.ijkl9012.partial"  # the user's, or unknown: no marker
    lookalike.mkdir()
    unrelated = [tmp_path / ".o.backup", tmp_path / ".other.abcd1234.partial", tmp_path / ".o.abcd1234.partial.x"]
    for folder in unrelated:
        _marker(folder, dead)
    with caplog.at_level(logging.INFO, logger="onnx_hybrid.exporter"):
        remove_leftovers(out)
    assert not killed.exists()
    assert running.is_dir() and lookalike.is_dir() and all(f.is_dir() for f in unrelated)
    log = caplog.text
    assert f"removed {killed}, left by a killed export (pid {dead})" in log
    assert f"leaving {running}: export process {os.getpid()} is still writing it" in log
    assert f"leaving {lookalike}: it looks like an export's temporary folder, but no marker" in log
    assert not any(str(f) in log for f in unrelated)


def test_an_output_whose_swap_was_killed_is_restored(tmp_path, caplog):
    out, dead = tmp_path / "o", _dead_pid()
    staged = _marker(tmp_path / ".o.abcd1234.partial", dead)
    old = _marker(tmp_path / ".o.abcd1234.old", dead)  # the previous output, moved aside before the swap
    (old / "keep.txt").write_text("old")
    with caplog.at_level(logging.WARNING, logger="onnx_hybrid.exporter"):
        remove_leftovers(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["o"] and not staged.exists()
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt", "model.onnx.data"]  # the marker is gone
    assert f"restored {out} from {old}" in caplog.text


# A real export in a child process that holds still once the weights are written, so the test can signal it.
_SLOW_EXPORT = """
import signal, sys, time
# Ctrl-C as in a foreground process: one started from a background job inherits SIGINT ignored, and keeps it so.
signal.signal(signal.SIGINT, signal.default_int_handler)
import onnx_hybrid.exporter
from onnx_hybrid.cli import export_main
module = sys.modules["onnx_hybrid.exporter.export"]
write = module.write_external_data
def write_then_wait(*args, **kwargs):
    write(*args, **kwargs)
    print("weights written", flush=True)
    time.sleep(60)
module.write_external_data = write_then_wait
sys.exit(export_main(sys.argv[1:]))
"""


def _export_and_signal(model_dir: Path, out: Path, signum: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_EXPORT, str(model_dir), "-o", str(out), "-q"], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "weights written\n"
        assert any(p.name.endswith(".partial") for p in out.parent.iterdir())
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


@pytest.mark.parametrize("signum, status, message", [(signal.SIGTERM, 143, "terminated"),
                                                     (signal.SIGINT, 130, "interrupted")])
def test_sigterm_and_sigint_remove_the_staging_folder(tiny, tmp_path, signum, status, message):
    out = tmp_path / "exports" / "o"
    done = _export_and_signal(tiny, out, signum)
    assert done.returncode == status, done.stderr
    assert f"export-hybrid: {message}" in done.stderr and "Traceback" not in done.stderr
    assert list(out.parent.iterdir()) == []


def test_the_next_export_removes_what_a_killed_one_left(tiny, tmp_path, caplog):
    out = tmp_path / "exports" / "o"
    done = _export_and_signal(tiny, out, signal.SIGKILL)
    assert done.returncode == -signal.SIGKILL
    (left,) = out.parent.iterdir()
    assert left.name.startswith(".o.") and left.name.endswith(".partial") and (left / MARKER).is_file()
    with caplog.at_level(logging.WARNING, logger="onnx_hybrid.exporter"):
        export(tiny, out, progress=False)
    assert f"removed {left}, left by a killed export" in caplog.text
    assert [p.name for p in out.parent.iterdir()] == ["o"]
    assert (out / "model.onnx").is_file() and not (out / MARKER).exists()


def test_write_errors_name_the_output_not_the_staging_folder(tiny, tmp_path, monkeypatch, capsys):
    def unwritable(weights, path, progress):
        open(path.parent / "missing" / path.name, "wb")  # a real OSError about a file in the staging folder

    monkeypatch.setattr(sys.modules["onnx_hybrid.exporter.export"], "write_external_data", unwritable)
    out = tmp_path / "o"
    assert export_main([str(tiny), "-o", str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert f"No such file or directory: '{out / 'missing' / 'model.onnx.data'}'" in err
    assert ".partial" not in err
    assert list(tmp_path.iterdir()) == []


def test_summary_reports_what_the_export_wrote(tiny, tmp_path):
    out = export(tiny, tmp_path / "o", state_update_capacity=2, progress=False)
    summary = summarize(tiny, out, elapsed_s=1.25)
    assert summary.architecture == "Qwen3_5ForCausalLM"
    assert summary.layers == {"linear attention": 3, "full attention": 1} and summary.moe_layers == 0
    assert summary.dtype == "fp32" and summary.execution_providers == ()
    assert summary.op_domains == {"onnx_hybrid": ("GatedDeltaNet", "VarlenCausalConvWithState"),
                                  "com.microsoft": ("GroupQueryAttention", "RotaryEmbedding",
                                                    "SkipSimplifiedLayerNormalization")}
    assert summary.state_groups == 2  # conv and recurrent; the KV cache is onnxruntime-genai's own
    assert dict(summary.files) == {p.name: p.stat().st_size for p in out.iterdir()}
    assert {"model.onnx", "model.onnx.data", "genai_config.json", "libonnx_hybrid_ortops.so"} <= dict(summary.files).keys()
    lines = summary.lines()
    assert lines[0] == f"exported {tiny} -> {out} in 1.25 s"
    assert "  layers              4: 3 linear attention, 1 full attention; feed-forward dense" in lines


def test_summary_lines_for_moe_and_named_providers(tmp_path):
    summary = ExportSummary(
        source=Path("hf"), output=Path("o"), architecture="Qwen3NextForCausalLM",
        layers={"linear attention": 3, "full attention": 1}, moe_layers=3, dtype="fp16",
        op_domains={"com.microsoft": ("GatedDeltaNet", "MoE")}, execution_providers=("cuda",), state_groups=2,
        files=(("model.onnx", 2048), ("model.onnx.data", 3 * 1024 ** 3)), elapsed_s=61.0)
    lines = summary.lines()
    assert "feed-forward MoE in 3, dense in 1" in lines[2]
    assert lines[3:6] == ["  dtype               fp16", "  custom ops          com.microsoft (GatedDeltaNet, MoE)",
                          "  execution provider  cuda"]
    assert lines[-3:] == ["  files               2, 3.0 GB", f"    {'model.onnx':<30} {'2.0 KB':>10}",
                          f"    {'model.onnx.data':<30} {'3.0 GB':>10}"]


def test_cli_prints_a_summary_unless_quiet(tiny, tmp_path, capsys, caplog):
    assert export_main([str(tiny), "-o", str(tmp_path / "o")]) == 0
    out, err = capsys.readouterr()
    assert out.startswith(f"exported {tiny} -> {tmp_path / 'o'} in ") and "model.onnx.data" in out
    assert "writing weights" in err  # the progress bar
    caplog.clear()
    assert export_main([str(tiny), "-o", str(tmp_path / "q"), "--quiet"]) == 0
    out, err = capsys.readouterr()
    assert out == "" and "writing weights" not in err
    assert "has no tokenizer.json or tokenizer_config.json" in caplog.text  # warnings are still logged


def test_missing_tokenizer_files_are_warned_about(tiny, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="onnx_hybrid.exporter"):
        export(tiny, tmp_path / "bare", progress=False)
    assert f"{tiny} has no tokenizer.json or tokenizer_config.json: onnxruntime-genai's og.Tokenizer will fail" \
        in caplog.text
    src = tmp_path / "hf"
    src.mkdir()
    for f in tiny.iterdir():
        (src / f.name).symlink_to(f)
    (src / "tokenizer.json").write_text("{}")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="onnx_hybrid.exporter"):
        export(src, tmp_path / "half", progress=False)
    assert "has no tokenizer_config.json:" in caplog.text
    (src / "tokenizer_config.json").write_text("{}")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="onnx_hybrid.exporter"):
        export(src, tmp_path / "full", progress=False)
    assert "tokenizer" not in caplog.text


@pytest.mark.parametrize("entry, prog", [(export_main, "export-hybrid"), (main, "onnx-hybrid")])
def test_version(entry, prog, capsys):
    with pytest.raises(SystemExit) as exit_:
        entry(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"{prog} {__version__}\n"
    assert __version__ == tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
