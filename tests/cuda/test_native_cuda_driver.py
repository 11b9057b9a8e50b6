"""The library's driver-API launcher (ops/native/cuda/driver.cc) against a stand-in libcuda.so.1, on a
host without a GPU: a small C++ program drives cuda::Launcher the way a CUDA Compute does, and the stub
driver prints every call it receives. Checked: the lazy dlopen and its error, context push/pop balanced
on every path, one module load per context, the image chosen by compute capability (same major, minor not
above the device's), function lookups and the shared-memory attribute (static + dynamic > 48 KB) cached, the launch
configuration and by-value parameters passed through, driver errors carrying the driver's text, grids
beyond CUDA's limits refused with their sizes.

Programmatic dependent launch, in both launchers (this one and the Python one, cuda_ops/launch.py): the stub's
cuLaunchKernelEx is compiled against CUDA's own cuda.h, so the launchers' copies of CUlaunchConfig and
CUlaunchAttribute are checked against the real layout; cuLaunchKernel is the fallback below sm_90, with a
driver older than CUDA 12.3 or without cuLaunchKernelEx, and when the option turns it off."""

import ctypes
import json
import os
import shutil
import subprocess
import sys

import pytest

from onnx_hybrid.cuda_ops import launch as py_launch
from file_modules import ROOT

NATIVE = str(ROOT / "onnx_hybrid" / "ops" / "native")
CUDA_INCLUDE = next((d for d in (os.path.join(os.environ.get("CUDA_PATH", "/nonexistent"), "include"),
                                 "/usr/local/cuda/include") if os.path.isfile(os.path.join(d, "cuda.h"))), None)

