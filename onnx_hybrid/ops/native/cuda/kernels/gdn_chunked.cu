// GatedDeltaNet chunked engine (docs/op-contract.md#chunked-engine) for Dk = Dv = 128, scalar decay, fp16/bf16
// activations.
//
// A request is cut into chunks of 64 tokens counted from its first token. With gamma the inclusive
// cumulative log decay within a chunk and S0 the state entering it:
//   M = strict_lower(beta_t k_t.k_s e^{g_t-g_s}),  T = (I+M)^{-1},  P = lower(q_t.k_s e^{g_t-g_s})
//   W = T diag(beta e^g) K,  U~ = T diag(beta) V                      (state-independent)
//   U = U~ - W S0,  O = scale (diag(e^g) Q S0 + P U),  S = e^{g_L} S0 + K^T diag(e^{g_L-g}) U
// Two kernels:
// * gdn_chunk_prep, one CTA per (chunk, value head) or, on large grids, per (chunk, key head) serving the key
//   head's group of value heads, fully parallel: normalised Q and K, gamma, P, W and U~ into the workspace
//   (U~ is staged in the output rows, which the scan overwrites with O).
// * gdn_chunked, one CTA per (request, value head, 64 or 128 value columns), walks the chunks in order with
//   the fp32 state in registers, 16 value rows per warp; per chunk only three products depend on the state
//   (W S0 and Q S0, then P U and K^T U), computed transposed so that the state and U stay in registers,
//   with the next chunk's operands arriving meanwhile through cp.async.
// Only decay ratios e^{g_t-g_s} <= 1 are formed, never k e^{-g}. Every product has fp16 operands and fp32
// accumulation (bf16 activations are converted to fp16 operands on load): on mma.sync.m16n8k16, except the
// scan's state products in the sm_90a image, which run on wgmma with the same register layout.
//
// Rows that must run sequentially (captured rows, rows shorter than 32 tokens) are skipped by both kernels and
// served by the recurrent kernel's tail pass (docs/op-contract.md#engine-selection).
#include "common.cuh"
#include "mma.cuh"

// The image built for sm_90a (compiler.py) takes the scan body on wgmma; every other image the mma.sync one.
// Both kernels keep their names, so the planner only picks the shared memory per architecture.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define OHK_SCAN_WGMMA 1
#include "wgmma.cuh"
#else
#define OHK_SCAN_WGMMA 0
#endif

namespace ohk {
namespace chunk {

constexpr int BT = launch_config::kChunkTokens;  // tokens per chunk
constexpr int D = launch_config::kChunkD;        // Dk = Dv
constexpr int WARPS = 8;
constexpr int THREADS = WARPS * 32;
static_assert(THREADS == launch_config::kChunkThreads, "the prep kernel's block is the planner's");
constexpr int LDH = D + 8;   // halves per 128-wide row (+16 B against bank conflicts)
constexpr int LDT = BT + 8;  // halves per 64-wide row
constexpr int LDD = 16 + 8;  // halves per 16-wide row
constexpr int LDM = 16 + 4;  // floats per 16-wide row (16-byte rows: float4 loads)

// Prep kernel: one CTA serves `heads` value heads of one key head's group (gridDim.y = Hv / heads). Q, K,
// their norms and the raw Gram products K K^T and Q K^T are formed once per CTA; per value head the decay
// ratios and beta scale them into M and P, T = (I+M)^{-1} is formed once (64 columns) and scaled into
// T diag(beta e^g) and T diag(beta), and [W | U~] = T diag(coef) [K | V] are chain-free products, 32 columns
// per warp: warps 0-3 W, warps 4-7 U~.
constexpr int RHS = 2 * D;
constexpr int U_WARPS = WARPS / 2;  // warps forming U~, each with its own slice of V
constexpr int LDV = 32 + 8;         // elements per row of a U~ warp's V slice (32 columns, 16-bit)
constexpr int P_OFF_K = 0;                                // K chunk, fp16 [BT][LDH]
constexpr int P_OFF_Q = P_OFF_K + BT * LDH * 2;           // Q chunk, fp16 [BT][LDH]; after the Gram: T_W, T_U
constexpr int P_OFF_V = P_OFF_Q + BT * LDH * 2;           // V slices, input type [2 heads][U_WARPS][BT][LDV]
constexpr int P_OFF_M = P_OFF_V + 2 * U_WARPS * BT * LDV * 2;  // -M, fp16 [BT][LDT]
constexpr int P_OFF_DINV = P_OFF_M + BT * LDT * 2;        // inverses of the diagonal blocks, fp16 [BT][LDD]
constexpr int P_OFF_MD = P_OFF_DINV + BT * LDD * 2;       // diagonal blocks of M, fp32 [BT][LDM]
constexpr int P_OFF_VEC = P_OFF_MD + BT * LDM * 4;        // gamma, beta, beta e^gamma, fp32 [2 heads][3][BT]
constexpr int P_OFF_STG = P_OFF_VEC + 2 * 3 * BT * 4;     // per warp: 16 output rows of 64 bytes (swizzled)
constexpr int GRAM_WARPS = 6;                             // warps whose 16x32 Gram tile meets the lower triangle
constexpr int P_OFF_KK = P_OFF_STG + WARPS * 16 * 64;     // raw K K^T tiles, fp32 [GRAM_WARPS][4 n tiles][32 lanes][4]
constexpr int PREP_SMEM_BYTES = P_OFF_KK + GRAM_WARPS * 4 * 32 * 16;
constexpr int VEC_WARP = 6;  // forms the next head's vectors while warps 0-5 and 7 form T (prep_vectors)
// Forms the first head's vectors while the Gram warps form the Gram (it has no Gram tile), and hands them to
// them through named barrier VEC0_BARRIER.
constexpr int VEC0_WARP = 1;
constexpr int VEC0_BARRIER = 1;
// T diag(coef), transposed ([source token s][token t], 128-byte rows, 16-byte piece c of row s at c ^ (s % 8):
// the 8 rows of every ldmatrix / store phase hit distinct banks), for W and for U~, in the dead Q region.
constexpr int T_BYTES = BT * BT * 2;
static_assert(2 * T_BYTES <= BT * LDH * 2, "T_W and T_U fit the Q region");
static_assert(WARPS * 32 == RHS && U_WARPS * 32 == D, "32 output columns per warp");
static_assert(2 * PREP_SMEM_BYTES + 2048 <= 228 * 1024, "two prep CTAs per sm_90 SM");

// Scan kernel, VT value columns per CTA (VT / 16 compute warps of 16 value rows each), instantiated for two
// widths: the narrow one gives more CTAs, the wide one two warps per scheduler. Every operand read from the
// workspace has STAGES buffers, so the next chunks' arrive while the current one runs; the stages are all the
// shared memory. The two bodies (mma.sync, wgmma: see the scan below) store W, Q, K and P differently; each
// layout names, for the copy, the byte offset of the 16-byte piece `piece` of token row t of W/Q/K (16 pieces)
// and of P (8 pieces), and the bytes from row t to row t + 8 (each thread copies rows a multiple of 8 apart).
// PRODUCER_WARPS > 0 (sm_90a, narrow width): a second warpgroup does all the copies (COPY_THREADS threads)
// and hands the stages over through named barriers; otherwise every thread copies and computes.
constexpr int VT_NARROW = launch_config::kChunkVt;
constexpr int VT_WIDE = launch_config::kChunkVtWide;
#if OHK_SCAN_WGMMA
// W, Q and K: per key half (64 keys) [token][128 bytes], each 8-token block a 128B-swizzle atom (wgmma.cuh),
// the two key halves of an operand KEY_STRIDE bytes apart. In the wide width (XY_FUSED) W's and Q's rows of a
// key half are adjacent ([W half 0][Q half 0][W half 1][Q half 1]), so [X | Y] = S0^T [W | Q]^T is one n128
// product (K-major B, n = W's 64 tokens then Q's, k = keys), and P fills the gap between K's key halves. The
// narrow width keeps [W][Q][K][P] with each operand's halves adjacent: there two n64 products X then Y let the
// compute warps form U while Y runs (measured on the H200: the narrow scan lost 16% with the fused product and
// O deferred, the wide one gained 4% from the fused product). K is read as MN-major B by the state update
// (k = tokens, n = keys); P is [token t][128 bytes over source tokens s], swizzled the same way: K-major B of
// O^T += U^T P^T (n = t, k = s). Every one of them starts on a 1024-byte boundary.
template <int VT>
struct ScanLayout {
  static_assert(VT % 64 == 0 && D % VT == 0, "whole warpgroups of 64 value rows");
  static constexpr int WARPS = VT / 16;  // compute warps (warps 0 ...), whole warpgroups
  // The narrow width's one compute warpgroup is alone on its SM (one warp per scheduler), and each of its
  // warps issued 33 cp.async and ~230 address instructions per chunk besides the wgmma work: a producer
  // warpgroup takes those over. The wide width keeps its warps' copies (two warps per scheduler already, and
  // a third stage would not fit).
  static constexpr int PRODUCER_WARPS = VT == VT_NARROW ? 4 : 0;
  static constexpr int THREADS = (WARPS + PRODUCER_WARPS) * 32;
  static constexpr int COPY_THREADS = PRODUCER_WARPS > 0 ? PRODUCER_WARPS * 32 : THREADS;
  static constexpr int STAGES = PRODUCER_WARPS > 0 ? 3 : 2;
  static constexpr int LDU = VT + 8;                        // halves per VT-wide row of U~ (ldmatrix, unswizzled)
  static constexpr int KEY_HALF = BT * 128;                 // bytes of 64 keys of every token
  static constexpr bool XY_FUSED = VT == VT_WIDE;          // [X | Y] as one n128 product
  static constexpr int KEY_STRIDE = XY_FUSED ? 2 * KEY_HALF : KEY_HALF;  // an operand's key half 0 -> half 1
  static constexpr int STAGE_W = 0;
  static constexpr int STAGE_Q = STAGE_W + (XY_FUSED ? KEY_HALF : 2 * KEY_HALF);  // fused: after W's rows
  static constexpr int STAGE_K = STAGE_W + 4 * KEY_HALF;
  static constexpr int STAGE_P = STAGE_K + (XY_FUSED ? KEY_HALF : 2 * KEY_HALF);  // fused: between K's halves
  static constexpr int STAGE_U = STAGE_W + 7 * KEY_HALF;    // U~ of this CTA's columns, fp16 [BT][LDU]
  static constexpr int STAGE_G = STAGE_U + BT * LDU * 2;    // gamma, fp32 [BT]
  // With producer warps: e^g [BT], e^{g_L-g} [BT] and e^{g_L}, fp32, written by them (StagedDecays).
  static constexpr int STAGE_E = STAGE_G + BT * 4;
  static constexpr int ALIGN = 1024;                        // swizzle atoms start on 1024-byte boundaries
  static constexpr int STAGE_BYTES = (STAGE_E + (2 * BT + 4) * 4 + ALIGN - 1) / ALIGN * ALIGN;
  // Output staging, after the stages: a chunk's scale * O^T in the output type as token rows, written by the
  // compute warps with stmatrix (the transpose for free), then stored with 16-byte stores whose rows are whole
  // sectors (4-byte stores from the fragments, 8 token rows per instruction, backed up the LSU and held the
  // compute warps' registers: the profile's hottest stalls). One [BT][16 values] buffer per compute warp
  // (32-byte rows, 16-byte piece c of row t at c ^ ((t / 4) % 2)), which the warp stores itself. (Having the
  // producer warps store the narrow width's rows from two [BT][VT] buffers was slower on the H200: their loop
  // grew and the compute warps waited for their "full" barrier three times as often.)
  static constexpr int OUT_ROW_BYTES = 32;
  static constexpr int OUT_BUFFERS = WARPS;
  static constexpr int OUT_BUFFER_BYTES = BT * OUT_ROW_BYTES;
  static constexpr int STAGE_OUT = STAGES * STAGE_BYTES;  // from the first stage
  static constexpr int SMEM_BYTES = STAGE_OUT + OUT_BUFFERS * OUT_BUFFER_BYTES + ALIGN;  // + the run-time alignment
  static constexpr int WQK_ROW8_BYTES = 8 * 128, P_ROW8_BYTES = 8 * 128;
  static __device__ __forceinline__ unsigned wqk_offset(int t, int piece) {
    return (piece >> 3) * KEY_STRIDE + swizzle128_offset(t, piece & 7);
  }
  static __device__ __forceinline__ unsigned p_offset(int t, int piece) { return swizzle128_offset(t, piece); }
  static_assert(STAGE_P % ALIGN == 0 && KEY_HALF % ALIGN == 0, "swizzle atoms on 1024-byte boundaries");
  static_assert(BT * 128 == KEY_HALF && STAGE_U == STAGE_P + KEY_STRIDE && STAGE_K + KEY_STRIDE + KEY_HALF <= STAGE_U,
                "W, Q, K and P do not overlap");
  static_assert(SMEM_BYTES <= 227 * 1024, "the scan fits sm_90's opt-in shared memory per block");
};
#else
// Row-major with 16 bytes of padding per row against ldmatrix bank conflicts.
template <int VT>
struct ScanLayout {
  static_assert(VT % 16 == 0 && D % VT == 0, "whole warps of 16 value rows");
  static constexpr int WARPS = VT / 16;
  static constexpr int PRODUCER_WARPS = 0;
  static constexpr int THREADS = WARPS * 32;
  static constexpr int COPY_THREADS = THREADS;
  static constexpr int STAGES = 2;
  static constexpr int LDU = VT + 8;                        // halves per VT-wide row
  static constexpr int STAGE_W = 0;                         // W, fp16 [BT][LDH]
  static constexpr int STAGE_K = STAGE_W + BT * LDH * 2;    // K, fp16 [BT][LDH]
  static constexpr int STAGE_Q = STAGE_K + BT * LDH * 2;    // Q, fp16 [BT][LDH]
  static constexpr int STAGE_P = STAGE_Q + BT * LDH * 2;    // P, fp16 [BT][LDT]
  static constexpr int STAGE_U = STAGE_P + BT * LDT * 2;    // U~ of this CTA's columns, fp16 [BT][LDU]
  static constexpr int STAGE_G = STAGE_U + BT * LDU * 2;    // gamma, fp32 [BT]
  static constexpr int ALIGN = 16;
  static constexpr int STAGE_BYTES = STAGE_G + BT * 4;
  static constexpr int SMEM_BYTES = STAGES * STAGE_BYTES;
  static constexpr int WQK_ROW8_BYTES = 8 * LDH * 2, P_ROW8_BYTES = 8 * LDT * 2;
  static __device__ __forceinline__ unsigned wqk_offset(int t, int piece) { return (t * LDH + piece * 8) * 2; }
  static __device__ __forceinline__ unsigned p_offset(int t, int piece) { return (t * LDT + piece * 8) * 2; }
  static_assert(SMEM_BYTES <= 163 * 1024, "the scan fits sm_80's opt-in shared memory per block");
};
#endif

}  // namespace chunk

// The workspace of one call (ChunkWorkspaceBytes in cuda/launch_plan.cc): per token, W [Hv][D] and P [Hv][BT] (fp16),
// normalised Q and K [Hk][D] (fp16), gamma [Hv] (fp32). Rows are addressed by token, so ragged requests need
// no chunk table.
struct ChunkWorkspace {
  __half* w;
  __half* p;
  __half* q;
  __half* k;
  float* g;
};

__device__ __forceinline__ ChunkWorkspace chunk_workspace(const GdnParams& p) {
  using namespace chunk;
  const size_t t = (size_t)p.total_tokens;
  ChunkWorkspace ws;
  ws.w = static_cast<__half*>(p.workspace);
  ws.p = ws.w + t * p.hv * D;
  ws.q = ws.p + t * p.hv * BT;
  ws.k = ws.q + t * p.hk * D;
  ws.g = reinterpret_cast<float*>(ws.k + t * p.hk * D);
  return ws;
}

template <typename T>
__device__ __forceinline__ void unpack4(uint2 r, float (&x)[4]) {
  const T* e = reinterpret_cast<const T*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) x[i] = to_f32(e[i]);
}

