"""CUDA kernels without a GPU: NVRTC compiles every kernel for sm_80 and sm_90a (a build break fails CI), with the
installed NVRTC and with the oldest one pyproject.toml allows, the conv kernels do not spill on sm_90a, the cubin
cache behaves, the launch plan picks the engines the contract asks for, and a raw stream handle reaches CuPy."""

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from file_modules import ROOT

pytest.importorskip("cupy_backends.cuda.libs.nvrtc")

from onnx_hybrid.cuda_ops import compiler, plan  # noqa: E402
from onnx_hybrid.ops import contract  # noqa: E402


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("kernel-cache")
    mp = pytest.MonkeyPatch()
    mp.setenv(compiler.CACHE_ENV, str(path))
    yield path
    mp.undo()


@pytest.mark.parametrize("arch", [80, 90])
def test_every_kernel_compiles_offline(cache, arch):
    image = compiler.compile_image(arch)
    assert image[:4] == b"\x7fELF"
    # the whole ELF: it ends where its header says its program header table ends (compiler._whole_elf)
    phoff, phentsize, phnum = int.from_bytes(image[0x20:0x28], "little"), image[0x36], image[0x38]
    assert len(image) == phoff + phentsize * phnum
    missing = [name for name in plan.kernel_names() if name.encode() + b"\0" not in image]
    assert not missing, f"kernels missing from the sm_{arch} cubin: {missing}"
    cached = cache / f"{compiler.cache_key(arch)}.cubin"
    assert cached.read_bytes() == image
    assert not list(cache.glob("*.tmp"))


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


OLDEST_NVRTC_LIB = ROOT / "build" / "oldest-nvrtc" / "nvidia" / "cu13" / "lib"  # fetched by `make test`


def oldest_allowed_nvrtc() -> tuple[int, int]:
    """The lower bound of pyproject.toml's nvidia-cuda-nvrtc requirement, as (major, minor)."""
    bound = re.search(r'"nvidia-cuda-nvrtc>=(\d+)\.(\d+)', (ROOT / "pyproject.toml").read_text())
    return int(bound.group(1)), int(bound.group(2))


def test_kernels_build_with_the_oldest_allowed_nvrtc():
    """pip gives CI the newest NVRTC 13.x, while users (and the H200 machine) may have 13.0, which rejects code
    that later versions accept: to 13.0's JIT mode a generic lambda is a host function
    (docs/design-notes.md#oldest-nvrtc). So the two build tests above run again, in a process that loads the oldest
    allowed NVRTC."""
    lib = OLDEST_NVRTC_LIB / "libnvrtc.so.13"
    assert lib.is_file(), f"{lib} is missing: `make test` fetches it"
    env = dict(os.environ, LD_PRELOAD=str(lib),
               LD_LIBRARY_PATH=os.pathsep.join(filter(None, [str(OLDEST_NVRTC_LIB), os.environ.get("LD_LIBRARY_PATH")])))
    script = (
        "import sys, pytest\n"
        "from onnx_hybrid.cuda_ops import compiler\n"
        f"assert compiler.nvrtc_version() == {oldest_allowed_nvrtc()}, compiler.nvrtc_version()\n"
        f"sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', {__file__!r}, "
        "'-k', 'compiles_offline or fit_their_registers']))\n")
    result = subprocess.run([sys.executable, "-c", script], env=env, cwd=ROOT, capture_output=True, text=True,
                            timeout=900)
    assert result.returncode == 0, f"NVRTC {oldest_allowed_nvrtc()}:\n{result.stdout[-6000:]}{result.stderr[-3000:]}"
    assert "3 passed" in result.stdout, result.stdout[-2000:]


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


def _geo(lengths, hq=16, hv=48, dk=128, dv=128, per_key=False, capacity=0):
    t = sum(lengths)
    shapes = {"query": (t, hq, dk), "key": (t, hq, dk), "value": (t, hv, dv), "cu_seqlens": (len(lengths) + 1,),
              "decay": (t, hv, dk) if per_key else (t, hv), "beta": (t, hv)}
    if capacity:
        shapes["capture_count"] = (len(lengths),)
    attrs = contract.resolve_attributes(contract.GATED_DELTA_NET, {"state_update_capacity": capacity})
    return contract.resolve_gdn(shapes, attrs)


