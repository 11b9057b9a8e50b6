"""The wheel (`make wheel`): its platform tag, what it carries, and that an installed copy runs the ops.

The tag and image-staging logic (onnx_hybrid/ops/native/build/wheel.py) is checked on every run against readelf and the
library built here. The built wheel itself is checked when `make wheel` has left one in dist/: its tag against
auditwheel's verdict, its library and CUDA images, and a CPU session through its library installed into a fresh
virtual environment (scripts/check_wheel_gpu.sh does the same on a GPU host, for CUDA sessions).
"""

from __future__ import annotations

import email.parser
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import numpy as np
import onnx
import pytest

from native_util import CONV, check_conv
from onnx_hybrid.ops import library, library_path
from onnx_hybrid_testing import single_op
from onnx_hybrid.ops.native.build import wheel
from onnx_hybrid_testing.cases import random_conv_case
from file_modules import ROOT

LIBRARY_IN_WHEEL = "onnx_hybrid/ops/_native/libonnx_hybrid_ortops.so"
IMAGES_IN_WHEEL = f"onnx_hybrid/ops/_native/{library.IMAGE_FOLDER}"
EM_CUDA = 190


def readelf(*args) -> str:
    if not shutil.which("readelf"):
        pytest.fail("readelf (binutils) is needed to cross-check the ELF reader")
    return subprocess.run(["readelf", "--wide", *args], capture_output=True, text=True, check=True).stdout


def test_elf_reader_agrees_with_readelf():
    path = library_path()
    so = wheel.read_shared_object(path)
    assert so.machine == os.uname().machine
    assert list(so.needed) == re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", readelf("-d", path))
    # readelf -V: "File: libc.so.6  Cnt: 5" then "0x0010:   Name: GLIBC_2.2.5  Flags: none  Version: 3" lines
    section = readelf("-V", path).split(".gnu.version_r", 1)[1]
    expected, current = {}, None
    for line in section.splitlines():
        if m := re.search(r"File: (\S+)", line):
            current = expected.setdefault(m.group(1), [])
        elif (m := re.search(r"Name: (\S+)", line)) and current is not None:
            current.append(m.group(1))
    assert {k: sorted(v) for k, v in so.versions.items()} == {k: sorted(v) for k, v in expected.items()}


def test_library_built_here_earns_a_manylinux_tag():
    tag = wheel.manylinux_platform(library_path())
    so = wheel.read_shared_object(library_path())
    newest = max(tuple(int(p) for p in n.removeprefix("GLIBC_").split(".")[:2])
                 for names in so.versions.values() for n in names if n.startswith("GLIBC_"))
    assert tag == f"manylinux_{newest[0]}_{newest[1]}_{so.machine}"
    assert "libstdc++.so.6" not in so.needed


def test_a_library_needing_libstdcxx_is_refused(tmp_path):
    if not shutil.which("g++"):
        pytest.fail("g++ is needed to build the refused library")
    source = tmp_path / "needs_libstdcxx.cc"
    source.write_text('#include <string>\nextern "C" int length(const char* s) { return std::string(s).size(); }\n')
    built = tmp_path / "libneeds.so"
    # -Wl,--no-as-needed: the C++ runtime stays NEEDED even where the inlined code calls none of it.
    subprocess.run(["g++", "-shared", "-fPIC", "-Wl,--no-as-needed", str(source), "-o", str(built)], check=True)
    with pytest.raises(wheel.WheelError, match=rf"{re.escape(str(built))} needs \['libstdc\+\+\.so\.6'\]"):
        wheel.manylinux_platform(built)


def test_a_file_that_is_not_elf_is_refused(tmp_path):
    text = tmp_path / "libfake.so"
    text.write_text("not a library")
    with pytest.raises(wheel.WheelError, match=rf"{re.escape(str(text))}: not a 64-bit little-endian ELF file"):
        wheel.manylinux_platform(text)


def test_stage_cuda_images(tmp_path):
    names = [library.image_file_name(a) for a in library.DEFAULT_CUDA_ARCHS]
    source, target = tmp_path / "prepared", tmp_path / "build" / library.IMAGE_FOLDER
    source.mkdir()
    for i, name in enumerate(names[:-1]):
        (source / name).write_bytes(bytes([i]) * 8)
    with pytest.raises(wheel.WheelError, match=rf"missing from {re.escape(str(source))}: \['{names[-1]}'\]"):
        wheel.stage_cuda_images(source, target, names)
    assert not target.exists()
    (source / names[-1]).write_bytes(b"last")
    (source / "sm75.cubin").write_bytes(b"not a default arch")
    target.mkdir(parents=True)
    (target / "sm70.cubin").write_bytes(b"left by an earlier build")
    staged = wheel.stage_cuda_images(source, target, names)
    assert sorted(p.name for p in target.iterdir()) == sorted(names) == sorted(p.name for p in staged)
    assert all((target / n).read_bytes() == (source / n).read_bytes() for n in names)
    assert wheel.stage_cuda_images(None, target, names) == [] and not target.exists()