__device__ __forceinline__ uint2 pack4_half(const float (&x)[4]) {
  __half2 a = __floats2half2_rn(x[0], x[1]), b = __floats2half2_rn(x[2], x[3]);
  return make_uint2(*reinterpret_cast<unsigned*>(&a), *reinterpret_cast<unsigned*>(&b));
}

__device__ __forceinline__ void store_half2(__half* p, float a, float b) {
  *reinterpret_cast<__half2*>(p) = __floats2half2_rn(a, b);
}

constexpr int kPrepRows = chunk::BT / chunk::WARPS;  // chunk rows each prep warp loads and normalises
static_assert(kPrepRows * chunk::WARPS == chunk::BT, "the warps load every chunk row");

__device__ __forceinline__ int chunks_of(int len) { return (len + chunk::BT - 1) / chunk::BT; }

// Chunk `x` of the call, counting the chunks of the rows the chunked engine serves in row order: its row, index
// within the row (row -1 past the last chunk) and the row's span (row_span), so that the CTA reads the offsets
// once; and whether chunk `next` may exist (exact where the scan has seen every row by then, else true), so
// that a CTA with nothing after its chunk leaves without looking again. Warp 0 scans the rows 32 at a time.
struct ChunkRef {
  int row;
  int index;
  RowSpan span;
  bool more;
};

__device__ __forceinline__ ChunkRef find_chunk(const GdnParams& p, int x, int next, int lane) {
  int before = 0;
  for (int b0 = 0; b0 < p.batch; b0 += 32) {
    const int b = b0 + lane;
    int n = 0;
    RowSpan s = {0, 0};
    if (b < p.batch) {
      s = row_span(p.cu_seqlens, p.uniform_len, b, p.total_tokens);
      n = gdn_row_is_sequential(p, b, s.len) ? 0 : chunks_of(s.len);
    }
    int incl = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int m = __shfl_up_sync(0xffffffffu, incl, o);
      if (lane >= o) incl += m;
    }
    const unsigned hit = __ballot_sync(0xffffffffu, before + incl > x);
    if (hit) {
      const int l = __ffs(hit) - 1;
      const int excl = __shfl_sync(0xffffffffu, before + incl - n, l);
      const RowSpan span = {__shfl_sync(0xffffffffu, s.start, l), __shfl_sync(0xffffffffu, s.len, l)};
      const int through = __shfl_sync(0xffffffffu, before + incl, 31);  // the chunks of rows < b0 + 32
      return {b0 + l, x - excl, span, b0 + 32 < p.batch || through > next};
    }
    before += __shfl_sync(0xffffffffu, incl, 31);
  }
  return {-1, 0, {0, 0}, false};
}

// ---------------------------------------------------------------------------------------------------------
// Prep: everything of a chunk that does not depend on the state. Grid-strided over the call's chunks (the
// grid is sized from an upper bound that well-formed offsets respect; a loop keeps malformed ones covered).

template <typename E>
__device__ __forceinline__ float2 to_f32x2(unsigned x);
template <>
__device__ __forceinline__ float2 to_f32x2<__half>(unsigned x) {
  return __half22float2(*reinterpret_cast<const __half2*>(&x));
}
template <>
__device__ __forceinline__ float2 to_f32x2<__nv_bfloat16>(unsigned x) {
  return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&x));
}

// A U~ warp's 32 columns of V (src: token 0's row at the first column) for the chunk's rows into its slice, in
// the input type (rows past L zero-filled without reading): 64 rows of 8 pieces of 8 bytes, 16 per lane. The
// row pointer advances by one running sum: 16 precomputed 64-bit addresses would cost 32 registers.
template <typename T>
__device__ __forceinline__ void prep_load_v(T* slice, const T* src, long long stride, size_t tok0, int L, int lane) {
  using namespace chunk;
  const int piece = (lane & 7) * 4;
  const T* row = src + (tok0 + (lane >> 3)) * stride + piece;
#pragma unroll 1
  for (int t = lane >> 3; t < BT; t += 4, row += 4 * stride) {
    const bool ok = t < L;
    cp_async8(slice + t * LDV + piece, ok ? row : src, ok);
  }
}

// Value head h's inputs for chunk rows 2 lane and 2 lane + 1 as read (raw decay 0 and beta 0 past L, beta 1
// without the delta rule), loaded a head ahead of their use.
struct PrepScalars {
  float gate[2], beta[2];
  float a_log, dt_bias;  // the head's gate parameters (qwen gate)
};

template <typename T>
__device__ __forceinline__ PrepScalars prep_load_scalars(const GdnParams& p, int h, size_t tok0, int L, int lane) {
  PrepScalars s;
  s.a_log = p.gate_qwen ? p.a_log[h] : 0.f;
  s.dt_bias = p.gate_qwen ? p.dt_bias[h] : 0.f;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int t = 2 * lane + i;
    const size_t idx = (tok0 + t) * p.hv + h;
    s.gate[i] = t < L && p.has_decay ? gdn_gate<T>(p, p.decay, idx) : 0.f;
    s.beta[i] = t < L ? (p.has_delta ? gdn_gate<T>(p, p.beta, idx) : 1.f) : 0.f;
  }
  return s;
}

// Value head h's per-row vectors, formed by one warp for the CTA (the first head's by VEC0_WARP, published by a
// named barrier; the others by VEC_WARP, a head ahead, published by a block barrier): gamma, the inclusive
// cumulative log decay (padding rows add 0), beta, and beta e^gamma (0 without the delta rule) into
// vec = [gamma | beta | beta e^gamma]; gamma also to the workspace.
__device__ __forceinline__ void prep_vectors(const GdnParams& p, const ChunkWorkspace& ws, int h, const PrepScalars& s,
                                             size_t tok0, int L, int lane, float* vec) {
  float a[2], b[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const bool in = 2 * lane + i < L;
    a[i] = s.gate[i];
    if (in && p.has_decay && p.gate_qwen) {
      const float z = a[i] + s.dt_bias;
      a[i] = -expf(s.a_log) * (z > 20.0f ? z : log1pf(expf(z)));
    }
    b[i] = s.beta[i];
    if (in && p.has_delta && p.beta_sigmoid) b[i] = 1.0f / (1.0f + expf(-b[i]));
  }
  float sum = a[0] + a[1];
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, sum, o);
    if (lane >= o) sum += n;
  }
  const float gg[2] = {sum - a[1], sum};
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int t = 2 * lane + i;
    vec[t] = gg[i];
    vec[chunk::BT + t] = b[i];
    vec[2 * chunk::BT + t] = p.has_delta ? b[i] * expf(gg[i]) : 0.f;
    if (t < L) ws.g[(tok0 + t) * p.hv + h] = gg[i];
  }
}

// Byte-free element offset of the pair (s, t), (s, t + 1) in a transposed T store (P_OFF_Q's comment): row s,
// 16-byte piece t / 8 swizzled by s % 8.
__device__ __forceinline__ int t_offset(int s, int t) { return s * chunk::BT + (((t >> 3) ^ (s & 7)) << 3) + (t & 7); }

