"""Runs the tests marked ``asan`` (tests/native/test_native_asan.py) against the AddressSanitizer build of the library.

    python tests/native/asan_runner.py [PYTEST_ARGS...]      # what `make asan` runs; e.g. -k quick

Builds build/asan/libonnx_hybrid_ortops.so (onnx_hybrid/ops/native/build/build_config.py), then runs pytest in a child
with libasan preloaded (and libstdc++: ASan must find its __cxa_throw to wrap when it starts, and python does not
link libstdc++) and ONNX_HYBRID_LIBRARY naming that copy. Leak checks are off: CPython and ORT keep allocations
alive until exit, and leaks are not what this checks. The exit status is pytest's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script: tests/ for file_modules
from file_modules import ROOT, load_file  # noqa: E402

ASAN_LIBRARY = ROOT / "build" / "asan" / "libonnx_hybrid_ortops.so"


def _gcc_file(name: str) -> str:
    return subprocess.run(["g++", f"-print-file-name={name}"], capture_output=True, text=True,
                          check=True).stdout.strip()


def run(pytest_args: list[str], **subprocess_options) -> subprocess.CompletedProcess:
    build_config = load_file("onnx_hybrid/ops/native/build/build_config.py", "build_config")
    library = build_config.build_asan_library(ASAN_LIBRARY)
    env = {**os.environ, "LD_PRELOAD": f"{_gcc_file('libasan.so')} {_gcc_file('libstdc++.so.6')}",
           "ONNX_HYBRID_LIBRARY": str(library), "ASAN_OPTIONS": "detect_leaks=0:abort_on_error=1:halt_on_error=1"}
    command = [sys.executable, "-m", "pytest", "-m", "asan", "-p", "no:cacheprovider",
               "tests/native/test_native_asan.py", *pytest_args]
    return subprocess.run(command, env=env, cwd=ROOT, **subprocess_options)


def start(pytest_args: list[str], output) -> subprocess.Popen:
    """:func:`run` in a child process (the build too), its output written to the file ``output``."""
    return subprocess.Popen([sys.executable, __file__, *pytest_args], cwd=ROOT, stdout=output,
                            stderr=subprocess.STDOUT, text=True)


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]).returncode)
