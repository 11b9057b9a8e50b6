"""Build of the native custom-op library (docs/native-library.md#build).

Everything else about the package lives in pyproject.toml. The library is one shared object,
onnx_hybrid/ops/_native/libonnx_hybrid_ortops.so, compiled from onnx_hybrid/ops/native/**/*.cc against
ONNX Runtime API 21 headers: $ONNX_HYBRID_ORT_INCLUDE if set, otherwise Debian trixie's
libonnxruntime-dev 1.21.0+dfsg-1 fetched into build/ort-headers (cached, git-ignored). Sources, flags and
include folders are in onnx_hybrid/ops/native/build/build_config.py.

Wheels (`make wheel`) are tagged py3-none-manylinux_<glibc>_<arch> (onnx_hybrid/ops/native/build/wheel.py) and carry the
CUDA kernel images of library.DEFAULT_CUDA_ARCHS from $ONNX_HYBRID_WHEEL_CUDA_IMAGES, beside the library.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys
from concurrent.futures import ThreadPoolExecutor

from setuptools import Extension, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext

ROOT = pathlib.Path(__file__).resolve().parent
LIBRARY = "onnx_hybrid.ops._native.libonnx_hybrid_ortops"
# Build: the folder of sm<CC>.cubin (`onnx-hybrid prepare-cuda`) whose DEFAULT_CUDA_ARCHS images a wheel carries.
WHEEL_IMAGES_ENV = "ONNX_HYBRID_WHEEL_CUDA_IMAGES"


def load(relative: str):
    """A standard-library-only module of the package, loaded by path (its dependencies may not be installed)."""
    name = f"onnx_hybrid_build_{pathlib.Path(relative).stem}"
    spec = importlib.util.spec_from_file_location(name, ROOT / relative)
    module = sys.modules[name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


config = load("onnx_hybrid/ops/native/build/build_config.py")
wheel = load("onnx_hybrid/ops/native/build/wheel.py")
library = load("onnx_hybrid/ops/library.py")


class BuildNative(build_ext):
    """Fetches the headers and writes the contract header before compiling; names the library plainly."""

    def build_extensions(self):
        try:
            include = config.include_dirs()
        except config.BuildConfigError as error:
            sys.exit(f"onnx_hybrid build: {error}")
        for ext in self.extensions:
            ext.include_dirs[:0] = include
        self.compiler.compile = compile_in_parallel(self.compiler.compile)
        super().build_extensions()

    def get_ext_filename(self, fullname):
        if fullname.split(".")[-1] == LIBRARY.split(".")[-1]:  # called with the full and the last name
            return os.path.join(*fullname.split(".")) + ".so"  # ORT loads it by path: no ABI tag needed
        return super().get_ext_filename(fullname)

    def get_export_symbols(self, ext):
        return []  # not a Python module: no PyInit_ symbol

    def run(self):
        super().run()
        if not (self.inplace or self.editable_mode):  # a wheel's build: the images go beside its library
            images = pathlib.Path(self.get_ext_fullpath(LIBRARY)).parent / library.IMAGE_FOLDER
            try:
                wheel.stage_cuda_images(os.environ.get(WHEEL_IMAGES_ENV) or None, images,
                                        [library.image_file_name(a) for a in library.DEFAULT_CUDA_ARCHS])
            except wheel.WheelError as error:
                sys.exit(f"onnx_hybrid build: {error} (${WHEEL_IMAGES_ENV})")

    def copy_extensions_to_source(self):
        # _native/ is a plain folder, not a package, so in-place (editable) builds must create it.
        (ROOT / "onnx_hybrid" / "ops" / "_native").mkdir(exist_ok=True)
        super().copy_extensions_to_source()


def compile_in_parallel(compile_sources):
    """The compiler's compile() with one source a task on every core: setuptools compiles the sources of an extension
    one after another, and this one extension is the whole build."""
    def compile(sources, *args, **kwargs):
        with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
            objects = pool.map(lambda source: compile_sources([source], *args, **kwargs), sources)
            return [name for one in objects for name in one]
    return compile


class PortableWheel(bdist_wheel):
    """ORT loads the library by path, so the wheel binds to no Python version or ABI, only to a glibc: the newest
    one the built library needs."""

    def get_tag(self):
        built = pathlib.Path(self.bdist_dir, *LIBRARY.split(".")).with_suffix(".so")
        if not built.is_file():  # editable installs ask before anything is built; their wheel stays on this host
            return super().get_tag()
        try:
            return "py3", "none", wheel.manylinux_platform(built)
        except wheel.WheelError as error:
            sys.exit(f"onnx_hybrid build: {error}")


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
            extra_link_args=config.LINK_ARGS + config.PORTABLE_LINK_ARGS,
        )
    ],
    cmdclass={"build_ext": BuildNative, "bdist_wheel": PortableWheel},
)