// Column block J (16 columns) of T = (I+M)^{-1} below the diagonal, by block forward substitution on the
// transposes, with the identity as the right-hand side:
//   X_i^T = sum_{J<=j<i} T_jJ^T (-M_ij)^T,   T_iJ^T = X_i^T Dinv_i^T   (i > J; T_JJ = Dinv_J)
// The block's columns are the mma rows and tokens its columns, so each accumulator is reused as the next A
// operand in registers (C -> A fragments). B operands come straight from -M and Dinv with ldmatrix. X and the
// T blocks are rounded to fp16 as operands (as the old solve rounded X and its solution); the fp32 T blocks
// leave scaled by their columns' coefficients into the transposed stores Tw = (T diag(beta e^g))^T and
// Tu = (T diag(beta))^T, one 4-byte pair per accumulator pair. The diagonal blocks are not written here.
template <int J>
__device__ __forceinline__ void prep_t_column(const __half* Mh, const __half* Dh, const float* rco, const float* bet,
                                              __half* Tw, __half* Tu, int lane) {
  using namespace chunk;
  const int g8 = lane >> 2;
  const int q2 = (lane & 3) * 2;
  unsigned sol[BT / 16 - 1][4];  // T_jJ^T as A fragments (m = the block's 16 columns, k = tokens of block j)
  // T_JJ^T = Dinv_J^T: Dh holds Dinv_J row-major ([k][m] for this A), so the transposing load gives it.
  ldmatrix_x4_trans(sol[J], Dh + (J * 16 + (lane & 7) + (lane >> 4) * 8) * LDD + ((lane >> 3) & 1) * 8);
  const int s0 = J * 16 + g8;  // this lane's columns of T: s0 and s0 + 8
  const float cw[2] = {rco[s0], rco[s0 + 8]}, cu[2] = {bet[s0], bet[s0 + 8]};
#pragma unroll
  for (int i = J + 1; i < BT / 16; ++i) {
    float acc[2][4] = {};  // per 8-token half of block i
#pragma unroll
    for (int j = J; j < i; ++j) {
      unsigned m[4];  // (-M_ij)^T as B fragments: token half nt of block i is {m[nt], m[nt + 2]}
      ldmatrix_a(m, Mh + i * 16 * LDT + j * 16, LDT, lane);
#pragma unroll
      for (int nt = 0; nt < 2; ++nt) {
        const unsigned b[2] = {m[nt], m[nt + 2]};
        mma_16816(acc[nt], sol[j], b);
      }
    }
    unsigned d[4];  // Dinv_i^T as B fragments, the same way
    ldmatrix_a(d, Dh + i * 16 * LDD, LDD, lane);
    const unsigned x[4] = {pack2<__half>(acc[0][0], acc[0][1]), pack2<__half>(acc[0][2], acc[0][3]),
                           pack2<__half>(acc[1][0], acc[1][1]), pack2<__half>(acc[1][2], acc[1][3])};
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      float t[4] = {0.f, 0.f, 0.f, 0.f};  // T[i * 16 + nt * 8 + q2 + {0, 1}][s0 + {0, 8}]
      const unsigned b[2] = {d[nt], d[nt + 2]};
      mma_16816(t, x, b);
      if (i < BT / 16 - 1) {
        sol[i][2 * nt] = pack2<__half>(t[0], t[1]);
        sol[i][2 * nt + 1] = pack2<__half>(t[2], t[3]);
      }
      const int tok = i * 16 + nt * 8 + q2;
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const int o = t_offset(s0 + 8 * r, tok);
        *reinterpret_cast<unsigned*>(Tw + o) = pack2<__half>(t[2 * r] * cw[r], t[2 * r + 1] * cw[r]);
        *reinterpret_cast<unsigned*>(Tu + o) = pack2<__half>(t[2 * r] * cu[r], t[2 * r + 1] * cu[r]);
      }
    }
  }
}

// B fragments of n tiles (n0, n0 + 8) from a [k][n] slice of 16-bit E, as fp16 operands (bf16 converted; the
// solve has always rounded the right-hand side to fp16).
template <typename E>
__device__ __forceinline__ void prep_load_b(unsigned (&b)[2][2], const E* tile, int ld, int lane);
template <>
__device__ __forceinline__ void prep_load_b<__half>(unsigned (&b)[2][2], const __half* tile, int ld, int lane) {
  ldmatrix_b_pair_trans(b, tile, ld, lane);
}
template <>
__device__ __forceinline__ void prep_load_b<__nv_bfloat16>(unsigned (&b)[2][2], const __nv_bfloat16* tile, int ld,
                                                           int lane) {
  ldmatrix_b_pair_trans(b, reinterpret_cast<const __half*>(tile), ld, lane);
#pragma unroll
  for (int n = 0; n < 2; ++n) {
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const float2 f = to_f32x2<__nv_bfloat16>(b[n][k]);
      b[n][k] = pack2<__half>(f.x, f.y);
    }
  }
}

// A warp's 16 x 32 tile in the mma accumulator layout (acc[nt]: rows g8 and g8 + 8, columns 8 nt + q2 + {0, 1})
// as fp16 to its rows r < rows at dst + r * stride, through the warp's stage (16 rows of 64 bytes, 16-byte
// piece c of row r at c ^ (r / 2 % 4): the pair stores and the 16-byte loads meet no bank twice). Each lane
// then stores 16 bytes, and every 32-byte sector is written whole by one instruction (dst and stride keep
// rows 16-byte aligned: the planner's ChunkedAligned for the output). The caller orders earlier reads of the stage
// before this call (__syncwarp).
__device__ __forceinline__ void prep_store_tile(const float (&acc)[4][4], unsigned* stage, __half* dst, int stride,
                                                int rows, int lane) {
  const int g8 = lane >> 2;
#pragma unroll
  for (int r = 0; r < 2; ++r) {
#pragma unroll
    for (int nt = 0; nt < 4; ++nt)
      stage[(g8 + 8 * r) * 16 + ((nt ^ ((g8 >> 1) & 3)) << 2) + (lane & 3)] =
          pack2<__half>(acc[nt][2 * r], acc[nt][2 * r + 1]);
  }
  __syncwarp();
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int row = (lane >> 2) + 8 * r;  // 16-byte piece lane % 4 of it
    const uint4 v = *reinterpret_cast<const uint4*>(stage + row * 16 + (((lane & 3) ^ ((lane >> 3) & 3)) << 2));
    if (row < rows) *reinterpret_cast<uint4*>(dst + (row * stride + (lane & 3) * 8)) = v;
  }
}

// Output blocks IA > IB of prep_apply in one pass over the source blocks j <= IA: the B fragments of the blocks
// j <= IB serve both, and the two sums give the mma pipe independent work. Each block's sum runs over j in the
// same order as one block at a time did (bitwise the same). Both leave through the warp's stage in turn.
template <int IA, int IB, typename E>
__device__ __forceinline__ void prep_apply_pair(const E* src, int ld, const __half* a_base, int a_piece, __half* dst,
                                                int dst_stride, int L, unsigned* stage, int lane) {
  using namespace chunk;
  static_assert(IA > IB, "the longer block first");
  // Bounds ptxas's scheduling to one pair at a time (else the images spill), and orders the previous pair's
  // reads of the stage before this pair's writes.
  __syncwarp();
  float acc[2][4][4] = {};  // blocks IA and IB, n tiles of 8 columns
#pragma unroll
  for (int j = 0; j <= IA; ++j) {
    unsigned b[2][2][2];  // [n pair]
#pragma unroll
    for (int np = 0; np < 2; ++np) prep_load_b<E>(b[np], src + j * 16 * ld + np * 16, ld, lane);
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const int i = k ? IB : IA;
      if (j <= i) {
        unsigned a[4];
        ldmatrix_x4_trans(a, a_base + j * 16 * BT + ((a_piece ^ (2 * i)) << 3));
#pragma unroll
        for (int np = 0; np < 2; ++np) {
          mma_16816(acc[k][2 * np], a, b[np][0]);
          mma_16816(acc[k][2 * np + 1], a, b[np][1]);
        }
      }
    }
  }
  prep_store_tile(acc[0], stage, dst + IA * 16 * dst_stride, dst_stride, L - IA * 16, lane);
  __syncwarp();  // the stage's reads before its next writes
  prep_store_tile(acc[1], stage, dst + IB * 16 * dst_stride, dst_stride, L - IB * 16, lane);
}

// One warp's 32 columns of [W | U~]: out = Tc src, Tc = T diag(coef) from its transposed store (t_offset),
// src: this warp's first column of the chunk's rows ([token][column], 16-bit E, ld elements per row). Each
// 16-token block i of the output is the sum of i + 1 independent products over source blocks j <= i (T is
// block lower-triangular); nothing chains. The blocks go in pairs of 4 + 1 and 3 + 2 products
// (prep_apply_pair: 14 B fragment loads instead of 20). Each block leaves through prep_store_tile (row t < L at
// dst + t * dst_stride; 64 dst_stride fits an int).
template <typename E>
__device__ __forceinline__ void prep_apply(const E* src, int ld, const __half* Tc, __half* dst, int dst_stride, int L,
                                           unsigned* stage, int lane) {
  using namespace chunk;
  static_assert(BT / 16 == 4, "two pairs of token blocks");
  // ldmatrix_x4_trans of the A tile (i, j) = Tc[16 i.., 16 j..] from [s][t] rows: row s = 16 j + a_row, piece
  // 2 i + a_piece, swizzled by s % 8 = lane % 8.
  // The row offset is opaque to the compiler, so that the base is formed here per call: hoisted out of the
  // chunk loop, it was a value ptxas spilled at 128 registers.
  int a_row = (lane & 7) + (lane >> 4) * 8;
  asm volatile("" : "+r"(a_row));
  const __half* a_base = Tc + a_row * BT;
  const int a_piece = ((lane >> 3) & 1) ^ (lane & 7);
  prep_apply_pair<3, 0, E>(src, ld, a_base, a_piece, dst, dst_stride, L, stage, lane);
  prep_apply_pair<2, 1, E>(src, ld, a_base, a_piece, dst, dst_stride, L, stage, lane);
}

