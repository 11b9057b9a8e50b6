"""scripts/profile_decode.py on the CPU: ORT's profile of onnxruntime-genai runs of a tiny export, read back per
decode step and for the prompt's run; the ncu CSV it parses for kernel launches per step."""

from __future__ import annotations

import json
import shutil

import pytest

pytest.importorskip("onnxruntime_genai")

from onnx_hybrid.exporter import export  # noqa: E402
from onnx_hybrid_testing.checkpoints import make_tiny_checkpoint  # noqa: E402
from file_modules import load_file  # noqa: E402



profile = load_file("scripts/profile_decode.py", "profile_decode")


@pytest.fixture(scope="module")
def tiny_export(tmp_path_factory):
    root = tmp_path_factory.mktemp("profile")
    checkpoint = make_tiny_checkpoint(root / "hf", "qwen3_5_text", seed=3)
    return export(checkpoint, root / "out", mtp=False, progress=False)


def test_decode_steps_and_prompt_run_are_profiled(tiny_export, tmp_path, capsys):
    out = tmp_path / "decode.json"
    assert profile.main([f"a={tiny_export}", "--prompt", "6", "--steps", "3", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decode steps profiled per export: batch 1, prompt 6") and "| a | " in text
    nodes = json.loads(out.read_text())["a"]["nodes"]
    assert nodes["steps"] == 2  # the first decode step (allocations) is left out
    assert nodes["nodes"] > 50 and set(nodes["by_provider"]) == {"CPUExecutionProvider"}
    assert nodes["op_count"]["GatedDeltaNet"] == nodes["op_count"]["VarlenCausalConvWithState"] > 0
    assert 0 < nodes["node_us"] <= nodes["run_us"]

    assert profile.main([f"a={tiny_export}", "--prompt", "6", "--steps", "1", "--prompt-run", "--json",
                         str(out)]) == 0
    assert capsys.readouterr().out.startswith("the prompt's run profiled per export")
    assert json.loads(out.read_text())["a"]["nodes"]["steps"] == 1


def test_kernel_counts_need_ncu(tiny_export, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="needs Nsight Compute's ncu on the PATH"):
        profile.kernel_profile(str(tiny_export), type("Args", (), {"steps": 1, "batch": 1, "prompt": 4})())


def test_ncu_log_keeps_only_the_csv():
    log = '==PROF== Connected to process 7\n==PROF== Disconnected\n"ID","Kernel Name","Metric Name"\n"0","k","m"\n'
    assert profile._csv_part(log) == '"ID","Kernel Name","Metric Name"\n"0","k","m"'
    assert profile._csv_part("==PROF== nothing profiled\n") == ""


FAKE_NCU = r'''#!/usr/bin/env python3
"""Stands in for ncu: writes the CSV ncu would for a prompt kernel and 2 launches of `gemv` per decode step."""
import json, sys
argv = sys.argv[1:]
log = argv[argv.index("--log-file") + 1]
steps = json.loads(argv[argv.index("--worker") + 1])["steps"]
rows = ['"ID","Kernel Name","Metric Name","Metric Unit","Metric Value"']
launches = [("prompt_kernel(float*)", 50.0)] + [("void gemv<half>(int)", 10.0)] * (2 * (steps + 1))
for i, (name, us) in enumerate(launches):
    rows += [f'"{i}","{name}","gpu__time_duration.sum","usecond","{us}"',
             f'"{i}","{name}","dram__bytes_read.sum","Mbyte","24"',
             f'"{i}","{name}","dram__bytes_write.sum","byte","1,000"']
open(log, "w").write("==PROF== Disconnected\n" + "\n".join(rows) + "\n")
'''


def test_kernels_per_step_are_the_difference_of_two_runs(tmp_path, monkeypatch):
    """Per decode step: launches, GPU time and DRAM bytes (units converted), over the extra steps of the second run."""
    ncu = tmp_path / "ncu"
    ncu.write_text(FAKE_NCU)
    ncu.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    got = profile.kernel_profile("unused", type("Args", (), {"steps": 3, "batch": 1, "prompt": 4})())
    assert list(got["kernels"]) == ["void gemv"]
    launches, us, gb = got["kernels"]["void gemv"]
    assert launches == 2 and us == pytest.approx(20.0) and gb == pytest.approx(2 * 24.001e-3)
    assert got["launches"] == 2 and got["gpu_us"] == pytest.approx(20.0)
    assert profile._rate(gb, us) == "2.40"