# ---------------------------------------------------------------------------------------------------------
# The built wheel
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def built_wheel() -> pathlib.Path:
    found = sorted((ROOT / "dist").glob("onnx_hybrid-*.whl"))
    if not found:
        pytest.skip("no wheel in dist/: `make wheel` builds one")
    assert len(found) == 1, f"several wheels in dist/ ({[p.name for p in found]}); `make wheel` leaves one"
    return found[0]


def wheel_tag(path: pathlib.Path) -> tuple[str, str, str]:
    python, abi, platform = path.stem.split("-")[-3:]
    return python, abi, platform


@pytest.mark.slow
def test_built_wheel_carries_the_library_and_the_images(built_wheel, tmp_path):
    python, abi, platform = wheel_tag(built_wheel)
    assert (python, abi) == ("py3", "none") and re.fullmatch(rf"manylinux_2_\d+_{os.uname().machine}", platform), built_wheel.name
    with zipfile.ZipFile(built_wheel) as archive:
        names = archive.namelist()
        info = next(n for n in names if n.endswith(".dist-info/WHEEL"))
        metadata = email.parser.Parser().parsestr(archive.read(info).decode())
        assert metadata.get_all("Tag") == [f"{python}-{abi}-{platform}"] and metadata["Root-Is-Purelib"] == "false"
        images = {f"{IMAGES_IN_WHEEL}/{library.image_file_name(a)}" for a in library.DEFAULT_CUDA_ARCHS}
        assert {n for n in names if "/_native/" in n} == {LIBRARY_IN_WHEEL, *images}
        for name in images:  # CUDA ELF images, not placeholders
            data = archive.read(name)
            assert data[:4] == b"\x7fELF" and int.from_bytes(data[18:20], "little") == EM_CUDA, name
        assert not [n for n in names if n.endswith((".o", ".tmp")) or n.startswith("build/")], names
        library_file = tmp_path / "libonnx_hybrid_ortops.so"
        library_file.write_bytes(archive.read(LIBRARY_IN_WHEEL))
    assert wheel.manylinux_platform(library_file) == platform
    assert set(wheel.read_shared_object(library_file).needed) <= wheel.ALLOWED_LIBRARIES


@pytest.mark.slow
def test_auditwheel_accepts_the_tag(built_wheel):
    pytest.importorskip("auditwheel", reason="`make wheel` installs auditwheel")
    shown = subprocess.run([sys.executable, "-m", "auditwheel", "show", str(built_wheel)], capture_output=True,
                           text=True, check=True).stdout
    verdict = re.search(r'consistent\s+with the following platform tag:\s+"(\S+)"', shown)
    assert verdict, shown
    assert verdict.group(1) == wheel_tag(built_wheel)[2]


# Runs in the fresh environment: ORT registers the installed library by path, nothing of the build involved.
CHILD = r'''
import os, sys, sysconfig
import numpy as np
import onnxruntime as ort

installed = os.path.join(sysconfig.get_path("platlib"), "onnx_hybrid", "ops", "_native", "libonnx_hybrid_ortops.so")
so = ort.SessionOptions()
so.register_custom_ops_library(installed)
session = ort.InferenceSession(sys.argv[1], so, providers=["CPUExecutionProvider"])
feeds = dict(np.load(sys.argv[2]))
np.savez(sys.argv[3], **dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds))))

import onnx_hybrid
from onnx_hybrid.ops import library
assert onnx_hybrid.__file__.startswith(sys.prefix), onnx_hybrid.__file__
assert library.library_path() == installed, library.library_path()
images = sorted(os.listdir(os.path.join(os.path.dirname(installed), library.IMAGE_FOLDER)))
assert images == sorted(library.image_file_name(a) for a in library.DEFAULT_CUDA_ARCHS), images
print("ran from", installed)
'''


@pytest.mark.slow
def test_installed_wheel_runs_a_cpu_session(built_wheel, tmp_path):
    # Without $PYTHONPATH (the checkout's onnx_hybrid.egg-info would make pip think the package installed).
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "ONNX_HYBRID_"))}
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, env=env)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
                    str(built_wheel)], check=True, env=env)
    # onnxruntime and numpy come from this environment (no network in tests); its onnx_hybrid does not: a path
    # line in a .pth adds the folder without running the .pth files (editable finders) inside it.
    platlib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('platlib'))"],
                             capture_output=True, text=True, check=True, env=env).stdout.strip()
    (pathlib.Path(platlib) / "host_packages.pth").write_text(
        "\n".join(p for p in sys.path if p.endswith("site-packages")) + "\n")

    case = random_conv_case(np.random.default_rng(3))
    model = tmp_path / "conv.onnx"
    onnx.save(single_op.single_op_model(CONV, case.feeds, case.attributes), model)
    np.savez(tmp_path / "feeds.npz", **case.feeds)
    child = subprocess.run([str(python), "-P", "-c", CHILD, str(model), str(tmp_path / "feeds.npz"),
                            str(tmp_path / "out.npz")], capture_output=True, text=True, cwd=tmp_path, env=env)
    assert child.returncode == 0, child.stderr[-4000:]
    assert child.stdout.strip() == f"ran from {platlib}/{LIBRARY_IN_WHEEL}"
    check_conv(case, dict(np.load(tmp_path / "out.npz")))
