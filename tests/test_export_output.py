"""The output folder: never the checkpoint, nothing left behind by a signal or a kill, errors name the user's path."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from onnx_hybrid.cli import export_main
from onnx_hybrid.exporter import ExportError, export
from onnx_hybrid.exporter.output_dir import MARKER, remove_leftovers

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("transformers")
    from onnx_hybrid.testing.checkpoints import make_tiny_checkpoint

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
import sys, time
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
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", _SLOW_EXPORT, str(model_dir), "-o", str(out), "-q"], cwd=REPO,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline() == "weights written\n"
        assert any(p.name.endswith(".partial") for p in out.parent.iterdir())
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def test_sigterm_removes_the_staging_folder_and_exits_143(tiny, tmp_path):
    out = tmp_path / "exports" / "o"
    done = _export_and_signal(tiny, out, signal.SIGTERM)
    assert done.returncode == 143, done.stderr
    assert "export-hybrid: terminated" in done.stderr and "Traceback" not in done.stderr
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
