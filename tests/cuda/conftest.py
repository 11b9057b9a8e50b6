"""The kernel build tests compile every CUDA kernel with NVRTC: the installed NVRTC builds the sm_90a cubin and PTX for
sm_80, the oldest one pyproject.toml allows builds PTX for both, one to two and a half minutes a build on one core.
So that they overlap the rest of the suite on a 2-core CI machine, each NVRTC's build tests run in a child pytest
started when collection ends; test_cuda_ops_build.py's test_kernels_build_with_* run last, wait for the children
and assert their results, and the build tests themselves are deselected from this process (a run that selects them
without those two runs them here)."""

import os
import re
import subprocess
import sys
import tempfile

import pytest
from file_modules import ROOT

BUILD_TESTS = "tests/cuda/test_cuda_ops_build.py"
# The build tests each child runs. PTX (the front end and NVVM, where NVRTC versions differed) takes half of a
# cubin's time: the whole build runs once, for sm_90a (docs/design-notes.md#oldest-nvrtc).
REGISTERS = "test_conv_kernels_fit_their_registers_on_sm90"
CHILD_TESTS = {"installed": ("test_every_kernel_compiles_offline", "test_every_kernel_compiles_to_ptx[80]", REGISTERS),
               "oldest": ("test_every_kernel_compiles_to_ptx[80]", "test_every_kernel_compiles_to_ptx[90]", REGISTERS)}
CHILD_RUNS = {"installed": "test_kernels_build_with_the_installed_nvrtc",
              "oldest": "test_kernels_build_with_the_oldest_allowed_nvrtc"}
OLDEST_NVRTC_LIB = ROOT / "build" / "oldest-nvrtc" / "nvidia" / "cu13" / "lib"  # fetched by `make test`
BUILD_CHILDREN = pytest.StashKey[dict]()


def oldest_allowed_nvrtc() -> tuple[int, int]:
    """The lower bound of pyproject.toml's nvidia-cuda-nvrtc requirement, as (major, minor)."""
    bound = re.search(r'"nvidia-cuda-nvrtc>=(\d+)\.(\d+)', (ROOT / "pyproject.toml").read_text())
    return int(bound.group(1)), int(bound.group(2))


def _start(which: str):
    """The child pytest of the build tests with the installed or the oldest NVRTC, and the file of its output; None
    when the oldest NVRTC is not there."""
    env = dict(os.environ)
    check = ""
    if which == "oldest":
        lib = OLDEST_NVRTC_LIB / "libnvrtc.so.13"
        if not lib.is_file():
            return None
        env.update(LD_PRELOAD=str(lib), LD_LIBRARY_PATH=os.pathsep.join(
            filter(None, [str(OLDEST_NVRTC_LIB), os.environ.get("LD_LIBRARY_PATH")])))
        check = f"assert compiler.nvrtc_version() == {oldest_allowed_nvrtc()}, compiler.nvrtc_version()\n"
    tests = [f"{BUILD_TESTS}::{name}" for name in CHILD_TESTS[which]]
    script = ("import sys, pytest\nfrom onnx_hybrid.cuda_ops import compiler\n" + check +
              f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', *{tests!r}]))\n")
    output = tempfile.TemporaryFile(mode="w+")
    child = subprocess.Popen([sys.executable, "-c", script], env=env, cwd=ROOT, stdout=output,
                             stderr=subprocess.STDOUT, text=True)
    return child, output


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected theirs: a child selects only the build tests
def pytest_collection_modifyitems(config, items):
    runs = [which for which, name in CHILD_RUNS.items() if any(item.name == name for item in items)]
    if not runs or config.option.collectonly:
        return
    in_children = {name for which in runs for name in CHILD_TESTS[which]}
    moved = [item for item in items if item.nodeid.startswith(BUILD_TESTS) and item.name in in_children]
    config.hook.pytest_deselected(items=moved)
    waiting = [item for item in items if item.name in CHILD_RUNS.values()]
    items[:] = [item for item in items if item not in moved and item not in waiting] + waiting  # they wait last
    config.stash[BUILD_CHILDREN] = {which: _start(which) for which in runs}


@pytest.fixture
def nvrtc_build(request):
    """wait(which) -> (exit status, output) of the build child for "installed" or "oldest" NVRTC (started now if
    collection did not start it); the status is None when the oldest NVRTC is missing."""
    started = request.config.stash.get(BUILD_CHILDREN, {})

    def wait(which: str):
        run = started[which] if which in started else _start(which)
        if run is None:
            return None, f"{OLDEST_NVRTC_LIB / 'libnvrtc.so.13'} is missing: `make test` fetches it"
        child, output = run
        try:
            child.wait(timeout=900)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
        output.seek(0)
        return child.returncode, output.read()

    return wait