template <typename T>
__device__ __forceinline__ void gdn_chunk_prep(const GdnParams& p) {
  using namespace chunk;
  extern __shared__ __align__(16) unsigned char smem[];
  __half* Kh = reinterpret_cast<__half*>(smem + P_OFF_K);
  __half* Qh = reinterpret_cast<__half*>(smem + P_OFF_Q);
  float* Md = reinterpret_cast<float*>(smem + P_OFF_MD);
  __half* Mh = reinterpret_cast<__half*>(smem + P_OFF_M);
  __half* Dh = reinterpret_cast<__half*>(smem + P_OFF_DINV);
  __half* Tw = Qh;  // T diag(beta e^g) and T diag(beta), transposed, once the Gram has read Q
  __half* Tu = Qh + BT * BT;
  __shared__ ChunkRef found;
  // Whether this CTA stores the group's shared normalised Q and K (one CTA of the group does), kept in shared
  // memory: held in a register across the chunk loop, it was the value ptxas spilled at 128 registers.
  __shared__ bool write_qk_shared;
  __shared__ int key_head;  // the CTA's key head, also in shared memory for the same reason

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int heads = p.hv / gridDim.y;  // value heads per CTA (the planner's choice): a divisor of the group
  const int h_first = blockIdx.y * heads;
  const int group = p.hv / p.hk;
  const ChunkWorkspace ws = chunk_workspace(p);
  const int wm = warp >> 1;  // 16-row block of the 64x64 Gram products
  const int wn = warp & 1;   // 32-column half of them
  const int g8 = lane >> 2;
  const int q2 = (lane & 3) * 2;
  const bool gram_warp = wn * 32 <= wm * 16 + 15;  // its tile meets the lower triangle
  const bool inverts = wn == wm >> 1;              // its tile holds diagonal block wm
  const bool u_warp = warp >= WARPS - U_WARPS;     // solves 32 columns of U~ (else of W)
  const int col0 = warp % U_WARPS * 32;
  T* const v_slices = reinterpret_cast<T*>(smem + P_OFF_V) + warp % U_WARPS * BT * LDV;  // buffer b: + b * V_BUF
  constexpr int V_BUF = U_WARPS * BT * LDV;
  float* const vecs = reinterpret_cast<float*>(smem + P_OFF_VEC);  // head hi's at + (hi & 1) * 3 * BT
  const bool vec_warp = warp == VEC_WARP;

  if (tid == 0) {  // read after the chunk loop's first barrier
    write_qk_shared = h_first % group == 0;
    key_head = h_first / group;
  }
  for (int x = blockIdx.x;; x += gridDim.x) {
    if (warp == 0) {
      const ChunkRef c = find_chunk(p, x, x + gridDim.x, lane);
      if (lane == 0) found = c;
    }
    __syncthreads();
    const ChunkRef ref = found;
    if (ref.row < 0) return;
    const RowSpan span = ref.span;
    const int t0 = ref.index * BT;
    const int L = min(BT, span.len - t0);
    const size_t tok0 = (size_t)span.start + t0;
    const int out_row = p.hv * D;  // W and the output rows: elements per token
    const int hk = key_head;
    const T* qb = static_cast<const T*>(p.q) + (size_t)hk * D;
    const T* kb = static_cast<const T*>(p.k) + (size_t)hk * D;

    // 1. Inputs, every load issued before any is used, so that their latencies overlap: each warp copies the
    //    raw q and k of its rows into the Q and K buffers (cp.async, one group; rows past the request are
    //    zero-filled), the U~ warps then the V slices of the first two heads (one group per head), and
    //    VEC0_WARP and VEC_WARP load the first and second heads' gates. One wait, then each warp normalises its
    //    rows in place. (Before, the rows came through registers in two halves, two load latencies one after
    //    the other, since all rows at once left too few registers.) Every lane reads back only the 8 bytes it
    //    copied itself, so the wait alone orders the copy before the reads.
    const int r0 = warp * kPrepRows;  // this warp's first row
    {
      const T* qrow = qb + (tok0 + r0) * p.q_stride + lane * 4;
      const T* krow = kb + (tok0 + r0) * p.k_stride + lane * 4;
#pragma unroll
      for (int j = 0; j < kPrepRows; ++j) {
        const bool ok = r0 + j < L;
        cp_async8(Qh + (r0 + j) * LDH + lane * 4, ok ? qrow + j * p.q_stride : qb, ok);
        cp_async8(Kh + (r0 + j) * LDH + lane * 4, ok ? krow + j * p.k_stride : kb, ok);
      }
      cp_async_commit();
    }
    if (u_warp) {
#pragma unroll
      for (int b = 0; b < 2; ++b) {
        if (b < heads) {
          const T* v = static_cast<const T*>(p.v) + (size_t)(h_first + b) * D + col0;
          prep_load_v<T>(v_slices + b * V_BUF, v, p.v_stride, tok0, L, lane);
        }
        cp_async_commit();
      }
    }
    PrepScalars next;  // VEC0_WARP's: the inputs of the first head's vectors; VEC_WARP's: of the next head's
    if (warp == VEC0_WARP)
      next = prep_load_scalars<T>(p, h_first, tok0, L, lane);
    else if (vec_warp && heads > 1)
      next = prep_load_scalars<T>(p, h_first + 1, tok0, L, lane);
    if (u_warp)
      cp_async_wait<2>();  // q and k (the V groups may still be in flight)
    else
      cp_async_wait<0>();
    // Four rows at a time with their eight norms' reductions side by side (one branch-free block, so the
    // shuffle chains overlap); the same arithmetic per row as before. Padding rows are zero and stay zero.
#pragma unroll
    for (int j0 = 0; j0 < kPrepRows; j0 += kPrepRows / 2) {
      constexpr int R = kPrepRows / 2;
      float qv[R][4], kv[R][4];
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int t = r0 + j0 + j;
        unpack4<T>(*reinterpret_cast<const uint2*>(Qh + t * LDH + lane * 4), qv[j]);
        unpack4<T>(*reinterpret_cast<const uint2*>(Kh + t * LDH + lane * 4), kv[j]);
      }
      if (p.l2norm) {
        float sq[R], sk[R];
#pragma unroll
        for (int j = 0; j < R; ++j) {
          sq[j] = sk[j] = 0.f;
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            sq[j] = fmaf(qv[j][i], qv[j][i], sq[j]);
            sk[j] = fmaf(kv[j][i], kv[j][i], sk[j]);
          }
        }
#pragma unroll
        for (int j = 0; j < R; ++j) {
          const float iq = rsqrtf(warp_sum(sq[j]) + 1e-12f), ik = rsqrtf(warp_sum(sk[j]) + 1e-12f);
#pragma unroll
          for (int i = 0; i < 4; ++i) { qv[j][i] *= iq; kv[j][i] *= ik; }
        }
      }
#pragma unroll
      for (int j = 0; j < R; ++j) {
        const int t = r0 + j0 + j;
        *reinterpret_cast<uint2*>(Qh + t * LDH + lane * 4) = pack4_half(qv[j]);
        *reinterpret_cast<uint2*>(Kh + t * LDH + lane * 4) = pack4_half(kv[j]);
      }
    }
    __syncthreads();

    // The first head's vectors, by VEC0_WARP during the Gram (they were formed before the barrier above, on the
    // path every warp waited for); the Gram warps wait for them before the first head's -M and P (VEC0_BARRIER,
    // which VEC0_WARP syncs on as well after its Q stores below: an arrive would do, but racecheck does not
    // model bar.arrive as a release: docs/design-notes.md#scan-producer-warpgroup).
    static_assert(VEC0_WARP == 1, "VEC0_WARP is a warp without a Gram tile");
    if (warp == VEC0_WARP) prep_vectors(p, ws, h_first, next, tok0, L, lane, vecs);

    // The group's normalised Q and K to the workspace (one CTA of the group stores them), from shared memory
    // by the two warps that have no Gram tile (1: Q, 3: K), while the others form the Gram: 16-byte stores,
    // two rows per instruction. They read Q before barrier (A), after which T overwrites it.
    if (!gram_warp && write_qk_shared) {
      // The lane's offsets, opaque to the compiler: hoisted out of the chunk loop, they were what ptxas spilled.
      int piece = (lane & 15) * 8, row = lane >> 4, head = hk * D, is_q = warp == 1;
      asm volatile("" : "+r"(piece), "+r"(row), "+r"(head), "+r"(is_q));
      const __half* src = (is_q ? Qh : Kh) + row * LDH + piece;
      __half* dst = (is_q ? ws.q : ws.k) + (tok0 + row) * (p.hk * D) + head + piece;
      const size_t dst_step = 2 * (size_t)p.hk * D;
#pragma unroll 4
      for (int t = row; t < L; t += 2, src += 2 * LDH, dst += dst_step)
        *reinterpret_cast<uint4*>(dst) = *reinterpret_cast<const uint4*>(src);
    }
    if (warp == VEC0_WARP) named_barrier_sync(VEC0_BARRIER, (GRAM_WARPS + 1) * 32);

    // 2. The raw K K^T and Q K^T (lower triangle), shared by the CTA's heads: Q K^T kept in registers, K K^T
    //    in shared memory (each lane its own accumulators, 16-byte pieces in lane order: no bank conflicts).
    //    Both in registers across the head loop left too few for the rest (the images spilled).
    float4* const kk_tile =
        reinterpret_cast<float4*>(smem + P_OFF_KK) + (warp < 4 ? warp / 2 : warp - 2) * 4 * 32 + lane;
    float qk[4][4] = {};
    if (gram_warp) {
      float kk[4][4] = {};
#pragma unroll
      for (int kstep = 0; kstep < D / 16; ++kstep) {
        unsigned ak[4], aq[4];
        ldmatrix_a(ak, Kh + wm * 16 * LDH + kstep * 16, LDH, lane);
        ldmatrix_a(aq, Qh + wm * 16 * LDH + kstep * 16, LDH, lane);
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          unsigned bk[2];
          ldmatrix_b(bk, Kh + (wn * 32 + nt * 8) * LDH + kstep * 16, LDH, lane);
          mma_16816(kk[nt], ak, bk);
          mma_16816(qk[nt], aq, bk);
        }
      }
#pragma unroll
      for (int nt = 0; nt < 4; ++nt) kk_tile[nt * 32] = make_float4(kk[nt][0], kk[nt][1], kk[nt][2], kk[nt][3]);
    }

    // Per value head: two block barriers. (A) -M and the diagonal inverses are complete: T's column blocks
    // form. (B) T is complete: every warp applies it. Each buffer is written before one barrier and read
    // before the next barrier of the same kind, so -M, Dinv and T need one buffer each; the vectors and the V
    // slices, formed or loaded a head ahead, two.
    for (int hi = 0; hi < heads; ++hi) {
      const int h = h_first + hi;
      const float* gam = vecs + (hi & 1) * 3 * BT;
      const float* bet = gam + BT;
      const float* rco = bet + BT;
      __syncwarp();  // this warp is done with the previous head's V slice
      if (u_warp && hi >= 1) {  // the next head's V goes into the slice the previous head used
        if (hi + 1 < heads) {
          const T* v = static_cast<const T*>(p.v) + (size_t)(h + 1) * D + col0;
          prep_load_v<T>(v_slices + ((hi + 1) & 1) * V_BUF, v, p.v_stride, tok0, L, lane);
        }
        cp_async_commit();
      }

      // 3. -M and its diagonal blocks (fp32) from the raw K K^T, P from Q K^T to the workspace through the
      //    warp's stage (free since the __syncwarp above). The gamma and beta values are read into registers
      //    first (the Md / Mh stores would otherwise make the compiler reload them for every element), and the
      //    decay exponent above the diagonal is masked to -inf instead of branching around __expf, which then
      //    gives +0 there: the same values as before, without a branch per element.
      unsigned* const stage = reinterpret_cast<unsigned*>(smem + P_OFF_STG) + warp * 16 * 16;
      float pt[4][4];  // P's tile, accumulator layout
      if (gram_warp) {
        if (hi == 0) named_barrier_sync(VEC0_BARRIER, (GRAM_WARPS + 1) * 32);  // the first head's vectors
        float g_row[2], b_row[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          g_row[r] = gam[wm * 16 + g8 + 8 * r];
          b_row[r] = bet[wm * 16 + g8 + 8 * r];
        }
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
          const float2 g_col = *reinterpret_cast<const float2*>(gam + wn * 32 + nt * 8 + q2);
          const float4 k4 = kk_tile[nt * 32];
          const float kk[4] = {k4.x, k4.y, k4.z, k4.w};
#pragma unroll
          for (int half_row = 0; half_row < 2; ++half_row) {
            const int t = wm * 16 + g8 + half_row * 8;
            float mv[2];
#pragma unroll
            for (int j = 0; j < 2; ++j) {
              const int e = half_row * 2 + j;
              const int col = wn * 32 + nt * 8 + q2 + j;
              const float d = col <= t ? g_row[half_row] - (j ? g_col.y : g_col.x) : __int_as_float(0xff800000);
              const float ratio = __expf(d);  // <= 1 (0 above the diagonal); ex2.approx: 2 instructions
              mv[j] = (p.has_delta && col < t) ? b_row[half_row] * kk[e] * ratio : 0.f;
              if ((col >> 4) == (t >> 4)) Md[t * LDM + (col & 15)] = mv[j];
              pt[nt][e] = qk[nt][e] * ratio;
            }
            store_half2(Mh + t * LDT + wn * 32 + nt * 8 + q2, -mv[0], -mv[1]);
          }
        }
      } else {  // the tile lies above the diagonal: -M and P are zero there
#pragma unroll
        for (int nt = 0; nt < 4; ++nt) {
#pragma unroll
          for (int e = 0; e < 4; ++e) pt[nt][e] = 0.f;
#pragma unroll
          for (int half_row = 0; half_row < 2; ++half_row)
            *reinterpret_cast<unsigned*>(Mh + (wm * 16 + g8 + half_row * 8) * LDT + wn * 32 + nt * 8 + q2) = 0u;
        }
      }
      prep_store_tile(pt, stage, ws.p + ((tok0 + wm * 16) * p.hv + h) * BT + wn * 32, p.hv * BT, L - wm * 16, lane);

      // 4. Exact inverses of the unit lower-triangular diagonal blocks of (I + M), lane j < 16 solving column
      //    j by forward substitution, each by the warp that just wrote its block: fp16 into Dh, and fp32 over
      //    the block's own rows of Md, transposed (lane j's column as row j), for T's diagonal block.
      if (inverts) {
        __syncwarp();
        const int i0 = wm * 16;
        const int j = lane & 15;
        float xv[16];
#pragma unroll
        for (int r = 0; r < 16; ++r) {
          float m[16];  // row r of the block, 4 floats per (broadcast) load
#pragma unroll
          for (int c = 0; c < (r + 3) / 4; ++c) {
            const float4 v = *reinterpret_cast<const float4*>(Md + (i0 + r) * LDM + 4 * c);
            m[4 * c] = v.x;
            m[4 * c + 1] = v.y;
            m[4 * c + 2] = v.z;
            m[4 * c + 3] = v.w;
          }
          float acc = r == j ? 1.f : 0.f;
#pragma unroll
          for (int kq = 0; kq < r; ++kq) acc = fmaf(-m[kq], xv[kq], acc);
          xv[r] = acc;
        }
        __syncwarp();  // every lane has read the block of M
        if (lane < 16) {
#pragma unroll
          for (int r = 0; r < 16; ++r) Dh[(i0 + r) * LDD + j] = __float2half_rn(xv[r]);
#pragma unroll
          for (int c = 0; c < 4; ++c)
            *reinterpret_cast<float4*>(Md + (i0 + j) * LDM + 4 * c) =
                make_float4(xv[4 * c], xv[4 * c + 1], xv[4 * c + 2], xv[4 * c + 3]);
        }
      }
      if (u_warp) cp_async_wait<1>();  // this head's V slice (the next head's may still be in flight)
      __syncthreads();  // (A)

      // 5. T diag(coef) into the transposed stores: the diagonal blocks from the inverting warps' fp32
      //    columns (lane j: row s = 16 wm + j, 16 tokens as two 16-byte pieces), the blocks below them by
      //    warps 1, 3 and 4 (column blocks 0, 1, 2; the first has the longest chain). Meanwhile VEC_WARP forms
      //    the next head's vectors.
      if (inverts) {
        if (lane < 16) {
          const int s = wm * 16 + lane;  // the column of T this lane's Md row holds
          const float cw = rco[s], cu = bet[s];
#pragma unroll
          for (int half = 0; half < 2; ++half) {
            const float4 x0 = *reinterpret_cast<const float4*>(Md + s * LDM + half * 8);
            const float4 x1 = *reinterpret_cast<const float4*>(Md + s * LDM + half * 8 + 4);
            const uint4 pw = make_uint4(pack2<__half>(x0.x * cw, x0.y * cw), pack2<__half>(x0.z * cw, x0.w * cw),
                                        pack2<__half>(x1.x * cw, x1.y * cw), pack2<__half>(x1.z * cw, x1.w * cw));
            const uint4 pu = make_uint4(pack2<__half>(x0.x * cu, x0.y * cu), pack2<__half>(x0.z * cu, x0.w * cu),
                                        pack2<__half>(x1.x * cu, x1.y * cu), pack2<__half>(x1.z * cu, x1.w * cu));
            const int o = t_offset(s, wm * 16 + half * 8);
            *reinterpret_cast<uint4*>(Tw + o) = pw;
            *reinterpret_cast<uint4*>(Tu + o) = pu;
          }
        }
      } else if (warp == 1) {
        prep_t_column<0>(Mh, Dh, rco, bet, Tw, Tu, lane);
      } else if (warp == 3) {
        prep_t_column<1>(Mh, Dh, rco, bet, Tw, Tu, lane);
      } else if (warp == 4) {
        prep_t_column<2>(Mh, Dh, rco, bet, Tw, Tu, lane);
      } else if (vec_warp && hi + 1 < heads) {  // the next head's vectors, into the other buffer
        prep_vectors(p, ws, h + 1, next, tok0, L, lane, vecs + ((hi + 1) & 1) * 3 * BT);
        if (hi + 2 < heads) next = prep_load_scalars<T>(p, h + 2, tok0, L, lane);
      }
      __syncthreads();  // (B)

      // 6. [W | U~] = T diag(coef) [K | V]: 32 columns per warp, no chains.
      const size_t first = tok0 * out_row + col0;
      const size_t head = (size_t)h * D;
      if (u_warp)
        prep_apply<T>(reinterpret_cast<T*>(smem + P_OFF_V) + ((hi & 1) * U_WARPS + warp % U_WARPS) * BT * LDV, LDV, Tu,
                      static_cast<__half*>(p.out) + first + head, out_row, L, stage, lane);
      else
        prep_apply<__half>(Kh + col0, LDH, Tw, ws.w + first + head, out_row, L, stage, lane);
    }
    if (!found.more) return;  // read before the barrier below, after which warp 0 overwrites it
    __syncthreads();  // the next chunk's inputs overwrite this one's
  }
}

