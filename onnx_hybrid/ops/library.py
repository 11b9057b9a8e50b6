"""The native custom-op library: where it is, how to register it, and its ctypes control functions.

ORT loads the library by path (``SessionOptions.register_custom_ops_library``); ctypes opens the same
file, which gives the same loaded object, so options set here are seen by kernels in live sessions
(docs/native-library.md#control-functions). That is how the CUDA variants get their kernels: :func:`prepare_cuda`
hands the library one cubin per compute capability, compiled from ``onnx_hybrid.cuda_ops`` through CuPy
(cached on disk) or read from a folder written by ``onnx-hybrid prepare-cuda``.
"""

from __future__ import annotations

import ctypes
import functools
import os
import pathlib
import re
import tempfile
import warnings

ABI_VERSION = 4  # 2: the CUDA image functions; 3: onnx_hybrid_cuda_has_image; 4: native/ort/c_api.h
# ONNX_HYBRID_LIBRARY points the package at another build of the library (e.g. the AddressSanitizer
# copy of `make asan`).
_LIBRARY = pathlib.Path(os.environ.get("ONNX_HYBRID_LIBRARY") or
                        pathlib.Path(__file__).resolve().parent / "_native" / "libonnx_hybrid_ortops.so").resolve()


class LibraryNotBuiltError(FileNotFoundError):
    pass


def library_path() -> str:
    """Absolute path of the built library (the same string every call)."""
    if not _LIBRARY.is_file():
        raise LibraryNotBuiltError(
            f"the onnx_hybrid custom-op library is not built: {_LIBRARY} is missing. Build it with "
            "`pip install -e .` (or `python setup.py build_ext --inplace`) from the repository root; the build "
            "fetches the ONNX Runtime API 21 headers, or set ONNX_HYBRID_ORT_INCLUDE to a folder that has them."
        )
    return str(_LIBRARY)


# Session-config key that marks options already registered: ORT accepts a second registration into the
# same options but then fails session creation with "Domain already set in registry".
_REGISTERED_KEY = "onnx_hybrid.custom_ops_library"


def register(session_options) -> None:
    """Register the library's ops (domain ``onnx_hybrid``) into ``session_options``; idempotent.

    The library finds CUDA kernel images by itself ($ONNX_HYBRID_CUDA_IMAGES, then ``onnx_hybrid_cuda/``
    beside its file: :func:`has_cuda_image`). Where a CUDA session could run (an ORT with the CUDA EP and
    a visible GPU) and neither holds an image for the GPU, this also compiles the kernels through CuPy
    (:func:`prepare_cuda`; once per process and GPU architecture), so that a plain
    ``InferenceSession(..., providers=["CUDAExecutionProvider"])`` works in a source checkout. A failure to
    compile them is a warning: CPU sessions do not need them.
    """
    path = library_path()
    try:
        if session_options.get_session_config_entry(_REGISTERED_KEY) == path:
            return
    except Exception:  # onnxruntime raises when the key is absent
        pass
    control()  # refuse a library with another control ABI before ORT loads it into a session
    session_options.register_custom_ops_library(path)
    session_options.add_session_config_entry(_REGISTERED_KEY, path)
    # The library reads $ONNX_HYBRID_CUDA_IMAGES and the folder beside it by itself; compile only what neither has.
    if (archs := _visible_cuda_archs()) and not all(has_cuda_image(a) for a in archs):  # once per process
        try:
            prepare_cuda()
        except (RuntimeError, OSError, ImportError) as error:  # CPU sessions must not depend on the CUDA kernels
            warnings.warn(f"onnx_hybrid: the CUDA kernels could not be prepared ({error}); CUDA sessions fail until "
                          "onnx_hybrid.ops.library.prepare_cuda() succeeds", RuntimeWarning, stacklevel=2)