STUB_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
static int cc(int which) { const char* v = getenv("STUB_CC"); int n = v ? atoi(v) : 90; return which ? n % 10 : n / 10; }
int cuInit(unsigned flags) { return 0; }
int cuDriverGetVersion(int* v) { const char* e = getenv("STUB_DRIVER_VERSION"); *v = e ? atoi(e) : 13000; return 0; }
int cuGetErrorString(int r, const char** s) { *s = "CUDA_ERROR_NOT_FOUND (stub)"; return 0; }
int cuGetErrorName(int r, const char** s) { *s = "CUDA_ERROR_NOT_FOUND"; return 0; }
int cuStreamGetCtx(void* stream, void** ctx) { *ctx = stream; return 0; }  /* one context per stream here */
int cuCtxGetCurrent(void** ctx) {  /* STUB_CURRENT: the context current on the calling thread */
  const char* v = getenv("STUB_CURRENT");
  *ctx = v ? (void*)strtoul(v, NULL, 16) : NULL;
  return 0;
}
int cuCtxPushCurrent_v2(void* ctx) { printf("push %p\n", ctx); return 0; }
int cuCtxPopCurrent_v2(void** ctx) { printf("pop\n"); return 0; }
int cuCtxGetDevice(int* device) { *device = 0; return 0; }
int cuDeviceGetAttribute(int* v, int attr, int device) {
  *v = attr == 75 ? cc(0) : attr == 76 ? cc(1) : attr == 97 ? 232448 : attr == 16 ? 132 : -1;
  return 0;
}
int cuModuleLoadData(void** module, const void* image) { printf("load %s\n", (const char*)image); *module = (void*)1; return 0; }
int cuModuleGetFunction(void** f, void* module, const char* name) {
  if (strcmp(name, "absent") == 0) return 500;
  printf("lookup %s\n", name);
  *f = strdup(name);
  return 0;
}
int cuFuncGetAttribute(int* v, int attr, void* f) {  /* kernels named "static..." have 16 KB of static smem */
  *v = attr == 1 && strncmp((const char*)f, "static", 6) == 0 ? 16384 : 0;
  return 0;
}
int cuFuncSetAttribute(void* f, int attr, int value) { printf("attr %s %d %d\n", (char*)f, attr, value); return 0; }
int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned smem, void* stream, void** params, void** extra) {
  const int* p = (const int*)params[0];
  if (strcmp((const char*)f, "failing") == 0) return 500;
  printf("launch %s %u %u %u %u %u %u %u %p %d %d\n", (char*)f, gx, gy, gz, bx, by, bz, smem, stream, p[0], p[1]);
  fflush(stdout);
  return 0;
}
"""

# cuLaunchKernelEx, read through cuda.h's own structs; stub_layout reports their sizes and offsets.
STUB_LAUNCH_EX = r"""
#include <cuda.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** params, void** extra) {
  const int* p = (const int*)params[0];
  if (strcmp((const char*)f, "failing") == 0) return CUDA_ERROR_NOT_FOUND;
  printf("launch_ex %s %u %u %u %u %u %u %u %p", (const char*)f, c->gridDimX, c->gridDimY, c->gridDimZ,
         c->blockDimX, c->blockDimY, c->blockDimZ, c->sharedMemBytes, (void*)c->hStream);
  for (unsigned i = 0; i < c->numAttrs; ++i)
    printf(" attr %d=%d", (int)c->attrs[i].id, c->attrs[i].value.programmaticStreamSerializationAllowed);
  printf(" %d %d%s\n", p[0], p[1], extra ? " extra" : "");
  fflush(stdout);
  return CUDA_SUCCESS;
}
void stub_layout(size_t* out) {
  out[0] = sizeof(CUlaunchAttribute); out[1] = offsetof(CUlaunchAttribute, value);
  out[2] = sizeof(CUlaunchConfig); out[3] = offsetof(CUlaunchConfig, hStream);
  out[4] = offsetof(CUlaunchConfig, attrs); out[5] = offsetof(CUlaunchConfig, numAttrs);
}
"""

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
    (folder / "stub.c").write_text(STUB_DRIVER)
    (folder / "harness.cc").write_text(HARNESS)
    (folder / "stub_ex.c").write_text(STUB_LAUNCH_EX)
    drivers = {}  # the stub without cuLaunchKernelEx (a pre-11.8 driver), and with it where cuda.h is at hand
    for name, extra in (("plain", []), ("ex", [str(folder / "stub_ex.c"), f"-I{CUDA_INCLUDE}"])):
        if extra and not CUDA_INCLUDE:
            continue
        drivers[name] = folder / name
        drivers[name].mkdir()
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(drivers[name] / "libcuda.so.1"), str(folder / "stub.c"),
                        *extra], check=True)
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


def test_missing_driver_is_a_clear_error(programs):
    if any(os.path.exists(os.path.join(d, "libcuda.so.1")) for d in ("/usr/lib/x86_64-linux-gnu", "/usr/lib64")):
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


def test_python_launch_structs_match_cuda_h(programs):
    stub = ctypes.CDLL(str(stub_with_launch_ex(programs)))
    layout = (ctypes.c_size_t * 6)()
    stub.stub_layout(layout)
    cfg = py_launch.LaunchConfig
    assert list(layout) == [ctypes.sizeof(py_launch.LaunchAttribute), py_launch.LaunchAttribute.value.offset,
                            ctypes.sizeof(cfg), cfg.stream.offset, cfg.attrs.offset, cfg.num_attrs.offset]


@pytest.fixture
def py_driver(programs, monkeypatch):
    """cuda_ops.launch.Driver over the stub with cuLaunchKernelEx; the module's switch restored afterwards."""
    def make(version="13000"):
        monkeypatch.setenv("STUB_DRIVER_VERSION", version)
        return py_launch.Driver(ctypes.CDLL(str(stub_with_launch_ex(programs))))
    yield make
    py_launch.set_programmatic_launch(True)


def launch_python(driver, name, arch):
    params = (ctypes.c_int * 2)(42, 7)
    function = ctypes.c_char_p(name.encode())
    driver.launch(ctypes.cast(function, ctypes.c_void_p).value, (2, 3, 4), (128, 1, 1), 1024, 0x10,
                  ctypes.addressof(params), programmatic=driver.programmatic(arch), name=name)


def test_python_launcher_programmatic_and_fallbacks(py_driver, capfd):
    driver = py_driver()
    launch_python(driver, "k", 90)
    launch_python(driver, "k", 80)
    py_launch.set_programmatic_launch(False)
    launch_python(driver, "k", 90)
    py_launch.set_programmatic_launch(True)
    launch_python(py_driver(version="12020"), "k", 90)
    assert capfd.readouterr().out.splitlines() == [
        "launch_ex k 2 3 4 128 1 1 1024 0x10 attr 6=1 42 7",
        "launch k 2 3 4 128 1 1 1024 0x10 42 7",
        "launch k 2 3 4 128 1 1 1024 0x10 42 7",
        "launch k 2 3 4 128 1 1 1024 0x10 42 7",
    ]


