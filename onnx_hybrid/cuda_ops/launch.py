"""Load the image into the current device's (primary) context and launch plans through the driver API.

Launching goes through ``cuLaunchKernel`` with the parameter struct passed by value, exactly as the C++
launcher of the custom-op library does, so the Python path exercises the same ABI.
"""

from __future__ import annotations

import ctypes
import threading

from .compiler import compile_image
from .plan import Launch

_SMEM_DEFAULT_LIMIT = 48 * 1024


class _Image:
    def __init__(self, device: int):
        import cupy
        from cupy_backends.cuda.api import driver

        with cupy.cuda.Device(device):
            cupy.cuda.runtime.free(0)  # make the primary context current
            cc = cupy.cuda.Device(device).compute_capability
            self.arch = int(cc)
            self.smem_optin = cupy.cuda.runtime.deviceGetAttribute(
                cupy.cuda.runtime.cudaDevAttrMaxSharedMemoryPerBlockOptin, device)
            self.module = driver.moduleLoadData(compile_image(self.arch))
        self.device = device
        self.functions: dict[str, int] = {}
        self.smem_allowed: dict[str, int] = {}  # dynamic shared memory each function may take now

    def function(self, name: str, smem: int) -> int:
        from cupy_backends.cuda.api import driver

        f = self.functions.get(name)
        if f is None:
            f = self.functions[name] = driver.moduleGetFunction(self.module, name)
            # Without the opt-in, static and dynamic shared memory together stay within 48 KB.
            static = driver.funcGetAttribute(driver.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, f)
            self.smem_allowed[name] = _SMEM_DEFAULT_LIMIT - static
        if smem > self.smem_allowed[name]:
            driver.funcSetAttribute(f, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem)
            self.smem_allowed[name] = smem
        return f


_images: dict[int, _Image] = {}
_lock = threading.Lock()


def image(device: int) -> _Image:
    with _lock:
        img = _images.get(device)
        if img is None:
            img = _images[device] = _Image(device)
        return img


def device_arch(device: int) -> int:
    return image(device).arch


def device_smem_optin(device: int) -> int:
    """Opt-in shared memory per block (bytes): what a kernel may request with the dynamic-size attribute."""
    return image(device).smem_optin


def run(launches: list[Launch], device: int, stream: int) -> None:
    """Enqueue the plan on ``stream`` (a raw cudaStream_t); no host synchronisation."""
    import cupy
    from cupy_backends.cuda.api import driver

    img = image(device)
    with cupy.cuda.Device(device):
        for ln in launches:
            if 0 in ln.grid:
                continue
            f = img.function(ln.kernel, ln.smem)
            args = (ctypes.c_void_p * 1)(ctypes.addressof(ln.params))
            driver.launchKernel(f, *ln.grid, *ln.block, ln.smem, stream, ctypes.addressof(args), 0)


def global_int(device: int, name: str) -> int:
    """Read an ``extern "C" __constant__ int`` of the image (for plan/kernel consistency checks)."""
    import cupy
    from cupy_backends.cuda.api import driver

    img = image(device)
    with cupy.cuda.Device(device):
        ptr = driver.moduleGetGlobal(img.module, name)
        out = cupy.empty(1, dtype=cupy.int32)
        cupy.cuda.runtime.memcpy(out.data.ptr, ptr, 4, cupy.cuda.runtime.memcpyDeviceToDevice)
        return int(out.get()[0])
