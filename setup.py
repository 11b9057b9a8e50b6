"""Build of the native custom-op library (spec/native_library.md §2, §4).

Everything else about the package lives in pyproject.toml. The library is one shared object,
onnx_hybrid/ops/_native/libonnx_hybrid_ortops.so, compiled from onnx_hybrid/ops/native/*.cc against
ONNX Runtime API 21 headers: $ONNX_HYBRID_ORT_INCLUDE if set, otherwise Debian trixie's
libonnxruntime-dev 1.21.0+dfsg-1 fetched into build/ort-headers (cached, git-ignored).
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
NATIVE = ROOT / "onnx_hybrid" / "ops" / "native"
LIBRARY = "onnx_hybrid.ops._native.libonnx_hybrid_ortops"
ORT_API_VERSION = 21
HEADER_CACHE = ROOT / "build" / "ort-headers"
GENERATED = ROOT / "build" / "generated"

COMPILE_ARGS = ["-std=c++17", "-O2", "-g0", "-fPIC", "-fvisibility=hidden", "-fvisibility-inlines-hidden",
                "-ffp-contract=off", "-fno-fast-math", "-Wall", "-Wextra", "-Wno-unused-parameter"]
LINK_ARGS = ["-Wl,--exclude-libs,ALL", "-Wl,--as-needed", f"-Wl,--version-script={NATIVE / 'exports.map'}"]


def ort_include_dir() -> pathlib.Path:
    given = os.environ.get("ONNX_HYBRID_ORT_INCLUDE")
    if given:
        include = pathlib.Path(given)
    else:
        include = HEADER_CACHE
        if not (include / "onnxruntime_c_api.h").exists():
            subprocess.run(["sh", str(NATIVE / "fetch_ort_headers.sh"), str(include)], check=True)
    header = include / "onnxruntime_c_api.h"
    if not header.exists():
        sys.exit(f"onnx_hybrid build: {header} not found; set ONNX_HYBRID_ORT_INCLUDE to a folder with the "
                 f"ONNX Runtime API {ORT_API_VERSION} C/C++ headers")
    found = re.search(r"^#define ORT_API_VERSION (\d+)", header.read_text(), re.M)
    if not found or int(found.group(1)) != ORT_API_VERSION:
        got = found.group(1) if found else "none"
        sys.exit(f"onnx_hybrid build: {header} has ORT_API_VERSION {got}, expected {ORT_API_VERSION} "
                 "(libonnxruntime-dev 1.21.0+dfsg-1); a newer API would make the library refuse older runtimes")
    return include


class BuildNative(build_ext):
    """Fetches the headers and writes the contract header before compiling; names the library plainly."""

    def build_extensions(self):
        include = ort_include_dir()
        subprocess.run([sys.executable, str(NATIVE / "gen_contract_header.py"),
                        str(GENERATED / "contract_generated.h")], check=True)
        for ext in self.extensions:
            ext.include_dirs[:0] = [str(include), str(GENERATED), str(NATIVE)]
        # Python's own CFLAGS carry -g and C-only options; the library wants exactly its flags.
        self.compiler.compiler_so = [a for a in self.compiler.compiler_so if a not in ("-g", "-Wstrict-prototypes")]
        super().build_extensions()

    def copy_extensions_to_source(self):
        # _native/ is a plain folder, not a package, so in-place (editable) builds must create it.
        (ROOT / "onnx_hybrid" / "ops" / "_native").mkdir(exist_ok=True)
        super().copy_extensions_to_source()

    def get_ext_filename(self, fullname):
        if fullname.split(".")[-1] == LIBRARY.split(".")[-1]:  # called with the full and the last name
            return os.path.join(*fullname.split(".")) + ".so"  # ORT loads it by path: no ABI tag needed
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        return []  # not a Python module: no PyInit_ symbol


setup(
    ext_modules=[
        Extension(
            LIBRARY,
            sources=sorted(str(p.relative_to(ROOT)) for p in NATIVE.glob("*.cc")),
            language="c++",
            extra_compile_args=COMPILE_ARGS,
            extra_link_args=LINK_ARGS,
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