H100_SMEM, A100_SMEM, SM89_SMEM = 232448, 166912, 101376  # opt-in shared memory per block


def _kernels(geo, dtype="float16", engine="auto", arch=90, smem=H100_SMEM):
    return [(ln.kernel, ln.params.tail_only if ln.kernel.startswith("gdn_recurrent") else None)
            for ln in plan.gdn_plan(geo, dtype, plan.GdnParams(), arch=arch, smem_optin=smem, engine=engine)]


def test_plan_engine_selection():
    # decode and verify: the recurrent kernel alone, serving every row; at most one token per row: its decode
    # instantiation
    assert _kernels(_geo([1] * 32)) == [("gdn_recurrent_f16_k128_r8_decode", 0)]
    assert _kernels(_geo([1])) == [("gdn_recurrent_f16_k128_r4_decode", 0)]  # small batch: fewer rows, more warps
    assert _kernels(_geo([2, 0, 0])) == [("gdn_recurrent_f16_k128_r4_decode", 0)]  # the kernel serves any row
    assert _kernels(_geo([1] * 32), "bfloat16") == [("gdn_recurrent_bf16_k128_r8_decode", 0)]
    # decode shapes of no real model (fp32, other key sizes) take the general kernel
    assert _kernels(_geo([1] * 32), "float32") == [("gdn_recurrent_f32_k128_r8", 0)]
    assert _kernels(_geo([1] * 4, dk=512, dv=64)) == [("gdn_recurrent_f16_k512_r2", 0)]
    assert _kernels(_geo([1] * 4, dk=64, dv=64)) == [("gdn_recurrent_f16_k64_r4", 0)]
    assert _kernels(_geo([4] * 32, capacity=4)) == [("gdn_recurrent_f16_k128_r8", 0)]
    # prefill: the chunked prep and scan, then the tail pass for the rows they skip (decided on the device)
    assert _kernels(_geo([4096])) == [("gdn_chunk_prep_f16_d128", None), ("gdn_chunked_f16_d128_v64", None),
                                      ("gdn_recurrent_f16_k128_r4", 1)]
    assert [k for k, _ in _kernels(_geo([2048] * 8), "bfloat16")[:2]] == ["gdn_chunk_prep_bf16_d128",
                                                                           "gdn_chunked_bf16_d128_v128"]
    # shapes the chunked kernel does not serve fall back to the recurrent kernel
    assert _kernels(_geo([4096]), "float32") == [("gdn_recurrent_f32_k128_r4", 0)]
    assert _kernels(_geo([4096], dk=64, dv=32)) == [("gdn_recurrent_f16_k64_r4", 0)]
    assert _kernels(_geo([4096], per_key=True)) == [("gdn_recurrent_f16_k128_r4", 0)]
    assert _kernels(_geo([4096]), arch=75) == [("gdn_recurrent_f16_k128_r4", 0)]
    assert _kernels(_geo([4096]), arch=80, smem=A100_SMEM)[1][0] == "gdn_chunked_f16_d128_v64"
    assert _kernels(_geo([4096]), arch=89, smem=SM89_SMEM) == [("gdn_recurrent_f16_k128_r4", 0)]
    assert _kernels(_geo([1] * 4), engine="chunked")[1][0] == "gdn_chunked_f16_d128_v128"
    assert _kernels(_geo([4096]), engine="recurrent") == [("gdn_recurrent_f16_k128_r4", 0)]


