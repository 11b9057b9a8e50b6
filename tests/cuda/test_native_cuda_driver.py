"""The library's driver-API launcher (ops/native/cuda/driver.cc) against a stand-in libcuda.so.1, on a
host without a GPU: a small C++ program drives cuda::Launcher the way a CUDA Compute does, and the stub
driver prints every call it receives. Checked: the lazy dlopen and its error, context push/pop balanced
on every path, one module load per context, the image chosen by compute capability (same major, minor not
above the device's), function lookups and the shared-memory attribute (static + dynamic > 48 KB) cached, the launch
configuration and by-value parameters passed through, driver errors carrying the driver's text, grids
beyond CUDA's limits refused with their sizes.

Programmatic dependent launch: the stub's cuLaunchKernelEx (tests/cuda_stub.py) is compiled against CUDA's own
cuda.h, so the launcher's copies of CUlaunchConfig and CUlaunchAttribute are checked against the real layout;
cuLaunchKernel is the fallback below sm_90, with a driver older than CUDA 12.3 or without cuLaunchKernelEx, and
when the option turns it off. What the planner launches through this launcher: tests/cuda/test_launch_plan.py."""

import ctypes
import os
import shutil
import subprocess

import pytest
from cuda_stub import build_stub_drivers
from file_modules import ROOT

NATIVE = str(ROOT / "onnx_hybrid" / "ops" / "native")

HARNESS = r"""
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include "cuda/driver.h"
using namespace onnx_hybrid::cuda;

static void Attempt(unsigned long stream, const char* kernel, int smem, unsigned gx = 2, unsigned gz = 4) {
  try {
    Launcher launcher(reinterpret_cast<void*>(stream));
    std::printf("device %d %d\n", launcher.device().arch, launcher.device().smem_optin);
    const int params[2] = {42, 7};
    launcher.Launch(kernel, {gx, 3, gz}, {128, 1, 1}, smem, params);
  } catch (const std::exception& e) {
    std::printf("error %s\n", e.what());
  }
  std::fflush(stdout);
}

int main(int argc, char** argv) {
  if (std::getenv("HARNESS_PLAIN")) SetProgrammaticLaunch(false);
  Attempt(0x10, "k", 0);  // no image yet
  std::string error;
  for (int i = 1; i < argc; ++i) {  // images "sm80" ... given as arguments
    const std::string name = argv[i];
    const int arch = std::stoi(name.substr(2));
    if (!SetImage(arch / 10, arch % 10, argv[i], name.size() + 1, &error)) std::printf("set failed %s\n", error.c_str());
  }
  std::printf("images %s\n", ImageList().c_str());
  Attempt(0x10, "k", 0);
  Attempt(0x10, "k", 100000);  // > 48 KB: the attribute is set once
  Attempt(0x10, "k", 100000);
  Attempt(0x10, "static", 40000);  // 16 KB static + 40000 dynamic > 48 KB: the attribute is needed too
  Attempt(0x10, "k", 0, 0);    // an empty grid launches nothing
  Attempt(0x10, "k", 0, 2, 65536);  // a grid beyond CUDA's limits is refused with the sizes
  Attempt(0x20, "k", 0);       // another context loads the image again
  Attempt(0x10, "absent", 0);  // a driver error, with its text
  return 0;
}
"""


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    if not (shutil.which("g++") and shutil.which("gcc")):
        pytest.fail("g++ and gcc are needed to build the launcher test (they build the library too)")
    folder = tmp_path_factory.mktemp("cuda-driver")
    (folder / "harness.cc").write_text(HARNESS)
    drivers = build_stub_drivers(folder)
    subprocess.run(["g++", "-std=c++17", "-O1", f"-I{NATIVE}", str(folder / "harness.cc"),
                    os.path.join(NATIVE, "cuda", "driver.cc"), "-ldl", "-o", str(folder / "harness")], check=True)
    return folder / "harness", drivers


def stub_with_launch_ex(programs):
    if "ex" not in programs[1]:
        pytest.skip("needs CUDA's cuda.h (CUDA_PATH or /usr/local/cuda) to build the stub's cuLaunchKernelEx")
    return programs[1]["ex"] / "libcuda.so.1"


