"""How the native library is compiled: sources, flags, and the generated and fetched include folders.

Shared by setup.py (the package build), which loads this file by path, and `make asan`, which runs it as a
script to build the AddressSanitizer copy (`python build_config.py --asan OUTPUT`). Standard library only: it
runs before the package's dependencies are installed.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

BUILD = pathlib.Path(__file__).resolve().parent
NATIVE = BUILD.parent  # common.*, ort/, shapes/, cpu/, cuda/ (with the kernels NVRTC compiles)
ROOT = NATIVE.parent.parent.parent
ORT_API_VERSION = 21
HEADER_CACHE = ROOT / "build" / "ort-headers"
GENERATED = ROOT / "build" / "generated"
# The CUDA kernels' parameter structs (params.cuh) and launch configuration (launch_config.h) are compiled by
# NVRTC and by the library's planner and launcher.
CUDA_KERNELS = NATIVE / "cuda" / "kernels"

# docs/native-library.md#build: no FMA contraction (the recurrence's rounding is part of the contract), no
# fast-math, hidden symbols; AVX-512 code is confined to one file by a target pragma.
COMPILE_ARGS = ["-std=c++17", "-O2", "-g0", "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
                "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wextra", "-Wno-unused-parameter"]
LINK_ARGS = ["-Wl,--exclude-libs,ALL", "-Wl,--as-needed", f"-Wl,--version-script={BUILD / 'exports.map'}"]
# The package's library needs only glibc and libgcc_s (both on every Linux host, and allowed by every manylinux
# policy), so one wheel runs beside whatever libstdc++ the host or onnxruntime brings: libstdc++ is linked in,
# its symbols hidden by --exclude-libs. --gc-sections drops the parts of libstdc++.a nothing calls (random.o's
# arc4random, glibc 2.36). libgcc stays shared: the static unwinder calls _dl_find_object (glibc 2.35).
# (The AddressSanitizer copy links without these: ASan intercepts the shared libstdc++'s __cxa_throw.)
PORTABLE_LINK_ARGS = ["-static-libstdc++", "-Wl,--gc-sections"]


def sources() -> list[pathlib.Path]:
    return sorted(NATIVE.rglob("*.cc"))


def header_dependencies() -> list[pathlib.Path]:
    """The headers the sources include: ours (launch_config.h among them), the CUDA parameter structs, and the
    generated contract header (which may not exist yet; include_dirs() writes it before the compiler runs)."""
    return [*sorted(NATIVE.rglob("*.h")), *sorted(NATIVE.rglob("*.inc")), CUDA_KERNELS / "params.cuh",
            GENERATED / "contract_generated.h"]


class BuildConfigError(RuntimeError):
    pass


def ort_include_dir() -> pathlib.Path:
    """$ONNX_HYBRID_ORT_INCLUDE, or Debian trixie's API-21 headers fetched once into build/ort-headers."""
    given = os.environ.get("ONNX_HYBRID_ORT_INCLUDE")
    include = pathlib.Path(given) if given else HEADER_CACHE
    if not given and not (include / "onnxruntime_c_api.h").exists():
        # Unchecked: the script prints why it failed, and the missing header below ends the build with a hint.
        subprocess.run(["sh", str(BUILD / "fetch_ort_headers.sh"), str(include)], check=False)
    header = include / "onnxruntime_c_api.h"
    if not header.exists():
        raise BuildConfigError(f"{header} not found; set ONNX_HYBRID_ORT_INCLUDE to a folder with the ONNX Runtime "
                               f"API {ORT_API_VERSION} C/C++ headers")
    found = re.search(r"^#define ORT_API_VERSION (\d+)", header.read_text(), re.M)
    if not found or int(found.group(1)) != ORT_API_VERSION:
        raise BuildConfigError(
            f"{header} has ORT_API_VERSION {found.group(1) if found else 'none'}, expected {ORT_API_VERSION} "
            "(libonnxruntime-dev 1.21.0+dfsg-1); newer headers would make the library refuse older runtimes")
    return include


def _write_if_changed(path: pathlib.Path, text: str) -> None:
    """Keep the timestamp of an unchanged generated header, so the C++ sources are not rebuilt for nothing."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text() != text:
        path.write_text(text)


def include_dirs() -> list[str]:
    """Fetch the ORT headers if needed, generate the contract header, return the include path."""
    include = ort_include_dir()
    text = subprocess.run([sys.executable, str(BUILD / "gen_contract_header.py")], check=True, stdout=subprocess.PIPE,
                          text=True).stdout
    _write_if_changed(GENERATED / "contract_generated.h", text)
    return [str(include), str(GENERATED), str(NATIVE)]


# The AddressSanitizer copy (`make asan`): debug info and frame pointers for its reports, -O1 as ASan advises.
ASAN_ARGS = ["-O1", "-g", "-fsanitize=address", "-fno-omit-frame-pointer"]


def build_asan_library(output: pathlib.Path) -> pathlib.Path:
    """Compile the library with AddressSanitizer into ``output`` (one g++ call over every source)."""
    output.parent.mkdir(parents=True, exist_ok=True)
    flags = [f for f in COMPILE_ARGS if f not in ("-O2", "-g0")]
    command = (["g++", *flags, *ASAN_ARGS, "-shared"] + [f"-I{d}" for d in include_dirs()]
               + [str(s) for s in sources()] + LINK_ARGS + ["-o", str(output)])
    subprocess.run(command, check=True, cwd=ROOT)
    return output


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description="build the AddressSanitizer copy of the native library")
    parser.add_argument("--asan", type=pathlib.Path, required=True, metavar="OUTPUT", help="the .so to write")
    build_asan_library(parser.parse_args().asan)
