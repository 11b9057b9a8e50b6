"""Launch plans: which kernels run, with what grid, block, dynamic shared memory and parameters.

This is the one place that states the launch configuration of every kernel in ``ops/native/cuda/kernels/``. The parameter
structs below mirror ``params.cuh`` there field for field; the C++ launcher of the custom-op library
mirrors both. Nothing here touches a device: a plan is computed from the geometry alone, so it can be
checked (and mirrored) without a GPU.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

from ..ops.contract import SEQUENTIAL_MIN_TOKENS, ConvGeometry, GdnGeometry
from .tensors import ELEMENT_SIZE

_p = ctypes.c_void_p
_i = ctypes.c_int


class GdnParams(ctypes.Structure):
    _fields_ = [
        ("q", _p), ("k", _p), ("v", _p), ("cu_seqlens", _p), ("decay", _p), ("beta", _p),
        ("state_in", _p), ("a_log", _p), ("dt_bias", _p), ("capture_count", _p),
        ("out", _p), ("state_out", _p), ("capsule", _p), ("workspace", _p),
        ("q_stride", ctypes.c_longlong), ("k_stride", ctypes.c_longlong), ("v_stride", ctypes.c_longlong),
        ("batch", _i), ("total_tokens", _i), ("uniform_len", _i), ("hk", _i), ("hv", _i), ("dk", _i),
        ("dv", _i), ("has_decay", _i), ("has_delta", _i), ("gate_qwen", _i), ("beta_sigmoid", _i),
        ("l2norm", _i), ("decay_per_key", _i), ("capacity", _i), ("capture_active", _i), ("tail_only", _i),
        ("row_groups", _i),
        ("scale", ctypes.c_float),
    ]


class ConvParams(ctypes.Structure):
    _fields_ = [
        ("x", _p), ("weight", _p), ("bias", _p), ("state_in", _p), ("cu_seqlens", _p),
        ("capture_count", _p), ("out", _p), ("state_out", _p), ("capsule", _p),
        ("batch", _i), ("total_tokens", _i), ("channels", _i), ("kernel_size", _i), ("dilation", _i),
        ("state_len", _i), ("capacity", _i), ("silu", _i), ("state_rows", _i),
    ]


class GdnReplayParams(ctypes.Structure):
    _fields_ = [
        ("state_in", _p), ("state_out", _p), ("capsule", _p), ("accepted", _p),
        ("batch", _i), ("hk", _i), ("hv", _i), ("dk", _i), ("dv", _i), ("capacity", _i),
    ]


class ConvReplayParams(ctypes.Structure):
    _fields_ = [
        ("state_in", _p), ("state_out", _p), ("capsule", _p), ("accepted", _p),
        ("batch", _i), ("channels", _i), ("state_len", _i), ("capacity", _i),
    ]


# Kernel constants (kernels/*.cu). gdn_chunked_v64_smem_bytes, gdn_chunked_v128_smem_bytes and
# gdn_chunk_prep_smem_bytes in the image hold the chunked kernels' values; a GPU test checks them against
# chunk_scan_smem_bytes and CHUNK_PREP_SMEM_BYTES.
REC_WARPS = 4
REC_KEY_SIZES = (32, 64, 128, 256, 512)  # instantiations: key head size up to this
# Value rows per warp instantiated for each key size (gdn_recurrent.cu), and the default choice. Fewer rows
# per warp mean more warps in flight; more rows share the per-token work (loads, gate, norms).
REC_ROW_VARIANTS = {32: (1, 2, 4, 8), 64: (1, 2, 4, 8), 128: (1, 2, 4, 8), 256: (2, 4), 512: (1, 2)}
# Default rows per warp: the most rows when the batch is large enough for several row groups per warp (by
# rec_row_groups, which also sizes decode's batch threshold though decode then takes one group), else the
# small-batch choice (measured on an H200, 27B geometry: docs/design-notes.md#rows-and-row-groups-per-warp).
REC_ROWS_LARGE = {32: 8, 64: 8, 128: 8, 256: 4, 512: 2}
REC_ROWS_SMALL = {32: 4, 64: 4, 128: 4, 256: 4, 512: 2}
# Calls of at most one token per row (decode) take the `_decode` instantiation, which gives such rows a loop
# of their own (bitwise the same results). It exists only for the real models' shapes: these activation types,
# key size 128 and its default rows per warp (REC_ROWS_LARGE, REC_ROWS_SMALL); elsewhere the general kernel
# serves decode (each decode kernel is a second loop: for every shape they grew the image by 66%).
REC_DECODE_TYPES = ("float16", "bfloat16")
REC_DECODE_ROWS = {128: (4, 8)}
# Row groups per warp grow (1, 2, 4) while the grid keeps at least this many blocks: the general kernels (verify)
# share a block's per-token prologue over them. The decode instantiations take one group per warp, more blocks
# in flight: 2-3% faster than 2 or 4 groups at B = 32 and 128 on the H200
# (docs/design-notes.md#decode-with-one-row-group-per-warp).
REC_MIN_BLOCKS = 1024
# Tokens per row whose per-token prologue a general kernel's block runs in one pass, shared by its warps
# (gdn_recurrent.cu RecShared::kBlockTokens: two chunks). Longer rows share it chunk by chunk only where a warp has
# one row group, which keeps its state in registers from chunk to chunk, so calls whose rows average more take one
# group per warp (the chunked engine takes rows of SEQUENTIAL_MIN_TOKENS and more where it serves the call).
REC_BLOCK_TOKENS = {32: 8, 64: 8, 128: 8, 256: 4, 512: 2}
# Value rows per warp (rows x row groups) at most: a warp loads the values of all its rows in one access per
# token, a row per lane (gdn_recurrent.cu). The defaults reach 8 x 4.
REC_MAX_WARP_ROWS = 32

CHUNK_D, CHUNK_VT, CHUNK_THREADS, CHUNK_TOKENS = 128, 64, 256, 64
# The scan (gdn_chunked_*_v<VT>) has one warp per 16 of its VT value columns and one CTA per SM (its stage fills
# most of the SM's shared memory). The narrow width (CHUNK_VT) runs while its grid has at most
# CHUNK_NARROW_MAX_BLOCKS CTAs (one wave on an H200's 132 SMs); beyond, the wide one: half the CTAs, two warps
# per scheduler.
CHUNK_VT_WIDE = 128
CHUNK_NARROW_MAX_BLOCKS = 132
CHUNK_SMEM_BYTES, CHUNK_WIDE_SMEM_BYTES = 141824, 158208  # the scan on mma.sync (every image but sm_90's)
# The sm_90 image (built for sm_90a) runs the scan on wgmma, its stage in wgmma's swizzled layout. There the
# narrow width adds a producer warpgroup (CHUNK_WGMMA_PRODUCER_THREADS threads after the compute warps) that
# fills three stages; the wide one keeps two, filled by its compute warps. Both add 16 KB of output staging
# (the chunk's output rows go through shared memory to 16-byte stores: ScanLayout::STAGE_OUT).
CHUNK_WGMMA_ARCH = 90
CHUNK_WGMMA_SMEM_BYTES, CHUNK_WGMMA_WIDE_SMEM_BYTES = 211968, 168960
CHUNK_WGMMA_PRODUCER_THREADS = 128
CHUNK_PREP_SMEM_BYTES = 115200
# The prep kernel serves a key head's whole group of value heads per block (q/k loads, norms and the two Gram
# products once for the group) while that grid keeps at least this many blocks: two per SM on an H200's 132
# SMs. Below it, one value head per block: more blocks in flight for short calls.
CHUNK_PREP_SHARED_MIN_BLOCKS = 264
# Tokens per thread of the conv output pass (the kernel takes its run length from the grid's height): runs of
# CONV_TOKENS on calls of at least CONV_LONG_TOKENS tokens, else of CONV_MEDIUM_TOKENS, which keeps more blocks in
# flight on mid-sized calls. Of runs of 13 to 128 tokens, 16 were fastest at 27B, 1 x 3072 to 1 x 8192: shorter
# runs re-read their window more often, longer ones leave a longer last wave (H200;
# docs/design-notes.md#conv-output-loop-and-run-length).
CONV_THREADS, CONV_TOKENS, CONV_MEDIUM_TOKENS, CONV_LONG_TOKENS = 128, 16, 8, 2048
# Each conv thread holds 16 bytes of channels (conv.cu kConvVec: 8 at 16-bit types, 4 at fp32).
CONV_VECTOR_BYTES = 16
# At or below this many tokens (decode, verify) each output thread computes one token: a short call then
# spreads over total_tokens blocks instead of a few runs of CONV_MEDIUM_TOKENS tokens.
CONV_SHORT_TOKENS = 256
# At most this many tokens per request on average (decode, speculative verify): one fused launch, a thread
# per (request, 16 bytes of channels) doing its row's outputs and then its state (conv_rows; conv_decode at
# one token per request on average, which requests fewer inputs ahead).
CONV_ROW_TOKENS = 8
REPLAY_WARPS, REPLAY_ROWS = 2, 8  # GDN replay: warps per block, value rows per warp (gdn_replay.cu kReplay*)

TYPE_SUFFIX = {"float32": "f32", "float16": "f16", "bfloat16": "bf16"}


@dataclass(frozen=True)
class Launch:
    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    smem: int
    params: ctypes.Structure


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def rec_row_groups(geo: GdnGeometry, rows: int) -> int:
    """Row groups per warp: several only when the grid stays large, so small batches keep every SM busy."""
    warps = geo.batch * geo.num_heads_v * _ceil(geo.head_size_v, rows)
    groups = 1
    while groups < 4 and warps // (2 * groups * REC_WARPS) >= REC_MIN_BLOCKS:
        groups *= 2
    return groups


class PlanError(ValueError):
    """No kernel can serve the shape (the CUDA analogue of ORT's 'no supported plan')."""


def chunk_workspace_bytes(geo: GdnGeometry) -> int:
    """Scratch of the chunked engine (gdn_chunked.cu ChunkWorkspace), per token: W [Hv, D] and P [Hv, 64] in
    fp16, normalised Q and K [Hk, D] in fp16, the cumulative log decay [Hv] in fp32."""
    hv, hk = geo.num_heads_v, geo.num_heads_k
    return geo.total_tokens * (2 * hv * (CHUNK_D + CHUNK_TOKENS) + 2 * 2 * hk * CHUNK_D + 4 * hv)


def chunk_prep_blocks(geo: GdnGeometry) -> int:
    """Blocks of the prep kernel: the call's chunk count for well-formed offsets (each row adds at most one
    partial chunk); the kernel strides over any excess that malformed offsets make."""
    return (geo.total_tokens + (CHUNK_TOKENS - 1) * geo.batch) // CHUNK_TOKENS


def chunk_smem_needed(arch: int) -> int:
    """Opt-in shared memory per block that every chunked kernel variant of the image for ``sm_<arch>`` fits in."""
    return max(chunk_scan_smem_bytes(CHUNK_VT, arch), chunk_scan_smem_bytes(CHUNK_VT_WIDE, arch),
               CHUNK_PREP_SMEM_BYTES)


def chunk_scan_smem_bytes(vt: int, arch: int) -> int:
    """Dynamic shared memory of the scan of width ``vt`` in the image for ``sm_<arch>``."""
    if arch == CHUNK_WGMMA_ARCH:
        return CHUNK_WGMMA_SMEM_BYTES if vt == CHUNK_VT else CHUNK_WGMMA_WIDE_SMEM_BYTES
    return CHUNK_SMEM_BYTES if vt == CHUNK_VT else CHUNK_WIDE_SMEM_BYTES


def chunk_scan_threads(vt: int, arch: int) -> int:
    """Threads per block of the scan of width ``vt`` in the image for ``sm_<arch>``: a warp per 16 value columns,
    plus the producer warpgroup of the narrow width on wgmma."""
    producers = CHUNK_WGMMA_PRODUCER_THREADS if arch == CHUNK_WGMMA_ARCH and vt == CHUNK_VT else 0
    return vt // 16 * 32 + producers


def chunk_scan_width(geo: GdnGeometry) -> int:
    """Value columns per scan CTA: CHUNK_VT while that grid fits CHUNK_NARROW_MAX_BLOCKS CTAs, else
    CHUNK_VT_WIDE (docs/design-notes.md#scan-width)."""
    narrow_blocks = geo.head_size_v // CHUNK_VT * geo.num_heads_v * geo.batch
    return CHUNK_VT if narrow_blocks <= CHUNK_NARROW_MAX_BLOCKS else CHUNK_VT_WIDE


def chunk_prep_heads(geo: GdnGeometry, heads: int | None = None) -> int:
    """Value heads per prep block (the grid's height is Hv / heads; the kernel reads it back from there):
    ``heads`` if given (a tuning knob: it must divide the group Hv / Hk), else the whole group when the shared
    grid keeps CHUNK_PREP_SHARED_MIN_BLOCKS blocks, else one."""
    group = geo.num_heads_v // geo.num_heads_k
    if heads is not None:
        if heads < 1 or group % heads:
            raise ValueError(f"prep_heads {heads} does not divide the value heads per key head ({group})")
        return heads
    return group if chunk_prep_blocks(geo) * geo.num_heads_k >= CHUNK_PREP_SHARED_MIN_BLOCKS else 1


def chunked_supported(geo: GdnGeometry, dtype: str, arch: int, smem_optin: int) -> bool:
    """Shapes and devices the tensor-core chunked kernel serves (like ORT: Dk = Dv = 128, scalar decay,
    SM >= 80, and the device's opt-in shared memory per block holds ``chunk_smem_needed(arch)``: sm_80 and sm_90
    do, the 99 KB parts (sm_86, sm_89, sm_120) do not). The pointers must also pass ``chunked_aligned``."""
    return (dtype in ("float16", "bfloat16") and geo.head_size_k == CHUNK_D and geo.head_size_v == CHUNK_D
            and not geo.per_key_decay and arch >= 80 and smem_optin >= chunk_smem_needed(arch))


def chunked_aligned(params: GdnParams) -> bool:
    """The chunked kernels' vector accesses: 8-byte q/k/v; 16-byte output and state rows (the sm_90a scan
    stores the output 16 bytes at a time and copies U~ from it so; the state is accessed 8 bytes at a time),
    as the library's cuda/launch_plan.cc has it."""
    def ok(ptr, n):
        return ptr is None or ptr % n == 0
    return (ok(params.q, 8) and ok(params.k, 8) and ok(params.v, 8) and ok(params.out, 16)
            and ok(params.state_in, 16) and ok(params.state_out, 16))


def gdn_uses_chunked(geo: GdnGeometry, dtype: str, params: GdnParams, *, arch: int, smem_optin: int,
                     engine: str = "auto") -> bool:
    """Whether ``gdn_plan`` launches the chunked kernels (which then need ``params.workspace`` to hold
    ``chunk_workspace_bytes(geo)`` bytes). ``engine``: ``auto`` takes them when the shape allows it and the
    batch averages at least 32 tokens per row (ORT's rule: T >= 32 B; on an H200 the chunked engine is the
    faster one from 1 x 32 up, docs/design-notes.md#chunked-or-recurrent-engine); ``chunked`` whatever the token count
    (PlanError where the shape does not allow it); ``recurrent`` never."""
    if engine not in ("auto", "chunked", "recurrent"):
        raise ValueError(f"engine must be auto, chunked or recurrent, got {engine!r}")
    aligned = chunked_aligned(params)
    chunked = chunked_supported(geo, dtype, arch, smem_optin) and aligned
    if engine == "chunked" and not chunked:
        raise PlanError(f"GatedDeltaNet: the chunked engine needs float16/bfloat16, head sizes 128/128, "
                        f"scalar decay and sm_80+; got {dtype}, {geo.head_size_k}/{geo.head_size_v}, "
                        f"per-key decay {geo.per_key_decay}, sm_{arch} with {smem_optin} B of opt-in shared "
                        f"memory (needs {chunk_smem_needed(arch)}), aligned inputs {aligned}")
    return chunked and (engine == "chunked" or
                        (engine == "auto" and geo.total_tokens >= SEQUENTIAL_MIN_TOKENS * geo.batch))


def gdn_plan(geo: GdnGeometry, dtype: str, params: GdnParams, *, arch: int, smem_optin: int, engine: str = "auto",
             rec_rows: int | None = None, rec_groups: int | None = None,
             scan_width: int | None = None, prep_heads: int | None = None) -> list[Launch]:
    """The kernels of one GatedDeltaNet call.

    Where ``gdn_uses_chunked``: the chunked engine's prep kernel (state-independent work of every chunk into
    ``params.workspace``) and scan kernel (the state recurrence), then a recurrent tail pass over the same
    grid for the rows they skip (captured rows, rows under 32 tokens; decided on the device from cu_seqlens
    and capture_count). Otherwise the recurrent kernel runs every row sequentially; a call of at most one token
    per row takes its decode instantiation (``REC_DECODE_ROWS``).
    ``rec_rows`` / ``rec_groups`` override the recurrent kernel's value rows per warp and row groups per warp,
    ``scan_width`` the scan's value columns per CTA (CHUNK_VT or CHUNK_VT_WIDE),
    ``prep_heads`` the prep kernel's value heads per block; test and tuning knobs.
    """
    if engine not in ("auto", "chunked", "recurrent"):
        raise ValueError(f"engine must be auto, chunked or recurrent, got {engine!r}")
    kmax = next((k for k in REC_KEY_SIZES if geo.head_size_k <= k), None)
    if kmax is None:
        raise PlanError(f"GatedDeltaNet: no supported plan (head_size_qk {geo.head_size_k} > "
                        f"{REC_KEY_SIZES[-1]})")
    use_chunked = gdn_uses_chunked(geo, dtype, params, arch=arch, smem_optin=smem_optin, engine=engine)
    launches = []
    if use_chunked:
        sfx = TYPE_SUFFIX[dtype]
        heads = chunk_prep_heads(geo, prep_heads)
        launches.append(Launch(f"gdn_chunk_prep_{sfx}_d128", (chunk_prep_blocks(geo), geo.num_heads_v // heads, 1),
                               (CHUNK_THREADS, 1, 1), CHUNK_PREP_SMEM_BYTES, _copy(params)))
        vt = scan_width or chunk_scan_width(geo)
        if vt not in (CHUNK_VT, CHUNK_VT_WIDE):
            raise ValueError(f"scan_width {vt} is not instantiated: {(CHUNK_VT, CHUNK_VT_WIDE)}")
        launches.append(Launch(f"gdn_chunked_{sfx}_d128_v{vt}", (geo.head_size_v // vt, geo.num_heads_v, geo.batch),
                               (chunk_scan_threads(vt, arch), 1, 1), chunk_scan_smem_bytes(vt, arch),
                               _copy(params)))
    rec = _copy(params)
    rec.tail_only = int(use_chunked)
    rows = rec_rows or (REC_ROWS_LARGE[kmax] if rec_row_groups(geo, REC_ROWS_LARGE[kmax]) > 1
                        else REC_ROWS_SMALL[kmax])
    if rows not in REC_ROW_VARIANTS[kmax]:
        raise ValueError(f"rec_rows {rows} is not instantiated for key size {kmax}: {REC_ROW_VARIANTS[kmax]}")
    decode = (geo.total_tokens <= geo.batch and dtype in REC_DECODE_TYPES
              and rows in REC_DECODE_ROWS.get(kmax, ()))
    long_rows = not use_chunked and geo.total_tokens > REC_BLOCK_TOKENS[kmax] * geo.batch
    rec.row_groups = rec_groups or (1 if decode or long_rows else rec_row_groups(geo, rows))
    if rows * rec.row_groups > REC_MAX_WARP_ROWS:
        raise ValueError(f"rec_rows {rows} x rec_groups {rec.row_groups} exceeds {REC_MAX_WARP_ROWS} value rows "
                         f"per warp")
    rows_per_block = REC_WARPS * rows * rec.row_groups
    launches.append(Launch(f"gdn_recurrent_{TYPE_SUFFIX[dtype]}_k{kmax}_r{rows}" + ("_decode" if decode else ""),
                           (_ceil(geo.head_size_v, rows_per_block), geo.num_heads_v, geo.batch),
                           (REC_WARPS * 32, 1, 1), 0, rec))
    return launches


def conv_tokens_per_block(total_tokens: int) -> int:
    """Tokens per block of the conv output kernel (the kernel derives it from the grid's height)."""
    if total_tokens <= CONV_SHORT_TOKENS:
        return 1
    return CONV_TOKENS if total_tokens >= CONV_LONG_TOKENS else CONV_MEDIUM_TOKENS


def conv_channel_blocks(channels: int, dtype: str) -> int:
    """Blocks across the channels of a conv launch: CONV_THREADS threads of CONV_VECTOR_BYTES of channels each."""
    return _ceil(channels, CONV_THREADS * (CONV_VECTOR_BYTES // ELEMENT_SIZE[dtype]))


def conv_states_overlap(geo: ConvGeometry, dtype: str, params: ConvParams) -> bool:
    """Whether final_state shares memory with initial_state (in place, or any overlap of the two ranges)."""
    nbytes = geo.batch * geo.channels * geo.state_length * ELEMENT_SIZE[dtype]
    state_in, state_out = params.state_in or 0, params.state_out or 0
    return state_in < state_out + nbytes and state_out < state_in + nbytes


def conv_plan(geo: ConvGeometry, dtype: str, params: ConvParams) -> list[Launch]:
    """For short rows one launch that computes each row's outputs, then its state. Otherwise the output pass,
    which reads the incoming state, with the state and capsule pass as its grid's first rows; or, when the two
    states overlap, as a second launch after it."""
    sfx = TYPE_SUFFIX[dtype]
    cx = conv_channel_blocks(geo.channels, dtype)
    block = (CONV_THREADS, 1, 1)
    if geo.total_tokens <= CONV_ROW_TOKENS * geo.batch:
        kernel = "conv_decode" if geo.total_tokens <= geo.batch else "conv_rows"
        return [Launch(f"{kernel}_{sfx}", (cx, geo.batch, 1), block, 0, params)]
    run = conv_tokens_per_block(geo.total_tokens)
    output = _copy(params)
    output.state_rows = 0 if conv_states_overlap(geo, dtype, params) else geo.batch
    launches = [Launch(f"conv_output_{sfx}", (cx, output.state_rows + _ceil(geo.total_tokens, run), 1), block, 0,
                       output)]
    if not output.state_rows:
        launches.append(Launch(f"conv_state_{sfx}", (cx, geo.batch, 1), block, 0, params))
    return launches


def gdn_replay_plan(params: GdnReplayParams) -> list[Launch]:
    """REPLAY_WARPS warps per block, each on REPLAY_ROWS value rows of one (request, head) (gdn_replay.cu gdn_replay_f32)."""
    return [Launch("gdn_replay_f32", (_ceil(params.dv, REPLAY_WARPS * REPLAY_ROWS), params.hv, params.batch),
                   (REPLAY_WARPS * 32, 1, 1), 0, params)]


def conv_replay_plan(dtype: str, params: ConvReplayParams) -> list[Launch]:
    return [Launch(f"conv_replay_{TYPE_SUFFIX[dtype]}", (conv_channel_blocks(params.channels, dtype), params.batch, 1),
                   (CONV_THREADS, 1, 1), 0, params)]


def kernel_names() -> list[str]:
    """Every extern "C" kernel of the image (what a driver-API loader looks up)."""
    names = []
    for sfx in TYPE_SUFFIX.values():
        names += [f"gdn_recurrent_{sfx}_k{k}_r{r}" for k, rows in REC_ROW_VARIANTS.items() for r in rows]
        names += [f"conv_{kind}_{sfx}" for kind in ("output", "state", "rows", "decode", "replay")]
    names += [f"gdn_chunk_prep_{sfx}_d128" for sfx in ("f16", "bf16")]
    names += [f"gdn_chunked_{sfx}_d128_v{vt}" for vt in (CHUNK_VT, CHUNK_VT_WIDE) for sfx in ("f16", "bf16")]
    names += [f"gdn_recurrent_{TYPE_SUFFIX[t]}_k{k}_r{r}_decode" for t in REC_DECODE_TYPES
              for k, rows in REC_DECODE_ROWS.items() for r in rows]
    names += ["gdn_replay_f32"]
    return names


def _copy(params: ctypes.Structure) -> ctypes.Structure:
    out = type(params)()
    ctypes.pointer(out)[0] = params
    return out