// ---------------------------------------------------------------------------------------------------------
// Scan: the state recurrence over a request's chunks for VT value columns of one head. Each warp owns 16
// value rows of the state with all D key columns, S^T in fp32 accumulator registers, and every product is
// written transposed so that the state-dependent factor is the A operand (m = 16 value rows):
//   X = S0^T W^T,  Y = S0^T Q^T                                     (n = BT tokens, k = D keys)
//   U^T = U~^T - X,  O^T = scale (Y diag(e^g) + U^T P^T),  S^T = e^{g_L} S0^T + U^T diag(e^{g_L-g}) K
// Two adjacent n-8 accumulator tiles, packed to fp16 pairs, are one k-16 A fragment, so neither S nor U goes
// through shared memory and the warps exchange nothing: the one barrier per chunk only recycles the
// double-buffered stage of read-only operands (W, K, Q, P, U~, gamma), filled a chunk ahead by cp.async.
// Two bodies of the chunk loop: each warp on mma.sync with its B fragments through ldmatrix, or (sm_90a) each
// warpgroup of 4 warps on wgmma, which reads every B operand once per warpgroup straight from the stage and
// runs while the warps do the rest.
struct ScanStage {
  __half* w;
  __half* k;
  __half* q;
  __half* p;
  __half* u;
  float* g;
};

template <int VT>
__device__ __forceinline__ ScanStage scan_stage(unsigned char* stages, int s) {
  using Layout = chunk::ScanLayout<VT>;
  unsigned char* base = stages + s * Layout::STAGE_BYTES;
  return {reinterpret_cast<__half*>(base + Layout::STAGE_W), reinterpret_cast<__half*>(base + Layout::STAGE_K),
          reinterpret_cast<__half*>(base + Layout::STAGE_Q), reinterpret_cast<__half*>(base + Layout::STAGE_P),
          reinterpret_cast<__half*>(base + Layout::STAGE_U), reinterpret_cast<float*>(base + Layout::STAGE_G)};
}

// The first stage, at the layout's alignment (the dynamic shared memory is only known to be 16-byte aligned;
// the layout's SMEM_BYTES covers the difference).
template <int VT>
__device__ __forceinline__ unsigned char* scan_stages(unsigned char* smem) {
  constexpr unsigned align = chunk::ScanLayout<VT>::ALIGN;
  return smem + ((align - smem_addr(smem) % align) % align);
}

// This thread's share of loading a stage (tid counts the copying threads): fixed 16-byte slots, so each chunk
// costs one address per slot. W, K, Q: rows row + ROW_STEP j, piece col / 8; P: rows prow + P_ROW_STEP j,
// piece pcol / 8; U~: rows urow + U_ROW_STEP j at ucol; gamma: row tid (tid < BT). The row steps are multiples
// of 8, so a slot's shared-memory offset is its first row's plus j times a constant (also under the swizzle,
// which depends on t % 8 only).
template <int VT>
struct ScanCopy {
  using Layout = chunk::ScanLayout<VT>;
  static constexpr int THREADS = Layout::COPY_THREADS;
  static constexpr int ROW_STEP = THREADS / (chunk::D / 8);
  static constexpr int P_ROW_STEP = THREADS / (chunk::BT / 8);
  static constexpr int U_ROW_STEP = THREADS / (VT / 8);
  static_assert(ROW_STEP % 8 == 0 && P_ROW_STEP % 8 == 0, "copy rows 8 apart keep their place in the layout");
  static constexpr unsigned WQK_SLOT_BYTES = ROW_STEP / 8 * Layout::WQK_ROW8_BYTES;
  static constexpr unsigned P_SLOT_BYTES = P_ROW_STEP / 8 * Layout::P_ROW8_BYTES;
  const __half* w;  // token 0's row of each operand, at this thread's column (this head)
  const __half* k;
  const __half* q;
  const __half* p;
  const __half* u;  // U~ staged in the output rows: this CTA's VT columns
  const float* g;
  unsigned w_stride, k_stride, p_stride, u_stride, g_stride;  // elements per token (Q shares K's: both [Hk][D])
  unsigned wqk_dst, p_dst;  // stage byte offsets of slot 0 of W/Q/K (from STAGE_W, _Q, _K) and of P
  int row, prow, pblock, urow, ucol, tid;  // pblock: the 16-token block of this thread's P columns
};

template <int VT>
__device__ __forceinline__ ScanCopy<VT> scan_copy(const GdnParams& p, const ChunkWorkspace& ws, int h, int hk, int c0,
                                                  int tid) {
  using namespace chunk;
  using Layout = ScanLayout<VT>;
  ScanCopy<VT> c;
  c.row = tid / (D / 8);
  const int col = tid % (D / 8) * 8;
  c.prow = tid / (BT / 8);
  const int pcol = tid % (BT / 8) * 8;
  c.pblock = pcol / 16;
  c.urow = tid / (VT / 8);
  c.ucol = tid % (VT / 8) * 8;
  c.tid = tid;
  c.w = ws.w + (size_t)h * D + col;
  c.k = ws.k + (size_t)hk * D + col;
  c.q = ws.q + (size_t)hk * D + col;
  c.p = ws.p + (size_t)h * BT + pcol;
  c.u = static_cast<const __half*>(p.out) + (size_t)h * D + c0 + c.ucol;
  c.g = ws.g + h;
  c.w_stride = (unsigned)p.hv * D;
  c.k_stride = (unsigned)p.hk * D;
  c.p_stride = (unsigned)p.hv * BT;
  c.u_stride = (unsigned)p.hv * D;
  c.g_stride = (unsigned)p.hv;
  c.wqk_dst = Layout::wqk_offset(c.row, col / 8);
  c.p_dst = Layout::p_offset(c.prow, pcol / 8);
  return c;
}

// The chunk at token tok0 with L rows (the rest zero-filled, without reading).
template <int VT>
__device__ __forceinline__ void scan_load_stage(const ScanCopy<VT>& c, unsigned char* stage, unsigned tok0, int L) {
  using namespace chunk;
  using Copy = ScanCopy<VT>;
  using Layout = ScanLayout<VT>;
  constexpr int LDU = Layout::LDU;
  static_assert(Copy::THREADS % (D / 8) == 0 && BT % Copy::ROW_STEP == 0, "fixed W/K/Q copy slots");
  static_assert(Copy::THREADS % (BT / 8) == 0 && BT % Copy::P_ROW_STEP == 0, "fixed P copy slots");
  static_assert(Copy::THREADS % (VT / 8) == 0 && BT % Copy::U_ROW_STEP == 0, "fixed U~ copy slots");
  static_assert(Copy::THREADS >= BT, "one thread per gamma row");
  unsigned char* wqk = stage + c.wqk_dst;
#pragma unroll
  for (int j = 0; j < BT / Copy::ROW_STEP; ++j) {
    const int t = c.row + Copy::ROW_STEP * j;
    const bool ok = t < L;
    const unsigned tok = tok0 + (ok ? t : 0);
    unsigned char* dst = wqk + j * Copy::WQK_SLOT_BYTES;
    cp_async16(dst + Layout::STAGE_W, c.w + (size_t)tok * c.w_stride, ok);
    cp_async16(dst + Layout::STAGE_K, c.k + (size_t)tok * c.k_stride, ok);
    cp_async16(dst + Layout::STAGE_Q, c.q + (size_t)tok * c.k_stride, ok);
  }
  // P is lower triangular. Its 16 x 16 blocks above the diagonal are zero-filled instead of read: the mma.sync
  // body never reads them, the wgmma body multiplies them. (The diagonal blocks come from the prep, zeros
  // above the diagonal included.)
#pragma unroll
  for (int j = 0; j < BT / Copy::P_ROW_STEP; ++j) {
    const int t = c.prow + Copy::P_ROW_STEP * j;
    const bool ok = t < L && c.pblock <= t / 16;
    cp_async16(stage + Layout::STAGE_P + c.p_dst + j * Copy::P_SLOT_BYTES,
               c.p + (size_t)(tok0 + (ok ? t : 0)) * c.p_stride, ok);
  }
  __half* u = reinterpret_cast<__half*>(stage + Layout::STAGE_U);
#pragma unroll
  for (int j = 0; j < BT / Copy::U_ROW_STEP; ++j) {
    const int t = c.urow + Copy::U_ROW_STEP * j;
    const bool ok = t < L;
    cp_async16(u + t * LDU + c.ucol, c.u + (size_t)(tok0 + (ok ? t : 0)) * c.u_stride, ok);
  }
  if (c.tid < BT) {
    const bool ok = c.tid < L;
    cp_async4(reinterpret_cast<float*>(stage + Layout::STAGE_G) + c.tid,
              c.g + (size_t)(tok0 + (ok ? c.tid : 0)) * c.g_stride, ok);
  }
}

namespace scan {

using chunk::BT;
using chunk::D;
constexpr int NT = BT / 8;  // token tiles of the chunk products
constexpr int KT = D / 8;   // key tiles of the state

// The state's A fragment of keys 16 kk ... 16 kk + 15: two adjacent key tiles packed to fp16 pairs.
__device__ __forceinline__ void state_fragment(const float (&s)[KT][4], int kk, unsigned (&a)[4]) {
  a[0] = pack2<__half>(s[2 * kk][0], s[2 * kk][1]);
  a[1] = pack2<__half>(s[2 * kk][2], s[2 * kk][3]);
  a[2] = pack2<__half>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
  a[3] = pack2<__half>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
}

// The decays of a chunk: e^g (eg) and e^{g_L-g} (tail) of tokens 2 lane + {0, 1} (4 expf per lane), and
// e^{g_L}. A thread needs those of tokens nt*8 + q2 + {0, 1} for each token tile nt: lane nt*4 + lane%4's,
// fetched by shuffles where they are used.
struct ChunkDecays {
  float eg[2];
  float tail[2];
  float e_last;
  __device__ __forceinline__ float2 eg_tile(int nt, int lane) const;
  __device__ __forceinline__ float2 tail_tile(int nt, int lane) const;
  __device__ __forceinline__ float last() const { return e_last; }
};

__device__ __forceinline__ ChunkDecays chunk_decays(const float* g, int L, int lane) {
  static_assert(BT == 64, "one token pair per lane");
  const float g_last = g[L - 1];
  const float2 g_pair = *reinterpret_cast<const float2*>(g + 2 * lane);
  return {{expf(g_pair.x), expf(g_pair.y)}, {expf(g_last - g_pair.x), expf(g_last - g_pair.y)}, expf(g_last)};
}

// Token tile nt's pair of `pair` (eg or tail), as this thread needs it.
__device__ __forceinline__ float2 tile_decays(const float (&pair)[2], int nt, int lane) {
  const int src = nt * 4 + (lane & 3);
  return make_float2(__shfl_sync(0xffffffffu, pair[0], src), __shfl_sync(0xffffffffu, pair[1], src));
}
__device__ __forceinline__ float2 ChunkDecays::eg_tile(int nt, int lane) const { return tile_decays(eg, nt, lane); }
__device__ __forceinline__ float2 ChunkDecays::tail_tile(int nt, int lane) const {
  return tile_decays(tail, nt, lane);
}

// U~^T of this warp's 16 value rows (v0 = the warp's first) in the accumulator layout, as fp16 pairs.
__device__ __forceinline__ void load_u_tilde(unsigned (&ut)[NT / 2][2][2], const __half* u, int ldu, int v0,
                                             int lane) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) ldmatrix_c_pair_trans(ut[np], u + np * 16 * ldu + v0, ldu, lane);
}