def test_plan_falls_back_for_misaligned_inputs():
    aligned = plan.GdnParams(q=4096, k=8192, v=12288, state_in=16384, state_out=20480)
    shifted = plan.GdnParams(q=4096, k=8192, v=12288, state_in=16388, state_out=20480)  # a view 4 bytes in
    assert plan.gdn_plan(_geo([4096]), "float16", aligned, arch=90, smem_optin=H100_SMEM)[1].kernel == \
        "gdn_chunked_f16_d128_v64"
    assert [ln.kernel for ln in plan.gdn_plan(_geo([4096]), "float16", shifted, arch=90, smem_optin=H100_SMEM)] \
        == ["gdn_recurrent_f16_k128_r4"]
    out_8 = plan.GdnParams(q=4096, k=8192, v=12288, out=24584)  # the U~ staging copies 16-byte output rows
    assert not plan.gdn_uses_chunked(_geo([4096]), "float16", out_8, arch=90, smem_optin=H100_SMEM)


def test_chunked_workspace_follows_the_geometry():
    # per token: W [48, 128] and P [48, 64] in fp16, Q and K [16, 128] in fp16, gamma [48] in fp32
    assert plan.chunk_workspace_bytes(_geo([100, 20])) == 120 * (2 * 48 * 192 + 4 * 16 * 128 + 4 * 48)
    assert plan.gdn_uses_chunked(_geo([100, 20]), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM)
    assert not plan.gdn_uses_chunked(_geo([1] * 32), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM)


def test_plan_rejects_what_no_kernel_serves():
    with pytest.raises(plan.PlanError, match="no supported plan"):
        _kernels(_geo([4], dk=640, dv=8))
    with pytest.raises(plan.PlanError, match="chunked engine"):
        _kernels(_geo([64], dk=64, dv=64), engine="chunked")


def test_scan_width_follows_the_grid():
    """The narrow scan while its grid fits CHUNK_NARROW_MAX_BLOCKS CTAs (1 x 48 heads x 2 halves = 96), then the
    wide one (2 x 48 x 2 = 192 narrow CTAs become 96 wide ones)."""
    def scan(lengths, **kw):
        return plan.gdn_plan(_geo(lengths), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM, **kw)[1]
    narrow, wide = scan([8192]), scan([4096, 4096])
    assert (narrow.kernel, narrow.grid, narrow.block, narrow.smem) == \
        ("gdn_chunked_f16_d128_v64", (2, 48, 1), (256, 1, 1), plan.CHUNK_WGMMA_SMEM_BYTES)
    assert (wide.kernel, wide.grid, wide.block, wide.smem) == \
        ("gdn_chunked_f16_d128_v128", (1, 48, 2), (256, 1, 1), plan.CHUNK_WGMMA_WIDE_SMEM_BYTES)
    assert scan([8192], scan_width=128).kernel == "gdn_chunked_f16_d128_v128"
    with pytest.raises(ValueError, match="scan_width 32"):
        scan([8192], scan_width=32)


def test_scan_shared_memory_follows_the_image():
    """The sm_90 image (built for sm_90a) runs the scan on wgmma with its own stage layout; the other images run
    it on mma.sync. Same kernel names, so only the shared memory differs."""
    expected = {90: (plan.CHUNK_WGMMA_SMEM_BYTES, plan.CHUNK_WGMMA_WIDE_SMEM_BYTES),
                80: (plan.CHUNK_SMEM_BYTES, plan.CHUNK_WIDE_SMEM_BYTES),
                100: (plan.CHUNK_SMEM_BYTES, plan.CHUNK_WIDE_SMEM_BYTES)}
    for arch, smem in expected.items():
        optin = H100_SMEM if arch == 90 else A100_SMEM
        scans = [plan.gdn_plan(_geo(lengths), "float16", plan.GdnParams(), arch=arch, smem_optin=optin)[1]
                 for lengths in ([8192], [4096, 4096])]
        assert [(ln.kernel[-4:], ln.smem) for ln in scans] == [("_v64", smem[0]), ("v128", smem[1])], arch
    assert compiler.target(90) == "sm_90a" and compiler.target(80) == "sm_80"
    assert plan.chunk_smem_needed(80) <= A100_SMEM and plan.chunk_smem_needed(90) <= H100_SMEM
    # the narrow scan on sm_90a has a producer warpgroup besides its 4 compute warps
    assert [plan.chunk_scan_threads(vt, 90) for vt in (64, 128)] == [256, 256]
    assert [plan.chunk_scan_threads(vt, 80) for vt in (64, 128)] == [128, 256]


