"""The native custom-op library: where it is, how to register it, and its ctypes control functions.

ORT loads the library by path (``SessionOptions.register_custom_ops_library``); ctypes opens the same
file, which gives the same loaded object, so options set here are seen by kernels in live sessions
(spec/native_library.md §10).
"""

from __future__ import annotations

import ctypes
import functools
import os
import pathlib
import warnings

ABI_VERSION = 1
# ONNX_HYBRID_LIBRARY points the package at another build of the library (e.g. the AddressSanitizer
# copy of scripts/asan_check.py).
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
    """Register the library's ops (domain ``onnx_hybrid``) into ``session_options``; idempotent."""
    path = library_path()
    try:
        if session_options.get_session_config_entry(_REGISTERED_KEY) == path:
            return
    except Exception:  # onnxruntime raises when the key is absent
        pass
    control()  # refuse a library with another control ABI before ORT loads it into a session
    session_options.register_custom_ops_library(path)
    session_options.add_session_config_entry(_REGISTERED_KEY, path)


@functools.cache
def control() -> ctypes.CDLL:
    """The library opened through ctypes, with argtypes and restype declared for every function."""
    lib = ctypes.CDLL(library_path())
    lib.onnx_hybrid_abi_version.argtypes = []
    lib.onnx_hybrid_abi_version.restype = ctypes.c_int
    lib.onnx_hybrid_set_option.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
    lib.onnx_hybrid_set_option.restype = ctypes.c_int
    lib.onnx_hybrid_last_error.argtypes = []
    lib.onnx_hybrid_last_error.restype = ctypes.c_char_p
    lib.onnx_hybrid_cpu_isa.argtypes = []
    lib.onnx_hybrid_cpu_isa.restype = ctypes.c_char_p
    found = lib.onnx_hybrid_abi_version()
    if found != ABI_VERSION:
        raise RuntimeError(f"{library_path()} has control ABI {found}, this package expects {ABI_VERSION}; rebuild it")
    return lib


def set_option(key: str, value: str) -> None:
    """Set a library option (``register_com_microsoft`` = 0|1, ``cpu_engine`` = auto|sequential|chunked)."""
    lib = control()
    if lib.onnx_hybrid_set_option(key.encode(), value.encode()) != 0:
        raise ValueError(lib.onnx_hybrid_last_error().decode())


def cpu_isa() -> str:
    """Which variant of the CPU kernels this process runs: "avx512", "avx2" or "generic"."""
    return control().onnx_hybrid_cpu_isa().decode()


# Execution providers whose own com.microsoft kernels our alias silently replaces, and the first stock ORT
# version that has them (spec/native_library.md §8). Only CPU for now: the library has no CUDA variant yet,
# so ORT's CUDA kernels (onnxruntime-gpu >= 1.31) still win on the CUDA EP.
_ORT_OWN_KERNELS = {"CPUExecutionProvider": (1, 32)}


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
