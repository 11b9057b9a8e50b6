"""What a wheel of the package holds beside the Python code, and the platform it is tagged for.

* :func:`manylinux_platform`: the PEP 600 tag the built library earns, from the newest glibc symbol version it
  needs (read from its ELF version-needs section); refuses a library that needs anything but glibc and libgcc_s.
* :func:`stage_cuda_images`: puts the prepared CUDA kernel images beside the built library, where the library
  looks for them when a CUDA session needs kernels.

Standard library only: setup.py loads this file by path, before the package's dependencies are installed.
"""

from __future__ import annotations

import dataclasses
import pathlib
import re
import shutil
import struct

# What the library may need at run time: glibc's own libraries and libgcc_s, present on every glibc host and
# allowed by every manylinux policy. Anything else (libstdc++ above all) would have to travel with the wheel.
ALLOWED_LIBRARIES = frozenset({
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1", "libgcc_s.so.1",
    "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
})
# The oldest glibc that pip and auditwheel name a manylinux tag for on every architecture (manylinux2014).
OLDEST_GLIBC = (2, 17)
# How to make the images a wheel carries (the Makefile's `wheel` target does it first).
PREPARE_HINT = "run `make wheel`, or `onnx-hybrid prepare-cuda --arch <cc> ... -o DIR` for each default arch"

_MACHINES = {62: "x86_64", 183: "aarch64"}
_SHT_DYNAMIC, _SHT_GNU_VERNEED, _DT_NULL, _DT_NEEDED = 6, 0x6FFFFFFE, 0, 1
_GLIBC = re.compile(r"^GLIBC_(\d+)\.(\d+)(?:\.\d+)?$")
_LIBGCC = re.compile(r"^GCC_[\d.]+$")


class WheelError(ValueError):
    pass


@dataclasses.dataclass(frozen=True)
class SharedObject:
    machine: str  # "x86_64", "aarch64"
    needed: tuple[str, ...]  # DT_NEEDED entries, in order
    versions: dict[str, tuple[str, ...]]  # library -> the symbol versions needed from it


def read_shared_object(path) -> SharedObject:
    """The machine, NEEDED libraries and needed symbol versions of a 64-bit little-endian ELF shared object."""
    data = pathlib.Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or len(data) < 64 or data[4] != 2 or data[5] != 1:
        raise WheelError(f"{path}: not a 64-bit little-endian ELF file (starts with {data[:6]!r})")
    machine = struct.unpack_from("<H", data, 18)[0]
    if machine not in _MACHINES:
        raise WheelError(f"{path}: ELF machine {machine}, expected one of {sorted(_MACHINES)} ({_MACHINES})")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (sh_name, sh_type, sh_flags, sh_addr, sh_offset, sh_size, sh_link, sh_info, sh_addralign, sh_entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(table: int, offset: int) -> str:
        start = sections[table][4] + offset
        return data[start:data.index(b"\0", start)].decode()

    needed: list[str] = []
    versions: dict[str, tuple[str, ...]] = {}
    for _, kind, _, _, offset, size, link, info, _, _ in sections:
        if kind == _SHT_DYNAMIC:
            for pos in range(offset, offset + size, 16):
                tag, value = struct.unpack_from("<qQ", data, pos)
                if tag == _DT_NULL:
                    break
                if tag == _DT_NEEDED:
                    needed.append(string(link, value))
        elif kind == _SHT_GNU_VERNEED:
            pos = offset
            for _ in range(info):  # sh_info: the number of Verneed entries
                _, count, file, aux, following = struct.unpack_from("<HHIII", data, pos)
                names, at = [], pos + aux
                for _ in range(count):
                    _, _, _, name, next_aux = struct.unpack_from("<IHHII", data, at)
                    names.append(string(link, name))
                    at += next_aux
                versions[string(link, file)] = tuple(names)
                pos += following
    if not needed:
        raise WheelError(f"{path}: no dynamic section with NEEDED entries; is it a shared library?")
    return SharedObject(_MACHINES[machine], tuple(needed), versions)


def manylinux_platform(path) -> str:
    """``manylinux_<major>_<minor>_<machine>`` for the newest glibc version the shared object needs."""
    so = read_shared_object(path)
    foreign = [name for name in so.needed if name not in ALLOWED_LIBRARIES]
    if foreign:
        raise WheelError(f"{path} needs {foreign}; a wheel's library may need only {sorted(ALLOWED_LIBRARIES)} "
                         "(link the C++ runtime in: onnx_hybrid/ops/native/build/build_config.py PORTABLE_LINK_ARGS)")
    newest = OLDEST_GLIBC
    for library, names in so.versions.items():
        for name in names:
            if m := _GLIBC.match(name):
                newest = max(newest, (int(m.group(1)), int(m.group(2))))
            elif not (library == "libgcc_s.so.1" and _LIBGCC.match(name)):
                raise WheelError(f"{path} needs symbol version {name} of {library}; only GLIBC_* (and GCC_* of "
                                 "libgcc_s.so.1) name a glibc a manylinux tag can promise")
    return f"manylinux_{newest[0]}_{newest[1]}_{so.machine}"


def stage_cuda_images(source, target, names) -> list[pathlib.Path]:
    """Make ``target`` hold exactly the files ``names`` (e.g. sm90.cubin) from ``source``; with ``source`` None,
    remove ``target`` (a wheel built without images must not carry those of an earlier build)."""
    target = pathlib.Path(target)
    if source is None:
        shutil.rmtree(target, ignore_errors=True)
        return []
    source = pathlib.Path(source)
    missing = [name for name in names if not (source / name).is_file()]
    if missing:
        raise WheelError(f"CUDA kernel images missing from {source}: {missing} (expected {list(names)}); "
                         f"{PREPARE_HINT}")
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    return [pathlib.Path(shutil.copyfile(source / name, target / name)) for name in names]