def run(programs, *images, cc="90", with_driver=True, current=None, driver="plain", env_extra=None, harness=None):
    harness, drivers = harness or programs[0], programs[1]
    env = {k: v for k, v in os.environ.items() if k != "ONNX_HYBRID_CUDA_IMAGES"}
    env.update(STUB_CC=cc, **(env_extra or {}))
    if current:
        env["STUB_CURRENT"] = current
    if with_driver:
        env["LD_LIBRARY_PATH"] = str(drivers[driver])
    done = subprocess.run([str(harness), *images], capture_output=True, text=True, env=env, timeout=60, check=True)
    return done.stdout.splitlines()


def no_image_error(arch, folder, handed="none", env="$ONNX_HYBRID_CUDA_IMAGES: not set",
                   beside="no such folder"):
    """The library's error for a device it has no image for, with the places it looked in."""
    images = folder / "onnx_hybrid_cuda"
    return (f"error onnx_hybrid: no CUDA kernel image for this GPU's architecture sm_{arch}. Looked in {env}; "
            f"beside the library ({images}): {beside}; handed over by onnx_hybrid.ops.library.prepare_cuda(): "
            f"{handed}. Prepare one with `onnx-hybrid prepare-cuda --arch {arch} -o {images}` (needs CuPy and "
            f"NVRTC, no GPU), or export with `export-hybrid ... -e cuda --cuda-arch {arch}`")


def test_launch_sequence(programs):
    lines = run(programs, "sm80", "sm90", cc="90")
    assert lines == [
        "push 0x10",
        "pop",
        no_image_error(90, programs[0].parent),
        "images sm_80, sm_90",
        "push 0x10", "load sm90", "device 90 232448", "lookup k", "launch k 2 3 4 128 1 1 0 0x10 42 7", "pop",
        "push 0x10", "device 90 232448", "attr k 8 100000", "launch k 2 3 4 128 1 1 100000 0x10 42 7", "pop",
        "push 0x10", "device 90 232448", "launch k 2 3 4 128 1 1 100000 0x10 42 7", "pop",
        "push 0x10", "device 90 232448", "lookup static", "attr static 8 40000",
        "launch static 2 3 4 128 1 1 40000 0x10 42 7", "pop",
        "push 0x10", "device 90 232448", "pop",
        "push 0x10", "device 90 232448", "pop",
        "error onnx_hybrid: k needs a grid of 2 x 3 x 65536 blocks, beyond CUDA's limit of 2147483647 x 65535 x 65535; "
        "split the call into smaller batches",
        "push 0x20", "load sm90", "device 90 232448", "lookup k", "launch k 2 3 4 128 1 1 0 0x20 42 7", "pop",
        "push 0x10", "device 90 232448", "pop",
        "error onnx_hybrid: cuModuleGetFunction(absent) failed: CUDA_ERROR_NOT_FOUND (stub) (CUresult 500)",
    ]


def test_no_push_when_the_streams_context_is_current(programs):
    lines = run(programs, "sm90", current="0x10")
    assert "push 0x10" not in lines and "push 0x20" in lines
    assert lines.count("push 0x20") == lines.count("pop")
    assert "launch k 2 3 4 128 1 1 0 0x10 42 7" in lines


def test_a_cubin_serves_later_minors_of_its_major(programs):
    lines = run(programs, "sm80", "sm90", cc="86")
    assert "load sm80" in lines and "device 86 232448" in lines


def test_no_image_for_the_device_names_the_loaded_ones(programs):
    lines = run(programs, "sm86", cc="80")
    assert no_image_error(80, programs[0].parent, handed="sm_86") in lines
    assert sum(line.startswith("push") for line in lines) == lines.count("pop")  # popped on the error path too


@pytest.fixture
def own_harness(programs, tmp_path):
    """A copy of the harness in a folder of its own: the library's folder, as the launcher sees it (dladdr)."""
    folder = tmp_path / "lib"
    folder.mkdir()
    shutil.copy2(programs[0], folder / "harness")
    return folder / "harness"


def write_images(folder, *archs, tag="disk"):
    folder.mkdir(parents=True, exist_ok=True)
    for arch in archs:  # the stub's cuModuleLoadData prints the image as text: an ELF magic, then a name
        (folder / f"sm{arch}.cubin").write_bytes(b"\x7fELF" + f"sm{arch}-{tag}".encode() + b"\0")


