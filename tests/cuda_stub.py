"""A stand-in libcuda.so.1 for hosts without a GPU, and the launches the library plans through it.

The stub answers the driver calls the library makes (device attributes from STUB_CC and STUB_SMEM, the current
context from STUB_CURRENT) and prints every launch: kernel, grid, block, dynamic shared memory, stream, the first
two ints of the parameters and, for GatedDeltaNet's kernels and the conv's output pass, the plan's choices carried
in their parameter structs (tail_only and row_groups; state_rows). With STUB_IMAGE_SIZE set, the image handed to
cuModuleLoadData is a real cubin of that many bytes and a lookup of a kernel it does not hold fails, as the driver's
would. `planned_launches` runs onnx_hybrid.cuda_ops on fake device addresses in a child process (the stub must be
found before the library loads libcuda) and returns each call's launches, so tests see the planner's decisions
through the same entry points a GPU run takes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from file_modules import ROOT

KERNELS = ROOT / "onnx_hybrid" / "ops" / "native" / "cuda" / "kernels"
CUDA_INCLUDE = next((d for d in (os.path.join(os.environ.get("CUDA_PATH", "/nonexistent"), "include"),
                                 "/usr/local/cuda/include") if os.path.isfile(os.path.join(d, "cuda.h"))), None)
H100_SMEM, A100_SMEM, SM89_SMEM = 232448, 166912, 101376  # opt-in shared memory per block
G27 = dict(hk=16, hv=48, dk=128, dv=128)  # GatedDeltaNet heads and head sizes of the 27B geometry

STUB_DRIVER = r"""
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "params.cuh"
static int cc(int which) { const char* v = getenv("STUB_CC"); int n = v ? atoi(v) : 90; return which ? n % 10 : n / 10; }
static int env_int(const char* name, int fallback) { const char* v = getenv(name); return v ? atoi(v) : fallback; }
static const void* g_image;
int cuInit(unsigned flags) { return 0; }
int cuDriverGetVersion(int* v) { *v = env_int("STUB_DRIVER_VERSION", 13000); return 0; }
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
  *v = attr == 75 ? cc(0) : attr == 76 ? cc(1) : attr == 97 ? env_int("STUB_SMEM", 232448) : attr == 16 ? 132 : -1;
  return 0;
}
int cuModuleLoadData(void** module, const void* image) {
  g_image = image;
  printf("load %s\n", env_int("STUB_IMAGE_SIZE", 0) ? "cubin" : (const char*)image);
  *module = (void*)1;
  return 0;
}
int cuModuleGetFunction(void** f, void* module, const char* name) {
  const int size = env_int("STUB_IMAGE_SIZE", 0);
  if (strcmp(name, "absent") == 0 || (size && !memmem(g_image, size, name, strlen(name) + 1))) return 500;
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
  const char* name = (const char*)f;
  const int* p = (const int*)params[0];
  if (strcmp(name, "failing") == 0) return 500;
  printf("launch %s %u %u %u %u %u %u %u %p %d %d", name, gx, gy, gz, bx, by, bz, smem, stream, p[0], p[1]);
  if (strncmp(name, "gdn_recurrent", 13) == 0 || strncmp(name, "gdn_chunk", 9) == 0) {
    const struct GdnParams* g = (const struct GdnParams*)params[0];
    printf(" tail_only=%d row_groups=%d", g->tail_only, g->row_groups);
  } else if (strncmp(name, "conv_output", 11) == 0) {
    printf(" state_rows=%d", ((const struct ConvParams*)params[0])->state_rows);
  }
  printf("\n");
  fflush(stdout);
  return 0;
}
"""

# cuLaunchKernelEx, read through cuda.h's own structs.
STUB_LAUNCH_EX = r"""
#include <cuda.h>
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
"""


def build_stub_drivers(folder: Path) -> dict[str, Path]:
    """Folders holding a libcuda.so.1: "plain" (no cuLaunchKernelEx: a pre-11.8 driver) and, where CUDA's cuda.h is
    at hand, "ex" (with it)."""
    (folder / "stub.c").write_text(STUB_DRIVER)
    (folder / "stub_ex.c").write_text(STUB_LAUNCH_EX)
    drivers = {}
    for name, extra in (("plain", []), ("ex", [str(folder / "stub_ex.c"), f"-I{CUDA_INCLUDE}"])):
        if extra and not CUDA_INCLUDE:
            continue
        drivers[name] = folder / name
        drivers[name].mkdir()
        subprocess.run(["gcc", "-shared", "-fPIC", f"-I{KERNELS}", "-o", str(drivers[name] / "libcuda.so.1"),
                        str(folder / "stub.c"), *extra], check=True)
    return drivers


def gdn_call(batch: int, tokens: int, dtype: str = "float16", **kw) -> dict:
    """A GatedDeltaNet call for planned_launches, at the 27B geometry unless ``kw`` says otherwise."""
    return dict(op="gdn", batch=batch, tokens=tokens, dtype=dtype, **{**G27, **kw})


def stub_environment(driver: Path, cc: int = 90, smem: int = H100_SMEM, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "ONNX_HYBRID_CUDA_IMAGES"}
    env.update(STUB_CC=str(cc), STUB_SMEM=str(smem), STUB_CURRENT="0x10", LD_LIBRARY_PATH=str(driver), **extra)
    return env


def parse_launch(line: str) -> dict:
    """A stub "launch" line as {kernel, grid, block, smem, first_pointer (the parameter struct's first field: q,
    x or state_in)} plus the plan's parameter fields it printed."""
    fields = line.split()
    launch = {"kernel": fields[1], "grid": tuple(map(int, fields[2:5])), "block": tuple(map(int, fields[5:8])),
              "smem": int(fields[8]), "first_pointer": (int(fields[10]) & 0xFFFFFFFF) | (int(fields[11]) << 32)}
    launch.update({k: int(v) for k, v in (f.split("=") for f in fields[12:])})
    return launch


def planned_launches(driver: Path, calls: list[dict], *, cc: int = 90, smem: int = H100_SMEM,
                     image: bytes | None = None) -> list[list[dict] | str]:
    """Each call's launches (parse_launch), its workspace bytes (gdn_workspace), or its error as
    "TypeName | message". ``calls``: dicts for
    cuda_stub_child.py. ``image``: a real cubin to hand the library (lookups of kernels it lacks then fail)."""
    args = [sys.executable, str(Path(__file__).with_name("cuda_stub_child.py")), json.dumps(calls), str(cc)]
    extra = {}
    if image is not None:
        path = driver.parent / f"image-sm{cc}.cubin"
        path.write_bytes(image)
        args.append(str(path))
        extra["STUB_IMAGE_SIZE"] = str(len(image))
    done = subprocess.run(args, capture_output=True, text=True, env=stub_environment(driver, cc, smem, **extra),
                          timeout=300, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-3000:]
    results: list = []
    for line in done.stdout.splitlines():
        if line.startswith("call "):
            results.append([])
        elif line.startswith("error "):
            results[-1] = line[len("error "):]
        elif line.startswith("workspace "):  # the bytes, unless something was launched (which it must not)
            results[-1] = int(line.split()[1]) if not results[-1] else results[-1]
        elif line.startswith("launch "):
            results[-1].append(parse_launch(line))
    assert len(results) == len(calls), done.stdout[-3000:]
    return results