@pytest.mark.parametrize("arch, entry", [(80, "cuLaunchKernel"), (90, "cuLaunchKernelEx")])
def test_python_launcher_reports_driver_errors(py_driver, arch, entry):
    with pytest.raises(RuntimeError, match=rf"^{entry}\(failing\) failed: CUDA_ERROR_NOT_FOUND \(CUresult 500\)$"):
        launch_python(py_driver(), "failing", arch)


# onnx_hybrid.cuda_ops through the library's C entry points, against the stand-in driver: arrays are fake device
# addresses (the stub never touches them), so the plan the Python API launches is checked without a GPU.
API_CHILD = r"""
import json, sys
import numpy as np
from onnx_hybrid.ops import contract, library
from onnx_hybrid.cuda_ops import api, plan
from onnx_hybrid.cuda_ops.tensors import DeviceTensor
from onnx_hybrid_testing.cases import random_gdn_case, random_conv_case

library.set_cuda_image(90, b"sm90\0")
api._prepared.add(0)
address = [1 << 30]
def fake(shape, dtype):
    address[0] += 1 << 24
    return DeviceTensor(address[0], tuple(int(d) for d in shape), dtype, 0, None)
def on_device(feeds):
    return {k: (v if k == "state_update_active" else fake(v.shape, str(v.dtype))) for k, v in feeds.items()}
rng = np.random.default_rng(0)
expected = []
for lengths, dtype, knobs in json.loads(sys.argv[1]):
    case = random_gdn_case(rng, lengths, dtype=dtype, num_heads_q=2, num_heads_v=4, head_size_k=128,
                           head_size_v=128, capacity=0)
    feeds = on_device(case.feeds)
    dtype = feeds["query"].dtype
    attrs = contract.resolve_attributes(contract.GATED_DELTA_NET, case.attributes)
    geo = contract.resolve_gdn({k: getattr(v, "shape", None) for k, v in feeds.items()}, attrs)
    outs = {"output": fake(geo.output_shape, dtype), "final_state": fake(geo.state_shape, "float32"),
            "state_update": fake((geo.batch, geo.capsule_width), "float32")}
    params = plan.GdnParams(q=feeds["query"].ptr, k=feeds["key"].ptr, v=feeds["value"].ptr,
                            out=outs["output"].ptr, state_in=feeds["initial_state"].ptr,
                            state_out=outs["final_state"].ptr)
    for ln in plan.gdn_plan(geo, dtype, params, arch=90, smem_optin=232448, **knobs):
        expected.append([ln.kernel, *ln.grid, *ln.block, ln.smem])
    api.gated_delta_net(feeds, outputs=outs, stream=0x10, workspace=fake((1 << 28,), "int32"), **knobs,
                        **case.attributes)
for lengths, in_place in (([3, 700], True), ([3, 700], False), ([1, 1, 1], False)):
    conv = random_conv_case(rng, lengths, channels=256, dtype="float16")
    feeds = on_device(conv.feeds)
    geo = contract.resolve_conv({k: v.shape for k, v in feeds.items()},
                                contract.resolve_attributes(contract.VARLEN_CAUSAL_CONV, conv.attributes))
    state = feeds["initial_state"] if in_place else fake((geo.batch, 256, geo.state_length), "float16")
    outs = {"output": fake((geo.total_tokens, 256), "float16"), "final_state": state,
            "state_update": fake((geo.batch, 0, 256), "float16")}
    params = plan.ConvParams(state_in=feeds["initial_state"].ptr, state_out=state.ptr)
    for ln in plan.conv_plan(geo, "float16", params):
        expected.append([ln.kernel, *ln.grid, *ln.block, ln.smem])
    api.varlen_causal_conv(feeds, stream=0x10, outputs=outs, **conv.attributes)
# the replays: 3 requests, capacity 4, Hk 2, Hv 4, Dk 128, Dv 96 (GDN); 10240 channels (conv)
state, accepted = fake((3, 4, 96, 128), "float32"), fake((3,), "int32")
width = contract.gdn_capsule_width(4, 4, 2, 128, 96)
api.replay_gdn(state, fake((3, width), "float32"), accepted, 4, stream=0x10)
expected += [[ln.kernel, *ln.grid, *ln.block, ln.smem] for ln in plan.gdn_replay_plan(
    plan.GdnReplayParams(batch=3, hk=2, hv=4, dk=128, dv=96, capacity=4))]
api.replay_conv(fake((3, 10240, 3), "float16"), fake((3, 4, 10240), "float16"), accepted, stream=0x10)
expected += [[ln.kernel, *ln.grid, *ln.block, ln.smem] for ln in plan.conv_replay_plan(
    "float16", plan.ConvReplayParams(batch=3, channels=10240, state_len=3, capacity=4))]
print("expected", json.dumps(expected))
"""