@functools.cache
def control() -> ctypes.CDLL:
    """The library opened through ctypes, with argtypes and restype declared for every function."""
    lib = ctypes.CDLL(library_path())
    lib.onnx_hybrid_abi_version.argtypes = []
    lib.onnx_hybrid_abi_version.restype = ctypes.c_int
    found = lib.onnx_hybrid_abi_version()
    if found != ABI_VERSION:
        raise RuntimeError(f"{library_path()} has control ABI {found}, this package expects {ABI_VERSION}; rebuild it")
    lib.onnx_hybrid_set_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.onnx_hybrid_set_option.restype = ctypes.c_int
    lib.onnx_hybrid_last_error.argtypes = []
    lib.onnx_hybrid_last_error.restype = ctypes.c_char_p
    lib.onnx_hybrid_last_error_key.argtypes = []
    lib.onnx_hybrid_last_error_key.restype = ctypes.c_char_p
    lib.onnx_hybrid_cpu_isa.argtypes = []
    lib.onnx_hybrid_cpu_isa.restype = ctypes.c_char_p
    lib.onnx_hybrid_input_shapes.argtypes = []
    lib.onnx_hybrid_input_shapes.restype = ctypes.c_char_p
    lib.onnx_hybrid_set_cuda_image.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t]
    lib.onnx_hybrid_set_cuda_image.restype = ctypes.c_int
    lib.onnx_hybrid_cuda_images.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    lib.onnx_hybrid_cuda_images.restype = ctypes.c_int
    lib.onnx_hybrid_cuda_has_image.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.onnx_hybrid_cuda_has_image.restype = ctypes.c_int
    # The shape checks and the calls of onnx_hybrid.cuda_ops (their structs: ops/c_api.py, after native/ort/c_api.h).
    for name in ("onnx_hybrid_resolve_gdn", "onnx_hybrid_resolve_conv", "onnx_hybrid_resolve_paged_attention"):
        getattr(lib, name).argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        getattr(lib, name).restype = ctypes.c_int
    lib.onnx_hybrid_check_offsets.argtypes = [ctypes.c_char_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64,
                                              ctypes.c_void_p]
    lib.onnx_hybrid_check_offsets.restype = ctypes.c_int
    lib.onnx_hybrid_check_paged_rows.argtypes = [ctypes.c_void_p] * 5
    lib.onnx_hybrid_check_paged_rows.restype = ctypes.c_int
    lib.onnx_hybrid_cuda_gated_delta_net.argtypes = [ctypes.c_void_p]
    lib.onnx_hybrid_cuda_gated_delta_net.restype = ctypes.c_int
    lib.onnx_hybrid_cuda_varlen_causal_conv.argtypes = [ctypes.c_void_p]
    lib.onnx_hybrid_cuda_varlen_causal_conv.restype = ctypes.c_int
    lib.onnx_hybrid_cuda_replay_gdn.argtypes = [ctypes.c_void_p] * 4 + [ctypes.c_int] * 6 + [ctypes.c_void_p]
    lib.onnx_hybrid_cuda_replay_gdn.restype = ctypes.c_int
    lib.onnx_hybrid_cuda_replay_conv.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int] * 4 + [
        ctypes.c_void_p]
    lib.onnx_hybrid_cuda_replay_conv.restype = ctypes.c_int
    return lib


def set_option(key: str, value: str) -> None:
    """Set a library option (``register_com_microsoft`` = 0|1, ``cpu_engine`` = auto|sequential|chunked,
    ``cuda_gdn_engine`` = auto|chunked|recurrent, ``cuda_programmatic_launch`` = auto|off (programmatic
    dependent launch on sm_90+, from the next launch on), ``input_shapes`` = auto|copied: how kernels read
    input shapes from the next registration on, for every session of the process; a test knob)."""
    lib = control()
    if lib.onnx_hybrid_set_option(key.encode(), value.encode()) != 0:
        raise ValueError(lib.onnx_hybrid_last_error().decode())


def input_shapes() -> str:
    """How the kernels read input shapes: "lent" (ORT >= 1.24 lends them) or "copied" (the API-21 copy)."""
    return control().onnx_hybrid_input_shapes().decode()