// U^T = U~^T - X as two sets of A fragments (k = tokens): au for O, ad = U^T diag(e^{g_L-g}) for the state.
// Rows past L: W, U~ and gamma are zero there, so U is zero.
// Decays: ChunkDecays, or (with producer warps) StagedDecays; both give a token tile's pairs.
template <typename Decays>
__device__ __forceinline__ void u_fragments(const unsigned (&ut)[NT / 2][2][2], const float (&x)[NT][4],
                                            const Decays& dc, int lane, unsigned (&au)[NT / 2][4],
                                            unsigned (&ad)[NT / 2][4]) {
#pragma unroll
  for (int np = 0; np < NT / 2; ++np) {
#pragma unroll
    for (int i = 0; i < 2; ++i) {
      const int nt = 2 * np + i;
      const float2 tail = dc.tail_tile(nt, lane);
#pragma unroll
      for (int half_row = 0; half_row < 2; ++half_row) {
        const float2 u_in = __half22float2(*reinterpret_cast<const __half2*>(&ut[np][i][half_row]));
        const float u0 = u_in.x - x[nt][2 * half_row], u1 = u_in.y - x[nt][2 * half_row + 1];
        au[np][2 * i + half_row] = pack2<__half>(u0, u1);
        ad[np][2 * i + half_row] = pack2<__half>(u0 * tail.x, u1 * tail.y);
      }
    }
  }
}

// Y diag(e^g): column (token) scaling of the accumulator tiles, into ob (which may be y itself). The wgmma
// loops keep O in registers of its own, so the next chunk's X and Y can run while this chunk's output waits
// there (to be multiplied or packed). Decays: ChunkDecays or StagedDecays.
template <typename Decays>
__device__ __forceinline__ void scaled_tokens(const float (&y)[NT][4], const Decays& dc, int lane, float (&ob)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const float2 eg = dc.eg_tile(nt, lane);
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
      ob[nt][2 * half_row] = y[nt][2 * half_row] * eg.x;
      ob[nt][2 * half_row + 1] = y[nt][2 * half_row + 1] * eg.y;
    }
  }
}

__device__ __forceinline__ void scale_state(float (&s)[KT][4], float e_last) {
#pragma unroll
  for (int kt = 0; kt < KT; ++kt)
#pragma unroll
    for (int e = 0; e < 4; ++e) s[kt][e] *= e_last;
}

// What a warp's chunk loop needs besides the state.
template <typename T, int VT>
struct Walk {
  const ScanCopy<VT>& copy;
  unsigned char* stages;
  RowSpan span;
  int chunks;
  T* out;             // token 0 of the call at the CTA's first output column (this head)
  size_t out_stride;  // elements per token
  float scale;
  int lane, v0;
  unsigned out_stage;  // wgmma: shared address of this lane's stmatrix row in the output staging (stage_output)
};

// Waits until the stage of chunk ci has landed for every thread, which also means that every warp is done
// with the other stage. Returns chunk ci's stage.
template <int VT>
__device__ __forceinline__ ScanStage stage_landed(unsigned char* stages, int ci) {
  cp_async_wait<0>();
#if OHK_SCAN_WGMMA
  fence_proxy_async_shared();  // this thread's cp.async writes -> the wgmma that read them (after the barrier)
#endif
  __syncthreads();
  return scan_stage<VT>(stages, ci & 1);
}

// Starts filling the other stage with chunk ci + 1 (if any).
template <typename T, int VT>
__device__ __forceinline__ void load_next_stage(const Walk<T, VT>& w, int ci) {
  const int t1 = (ci + 1) * BT;
  if (ci + 1 < w.chunks)
    scan_load_stage(w.copy, w.stages + ((ci + 1) & 1) * chunk::ScanLayout<VT>::STAGE_BYTES, w.span.start + t1,
                    min(BT, w.span.len - t1));
  cp_async_commit();
}

#if !OHK_SCAN_WGMMA

// (The mma.sync body's output: the wgmma bodies stage theirs in shared memory, emit_output.)
// scale * O^T in the output type, each 8x8 block (values x tokens) transposed in registers: o[nt][0] holds
// token nt*8 + g8, values q2 + {0, 1} of the warp's first 8 rows, o[nt][1] the same of the next 8, so a
// thread stores two adjacent values of one token (4 bytes per store instead of 2).
template <typename T>
__device__ __forceinline__ void pack_output(const float (&y)[NT][4], float scale, unsigned (&o)[NT][2]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    o[nt][0] = movmatrix_trans(pack2<T>(scale * y[nt][0], scale * y[nt][1]));
    o[nt][1] = movmatrix_trans(pack2<T>(scale * y[nt][2], scale * y[nt][3]));
  }
}

// rows: the chunk's first token at this thread's value columns; the chunk has L tokens. The row pointer steps
// by 8 tokens (one 64-bit add per token tile, and predicated stores: with the address formed inside each
// guarded block, the loop paid a product and a branch per tile).
template <typename T>
__device__ __forceinline__ void store_output(const unsigned (&o)[NT][2], T* rows, size_t stride, int L, int g8) {
  T* row = rows + (size_t)g8 * stride;
  const size_t step = 8 * stride;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (nt * 8 + g8 < L) {
      *reinterpret_cast<unsigned*>(row) = o[nt][0];
      *reinterpret_cast<unsigned*>(row + 8) = o[nt][1];
    }
    row += step;
  }
}

template <typename T, int VT>
__device__ __forceinline__ void scan_chunks(float (&s)[KT][4], const Walk<T, VT>& w) {
  constexpr int LDU = chunk::ScanLayout<VT>::LDU;
  using chunk::LDH;
  using chunk::LDT;
  const int lane = w.lane;
  for (int ci = 0; ci < w.chunks; ++ci) {
    const int t0 = ci * BT;
    const int L = min(BT, w.span.len - t0);
    const ScanStage st = stage_landed<VT>(w.stages, ci);
    load_next_stage(w, ci);

    // 1. X = S0^T W^T and Y = S0^T Q^T: one A fragment of the state per 16 keys serves both.
    float x[NT][4], y[NT][4];
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) x[nt][e] = y[nt][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      unsigned a[4];
      state_fragment(s, kk, a);
#pragma unroll
      for (int np = 0; np < NT / 2; ++np) {
        unsigned bw[2][2], bq[2][2];
        ldmatrix_b_pair(bw, st.w + np * 16 * LDH + kk * 16, LDH, lane);
        ldmatrix_b_pair(bq, st.q + np * 16 * LDH + kk * 16, LDH, lane);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          mma_16816(x[2 * np + i], a, bw[i]);
          mma_16816(y[2 * np + i], a, bq[i]);
        }
      }
    }

    const ChunkDecays dc = chunk_decays(st.g, L, lane);
    unsigned ut[NT / 2][2][2], au[NT / 2][4], ad[NT / 2][4];
    load_u_tilde(ut, st.u, LDU, w.v0, lane);
    u_fragments(ut, x, dc, lane, au, ad);
    scaled_tokens(y, dc, lane, y);

    // 2. O^T = Y + U^T P^T. P is lower triangular: token tiles 2np, 2np + 1 need only k blocks j <= np.
#pragma unroll
    for (int np = 0; np < NT / 2; ++np) {
#pragma unroll
      for (int j = 0; j <= np; ++j) {
        unsigned bp[2][2];
        ldmatrix_b_pair(bp, st.p + np * 16 * LDT + j * 16, LDT, lane);
        mma_16816(y[2 * np], au[j], bp[0]);
        mma_16816(y[2 * np + 1], au[j], bp[1]);
      }
    }
    unsigned o[NT][2];
    pack_output<T>(y, w.scale, o);
    store_output(o, w.out + (size_t)(w.span.start + t0) * w.out_stride + w.v0 + (lane & 3) * 2, w.out_stride, L,
                 lane >> 2);

    // 3. S^T = e^{g_L} S0^T + (U^T diag(e^{g_L-g})) K, on this warp's registers.
    scale_state(s, dc.e_last);
#pragma unroll
    for (int kp = 0; kp < KT / 2; ++kp) {
#pragma unroll
      for (int j = 0; j < NT / 2; ++j) {
        unsigned bk[2][2];
        ldmatrix_b_pair_trans(bk, st.k + j * 16 * LDH + kp * 16, LDH, lane);
        mma_16816(s[2 * kp], ad[j], bk[0]);
        mma_16816(s[2 * kp + 1], ad[j], bk[1]);
      }
    }
  }
}

#else  // OHK_SCAN_WGMMA

// Descriptors of the stage's B operands (layouts: ScanLayout, wgmma.cuh). SBO is always 1024 bytes: 8 rows
// of 128 bytes. K-major ones have no LBO (16 bytes by convention); K read MN-major steps from keys 0-63 to
// keys 64-127 by LBO = KEY_STRIDE.
__device__ __forceinline__ unsigned long long k_major_desc(const void* operand) {
  return wgmma_desc_sw128(smem_addr(operand), 16, kWgmmaAtomBytes);
}

// Start of the k-16 step kk (keys 16 kk ...) of W, Q or [W | Q]: key half kk / 4, 32 bytes per step inside its
// rows.
template <int VT>
__device__ constexpr unsigned key_step_offset(int kk) {
  return (kk / 4) * chunk::ScanLayout<VT>::KEY_STRIDE + (kk % 4) * 32;
}

// The producer warpgroup's hand-off (ScanLayout::PRODUCER_WARPS > 0), on named barriers that count all the
// CTA's threads: the producers arrive on "full" once stage s holds its chunk (their copies landed and fenced
// for the async proxy), and the compute warps on "free" once their wgmma and loads of it are done.
constexpr int kMaxStages = 3;
constexpr int kStageFullBarrier = 1;  // + stage; barrier 0 is __syncthreads'
constexpr int kStageFreeBarrier = kStageFullBarrier + kMaxStages;

constexpr int kProducerBarrier = kStageFreeBarrier + kMaxStages;  // the producer warps alone

// The decays of a chunk as the producer warps leave them in the stage (STAGE_E): a token tile's pairs are
// adjacent floats, one 8-byte load each, instead of chunk_decays' expf and shuffles in the compute warps.
// The same expf of the same gamma, so the same values.
struct StagedDecays {
  const float* e;  // e^g [BT], then e^{g_L-g} [BT], then e^{g_L}
  int q2;          // this thread's first token within a tile
  __device__ __forceinline__ float2 eg_tile(int nt, int) const {
    return *reinterpret_cast<const float2*>(e + nt * 8 + q2);
  }
  __device__ __forceinline__ float2 tail_tile(int nt, int) const {
    return *reinterpret_cast<const float2*>(e + BT + nt * 8 + q2);
  }
  __device__ __forceinline__ float last() const { return e[2 * BT]; }
};

// Producer thread tid's share of StagedDecays (tid < BT: token tid; thread 0 also e^{g_L}), once every
// producer's gamma copy has landed. Gamma is zero past L, as chunk_decays reads it.
__device__ __forceinline__ void stage_decays(const float* g, float* e, int L, int tid) {
  if (tid < BT) {
    const float g_last = g[L - 1], gt = g[tid];
    e[tid] = expf(gt);
    e[BT + tid] = expf(g_last - gt);
    if (tid == 0) e[2 * BT] = expf(g_last);
  }
}