def test_plan_grids_follow_the_geometry():
    prep, chunk, rec = plan.gdn_plan(_geo([100, 20]), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM)
    # (100 + 20 + 2 * 63) // 64 = 3 chunks at most (the 20-token row has none: the tail pass serves it)
    assert prep.grid == (3, 48, 1) and prep.block == (256, 1, 1) and prep.smem == plan.CHUNK_PREP_SMEM_BYTES
    assert chunk.grid == (1, 48, 2) and chunk.block == (256, 1, 1) and chunk.smem == plan.CHUNK_WGMMA_WIDE_SMEM_BYTES
    assert rec.grid == (8, 48, 2) and rec.params.row_groups == 1 and rec.block == (128, 1, 1) and rec.smem == 0
    (rec,) = plan.gdn_plan(_geo([1]), "bfloat16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM)
    assert rec.kernel == "gdn_recurrent_bf16_k128_r4_decode"
    # large batches: 8 value rows per warp; verify shares its prologue over 4 row groups per warp, decode takes one
    # (more blocks in flight, measured faster)
    (verify,) = plan.gdn_plan(_geo([4] * 32, capacity=4), "float16", plan.GdnParams(), arch=90,
                              smem_optin=H100_SMEM)
    (decode,) = plan.gdn_plan(_geo([1] * 32), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM)
    assert (verify.kernel, verify.params.row_groups, verify.grid) == ("gdn_recurrent_f16_k128_r8", 4, (1, 48, 32))
    assert (decode.kernel, decode.params.row_groups, decode.grid) == ("gdn_recurrent_f16_k128_r8_decode", 1,
                                                                     (4, 48, 32))
    # verify of up to 8 drafts keeps 4 groups (the block's prologue covers the rows in one pass); rows averaging
    # more take one group per warp, so that the block shares each chunk's prologue
    (verify8,) = plan.gdn_plan(_geo([8] * 32, capacity=8), "float16", plan.GdnParams(), arch=90,
                               smem_optin=H100_SMEM)
    (longer,) = plan.gdn_plan(_geo([9] * 32), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM)
    assert (verify8.kernel, verify8.params.row_groups) == ("gdn_recurrent_f16_k128_r8", 4)
    assert (longer.kernel, longer.params.row_groups, longer.grid) == ("gdn_recurrent_f16_k128_r8", 1, (4, 48, 32))
    # a warp serves at most REC_MAX_WARP_ROWS value rows, the defaults included
    assert max(plan.REC_ROW_VARIANTS[128]) * 4 <= plan.REC_MAX_WARP_ROWS
    with pytest.raises(ValueError, match="value rows per warp"):
        plan.gdn_plan(_geo([1] * 64), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM, rec_rows=8,
                      rec_groups=8)
    # rows per warp without a decode instantiation (a tuning knob) take the general one
    (rec,) = plan.gdn_plan(_geo([1]), "bfloat16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM, rec_rows=2)
    assert rec.kernel == "gdn_recurrent_bf16_k128_r2"
    (rec,) = plan.gdn_plan(_geo([1]), "float32", plan.GdnParams(), arch=90, smem_optin=H100_SMEM)
    assert rec.kernel == "gdn_recurrent_f32_k128_r4"


def test_conv_and_replay_grids_follow_the_kernels_constants():
    source = "".join((compiler.KERNEL_DIR / name).read_text() for name in ("conv.cu", "gdn_replay.cu"))
    kernel = {name: int(v) for name, v in re.findall(r"constexpr int (k\w+) = (\d+);", source)}
    assert kernel["kConvThreads"] == plan.CONV_THREADS
    # the output kernel streams runs in pairs of chunks: the plan's runs are whole pairs (no idle last half)
    assert all(run % (2 * kernel["kConvChunk"]) == 0 for run in (plan.CONV_TOKENS, plan.CONV_MEDIUM_TOKENS))
    assert (kernel["kReplayWarps"], kernel["kReplayRowsPerWarp"]) == (plan.REPLAY_WARPS, plan.REPLAY_ROWS)
    # 16 bytes of channels per thread: 10240 channels are 10 blocks of 128 threads at fp16, 20 at fp32
    geo = contract.ConvGeometry(2, 600, 10240, 4, 3, 0)
    in_place = plan.ConvParams(state_in=1 << 20, state_out=1 << 20)
    out, state = plan.conv_plan(geo, "float16", in_place)
    assert (out.grid, state.grid) == ((10, -(-600 // plan.CONV_MEDIUM_TOKENS), 1), (10, 2, 1))
    assert out.kernel == "conv_output_f16" and out.params.state_rows == 0 and state.kernel == "conv_state_f16"
    # final_state apart from initial_state: the output grid's first two rows are the state pass
    state_bytes = 2 * 10240 * 3 * 2
    (fused,) = plan.conv_plan(geo, "float16", plan.ConvParams(state_in=1 << 20, state_out=(1 << 20) + state_bytes))
    assert fused.grid == (10, 2 + -(-600 // plan.CONV_MEDIUM_TOKENS), 1) and fused.params.state_rows == 2
    # a state that starts one byte before the other's end overlaps it
    overlap = plan.ConvParams(state_in=(1 << 20) + state_bytes - 1, state_out=1 << 20)
    assert [ln.kernel for ln in plan.conv_plan(geo, "float16", overlap)] == ["conv_output_f16", "conv_state_f16"]
    out, _ = plan.conv_plan(contract.ConvGeometry(1, 8191, 10240, 4, 3, 0), "bfloat16", plan.ConvParams())
    assert out.kernel == "conv_output_bf16" and out.grid == (10, -(-8191 // plan.CONV_TOKENS), 1)
    (short,) = [ln for ln in plan.conv_plan(contract.ConvGeometry(1, 256, 64, 4, 3, 0), "float16", plan.ConvParams())
                if ln.kernel.startswith("conv_output")]
    assert short.grid == (1, 256, 1)  # a token per thread
    (decode,) = plan.conv_plan(contract.ConvGeometry(32, 32, 10240, 4, 3, 0), "float32", plan.ConvParams())
    assert decode.kernel == "conv_decode_f32" and decode.grid == (20, 32, 1)
    (rows,) = plan.conv_plan(contract.ConvGeometry(32, 128, 10240, 4, 3, 0), "float16", plan.ConvParams())
    assert rows.kernel == "conv_rows_f16" and rows.grid == (10, 32, 1)
    (replay,) = plan.gdn_replay_plan(plan.GdnReplayParams(batch=3, hv=48, dv=100, dk=128))
    assert replay.grid == (-(-100 // (plan.REPLAY_WARPS * plan.REPLAY_ROWS)), 48, 3)
    assert replay.block == (plan.REPLAY_WARPS * 32, 1, 1)


def test_prep_serves_a_whole_group_per_block_only_on_large_grids():
    def prep_grid(lengths, **knobs):
        return plan.gdn_plan(_geo(lengths), "float16", plan.GdnParams(), arch=90, smem_optin=H100_SMEM,
                             **knobs)[0].grid
    # 16 key heads, 3 value heads each: 1 x 1024 is 16 x 16 = 256 group blocks (under 264: a head per block)
    assert prep_grid([1024]) == (16, 48, 1)
    assert prep_grid([1056]) == (17, 16, 1) and prep_grid([8192]) == (128, 16, 1)
    assert prep_grid([8192], prep_heads=1) == (128, 48, 1) and prep_grid([64], prep_heads=3) == (1, 16, 1)
    with pytest.raises(ValueError, match="does not divide"):
        prep_grid([64], prep_heads=2)


def test_raw_stream_handles_reach_cupy_without_a_deprecation():
    # The scratch allocation runs on the caller's stream, given as a raw handle: CuPy 14 deprecates
    # ExternalStream, so the handle goes through the CUDA stream protocol (no GPU needed to wrap it).
    import cupy
    from onnx_hybrid.cuda_ops import api

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        stream = cupy.cuda.Stream.from_external(api._StreamHandle(0x1234))
    assert stream.ptr == 0x1234
