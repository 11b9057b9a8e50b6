"""Compile the CUDA C kernels with NVRTC (through CuPy) into one cubin per architecture, cached on disk.

Works without a GPU: :func:`compile_image` takes the architecture explicitly and calls NVRTC directly
(``cupy.cuda.compiler.compile_using_nvrtc`` would query the current device). The cache key hashes the
sources, the options, the NVRTC version and the architecture; writes are atomic (temporary file + rename)
because several processes may compile at once (docs/native-library.md#compiling-the-kernels).
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
from functools import lru_cache
from pathlib import Path

from ..ops.contract import SEQUENTIAL_MIN_TOKENS

KERNEL_DIR = Path(__file__).resolve().parent.parent / "ops" / "native" / "cuda" / "kernels"
MAIN_SOURCE = "onnx_hybrid_kernels.cu"
CACHE_ENV = "ONNX_HYBRID_KERNEL_CACHE"
# No --use_fast_math: the state update's rounding is written out with __fmul_rn / __fmaf_rn, and the gate
# uses accurate expf / log1pf (the L2 norms use rsqrtf; docs/op-contract.md#state-update-rounding).
BASE_OPTIONS = ("-std=c++17", "--device-int128", f"-DOHK_SEQUENTIAL_MIN_TOKENS={SEQUENTIAL_MIN_TOKENS}")
# Bumped when what the cache holds for the same sources changes (2: whole ELF images, see _whole_elf).
CACHE_FORMAT = 2


class KernelBuildError(RuntimeError):
    """NVRTC rejected the kernel sources; the message carries its log."""


def _nvrtc():
    from cupy_backends.cuda.libs import nvrtc

    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    return tuple(_nvrtc().getVersion())


@lru_cache(maxsize=1)
def cuda_include_dir() -> str:
    """Directory holding cuda_fp16.h / cuda_bf16.h (not built into NVRTC 13)."""
    candidates = []
    try:
        import nvidia

        candidates += [Path(p) / "cu13" / "include" for p in nvidia.__path__]
    except ImportError:
        pass
    for env in ("CUDA_PATH", "CUDA_HOME"):
        if os.environ.get(env):
            candidates.append(Path(os.environ[env]) / "include")
    candidates.append(Path("/usr/local/cuda/include"))
    for path in candidates:
        if (path / "cuda_fp16.h").is_file():
            return str(path)
    raise KernelBuildError(
        "cuda_fp16.h not found: install nvidia-cuda-runtime (13.x) or set CUDA_PATH to a CUDA toolkit")


# Architectures whose image is built for the architecture-specific target (sm_90a): it enables wgmma, which
# the chunked scan uses there (ops/native/cuda/kernels/gdn_chunked.cu). Such a cubin runs only on devices of exactly that
# compute capability, which is how images are picked anyway (one per architecture).
ARCH_SPECIFIC = frozenset({90})


def target(arch: int) -> str:
    return f"sm_{arch}a" if arch in ARCH_SPECIFIC else f"sm_{arch}"


def options(arch: int, *, ptx: bool = False) -> tuple[str, ...]:
    """NVRTC's options for a cubin, or with ``ptx`` for PTX of the same architecture (compute_ instead of sm_)."""
    architecture = target(arch).replace("sm_", "compute_") if ptx else target(arch)
    return BASE_OPTIONS + (f"-arch={architecture}", f"-I{KERNEL_DIR}", f"-I{cuda_include_dir()}")


def sources() -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(KERNEL_DIR.iterdir()) if p.suffix in (".cu", ".cuh", ".h")}


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "onnx_hybrid" / "kernels"


def cache_key(arch: int) -> str:
    h = hashlib.sha256()
    for name, data in sources().items():
        h.update(name.encode() + b"\0" + data + b"\0")
    # The include path differs between machines; the options that change code are what matter.
    h.update("\0".join(BASE_OPTIONS + (f"-arch={target(arch)}",)).encode())
    h.update(repr(nvrtc_version()).encode())
    h.update(f"format {CACHE_FORMAT}".encode())
    return f"sm{arch}-{h.hexdigest()[:24]}"


def compile_image(arch: int, *, use_cache: bool = True) -> bytes:
    """The cubin of every kernel for ``sm_<arch>`` (e.g. 80, 90; 90 builds sm_90a), from the cache or NVRTC."""
    path = cache_dir() / f"{cache_key(arch)}.cubin"
    if use_cache and path.is_file():
        return path.read_bytes()
    image = _compile(arch)
    if use_cache:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(image)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return image


def compile_ptx(arch: int) -> str:
    """The PTX of every kernel for ``compute_<arch>`` (90: compute_90a): NVRTC's front end and NVVM without ptxas,
    about half of a cubin's build time (the build test of the oldest allowed NVRTC uses it)."""
    return _compile(arch, ptx=True).decode().rstrip("\0")


def _compile(arch: int, *, ptx: bool = False) -> bytes:
    nvrtc = _nvrtc()
    if arch not in nvrtc.getSupportedArchs():
        raise KernelBuildError(f"NVRTC {nvrtc_version()} cannot target sm_{arch}; it supports "
                               f"{nvrtc.getSupportedArchs()}")
    src = (KERNEL_DIR / MAIN_SOURCE).read_text()
    prog = nvrtc.createProgram(src, MAIN_SOURCE, (), ())
    try:
        try:
            nvrtc.compileProgram(prog, options(arch, ptx=ptx))
        except nvrtc.NVRTCError as exc:
            raise KernelBuildError(f"NVRTC failed for sm_{arch}: {exc}\n{nvrtc.getProgramLog(prog)}") from None
        return nvrtc.getPTX(prog) if ptx else _whole_elf(nvrtc.getCUBIN(prog), arch)
    finally:
        nvrtc.destroyProgram(prog)


def _whole_elf(image: bytes, arch: int) -> bytes:
    """The cubin as NVRTC built it. CuPy's getCUBIN returns it like a C string, without its last byte: the top
    byte of the last program header's alignment, which is zero. The driver loads the short image, but cuobjdump
    and nvdisasm reject it, and it should not depend on leniency: the byte is put back, checked against the end
    the ELF header declares for its section and program header tables."""
    if image[:5] != b"\x7fELF\x02":
        raise KernelBuildError(f"NVRTC returned no 64-bit ELF cubin for sm_{arch}")
    phoff, shoff = struct.unpack_from("<QQ", image, 0x20)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", image, 0x36)
    end = max(phoff + phentsize * phnum, shoff + shentsize * shnum)
    if len(image) == end - 1:
        return image + b"\0"
    if len(image) < end:
        raise KernelBuildError(f"the sm_{arch} cubin is {len(image)} bytes, its ELF header declares {end}")
    return image
