"""The benchmarks' machine-readable results (onnx_hybrid_testing.results): rows with where they came from."""

import json
import re
import subprocess

from file_modules import ROOT
from onnx_hybrid_testing.results import git_commit, write_json


def test_rows_are_written_with_date_commit_device_and_command(tmp_path):
    path = tmp_path / "out.json"
    write_json(path, "bench_x", "Some CPU", [{"case": "a", "ours_s": 1.5}], threads=2)
    written = json.loads(path.read_text())
    assert written["benchmark"] == "bench_x" and written["device"] == "Some CPU" and written["threads"] == 2
    assert written["rows"] == [{"case": "a", "ours_s": 1.5}]
    assert re.fullmatch(r"\d{4}-\d\d-\d\d \d\d:\d\d UTC", written["date"])
    assert written["commit"] == git_commit() and written["command"]


def test_commit_is_the_checkouts():
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    assert git_commit().split("-")[0] == head.strip()


def test_no_path_writes_nothing(tmp_path):
    write_json(None, "bench_x", "cpu", [])
    assert not list(tmp_path.iterdir())