// Shared address of this lane's row in stage_output's stmatrix for token group 0 (the warp's buffer): lane
// l gives stored row l % 8 of tile l / 8, tile (2 m + i / 2, value half i % 2) of the warp's O^T, i.e. token
// 16 m + 8 (i / 2) + l % 8 at value columns v0 + 8 (i % 2) ... + 7 (ScanLayout::STAGE_OUT, swizzled there).
template <int VT>
__device__ __forceinline__ unsigned output_stage_address(unsigned char* stages, int warp, int lane) {
  using Layout = chunk::ScanLayout<VT>;
  const int i = lane >> 3, token = (i >> 1) * 8 + (lane & 7);
  const unsigned base = smem_addr(stages + Layout::STAGE_OUT);
  return base + warp * Layout::OUT_BUFFER_BYTES + token * Layout::OUT_ROW_BYTES + (((i & 1) ^ ((token >> 2) & 1)) << 4);
}

// scale * O^T (ob, the accumulator layout) in the output type into the warp's staging buffer from `row` (this
// lane's output_stage_address): the same packs as the 4-byte stores of before (pack2 of the same products), so
// the same bits. Tiles 2m, 2m + 1 by one stmatrix.x4.trans; token groups 16 rows apart.
template <typename T, int VT>
__device__ __forceinline__ void stage_output(const float (&ob)[NT][4], float scale, unsigned row) {
  constexpr int ROW_BYTES = chunk::ScanLayout<VT>::OUT_ROW_BYTES;
#pragma unroll
  for (int m = 0; m < NT / 2; ++m) {
    const unsigned r[4] = {pack2<T>(scale * ob[2 * m][0], scale * ob[2 * m][1]),
                           pack2<T>(scale * ob[2 * m][2], scale * ob[2 * m][3]),
                           pack2<T>(scale * ob[2 * m + 1][0], scale * ob[2 * m + 1][1]),
                           pack2<T>(scale * ob[2 * m + 1][2], scale * ob[2 * m + 1][3])};
    stmatrix_x4_trans(r, row + m * 16 * ROW_BYTES);
  }
}

// The producer warps' loop: chunk ci into stage ci % STAGES, once the compute warps have freed it (chunk
// ci - STAGES done). Two chunks' copies are in flight: chunk ci + 1 is issued before chunk ci is waited for
// and published. (With one, waiting for each chunk's copies before issuing the next, the chain of issue,
// memory latency and hand-off was longer than the compute warps' chunk: 2.0 us per chunk at 1x8192 on the
// H200, against 1.85 us for the scan without producers.)
template <int VT>
__device__ __forceinline__ void produce_stages(const ScanCopy<VT>& c, unsigned char* stages, RowSpan span,
                                               int chunks) {
  using Layout = chunk::ScanLayout<VT>;
  static_assert(Layout::PRODUCER_WARPS > 0 && Layout::STAGES <= kMaxStages, "a producer warpgroup");
  static_assert(Layout::STAGES >= 3, "chunk ci + 1 is loaded while ci - 1 may still be read");
  const auto load = [&](int ci) {
    const int t0 = ci * BT;
    scan_load_stage(c, stages + ci % Layout::STAGES * Layout::STAGE_BYTES, span.start + t0,
                    min(BT, span.len - t0));
  };
  load(0);  // chunks >= 1: the kernel serves rows of at least OHK_SEQUENTIAL_MIN_TOKENS tokens
  cp_async_commit();
  for (int ci = 0; ci < chunks; ++ci) {
    if (ci + 1 < chunks) {
      const int next = (ci + 1) % Layout::STAGES;
      if (ci + 1 >= Layout::STAGES) named_barrier_sync(kStageFreeBarrier + next, Layout::THREADS);
      load(ci + 1);
    }
    cp_async_commit();   // one group per chunk, empty past the last
    cp_async_wait<1>();  // this thread's copies of chunk ci landed
    named_barrier_sync(kProducerBarrier, Layout::COPY_THREADS);  // everyone's: all of gamma
    const int st = ci % Layout::STAGES;
    unsigned char* stage = stages + st * Layout::STAGE_BYTES;
    stage_decays(reinterpret_cast<const float*>(stage + Layout::STAGE_G),
                 reinterpret_cast<float*>(stage + Layout::STAGE_E), min(BT, span.len - ci * BT), c.tid);
    fence_proxy_async_shared();  // these cp.async writes -> the wgmma that read them
    named_barrier_arrive(kStageFullBarrier + st, Layout::THREADS);
  }
}

// Packs a chunk's O^T (in the accumulator layout) into the warp's staging buffer, then stores its rows: the
// chunk's rows start at `rows` (the CTA's first column), len tokens. Two lanes per 32-byte row (one sector),
// lane l's 16-byte piece of rows l / 2 + 16 j: all loads first, then the stores of rows < len (rows past len
// are the next request's, which hold its U~ until its own scan has read them).
template <typename T, int VT>
__device__ __forceinline__ void emit_output(const float (&ob)[NT][4], const Walk<T, VT>& w, T* rows, int len) {
  using Layout = chunk::ScanLayout<VT>;
  constexpr int PASS = 32 * 16 / Layout::OUT_ROW_BYTES;  // rows per pass of the warp's 16-byte pieces
  __syncwarp();  // every lane's loads of the previous chunk's rows are done
  stage_output<T, VT>(ob, w.scale, w.out_stage);
  __syncwarp();
  const int piece = w.lane & 1, r0 = w.lane >> 1;
  const unsigned char* buf = w.stages + Layout::STAGE_OUT + (w.v0 / 16) * Layout::OUT_BUFFER_BYTES;
  // The piece's place in its row is the same in every pass (the swizzle repeats every 8 rows).
  const unsigned char* src = buf + r0 * Layout::OUT_ROW_BYTES + ((piece ^ ((r0 >> 2) & 1)) << 4);
  T* dst = rows + (size_t)r0 * w.out_stride + w.v0 + piece * 8;
  const size_t stride = w.out_stride;
  uint4 v[BT / PASS];
#pragma unroll
  for (int j = 0; j < BT / PASS; ++j) v[j] = ld_shared_v4(smem_addr(src) + j * PASS * Layout::OUT_ROW_BYTES);
  // The row pointer steps by PASS rows (with the offset formed per row, ptxas multiplied 64-bit per store).
  const size_t step = (size_t)PASS * stride;
#pragma unroll
  for (int j = 0; j < BT / PASS; ++j) {
    st_global_v4(dst, v[j], r0 + j * PASS < len);
    dst += step;
  }
}

// The first k step of X and Y overwrites their accumulators (scale-d 0); they are defined only because the
// instruction names them as inputs too. ob (O's) is written by scaled_tokens before O.
__device__ __forceinline__ void zero_accumulators(float (&x)[NT][4], float (&y)[NT][4], float (&ob)[NT][4]) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 4; ++e) x[nt][e] = y[nt][e] = ob[nt][e] = 0.f;
}

// The state's A fragments for X and Y, then the fence before their wgmma (x and y: their accumulators).
__device__ __forceinline__ void state_operands(float (&s)[KT][4], unsigned (&sa)[KT / 2][4], float (&x)[NT][4],
                                               float (&y)[NT][4]) {
  register_fence(s);
#pragma unroll
  for (int kk = 0; kk < KT / 2; ++kk) state_fragment(s, kk, sa[kk]);
  register_fence(sa);
  register_fence(x);
  register_fence(y);
  wgmma_fence();
}

// [X | Y] = S0^T [W | Q]^T: one n128 product (B = W's 64 token rows, then Q's; K-major), x holding its tiles
// 0-7 and y tiles 8-15; one commit group. (As two n64 products X then Y, the state update waited for Y behind
// X.)
template <int VT>
__device__ __forceinline__ void xy_product(float (&s)[KT][4], const ScanStage& st, float (&x)[NT][4],
                                           float (&y)[NT][4]) {
  static_assert(chunk::ScanLayout<VT>::XY_FUSED, "W's and Q's rows adjacent");
  unsigned sa[KT / 2][4];
  state_operands(s, sa, x, y);
  const unsigned long long wq_desc = k_major_desc(st.w);
#pragma unroll
  for (int kk = 0; kk < D / 16; ++kk)
    wgmma_m64n128k16_rs_split<0>(x, y, sa[kk], wgmma_desc_advance(wq_desc, key_step_offset<VT>(kk)), kk > 0);
  wgmma_commit();
}

// S^T = e^{g_L} S0^T + (U^T diag(e^{g_L-g})) K with the state registers as the accumulator (s already scaled).
// B = K, MN-major: token step j starts 16 rows (2048 bytes) further; keys 64-127 KEY_STRIDE (LBO) further.
// One commit group.
template <int VT>
__device__ __forceinline__ void state_product(float (&s)[KT][4], unsigned (&ad)[NT / 2][4], const ScanStage& st) {
  register_fence(ad);
  register_fence(s);
  wgmma_fence();
  const unsigned long long k_desc =
      wgmma_desc_sw128(smem_addr(st.k), chunk::ScanLayout<VT>::KEY_STRIDE, kWgmmaAtomBytes);
#pragma unroll
  for (int j = 0; j < NT / 2; ++j)
    wgmma_m64k16_rs<KT, 1>(s, ad[j], wgmma_desc_advance(k_desc, j * 2 * kWgmmaAtomBytes), 1);
  wgmma_commit();
}

// O^T = Y diag(e^g) + U^T P^T on ob (holding Y diag(e^g)), k block j = source tokens 16 j ...: 32 bytes per k
// step inside P's rows (B = P, K-major). All n = 64 tokens each time: P's blocks above the diagonal are zero in
// the stage. A product over tokens 16 j onwards only (on accumulator tiles 2 j ...) would skip them, but ptxas
// serializes wgmma on partly overlapping accumulators (C7511). Not committed here.
__device__ __forceinline__ void o_product(float (&ob)[NT][4], unsigned (&au)[NT / 2][4], const __half* p) {
  register_fence(ob);
  register_fence(au);
  wgmma_fence();
  const unsigned long long p_desc = k_major_desc(p);
#pragma unroll
  for (int j = 0; j < NT / 2; ++j) wgmma_m64k16_rs<NT, 0>(ob, au[j], wgmma_desc_advance(p_desc, j * 32), 1);
}

// Without producers (the wide width: every thread copies, two stages). The wgmma groups of a chunk, in the order
// committed: [X | Y], the state update, O. Chunk c's output is packed and stored while chunk c + 1's [X | Y]
// runs (O accumulates in `ob`, which that product does not write). Each chunk starts with every wgmma done:
// the other stage, which chunk c's O reads, is refilled after the chunk's barrier.
template <typename T, int VT>
__device__ __forceinline__ void scan_chunks_self_loaded(float (&s)[KT][4], const Walk<T, VT>& w) {
  using Layout = chunk::ScanLayout<VT>;
  static_assert(Layout::PRODUCER_WARPS == 0 && Layout::STAGES == 2, "two stages, refilled by every thread");
  const int lane = w.lane;
  float x[NT][4], y[NT][4], ob[NT][4];  // accumulators of X, Y and O
  zero_accumulators(x, y, ob);
  T* o_rows = nullptr;  // the previous chunk's output rows and length (its O^T waits in ob)
  int o_len = 0;

  for (int ci = 0; ci < w.chunks; ++ci) {
    const int t0 = ci * BT;
    const int L = min(BT, w.span.len - t0);
    wgmma_wait<0>();
    const ScanStage st = stage_landed<VT>(w.stages, ci);
    xy_product<VT>(s, st, x, y);
    // Meanwhile: the state's decay (ptxas still moves most of these FMUL after the wait below), the next
    // chunk's loads, the previous chunk's output and U~.
    const ChunkDecays dc = chunk_decays(st.g, L, lane);
    scale_state(s, dc.last());
    register_fence(s);
    load_next_stage(w, ci);
    if (ci > 0) emit_output(ob, w, o_rows, o_len);
    unsigned ut[NT / 2][2][2];
    load_u_tilde(ut, st.u, Layout::LDU, w.v0, lane);

    wgmma_wait<0>();  // X and Y
    register_fence(x);
    register_fence(y);
    unsigned au[NT / 2][4], ad[NT / 2][4];
    u_fragments(ut, x, dc, lane, au, ad);
    state_product<VT>(s, ad, st);
    scaled_tokens(y, dc, lane, ob);  // while the state update runs
    o_product(ob, au, st.p);
    wgmma_commit();
    o_rows = w.out + (size_t)(w.span.start + t0) * w.out_stride;
    o_len = L;
  }
  wgmma_wait<0>();
  register_fence(s);
  if (w.chunks > 0) emit_output(ob, w, o_rows, o_len);
}