def test_python_api_launches_the_library_plan(programs):
    """cuda_ops.gated_delta_net and varlen_causal_conv launch through the library: the kernels, grids, blocks and
    shared memory the stand-in driver receives are those of cuda_ops/plan.py for decode, verify and prefill calls,
    the tuning knobs, the conv in place and apart, and both replays."""
    cases = [([1] * 8, "float16", {}), ([4] * 8, "bfloat16", {}), ([200, 100], "float16", {}),
             ([200, 100], "float16", {"engine": "recurrent", "rec_rows": 2, "rec_groups": 2}),
             ([300, 40], "bfloat16", {"engine": "chunked", "scan_width": 128, "prep_heads": 1}),
             ([5, 3], "float", {})]
    env = {k: v for k, v in os.environ.items() if k != "ONNX_HYBRID_CUDA_IMAGES"}
    env.update(STUB_CC="90", STUB_CURRENT="0x10", LD_LIBRARY_PATH=str(programs[1]["plain"]))
    done = subprocess.run([sys.executable, "-c", API_CHILD, json.dumps(cases)], capture_output=True, text=True,
                          env=env, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    expected = json.loads(next(line for line in lines if line.startswith("expected "))[len("expected "):])
    launched = [line.split()[1:9] for line in lines if line.startswith("launch ")]
    got = [[f[0], *map(int, f[1:8])] for f in launched]
    assert got == expected


API_ERRORS_CHILD = r"""
import numpy as np
from onnx_hybrid.ops import contract, library
from onnx_hybrid.cuda_ops import api
from onnx_hybrid.cuda_ops.tensors import DeviceTensor
from onnx_hybrid_testing.cases import random_gdn_case

library.set_cuda_image(90, b"sm90\0")
api._prepared.add(0)
case = random_gdn_case(np.random.default_rng(1), (3, 2), dtype="float")
feeds = {k: (v if k == "state_update_active" else DeviceTensor(1 << 30, v.shape, str(v.dtype), 0, None))
         for k, v in case.feeds.items()}
geo = contract.resolve_gdn({k: getattr(v, "shape", None) for k, v in feeds.items()},
                           contract.resolve_attributes(contract.GATED_DELTA_NET, case.attributes))
outs = {"output": DeviceTensor(1 << 31, geo.output_shape, "float32", 0, None),
        "final_state": DeviceTensor(1 << 32, geo.state_shape, "float32", 0, None),
        "state_update": DeviceTensor(1 << 33, (geo.batch, geo.capsule_width), "float32", 0, None)}
def attempt(**changes):
    try:
        api.gated_delta_net(dict(feeds, **changes.pop("feeds", {})), outputs=outs, stream=0x10, **changes,
                            **case.attributes)
    except Exception as e:
        print(type(e).__name__, "|", e)
attempt(feeds={"value": DeviceTensor(1 << 30, (5, 5, 8), "float32", 0, None)})
attempt(rec_rows=3)
attempt(engine="chunked")
"""


def test_python_api_errors_come_from_the_library(programs):
    """A contract violation raises the contract's ContractError with the message ORT gives; a knob no kernel serves
    raises PlanError naming it; nothing is launched (the stand-in driver would print it)."""
    env = {k: v for k, v in os.environ.items() if k != "ONNX_HYBRID_CUDA_IMAGES"}
    env.update(STUB_CC="90", STUB_CURRENT="0x10", LD_LIBRARY_PATH=str(programs[1]["plain"]))
    done = subprocess.run([sys.executable, "-c", API_ERRORS_CHILD], capture_output=True, text=True, env=env,
                          timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if "|" in line or line.startswith("launch")]
    from onnx_hybrid.ops import contract

    assert len(lines) == 3, lines
    assert lines[0] == "ContractError | " + contract.format_message("GatedDeltaNet", "gdn_heads_v", 5, 2)
    assert lines[1].startswith("PlanError | GatedDeltaNet: rec_rows 3 is not instantiated for key size 32"), lines[1]
    assert lines[2].startswith("PlanError | GatedDeltaNet: the chunked engine needs float16/bfloat16"), lines[2]
