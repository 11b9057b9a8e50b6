"""CUDA kernels without a GPU: NVRTC compiles every kernel (a build break fails CI): the sm_90a cubin with the
installed NVRTC, PTX for sm_80 and sm_90a with it and with the oldest one pyproject.toml allows; every kernel the
library's planner can name for either is in what was built, the conv kernels do not spill on sm_90a, the cubin cache
behaves, and a raw stream handle reaches CuPy."""

import re
import warnings

import pytest

pytest.importorskip("cupy_backends.cuda.libs.nvrtc")

from cuda_stub import A100_SMEM, H100_SMEM, build_stub_drivers, planned_launches  # noqa: E402
from cuda_stub import gdn_call as gdn  # noqa: E402

from onnx_hybrid.cuda_ops import compiler  # noqa: E402


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return build_stub_drivers(tmp_path_factory.mktemp("stub-driver"))["plain"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("kernel-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv(compiler.CACHE_ENV, str(path))
    yield path
    mp.undo()


def test_every_kernel_compiles_offline(cache, driver):
    """The whole sm_90a build, ptxas included (sm_80's ptxas runs where wheels are built: its PTX is checked below)."""
    arch = 90
    image = compiler.compile_image(arch)
    assert image[:4] == b"\x7fELF"
    # the whole ELF: it ends where its header says its program header table ends (compiler._whole_elf)
    phoff, phentsize, phnum = int.from_bytes(image[0x20:0x28], "little"), image[0x36], image[0x38]
    assert len(image) == phoff + phentsize * phnum
    assert_planned_kernels_exist(image, arch, driver)
    cached = cache / f"{compiler.cache_key(arch)}.cubin"
    assert cached.read_bytes() == image
    assert not list(cache.glob("*.tmp"))


@pytest.mark.parametrize("arch", [80, 90])
def test_every_kernel_compiles_to_ptx(driver, arch):
    """NVRTC's front end and NVVM over every kernel, without ptxas (half the time of a cubin): where NVRTC 13.0
    rejected what later versions accept (docs/design-notes.md#oldest-nvrtc). Both NVRTCs run it (conftest.py); the
    planner's kernels are looked up among the PTX's entries."""
    entries = re.findall(r"^\.(?:visible|weak) \.entry (\w+)\(", compiler.compile_ptx(arch), re.M)
    # the stand-in driver finds a kernel by its NUL-terminated name after the ELF magic the library checks
    assert_planned_kernels_exist(b"\x7fELF\0" + b"".join(name.encode() + b"\0" for name in entries), arch, driver)


def test_conv_kernels_fit_their_registers_on_sm90():
    """The conv and replay kernels were tuned on the H200 for their register budgets (the output pass: 4 blocks of
    128 threads per SM, 128 registers). A spill there cost the bf16 prefill 30%
    (docs/design-notes.md#conv-register-budget), so one fails here, without a GPU."""
    nv = compiler._nvrtc()
    program = nv.createProgram('#include "conv.cu"\n#include "gdn_replay.cu"\n', "conv_registers.cu", (), ())
    nv.compileProgram(program, compiler.options(90) + ("-Xptxas=-v",))
    kernel, spills, compiled = None, [], []
    for line in nv.getProgramLog(program).splitlines():
        if found := re.search(r"Compiling entry function '(\w+)'", line):
            kernel = found.group(1)
            compiled.append(kernel)
        elif (found := re.search(r"(\d+) bytes spill stores", line)) and int(found.group(1)):
            spills.append((kernel, line.strip()))
    assert {"conv_output_bf16", "conv_decode_f16", "gdn_replay_f32"} <= set(compiled)
    assert not spills, f"kernels that spill on sm_90a: {spills}"


def test_kernels_build_with_the_installed_nvrtc(nvrtc_build):
    """The builds and the register check above with the NVRTC pip installed (conftest.CHILD_TESTS), in a child
    process that conftest.py starts when collection ends, so that its builds overlap the rest of the suite."""
    status, output = nvrtc_build("installed")
    assert status == 0, f"NVRTC {compiler.nvrtc_version()}:\n{output[-6000:]}"
    assert "3 passed" in output, output[-2000:]


def test_kernels_build_with_the_oldest_allowed_nvrtc(nvrtc_build):
    """pip gives CI the newest NVRTC 13.x, while users (and the H200 machine) may have 13.0, which rejects code
    that later versions accept: to 13.0's JIT mode a generic lambda is a host function
    (docs/design-notes.md#oldest-nvrtc). So every kernel is compiled to PTX for both architectures and the register
    check runs again, in a process that loads the oldest allowed NVRTC (started by conftest.py when collection
    ends)."""
    status, output = nvrtc_build("oldest")
    assert status == 0, output[-6000:]
    assert "3 passed" in output, output[-2000:]


def test_cache_is_hit_and_keyed_by_arch(cache):
    key80, key90 = compiler.cache_key(80), compiler.cache_key(90)
    assert key80 != key90 and key80.startswith("sm80-")
    marker = b"\x7fELF-cached"
    (cache / f"{key80}.cubin").write_bytes(marker)
    assert compiler.compile_image(80) == marker  # served from disk, NVRTC not called
    (cache / f"{key80}.cubin").unlink()


def test_unsupported_arch_is_a_clear_error():
    with pytest.raises(compiler.KernelBuildError, match="sm_70"):
        compiler.compile_image(70, use_cache=False)


def test_raw_stream_handles_reach_cupy_without_a_deprecation():
    # The scratch allocation runs on the caller's stream, given as a raw handle: CuPy 14 deprecates
    # ExternalStream, so the handle goes through the CUDA stream protocol (no GPU needed to wrap it).
    import cupy
    from onnx_hybrid.cuda_ops import api

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = cupy.cuda.Stream.from_external(api._StreamHandle(0x1234))
    assert stream.ptr == 0x1234


def assert_planned_kernels_exist(image: bytes, arch: int, driver) -> None:
    """Every dtype, key size, rows-per-warp variant, decode/verify/prefill shape, engine and scan width the planner
    can choose, launched through the library against this image (cuda_stub: the stand-in driver refuses a kernel
    the image lacks, as the real one would)."""
    calls = []
    variants = {32: (1, 2, 4, 8), 64: (1, 2, 4, 8), 128: (1, 2, 4, 8), 256: (2, 4), 512: (1, 2)}
    for dtype in ("float32", "float16", "bfloat16"):
        for key, rows in variants.items():
            for r in (None, *rows):
                for batch, tokens in ((32, 32), (1, 1), (8, 32), (1, 300)):
                    knobs = {"rec_rows": r} if r else {}
                    calls.append(gdn(batch, tokens, dtype, dk=key, dv=64, knobs=knobs))
        for width in (64, 128):
            calls.append(gdn(2, 4096, dtype, knobs={"engine": "chunked", "scan_width": width}))
        conv = dict(op="conv", dtype=dtype, channels=1000)
        calls += [dict(conv, batch=4, tokens=4), dict(conv, batch=4, tokens=16), dict(conv, batch=1, tokens=3000),
                  dict(conv, batch=1, tokens=3000, state_offset=0),
                  dict(op="replay_conv", dtype=dtype, batch=2, channels=1000, state_len=3, capacity=4)]
    calls.append(dict(op="replay_gdn", batch=2, hk=2, hv=4, dk=128, dv=128, capacity=4))
    smem = H100_SMEM if arch == 90 else A100_SMEM
    results = planned_launches(driver, calls, cc=arch, smem=smem, image=image)
    refused = [(c, r) for c, r in zip(calls, results) if isinstance(r, str) and "PlanError" not in r]
    assert not refused, refused[:5]
    launched = {ln["kernel"] for r in results if isinstance(r, list) for ln in r}
    assert set(PLANNED_KERNELS) <= launched, sorted(set(PLANNED_KERNELS) - launched)


# Kernels of each family that the planner launches for the calls above.
PLANNED_KERNELS = ("gdn_recurrent_f16_k128_r8_decode", "gdn_recurrent_f32_k512_r1", "gdn_chunked_bf16_d128_v64",
                   "gdn_chunk_prep_f16_d128", "conv_decode_f32", "conv_rows_bf16", "conv_output_f16", "conv_state_f16",
                   "conv_replay_bf16", "gdn_replay_f32")