// With a producer warpgroup (the narrow width, three stages). The chunk's wgmma groups, in the order
// committed: X, Y, the state update, O. Chunk c's output is packed and stored while chunk c + 1's X and Y run
// (O accumulates in `ob`, which Y does not write), so the recurrence (state -> X -> U -> state) no longer
// waits for the pack. (Leaving O in flight across the next chunk's start made ptxas serialize every wgmma,
// C7514; issuing chunk c's O after chunk c + 1's [X | Y], with the stage freed after it, was 16% slower on the
// H200: so each chunk starts with every wgmma done.)
template <typename T, int VT>
__device__ __forceinline__ void scan_chunks_produced(float (&s)[KT][4], const Walk<T, VT>& w) {
  using Layout = chunk::ScanLayout<VT>;
  static_assert(!Layout::XY_FUSED && Layout::KEY_STRIDE == Layout::KEY_HALF, "X and Y as two n64 products");
  static_assert(Layout::PRODUCER_WARPS > 0, "the stages come from the producer warps");
  static_assert(Layout::STAGE_E == Layout::STAGE_G + BT * 4, "the staged decays follow gamma");
  const int lane = w.lane;
  float x[NT][4], y[NT][4], ob[NT][4];  // accumulators of X, Y and O (the previous chunk's O^T waits in ob)
  zero_accumulators(x, y, ob);
  T* o_rows = nullptr;  // the previous chunk's output rows and length
  int o_len = 0;

  for (int ci = 0; ci < w.chunks; ++ci) {
    // From the loop counter: a few uniform-datapath instructions, and the stage's descriptors stay uniform.
    const int stage = ci % Layout::STAGES;
    named_barrier_sync(kStageFullBarrier + stage, Layout::THREADS);
    wgmma_wait<0>();  // the previous chunk's state update and O
    const ScanStage st = scan_stage<VT>(w.stages, stage);

    // X = S0^T W^T, then Y = S0^T Q^T (two commit groups: U needs only X). B = W, Q, K-major.
    unsigned sa[KT / 2][4];
    state_operands(s, sa, x, y);
    const unsigned long long w_desc = k_major_desc(st.w), q_desc = k_major_desc(st.q);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_m64k16_rs<NT, 0>(x, sa[kk], wgmma_desc_advance(w_desc, key_step_offset<VT>(kk)), kk > 0);
    wgmma_commit();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
      wgmma_m64k16_rs<NT, 0>(y, sa[kk], wgmma_desc_advance(q_desc, key_step_offset<VT>(kk)), kk > 0);
    wgmma_commit();

    // Meanwhile: the previous chunk's stage goes back to the producers (its wgmma are all done) and its output
    // out; this chunk's U~.
    if (ci > 0) {
      const int prev = (ci + Layout::STAGES - 1) % Layout::STAGES;
      if (ci - 1 + Layout::STAGES < w.chunks) named_barrier_arrive(kStageFreeBarrier + prev, Layout::THREADS);
      register_fence(ob);
      emit_output(ob, w, o_rows, o_len);
    }
    const StagedDecays dc{st.g + BT, (lane & 3) * 2};
    unsigned ut[NT / 2][2][2];
    load_u_tilde(ut, st.u, Layout::LDU, w.v0, lane);

    wgmma_wait<1>();  // X
    register_fence(x);
    unsigned au[NT / 2][4], ad[NT / 2][4];
    u_fragments(ut, x, dc, lane, au, ad);
    // Not while X runs: ptxas then waits for it before this write to the state registers (C7517).
    scale_state(s, dc.last());
    state_product<VT>(s, ad, st);

    wgmma_wait<1>();  // Y (the state update may still run)
    register_fence(y);
    scaled_tokens(y, dc, lane, ob);
    o_product(ob, au, st.p);
    wgmma_commit();

    const int t0 = ci * BT;
    o_rows = w.out + (size_t)(w.span.start + t0) * w.out_stride;
    o_len = min(BT, w.span.len - t0);
  }
  wgmma_wait<0>();
  register_fence(s);
  if (w.chunks > 0) {
    register_fence(ob);
    emit_output(ob, w, o_rows, o_len);
  }
}

template <typename T, int VT>
__device__ __forceinline__ void scan_chunks(float (&s)[KT][4], const Walk<T, VT>& w) {
  if constexpr (chunk::ScanLayout<VT>::PRODUCER_WARPS > 0) scan_chunks_produced(s, w);
  else scan_chunks_self_loaded(s, w);
}

#endif  // OHK_SCAN_WGMMA

}  // namespace scan

template <typename T, int VT>
__device__ __forceinline__ void gdn_chunk_scan(const GdnParams& p) {
  using namespace chunk;
  using scan::KT;
  constexpr int THREADS = ScanLayout<VT>::THREADS;
  extern __shared__ __align__(16) unsigned char smem[];

  const int tid = threadIdx.x;
  const int lane = tid & 31;
  const int warp = tid >> 5;
  const int c0 = blockIdx.x * VT;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  const RowSpan span = row_span(p.cu_seqlens, p.uniform_len, b, p.total_tokens);
  if (gdn_row_is_sequential(p, b, span.len)) return;  // uniform over the block: the tail pass serves it
  const int group = p.hv / p.hk;
  const int hk = h / group;

  // This row has no captured prefix here (capture inactive or capture_count <= 0): zero the capsule slots
  // this block owns.
  if (p.capsule != nullptr) {
    float* cap = p.capsule + (size_t)b * gdn_capsule_row(p);
    for (int i = tid; i < p.capacity * VT; i += THREADS) {
      const int t = i / VT, c = c0 + i % VT;
      cap[gdn_capsule_delta(p) + ((size_t)t * p.hv + h) * D + c] = 0.0f;
    }
    if (blockIdx.x == 0) {
      for (int t = tid; t < p.capacity; t += THREADS) cap[(size_t)t * p.hv + h] = 0.0f;
      if (h % group == 0)
        for (int i = tid; i < p.capacity * D; i += THREADS)
          cap[gdn_capsule_key(p) + ((size_t)(i / D) * p.hk + hk) * D + i % D] = 0.0f;
    }
  }

  // The copying threads: the producer warps (after the compute warps) if there are any, else all.
  using Layout = ScanLayout<VT>;
  constexpr int copy_tid0 = Layout::PRODUCER_WARPS > 0 ? Layout::WARPS * 32 : 0;
  const ScanCopy<VT> copy = scan_copy<VT>(p, chunk_workspace(p), h, hk, c0, tid - copy_tid0);
  unsigned char* stages = scan_stages<VT>(smem);
#if OHK_SCAN_WGMMA
  if constexpr (Layout::PRODUCER_WARPS > 0) {
    // The role as a broadcast value: ptxas then knows the branch is warp-uniform and keeps the compute warps'
    // loop counter and wgmma descriptors in uniform registers (with tid / 32 it did not: 744 static
    // instructions in the chunk loop instead of 644, an R2UR and a 64-bit add per wgmma).
    if (__shfl_sync(0xffffffffu, warp, 0) >= Layout::WARPS) {
      scan::produce_stages(copy, stages, span, chunks_of(span.len));
      return;  // nothing waits for the producers after their last stage
    }
  } else
#endif
  {
    scan_load_stage(copy, stages, span.start, min(BT, span.len));
    cp_async_commit();
  }

  // The fp32 state S^T in the accumulator layout: s[kt] holds value rows v0 + {g8, g8 + 8}, key columns
  // kt*8 + q2 + {0, 1}.
  const int v0 = warp * 16;
  const int g8 = lane >> 2;
  const int q2 = (lane & 3) * 2;
  float s[KT][4];
  const size_t state_base = (((size_t)b * p.hv + h) * D + c0 + v0) * D;
#pragma unroll
  for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
    for (int half_row = 0; half_row < 2; ++half_row) {
      float2 x = make_float2(0.f, 0.f);
      if (p.state_in != nullptr)
        x = *reinterpret_cast<const float2*>(p.state_in + state_base + (size_t)(g8 + 8 * half_row) * D + kt * 8 + q2);
      s[kt][2 * half_row] = x.x;
      s[kt][2 * half_row + 1] = x.y;
    }
  }

  // Output: the CTA's VT columns of every token; each warp's are v0 ... v0 + 15.
  T* out = static_cast<T*>(p.out) + (size_t)h * D + c0;
#if OHK_SCAN_WGMMA
  const unsigned out_stage = scan::output_stage_address<VT>(stages, warp, lane);
#else
  const unsigned out_stage = 0;
#endif
  const scan::Walk<T, VT> walk{copy, stages, span, chunks_of(span.len), out, (size_t)p.hv * D, p.scale, lane, v0,
                               out_stage};
  scan::scan_chunks(s, walk);

  if (p.state_out != nullptr) {
#pragma unroll
    for (int kt = 0; kt < KT; ++kt) {
#pragma unroll
      for (int half_row = 0; half_row < 2; ++half_row) {
        *reinterpret_cast<float2*>(p.state_out + state_base + (size_t)(g8 + 8 * half_row) * D + kt * 8 + q2) =
            make_float2(s[kt][2 * half_row], s[kt][2 * half_row + 1]);
      }
    }
  }
}

}  // namespace ohk

// The planner launches these kernels with launch_config.h's shared memory and block sizes: an image whose layouts
// disagree does not compile (a scan launched with fewer threads than its producer hand-off counts would hang).
namespace ohk::chunk {
#if OHK_SCAN_WGMMA
static_assert(ScanLayout<VT_NARROW>::SMEM_BYTES == launch_config::kChunkWgmmaSmemBytes, "narrow scan, sm_90a");
static_assert(ScanLayout<VT_WIDE>::SMEM_BYTES == launch_config::kChunkWgmmaWideSmemBytes, "wide scan, sm_90a");
static_assert(ScanLayout<VT_NARROW>::PRODUCER_WARPS * 32 == launch_config::kChunkWgmmaProducerThreads,
              "the narrow scan's producer warpgroup, sm_90a");
#else
static_assert(ScanLayout<VT_NARROW>::SMEM_BYTES == launch_config::kChunkSmemBytes, "narrow scan, mma.sync");
static_assert(ScanLayout<VT_WIDE>::SMEM_BYTES == launch_config::kChunkWideSmemBytes, "wide scan, mma.sync");
static_assert(ScanLayout<VT_NARROW>::PRODUCER_WARPS == 0, "mma.sync scans have no producer warps");
#endif
static_assert(ScanLayout<VT_WIDE>::PRODUCER_WARPS == 0, "the wide scan's warps copy and compute");
static_assert(ScanLayout<VT_NARROW>::WARPS == VT_NARROW / 16 && ScanLayout<VT_WIDE>::WARPS == VT_WIDE / 16,
              "the planner gives the scan a warp per 16 value columns");
static_assert(PREP_SMEM_BYTES == launch_config::kChunkPrepSmemBytes, "the prep kernel's shared memory");
}  // namespace ohk::chunk

extern "C" __global__ void __launch_bounds__(ohk::chunk::THREADS, 2) gdn_chunk_prep_f16_d128(const GdnParams p) {
  ohk::wait_for_inputs();
  ohk::gdn_chunk_prep<__half>(p);
}
extern "C" __global__ void __launch_bounds__(ohk::chunk::THREADS, 2) gdn_chunk_prep_bf16_d128(const GdnParams p) {
  ohk::wait_for_inputs();
  ohk::gdn_chunk_prep<__nv_bfloat16>(p);
}
#define OHK_CHUNK_SCAN(NAME, T, VT)                                                                  \
  extern "C" __global__ void __launch_bounds__(ohk::chunk::ScanLayout<VT>::THREADS, 1) NAME(const GdnParams p) { \
    ohk::wait_for_inputs();                                                                          \
    ohk::gdn_chunk_scan<T, VT>(p);                                                                   \
  }
OHK_CHUNK_SCAN(gdn_chunked_f16_d128_v64, __half, ohk::chunk::VT_NARROW)
OHK_CHUNK_SCAN(gdn_chunked_bf16_d128_v64, __nv_bfloat16, ohk::chunk::VT_NARROW)
OHK_CHUNK_SCAN(gdn_chunked_f16_d128_v128, __half, ohk::chunk::VT_WIDE)
OHK_CHUNK_SCAN(gdn_chunked_bf16_d128_v128, __nv_bfloat16, ohk::chunk::VT_WIDE)
