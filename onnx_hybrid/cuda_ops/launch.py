"""Load the image into the current device's (primary) context and launch plans through the driver API.

Launching calls libcuda's ``cuLaunchKernelEx`` / ``cuLaunchKernel`` (through ctypes) with the parameter struct
passed by value, exactly as the C++ launcher of the custom-op library does, so the Python path exercises the
same ABI.

Programmatic dependent launch: on sm_90+ with a driver that can capture it into graphs (CUDA >= 12.3), each
launch carries ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``, so its blocks may start while the
kernel before it in the stream finishes; every kernel waits for its predecessor before it touches memory
(``ohk::wait_for_inputs`` in ops/native/cuda/kernels/common.cuh). ``set_programmatic_launch(False)`` turns it off.
"""

from __future__ import annotations

import ctypes
import threading

from .compiler import compile_image
from .plan import Launch

_SMEM_DEFAULT_LIMIT = 48 * 1024
CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # cuda.h's CUlaunchAttributeID
PROGRAMMATIC_MIN_ARCH = 90
PROGRAMMATIC_MIN_DRIVER = 12030  # stream capture of programmatic launches into CUDA graphs


class LaunchAttributeValue(ctypes.Union):
    """cuda.h's CUlaunchAttributeValue: 64 bytes, 8-byte aligned (some members are pointers); one member named."""
    _fields_ = [("pad", ctypes.c_char * 64), ("programmatic_stream_serialization_allowed", ctypes.c_int),
                ("pointer_alignment", ctypes.c_void_p)]


class LaunchAttribute(ctypes.Structure):
    """cuda.h's CUlaunchAttribute: the id, padded to 8 bytes, then the value."""
    _fields_ = [("id", ctypes.c_int), ("value", LaunchAttributeValue)]


class LaunchConfig(ctypes.Structure):
    """cuda.h's CUlaunchConfig."""
    _fields_ = [("grid_dim_x", ctypes.c_uint), ("grid_dim_y", ctypes.c_uint), ("grid_dim_z", ctypes.c_uint),
                ("block_dim_x", ctypes.c_uint), ("block_dim_y", ctypes.c_uint), ("block_dim_z", ctypes.c_uint),
                ("shared_mem_bytes", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(LaunchAttribute)), ("num_attrs", ctypes.c_uint)]


class Driver:
    """The launch entry points of a libcuda (the real one, or a stand-in in tests)."""

    def __init__(self, lib: ctypes.CDLL):
        self._launch = lib.cuLaunchKernel
        self._launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self._launch.restype = ctypes.c_int
        self._launch_ex = getattr(lib, "cuLaunchKernelEx", None)  # drivers since CUDA 11.8
        if self._launch_ex is not None:
            self._launch_ex.argtypes = [ctypes.POINTER(LaunchConfig), ctypes.c_void_p, ctypes.c_void_p,
                                        ctypes.c_void_p]
            self._launch_ex.restype = ctypes.c_int
        self._error_name = lib.cuGetErrorName
        self._error_name.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
        version = ctypes.c_int(0)
        lib.cuDriverGetVersion.argtypes = [ctypes.POINTER(ctypes.c_int)]
        if lib.cuDriverGetVersion(ctypes.byref(version)) != 0:
            version.value = 0
        self.supports_programmatic = self._launch_ex is not None and version.value >= PROGRAMMATIC_MIN_DRIVER
        self._programmatic_attr = (LaunchAttribute * 1)()
        self._programmatic_attr[0].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        self._programmatic_attr[0].value.programmatic_stream_serialization_allowed = 1

    def programmatic(self, arch: int) -> bool:
        """Whether launches on a device of this architecture carry the programmatic attribute now."""
        return _programmatic_enabled and arch >= PROGRAMMATIC_MIN_ARCH and self.supports_programmatic

    def launch(self, function: int, grid, block, smem: int, stream: int, params: int, *, programmatic: bool,
               name: str) -> None:
        """Enqueue ``function`` with one by-value parameter struct at address ``params``."""
        args = (ctypes.c_void_p * 1)(params)
        if programmatic:
            config = LaunchConfig(*grid, *block, smem, stream, self._programmatic_attr, 1)
            result = self._launch_ex(ctypes.byref(config), function, args, None)
        else:
            result = self._launch(function, *grid, *block, smem, stream, args, None)
        if result != 0:
            text = ctypes.c_char_p()
            self._error_name(result, ctypes.byref(text))
            entry = "cuLaunchKernelEx" if programmatic else "cuLaunchKernel"
            raise RuntimeError(f"{entry}({name}) failed: {(text.value or b'unknown error').decode()} "
                               f"(CUresult {result})")


_programmatic_enabled = True


def set_programmatic_launch(enabled: bool) -> None:
    """Use programmatic dependent launch where the device and driver support it (the default), or never.
    Read at each launch, so a CUDA graph keeps the choice in force when it was captured."""
    global _programmatic_enabled
    _programmatic_enabled = bool(enabled)


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
_driver: Driver | None = None
_lock = threading.Lock()


def image(device: int) -> _Image:
    with _lock:
        img = _images.get(device)
        if img is None:
            img = _images[device] = _Image(device)
        return img


def libcuda() -> Driver:
    """The process's libcuda (CuPy has loaded it already)."""
    global _driver
    with _lock:
        if _driver is None:
            _driver = Driver(ctypes.CDLL("libcuda.so.1"))
        return _driver


def device_arch(device: int) -> int:
    return image(device).arch


def device_smem_optin(device: int) -> int:
    """Opt-in shared memory per block (bytes): what a kernel may request with the dynamic-size attribute."""
    return image(device).smem_optin


def programmatic_launch(device: int) -> bool:
    """Whether launches on ``device`` use programmatic dependent launch now."""
    return libcuda().programmatic(image(device).arch)


def run(launches: list[Launch], device: int, stream: int) -> None:
    """Enqueue the plan on ``stream`` (a raw cudaStream_t); no host synchronisation."""
    import cupy

    img = image(device)
    drv = libcuda()
    programmatic = drv.programmatic(img.arch)
    with cupy.cuda.Device(device):
        for ln in launches:
            if 0 in ln.grid:
                continue
            f = img.function(ln.kernel, ln.smem)
            drv.launch(f, ln.grid, ln.block, ln.smem, stream, ctypes.addressof(ln.params),
                       programmatic=programmatic, name=ln.kernel)


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