def test_images_beside_the_library_are_found_by_the_library(programs, own_harness):
    write_images(own_harness.parent / "onnx_hybrid_cuda", 80, 90)
    (own_harness.parent / "onnx_hybrid_cuda" / "sm90.cubin.tmp").write_bytes(b"ignored")
    lines = run(programs, cc="86", harness=own_harness)
    assert lines[:2] == ["push 0x10", "load \x7fELFsm80-disk"]  # the first launch, with no image handed over
    assert "launch k 2 3 4 128 1 1 0 0x10 42 7" in lines
    assert lines.count("load \x7fELFsm80-disk") == 2  # two contexts, one image read from disk


def test_the_variable_comes_before_the_folder_beside_the_library(programs, own_harness, tmp_path):
    write_images(own_harness.parent / "onnx_hybrid_cuda", 90, tag="beside")
    write_images(tmp_path / "env", 90, tag="env")
    lines = run(programs, cc="90", harness=own_harness, env_extra={"ONNX_HYBRID_CUDA_IMAGES": str(tmp_path / "env")})
    assert lines[1] == "load \x7fELFsm90-env"


def test_handed_images_come_before_the_folders(programs, own_harness):
    write_images(own_harness.parent / "onnx_hybrid_cuda", 90)
    lines = run(programs, "sm90", cc="90", harness=own_harness)
    assert "load \x7fELFsm90-disk" in lines  # the first launch, before the harness hands its images over
    assert "load sm90" not in lines  # then the image read from disk stays: images are never replaced
    assert "set failed onnx_hybrid_set_cuda_image: a different image is already set for sm_90 (images are never " \
           "replaced; restart the process to use new kernels)" in lines


def test_no_image_anywhere_names_every_place_looked_in(programs, own_harness, tmp_path):
    write_images(own_harness.parent / "onnx_hybrid_cuda", 80)
    (tmp_path / "empty").mkdir()
    lines = run(programs, cc="90", harness=own_harness, env_extra={"ONNX_HYBRID_CUDA_IMAGES": str(tmp_path / "empty")})
    assert lines[2] == no_image_error(90, own_harness.parent, env=f"$ONNX_HYBRID_CUDA_IMAGES ({tmp_path / 'empty'}): "
                                      "no sm<arch>.cubin", beside="holds sm_80")


def test_a_file_that_is_no_cubin_is_a_clear_error(programs, own_harness):
    folder = own_harness.parent / "onnx_hybrid_cuda"
    folder.mkdir()
    (folder / "sm90.cubin").write_text("not a cubin")
    lines = run(programs, cc="90", harness=own_harness)
    assert lines[2] == (f"error onnx_hybrid: {folder / 'sm90.cubin'} is not a cubin (no ELF header); write it with "
                        "`onnx-hybrid prepare-cuda`")


def _real_driver_loads() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


def test_missing_driver_is_a_clear_error(programs):
    if _real_driver_loads():
        pytest.skip("this host has a real libcuda.so.1")
    lines = run(programs, "sm90", with_driver=False)
    assert lines[0].startswith("error onnx_hybrid: the CUDA driver (libcuda.so.1) cannot be loaded: ")
    assert all(line.startswith(("error onnx_hybrid: the CUDA driver", "images")) for line in lines)


def test_programmatic_launch_on_sm90(programs):
    stub_with_launch_ex(programs)
    lines = run(programs, "sm80", "sm90", cc="90", driver="ex")
    assert "launch_ex k 2 3 4 128 1 1 0 0x10 attr 6=1 42 7" in lines
    assert "launch_ex static 2 3 4 128 1 1 40000 0x10 attr 6=1 42 7" in lines
    assert not any(line.startswith("launch ") for line in lines)


@pytest.mark.parametrize("cc, env", [("86", {}), ("90", {"STUB_DRIVER_VERSION": "12020"}),
                                     ("90", {"HARNESS_PLAIN": "1"})],
                         ids=["sm86", "driver-12.2", "option-off"])
def test_plain_launch_where_programmatic_does_not_apply(programs, cc, env):
    stub_with_launch_ex(programs)
    lines = run(programs, "sm80", "sm90", cc=cc, driver="ex", env_extra=env)
    assert "launch k 2 3 4 128 1 1 0 0x10 42 7" in lines
    assert not any(line.startswith("launch_ex") for line in lines)


def test_plain_launch_without_the_ex_entry_point(programs):
    lines = run(programs, "sm90", cc="90", driver="plain")
    assert "launch k 2 3 4 128 1 1 0 0x10 42 7" in lines
