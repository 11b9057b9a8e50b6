"""The installed wheel on a GPU host, as a user gets it (run by scripts/check_wheel_gpu.sh in a fresh virtual
environment without CuPy or a compiler): ``export-hybrid -e cuda`` with the architectures the wheel carries by
default, then onnxruntime-genai-cuda in a fresh process that never imports onnx_hybrid, through og.Generator and
og.Engine (paged), gives transformers' greedy tokens in fp32. The checkpoints and reference tokens come from
scripts/make_wheel_check_cases.py ($ONNX_HYBRID_WHEEL_CASES names its cases.json); skipped without them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

og = pytest.importorskip("onnxruntime_genai")

CASES_FILE = os.environ.get("ONNX_HYBRID_WHEEL_CASES")
CASES = json.loads(Path(CASES_FILE).read_text()) if CASES_FILE else []
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CASES or not og.is_cuda_available(),
                                                  reason="needs $ONNX_HYBRID_WHEEL_CASES and onnxruntime-genai-cuda")]


def run_genai(model: Path, mode: str, case: dict) -> list[list[int]]:
    from onnx_hybrid_testing import genai_driver

    job = {"model": str(model), "mode": mode, "prompts": case["prompts"], "new_tokens": len(case["tokens"][0])}
    done = subprocess.run([sys.executable, genai_driver.__file__], input=json.dumps(job), capture_output=True,
                          text=True, timeout=600, cwd=model)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["onnx_hybrid_imported"] is False
    return result["tokens"]


@pytest.mark.parametrize("paged", [False, True], ids=["generator", "engine"])
@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_installed_wheel_exports_and_runs_on_the_gpu(case, paged, tmp_path):
    out = tmp_path / "out"
    command = [str(Path(sys.executable).with_name("export-hybrid")), case["checkpoint"], "-o", str(out), "-e", "cuda",
               "--dtype", "fp32", "-q"] + (["--paged", "--block-size", "16"] if paged else [])
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    from onnx_hybrid.ops import library
    from onnx_hybrid_testing.engine import set_eos

    images = sorted(p.name for p in (out / library.IMAGE_FOLDER).iterdir())
    assert images == sorted(library.image_file_name(a) for a in library.DEFAULT_CUDA_ARCHS)
    set_eos(out, case["eos"])
    assert run_genai(out, "engine" if paged else "generator", case) == case["tokens"]