def cpu_isa() -> str:
    """Which variant of the CPU kernels this process runs: "avx512-vnni", "avx512", "avx2" or "generic"."""
    return control().onnx_hybrid_cpu_isa().decode()


# Execution providers whose own com.microsoft kernels our alias silently replaces, and the first stock ORT
# version that has them (docs/native-library.md#registering-under-onnx-runtimes-domain): the CPU kernels of
# onnxruntime 1.32 and the CUDA kernels of onnxruntime-gpu 1.31.
_ORT_OWN_KERNELS = {"CPUExecutionProvider": (1, 32), "CUDAExecutionProvider": (1, 31)}


def enable_com_microsoft_alias(enabled: bool = True) -> None:
    """Also register the kernels under ``com.microsoft`` in sessions registered from now on.

    Warns when the running ORT has its own kernels for these ops, which the alias then overrides.
    """
    if enabled:
        import onnxruntime as ort

        version = tuple(int(p) for p in ort.__version__.split(".")[:2])
        shadowed = [ep for ep, since in _ORT_OWN_KERNELS.items()
                    if ep in ort.get_available_providers() and version >= since]
        if shadowed:
            warnings.warn(
                f"onnxruntime {ort.__version__} has its own com.microsoft GatedDeltaNet / VarlenCausalConvWithState "
                f"kernels for {', '.join(shadowed)}; the onnx_hybrid alias overrides them in sessions registered "
                "from now on", RuntimeWarning, stacklevel=2)
    set_option("register_com_microsoft", "1" if enabled else "0")


# ---------------------------------------------------------------------------------------------------------
# CUDA kernels for the CUDA variants
# ---------------------------------------------------------------------------------------------------------

# A folder of prepared images (``onnx-hybrid prepare-cuda -o DIR``): every sm<arch>.cubin in it is loaded.
IMAGES_ENV = "ONNX_HYBRID_CUDA_IMAGES"
# The folder beside the library file where the library itself looks for sm<arch>.cubin when a CUDA session
# needs kernels none were handed for (after $ONNX_HYBRID_CUDA_IMAGES). Wheels and `-e cuda` exports fill it.
IMAGE_FOLDER = "onnx_hybrid_cuda"
# The architectures wheels and `-e cuda` exports carry by default: A100 (sm_80; its image also runs on
# sm_86/87), L4/L40 (sm_89) and H100/H200 (sm_90, built as sm_90a).
DEFAULT_CUDA_ARCHS = (80, 89, 90)
_IMAGE_NAME = re.compile(r"^sm(\d+)\.cubin$")


class CudaPrepareError(RuntimeError):
    pass


