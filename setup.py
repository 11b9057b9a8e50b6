"""Build of the native custom-op library (spec/native_library.md §2, §4).

Everything else about the package lives in pyproject.toml. The library is one shared object,
onnx_hybrid/ops/_native/libonnx_hybrid_ortops.so, compiled from onnx_hybrid/ops/native/*.cc against
ONNX Runtime API 21 headers: $ONNX_HYBRID_ORT_INCLUDE if set, otherwise Debian trixie's
libonnxruntime-dev 1.21.0+dfsg-1 fetched into build/ort-headers (cached, git-ignored). Sources, flags and
include folders are in onnx_hybrid/ops/native/build_config.py.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
LIBRARY = "onnx_hybrid.ops._native.libonnx_hybrid_ortops"


def load_build_config():
    path = ROOT / "onnx_hybrid" / "ops" / "native" / "build_config.py"
    spec = importlib.util.spec_from_file_location("onnx_hybrid_build_config", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


config = load_build_config()


class BuildNative(build_ext):
    """Fetches the headers and writes the contract header before compiling; names the library plainly."""

    def build_extensions(self):
        try:
            include = config.include_dirs()
        except config.BuildConfigError as error:
            sys.exit(f"onnx_hybrid build: {error}")
        for ext in self.extensions:
            ext.include_dirs[:0] = include
        super().build_extensions()

    def get_ext_filename(self, fullname):
        if fullname.split(".")[-1] == LIBRARY.split(".")[-1]:  # called with the full and the last name
            return os.path.join(*fullname.split(".")) + ".so"  # ORT loads it by path: no ABI tag needed
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        return []  # not a Python module: no PyInit_ symbol

    def copy_extensions_to_source(self):
        # _native/ is a plain folder, not a package, so in-place (editable) builds must create it.
        (ROOT / "onnx_hybrid" / "ops" / "_native").mkdir(exist_ok=True)
        super().copy_extensions_to_source()


setup(
    ext_modules=[
        Extension(
            LIBRARY,
            sources=[str(p.relative_to(ROOT)) for p in config.sources()],
            # Headers, the generated ones included: a change to any of them rebuilds the library (setuptools
            # compares only these and the sources with the built file).
            depends=[str(p) for p in config.header_dependencies()],
            language="c++",
            extra_compile_args=config.COMPILE_ARGS,
            extra_link_args=config.LINK_ARGS,
        )
    ],
    cmdclass={"build_ext": BuildNative},
)