def set_cuda_image(arch: int, image: bytes) -> None:
    """Hand the library the kernels' image for ``sm_<arch>`` (the library copies it). A second call for the
    same arch must pass the same bytes."""
    lib = control()
    if lib.onnx_hybrid_set_cuda_image(arch // 10, arch % 10, image, len(image)) != 0:
        raise CudaPrepareError(lib.onnx_hybrid_last_error().decode())


def cuda_images() -> list[int]:
    """The architectures (e.g. [90]) the library holds kernel images for."""
    text = _text(control().onnx_hybrid_cuda_images)
    return [int(item.removeprefix("sm_")) for item in text.split(", ") if item]


def has_cuda_image(arch: int) -> bool:
    """Whether a GPU of compute capability ``arch`` (e.g. 86) would get a kernel image from the library: one handed
    over, or one it finds in $ONNX_HYBRID_CUDA_IMAGES or beside its file (the launcher's own rule)."""
    found = control().onnx_hybrid_cuda_has_image(arch // 10, arch % 10)
    if found < 0:
        raise CudaPrepareError(control().onnx_hybrid_last_error().decode())
    return found == 1


def image_file_name(arch: int) -> str:
    return f"sm{arch}.cubin"


def packaged_image(arch: int) -> pathlib.Path | None:
    """The image for ``sm_<arch>`` that ships beside this package's library (wheels carry them), if any."""
    path = _LIBRARY.parent / IMAGE_FOLDER / image_file_name(arch)
    return path if path.is_file() else None


def cuda_image(arch: int) -> bytes:
    """The kernels' image for ``sm_<arch>``: compiled from this package's sources through CuPy/NVRTC (cached on
    disk; no GPU needed), or, where CuPy is absent, the one a wheel ships beside the library (built from the same
    sources). Compiling first means a source checkout never serves an image left from older sources."""
    try:
        from ..cuda_ops.compiler import compile_image
    except ImportError as error:
        if (shipped := packaged_image(arch)) is not None:
            return shipped.read_bytes()
        raise CudaPrepareError(f"no sm{arch}.cubin ships beside {_LIBRARY.name} ({_LIBRARY.parent / IMAGE_FOLDER}), "
                               f"and compiling one needs CuPy with NVRTC ({error}): pip install 'onnx-hybrid[gpu]', "
                               "or install a wheel that carries the images") from None
    return compile_image(arch)


def write_cuda_images(archs, directory) -> list[pathlib.Path]:
    """Write the kernels' image for each ``sm_<arch>`` (no GPU needed) to ``directory``/sm<arch>.cubin."""
    folder = pathlib.Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for arch in archs:
        path = folder / image_file_name(arch)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(cuda_image(arch))
            os.chmod(tmp, 0o644)  # mkstemp's 0600 would hide the images from other users of the folder
            os.replace(tmp, path)
        except BaseException:
            pathlib.Path(tmp).unlink(missing_ok=True)
            raise
        written.append(path)
    return written


def prepare_cuda(*, arch: int | None = None, directory=None) -> list[int]:
    """Give the library the CUDA kernels before a CUDA session runs; returns the archs now loaded from here.

    * ``directory`` (or $ONNX_HYBRID_CUDA_IMAGES): load every ``sm<arch>.cubin`` prepared there; no CuPy needed.
    * ``arch``: compile for ``sm_<arch>`` through CuPy/NVRTC (or take it from the kernel cache); no GPU needed.
    * neither: compile for the compute capability of every visible GPU.
    """
    folder = directory or os.environ.get(IMAGES_ENV)
    if folder:
        found = sorted((int(m.group(1)), p) for p in pathlib.Path(folder).glob("sm*.cubin")
                       if (m := _IMAGE_NAME.match(p.name)))
        if not found:
            raise CudaPrepareError(f"no sm<arch>.cubin in {folder}; write them with `onnx-hybrid prepare-cuda "
                                   f"--arch <cc> -o {folder}`")
        for a, path in found:
            set_cuda_image(a, path.read_bytes())
        return [a for a, _ in found]
    archs = [arch] if arch is not None else _visible_cuda_archs()
    if not archs:
        raise CudaPrepareError("no CUDA device visible to CuPy; pass arch=<compute capability> or set "
                               f"{IMAGES_ENV} to a folder written by `onnx-hybrid prepare-cuda`")
    for a in archs:
        set_cuda_image(a, cuda_image(a))
    return archs


def _visible_cuda_archs() -> list[int]:
    """Compute capabilities (e.g. 90) of the GPUs CuPy sees, when this ORT can run the CUDA EP; else []."""
    try:
        import onnxruntime as ort

        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return []
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, no driver, no device: nothing to prepare here
        return []
    return sorted({int(cupy.cuda.Device(d).compute_capability) for d in range(count)})


def _text(call, *args) -> str:
    """Call a control function that writes text into a caller buffer and returns the length it needs."""
    lib = control()
    size = 1024
    while True:
        buf = ctypes.create_string_buffer(size)
        n = call(*args, buf, size)
        if n < 0:
            raise ValueError(lib.onnx_hybrid_last_error().decode())
        if n < size:
            return buf.value.decode()
        size = n + 1
