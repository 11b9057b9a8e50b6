// GatedDeltaNet sequential engine (docs/op-contract.md#engine-selection): decode, verify, capture, and every shape the
// chunked engine does not serve. One warp per (request, value head, ROWS value rows); the state of the warp's
// rows stays in registers across the request's tokens.
//
// Lane layout (RecLayout): the key axis is cut into 32 pieces of NPL consecutive columns; a value row is held
// by kLanes lanes (8 or 32, see gdn_recurrent), lane s of the row holding pieces s, s + kLanes, ... (kLeaves =
// 32 / kLanes of them), and the 32 / kLanes lane groups hold different rows of the group. A row's dot products
// are then chains over each piece, added inside the lane (pieces kLanes * 2^i apart, highest first), then a
// butterfly over the row's lanes: the same additions, in the same pairing, as a 32-lane butterfly over one
// piece per lane. So every layout, and every kernel, gives a row the same bits; with 8 lanes per row a token's
// reductions take 3 shuffle levels instead of 5 and k and q come from the stash in 16-byte pieces.
//
// Per token a prologue that does not depend on the state (normalised q and k, decay, beta, q.k) runs once for
// all row groups, into a stash in shared memory: in the general kernels, for rows of up to two chunks (verify),
// the block's warps share it, a token or two each; longer rows go chunk by chunk, the block's warps sharing each
// chunk where a warp has one row group, else each warp running its own, again for each of its row groups.
// Each row group then needs one reduction per token: with S' = S * decay, the retrieval S'.k and the pre-update
// output S'.q reduce together, and the output follows as S'.q + u (k.q), because the update adds k u.
//
// The decode instantiations (DECODE_LOOP) give rows of one token a loop of their own: one prologue per warp,
// no block barrier, and the chunk bookkeeping goes. In one kernel with the general loop that made ptxas
// recompute predicates and addresses inside the verify loop (docs/design-notes.md#decode-only-instantiations), so
// the general instantiations leave it out and the planner picks a decode one only for calls of at most one token per
// row. The decode loop runs the general loop's operations in the same order: a row's bits do not depend on the
// choice.
//
// State rounding is the CUDA rule of docs/op-contract.md#state-update-rounding:
// S' = __fmul_rn(S, decay), S = __fmaf_rn(key, delta, S').
// The capsule stores exactly the decay, key and delta used here, so a replay is bit-exact.
#include "common.cuh"

namespace ohk {

constexpr int kRecWarps = launch_config::kRecWarps;  // value rows per warp (ROWS) is a template parameter
// Resident blocks per SM the register allocation must allow: decode is latency-bound, so warps in flight
// matter; the bounds are the highest at which ptxas (CUDA 13.0, sm_90) does not spill.
__host__ __device__ constexpr int rec_min_blocks(int npl, int rows) {
  if (npl >= 8) return 1;
  if (rows == 8) return npl == 1 ? 5 : 4;
  if (rows == 4) return npl == 1 ? 6 : 5;
  return npl == 4 && rows == 1 ? 5 : 6;
}

__host__ __device__ constexpr int log2_int(int n) { return n <= 1 ? 0 : 1 + log2_int(n / 2); }

// Which key columns and value rows a lane holds (see the file's head). Per row a lane's kKeys values are
// indexed i = c NPL + e: piece c, element e, at key column NPL (sub + kLanes c) + e.
template <int NPL_, int ROWS_, int LANES>
struct RecLayout {
  static constexpr int NPL = NPL_;
  static constexpr int ROWS = ROWS_;
  static constexpr int kLanes = LANES;                      // lanes per value row: 8 or 32 (gdn_recurrent)
  static constexpr int kLeaves = 32 / kLanes;               // pieces of NPL key columns per lane and row
  static constexpr int kKeys = kLeaves * NPL;               // key columns per lane and row
  static constexpr int kRows = ROWS * kLanes / 32;          // value rows per lane
  static constexpr int kVec = NPL % 4 == 0 ? 4 : NPL;       // floats per vector access
  static constexpr int kDk = 32 * NPL;                      // the key size of whole vector rows
  __device__ static int sub(int lane) { return lane & (kLanes - 1); }
  // Key column of value i, relative to the lane's first (NPL sub).
  __host__ __device__ static constexpr int col_off(int i) { return NPL * kLanes * (i / NPL) + i % NPL; }
  __device__ static int col(int lane, int i) { return NPL * sub(lane) + col_off(i); }
  // Row of the group held in the lane's value j of kRows.
  __device__ static int row(int lane, int j) { return (lane / kLanes) * kRows + j; }
};

// A lane's pieces added in the butterfly's order (pieces kLanes * kLeaves / 2 apart first); returns the sum.
template <int N>
__device__ __forceinline__ float piece_sum(float (&x)[N]) {
#pragma unroll
  for (int half = N / 2; half > 0; half /= 2)
#pragma unroll
    for (int c = 0; c < half; ++c) x[c] += x[c + half];
  return x[0];
}

// State rows are touched once per call: streaming (evict-first) loads and stores keep them from pushing the
// inputs and offsets, which each call's dependent chain waits on, out of L2 (decode and verify 3-20% faster on
// the H200, docs/design-notes.md#streaming-state-accesses): load_rows / store_rows' 16-byte path, which every
// whole, aligned row takes. The per-element helpers below serve the rest (partial key rows, unaligned state).
template <class L>
__device__ __forceinline__ void load_state_row(const float* row, int lane, int dk, float (&s)[L::kKeys]) {
#pragma unroll
  for (int i = 0; i < L::kKeys; ++i) {
    const int r = L::col(lane, i);
    s[i] = r < dk ? row[r] : 0.0f;
  }
}

template <class L>
__device__ __forceinline__ void store_state_row(float* row, int lane, int dk, const float (&s)[L::kKeys]) {
#pragma unroll
  for (int i = 0; i < L::kKeys; ++i) {
    const int r = L::col(lane, i);
    if (r < dk) row[r] = s[i];
  }
}

// A key vector's raw elements (zero past dk; converted where they are used), per element and predicated, in
// straight-line code: with an 8-byte path beside this one, the branch between made ptxas convert each vector as
// it landed, so a block's start waited for its input loads one after the other
// (docs/design-notes.md#block-start-loads-issued-together).
template <typename T, class L>
__device__ __forceinline__ void load_head(const T* base, int lane, int dk, T (&x)[L::kKeys]) {
#pragma unroll
  for (int i = 0; i < L::kKeys; ++i) {
    const int r = L::col(lane, i);
    x[i] = ld_global_if(base + r, r < dk);
  }
}

// Whole 16-byte key rows (dk == 32 NPL, 16-byte aligned base, so every row is aligned too): tested once per
// warp; a row group that lies inside the head then loads and stores through one base address, untested per row.
template <int NPL>
__device__ __forceinline__ bool vector_rows(const float* base, int dk) {
  return NPL % 4 == 0 && dk == 32 * NPL && base != nullptr && (reinterpret_cast<size_t>(base) & 15) == 0;
}

template <class L>
using RecRows = float[L::kRows][L::kKeys];  // a lane's share of a row group's state

template <class L>
__device__ __forceinline__ void load_rows(const GdnParams& p, bool vec, size_t head_base, int c0, int lane,
                                          RecRows<L>& S) {
  if constexpr (L::NPL % 4 == 0) {
    if (vec && c0 + L::ROWS <= p.dv) {
      const float* base = p.state_in + (head_base + c0 + L::row(lane, 0)) * L::kDk + L::col(lane, 0);
#pragma unroll
      for (int j = 0; j < L::kRows; ++j)
#pragma unroll
        for (int i = 0; i < L::kKeys; i += 4) {
          const float4 x = __ldcs(reinterpret_cast<const float4*>(base + j * L::kDk + L::col_off(i)));
          S[j][i] = x.x; S[j][i + 1] = x.y; S[j][i + 2] = x.z; S[j][i + 3] = x.w;
        }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < L::kRows; ++j) {
    const int c = c0 + L::row(lane, j);
    if (p.state_in != nullptr && c < p.dv) {
      load_state_row<L>(p.state_in + (head_base + c) * p.dk, lane, p.dk, S[j]);
    } else {
#pragma unroll
      for (int i = 0; i < L::kKeys; ++i) S[j][i] = 0.0f;
    }
  }
}

template <class L>
__device__ __forceinline__ void store_rows(const GdnParams& p, bool vec, size_t head_base, int c0, int lane,
                                           const RecRows<L>& S) {
  if constexpr (L::NPL % 4 == 0) {
    if (vec && c0 + L::ROWS <= p.dv) {
      float* base = p.state_out + (head_base + c0 + L::row(lane, 0)) * L::kDk + L::col(lane, 0);
#pragma unroll
      for (int j = 0; j < L::kRows; ++j)
#pragma unroll
        for (int i = 0; i < L::kKeys; i += 4)
          __stcs(reinterpret_cast<float4*>(base + j * L::kDk + L::col_off(i)),
                 make_float4(S[j][i], S[j][i + 1], S[j][i + 2], S[j][i + 3]));
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < L::kRows; ++j) {
    const int c = c0 + L::row(lane, j);
    if (c < p.dv) store_state_row<L>(p.state_out + (head_base + c) * p.dk, lane, p.dk, S[j]);
  }
}

// One token's values that do not depend on the state: k, q and the per-key decay (per-key rules) in key order
// (each lane of the row's first lane group writes its pieces, every lane reads its own), and the scalars.
template <int NPL>
struct alignas(16) RecToken {
  float vec[3][32 * NPL];  // [k, q, per-key decay][key column]
  float scalar[4];         // decay (scalar rules), beta, q.k
};

// Tokens per chunk of a row group's loop: 4 (a verify step of 4 tokens is one chunk). More made the small-key
// instantiations spill; wide keys take fewer, so a warp's stash stays within 6 KB.
__host__ __device__ constexpr int rec_chunk_tokens(int npl) { return npl >= 16 ? 1 : (npl >= 8 ? 2 : 4); }

// A lane's values of one key vector to or from a stash row in key order, NPL columns (a piece) at a time.
template <class L>
__device__ __forceinline__ void stash_put(float* dst, int lane, const float (&x)[L::kKeys]) {
  float* d = dst + L::col(lane, 0);
#pragma unroll
  for (int i = 0; i < L::kKeys; i += L::kVec) {
    if constexpr (L::kVec == 4) {
      *reinterpret_cast<float4*>(d + L::col_off(i)) = make_float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
    } else if constexpr (L::kVec == 2) {
      *reinterpret_cast<float2*>(d + L::col_off(i)) = make_float2(x[i], x[i + 1]);
    } else {
      d[L::col_off(i)] = x[i];
    }
  }
}

template <class L>
__device__ __forceinline__ void stash_get(const float* src, int lane, float (&x)[L::kKeys]) {
  const float* s = src + L::col(lane, 0);
#pragma unroll
  for (int i = 0; i < L::kKeys; i += L::kVec) {
    if constexpr (L::kVec == 4) {
      const float4 y = *reinterpret_cast<const float4*>(s + L::col_off(i));
      x[i] = y.x; x[i + 1] = y.y; x[i + 2] = y.z; x[i + 3] = y.w;
    } else if constexpr (L::kVec == 2) {
      const float2 y = *reinterpret_cast<const float2*>(s + L::col_off(i));
      x[i] = y.x; x[i + 1] = y.y;
    } else {
      x[i] = s[L::col_off(i)];
    }
  }
}

// The next row group's state goes through a per-warp shared-memory stage, copied by cp.async: its completion
// is a cp.async group, not a register scoreboard. Prefetched into registers, it was waited for inside the
// current group (ptxas, CUDA 13.0, sm_90: at a branch at the group's start in the general loop, and through a
// scoreboard shared with the group's own loads and shuffles in the decode loop), so every group exposed one
// full memory latency (docs/design-notes.md#next-row-group-through-a-shared-memory-stage).
// 16 bytes global -> shared, with no L2 policy. The state's other accesses stream (__ldcs, __stcs), but with an
// evict-first policy here verify 4 with capture took 223 us at 27B, B = 128, and 217.6 us without (H200;
// docs/design-notes.md#stage-copies-without-an-l2-policy).
__device__ __forceinline__ void stage_copy16(float* dst, const float* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}

// One row group's state, [lane's row][vector][lane][element]: each lane reads back only what it copied, so the
// stage needs no warp barrier.
template <class L>
using RecStage = float[L::kRows][L::kKeys / L::kVec][32][L::kVec];

template <class L>
__device__ __forceinline__ void stage_put(float (&dst)[L::kKeys / L::kVec][32][L::kVec], int lane,
                                          const float (&x)[L::kKeys]) {
#pragma unroll
  for (int c = 0; c < L::kKeys / L::kVec; ++c)
#pragma unroll
    for (int e = 0; e < L::kVec; ++e) dst[c][lane][e] = x[c * L::kVec + e];
}

// Requests the rows [c0, c0 + ROWS) into the stage (one cp.async group). Partial groups and rows that are not
// whole 16-byte vectors are loaded here and written to the stage (rare shapes; the same values).
template <class L>
__device__ __forceinline__ void stage_rows(const GdnParams& p, bool vec, size_t head_base, int c0, int lane,
                                           RecStage<L>& stage) {
  bool copied = false;
  if constexpr (L::NPL % 4 == 0) {
    if (vec && c0 + L::ROWS <= p.dv) {
      const float* base = p.state_in + (head_base + c0 + L::row(lane, 0)) * L::kDk + L::col(lane, 0);
#pragma unroll
      for (int j = 0; j < L::kRows; ++j)
#pragma unroll
        for (int c = 0; c < L::kKeys / 4; ++c)
          stage_copy16(stage[j][c][lane], base + j * L::kDk + L::col_off(4 * c));
      copied = true;
    }
  }
  if (!copied) {
    RecRows<L> S;
    load_rows<L>(p, false, head_base, c0, lane, S);
#pragma unroll
    for (int j = 0; j < L::kRows; ++j) stage_put<L>(stage[j], lane, S[j]);
  }
  cp_async_commit();
}

// The staged rows into registers, once their copies have landed.
template <class L>
__device__ __forceinline__ void unstage_rows(const RecStage<L>& stage, int lane, RecRows<L>& S) {
  cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < L::kRows; ++j)
#pragma unroll
    for (int c = 0; c < L::kKeys / L::kVec; ++c) {
      if constexpr (L::kVec == 4) {
        const float4 y = *reinterpret_cast<const float4*>(stage[j][c][lane]);
        S[j][4 * c] = y.x; S[j][4 * c + 1] = y.y; S[j][4 * c + 2] = y.z; S[j][4 * c + 3] = y.w;
      } else {
#pragma unroll
        for (int e = 0; e < L::kVec; ++e) S[j][c * L::kVec + e] = stage[j][c][lane][e];
      }
    }
}

// The kernel's shared memory. In the general kernels, rows of at most kBlockTokens tokens (verify of up to 8
// drafts at K <= 128) run the per-token prologue once, shared by the block's warps, into the block's stash.
// Longer rows run it chunk by chunk: shared by the block's warps too where a warp has one row group (into the
// block's stash, its two halves in turn), else per warp into the warp's own stash, as the decode kernels do for
// every row. A block holds one row, so the two are a union: the block's stash holds two chunks in the space of
// the warps'.
// The warps' value rows of the stashed tokens, and each warp's stage for its next row group, sit beside them,
// within 48 KB of static shared memory (45 KB at K = 128, 8 rows per warp).
// The decode kernels (DECODE) take one token at a time and share no prologue, so they hold one token per warp:
// 23 KB at K = 128, R = 8. They load the state straight into registers, and those loads stage in the L1, which
// gets what the blocks' shared memory leaves of the SM's 256 KB (the general kernels copy it past the L1): 60 KB
// with the general kernels' 45 KB was about enough, and the 22 KB per block that decode never touched are left to a
// kernel overlapping through programmatic launch (docs/design-notes.md#decode-kernels-shared-memory-and-the-l1).
template <class L, bool DECODE>
struct RecShared {
  static constexpr int kChunk = DECODE ? 1 : rec_chunk_tokens(L::NPL);
  static constexpr int kBlockTokens = DECODE ? 1 : 2 * kChunk;
  using Token = RecToken<L::NPL>;
  union {
    Token block[kBlockTokens];
    Token warp[kRecWarps][kChunk];
  } stash;
  float v[kRecWarps][kBlockTokens][32];  // warp w's value rows of the stash's tokens: row c_warp + l at l
  RecStage<L> stage[kRecWarps];
};

// The block's warps that hold rows of a launch of `group_rows` (ROWS x row groups) rows per warp; warp 0 always
// does (the grid is ceil(dv / rows per block)). Counted, not divided: ptxas (sm_90) put an integer division for it
// before the first state loads, and decode measured about 1% slower with it
// (docs/design-notes.md#shared-per-token-prologue).
__device__ __forceinline__ int rec_block_warps(const GdnParams& p, int group_rows) {
  const int c_block = blockIdx.x * kRecWarps * group_rows;
  int warps = 1;
#pragma unroll
  for (int w = 1; w < kRecWarps; ++w) warps += c_block + w * group_rows < p.dv;
  return warps;
}

// One token's raw inputs for the prologue, loaded a token ahead. Loading issues no arithmetic on them (q and k
// stay in the input type until token_values), so loads issued together are waited for together.
template <typename T, class L>
struct TokenInputs {
  T q[L::kKeys], k[L::kKeys];
  unsigned decay;  // raw decay input's bits (scalar-decay rules; gdn_gate_bits_if)
  unsigned beta;   // raw beta input's bits
};

// Token `tok`'s inputs, or zeros where `valid` is false (no load issued: the guessed token of an empty call).
template <typename T, class L>
__device__ __forceinline__ void load_token(const GdnParams& p, int tok, bool valid, int h, int lane, const T* qb,
                                           const T* kb, TokenInputs<T, L>& in) {
  const int dk = valid ? p.dk : 0;
  load_head<T, L>(qb + (size_t)tok * p.q_stride, lane, dk, in.q);
  load_head<T, L>(kb + (size_t)tok * p.k_stride, lane, dk, in.k);
  in.decay = gdn_gate_bits_if<T>(p, p.decay, (size_t)tok * p.hv + h, valid && p.has_decay && !p.decay_per_key);
  in.beta = gdn_gate_bits_if<T>(p, p.beta, (size_t)tok * p.hv + h, valid && p.has_delta);
}

// Sum over lanes OFF * 2, apart by less (a row's lanes), of N values per lane (N a power of two <= 2 OFF):
// each halving step (lane offset OFF) sends the half a lane does not keep, in N - 1 + log2(2 OFF / N)
// shuffles. Lane l ends with value (l mod 2 OFF) >> log2(2 OFF / N), summed in the same pairing order as a
// full butterfly, so the result does not depend on N.
template <int N, int OFF>
__device__ __forceinline__ float transposed_warp_sum(float* x, int lane) {
  if constexpr (N > 1) {
    const bool upper = (lane & OFF) != 0;
#pragma unroll
    for (int j = 0; j < N / 2; ++j) {
      const float send = upper ? x[j] : x[j + N / 2];
      const float keep = upper ? x[j + N / 2] : x[j];
      x[j] = keep + __shfl_xor_sync(0xffffffffu, send, OFF);
    }
    return transposed_warp_sum<N / 2, OFF / 2>(x, lane);
  } else {
    float s = x[0];
#pragma unroll
    for (int off = OFF; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    return s;
  }
}

// Per-head gate constants (qwen: g = -exp(a_log) * softplus(x + dt_bias)).
struct HeadGate {
  float neg_a, dt_bias;
};

// One token's values that do not depend on the state: normalised k and q, the head's decay, beta and q.k.
// The scalars come out of butterfly sums, so every lane holds the same bits.
template <class L>
struct TokenValues {
  float k[L::kKeys], q[L::kKeys];
  float alpha;
  // q.k = sqk * inv_k * q_scale, and beta (token_beta), are formed where they are used: the prologue forms
  // them in lane 0 only; formed in every lane here, they changed the general loop's code (ptxas, sm_90).
  float sqk, inv_k, q_scale;
  __device__ __forceinline__ float qk() const { return sqk * inv_k * q_scale; }
};

// The token's beta (delta rules), from its raw input.
template <typename T, class L>
__device__ __forceinline__ float token_beta(const GdnParams& p, const TokenInputs<T, L>& cur) {
  const float beta = gdn_gate_from_bits<T>(p, cur.beta);
  return p.has_delta ? (p.beta_sigmoid ? 1.0f / (1.0f + expf(-beta)) : beta) : 1.0f;
}

template <typename T, class L>
__device__ __forceinline__ void token_values(const GdnParams& p, const TokenInputs<T, L>& raw, HeadGate gate,
                                             TokenValues<L>& tv) {
  float q[L::kKeys], k[L::kKeys];
#pragma unroll
  for (int i = 0; i < L::kKeys; ++i) {
    q[i] = to_f32(raw.q[i]);
    k[i] = to_f32(raw.k[i]);
  }
  // Per piece, then the lane's pieces, then the row's lanes: the pairing of a 32-lane butterfly (file's head).
  float sq[L::kLeaves], sk[L::kLeaves], sqk[L::kLeaves];
#pragma unroll
  for (int c = 0; c < L::kLeaves; ++c) {
    sq[c] = sk[c] = sqk[c] = 0.0f;
#pragma unroll
    for (int e = 0; e < L::NPL; ++e) {
      const int i = c * L::NPL + e;
      sq[c] = fmaf(q[i], q[i], sq[c]);
      sk[c] = fmaf(k[i], k[i], sk[c]);
      sqk[c] = fmaf(q[i], k[i], sqk[c]);
    }
  }
  float q2 = piece_sum(sq), k2 = piece_sum(sk), qk = piece_sum(sqk);
#pragma unroll
  for (int off = L::kLanes / 2; off > 0; off >>= 1) {
    q2 += __shfl_xor_sync(0xffffffffu, q2, off);
    k2 += __shfl_xor_sync(0xffffffffu, k2, off);
    qk += __shfl_xor_sync(0xffffffffu, qk, off);
  }
  const float inv_k = p.l2norm ? rsqrtf(k2 + 1e-12f) : 1.0f;
  const float q_scale = p.scale * (p.l2norm ? rsqrtf(q2 + 1e-12f) : 1.0f);
#pragma unroll
  for (int i = 0; i < L::kKeys; ++i) {
    tv.k[i] = p.l2norm ? k[i] * inv_k : k[i];
    tv.q[i] = q[i] * q_scale;
  }
  tv.alpha = 1.0f;
  if (p.has_decay && !p.decay_per_key) {
    float g = gdn_gate_from_bits<T>(p, raw.decay);
    if (p.gate_qwen) {
      const float z = g + gate.dt_bias;
      g = gate.neg_a * (z > 20.0f ? z : log1pf(expf(z)));
    }
    tv.alpha = expf(g);
  }
  tv.sqk = qk;
  tv.inv_k = inv_k;
  tv.q_scale = q_scale;
}

// The captured decay and key of slot `slot`'s token (docs/op-contract.md#capsule-layout); the key by the lanes of the
// first row (every lane group holds the whole key). The capsule is read back only by a later replay, never by the
// next kernel, so its slots go out as streaming (evict-first) stores, like the state: as normal stores they pushed
// the call's inputs and outputs out of the L2, and verify with capture at B = 128 measured 3% slower (H200;
// docs/design-notes.md#capsule-as-streaming-stores). The general loop's delta slots do the same. The decode loop's
// delta slots and finish_group's zeros (rows that capture fewer tokens than the capacity) stay normal stores:
// streaming, they made ptxas spill 8-12 B in the decode kernels (CUDA 13.0, sm_90a).
template <class L>
__device__ __forceinline__ void capture_token(const GdnParams& p, const TokenValues<L>& tv, int slot, int h,
                                              int hk, int lane, float* cap, bool capture_decay, bool capture_key) {
  if (capture_decay && lane == 0) __stcs(cap + (size_t)slot * p.hv + h, tv.alpha);
  if (capture_key && lane < L::kLanes) {
    float* key = cap + gdn_capsule_key(p) + ((size_t)slot * p.hk + hk) * p.dk;
#pragma unroll
    for (int i = 0; i < L::kKeys; ++i) {
      const int r = L::col(lane, i);
      if (r < p.dk) __stcs(key + r, tv.k[i]);
    }
  }
}

// The per-key decay of the token at `tok` (per-key rules) into a stash row: computed once per token, so the row
// groups read it (decay_rows) rather than recompute it in every group.
template <typename T, class L>
__device__ __forceinline__ void key_decay(const GdnParams& p, int tok, int h, int lane, float alpha_head,
                                          float* dst) {
  float a[L::kKeys];
#pragma unroll
  for (int i = 0; i < L::kKeys; ++i) {
    const int r = L::col(lane, i);
    a[i] = r < p.dk ? expf(gdn_log_gate<T>(p, tok, h, r)) : alpha_head;
  }
  stash_put<L>(dst, lane, a);
}

// The prologue of tokens t0 + t, t = first, first + step, ... < n of a row into stash slots t; `cur` holds token
// t0 + first's inputs on entry. A warp alone runs every token (first 0, step 1); the warps of a block share the
// block's stash for a short row, or a chunk of a longer one (first = warp, step = its warps). With `capture_decay` /
// `capture_key` (the warps holding value row 0 of the head, or of the key head's group) it also writes the
// captured decay and key slots. The caller orders the stash writes before their reads (warp or block barrier).
template <typename T, class L>
__device__ __forceinline__ void token_prologue(const GdnParams& p, RecToken<L::NPL>* st, TokenInputs<T, L> cur,
                                               int start, int t0, int first, int step, int n, int h, int hk,
                                               HeadGate gate, int lane, const T* qb, const T* kb, int m, float* cap,
                                               bool capture_decay, bool capture_key) {
  TokenInputs<T, L> nxt;
  for (int t = first; t < n; t += step) {
    if (t + step < n) load_token<T, L>(p, start + t0 + t + step, true, h, lane, qb, kb, nxt);
    TokenValues<L> tv;
    token_values<T, L>(p, cur, gate, tv);
    if (lane < L::kLanes) {  // every lane group holds the same values
      stash_put<L>(st[t].vec[0], lane, tv.k);
      stash_put<L>(st[t].vec[1], lane, tv.q);
      if (p.decay_per_key) key_decay<T, L>(p, start + t0 + t, h, lane, tv.alpha, st[t].vec[2]);
    }
    if (lane == 0) {
      st[t].scalar[0] = tv.alpha;
      st[t].scalar[1] = token_beta<T, L>(p, cur);
      st[t].scalar[2] = tv.qk();
    }
    if (t0 + t < m) capture_token<L>(p, tv, t0 + t, h, hk, lane, cap, capture_decay, capture_key);
    if (t + step < n) cur = nxt;
  }
}

// S' = S * decay for a group's rows, with the token's decay per key column from the stash (per-key rules,
// key_decay) or the head's (scalar rules). One uniform branch: the per-element test cost ~8 instructions per key
// column. Apart from the reduction, so that the per-key branch holds one piece of decays at a time.
template <class L>
__device__ __forceinline__ void decay_rows(const GdnParams& p, const float* key_decays, int lane, float alpha_head,
                                           RecRows<L>& S) {
  if (p.decay_per_key) {
    float a[L::kKeys];
    stash_get<L>(key_decays, lane, a);
#pragma unroll
    for (int j = 0; j < L::kRows; ++j)
#pragma unroll
      for (int i = 0; i < L::kKeys; ++i) S[j][i] = __fmul_rn(S[j][i], a[i]);
  } else {
#pragma unroll
    for (int j = 0; j < L::kRows; ++j)
#pragma unroll
      for (int i = 0; i < L::kKeys; ++i) S[j][i] = __fmul_rn(S[j][i], alpha_head);
  }
}

// Reduces S'.k and S'.q of every row of the (decayed) group together; returns the value this lane holds
// afterwards: of the 2 kRows values (S'.k of the lane's rows, then S'.q), value sub >> kShift (gdn_recurrent).
template <class L>
__device__ __forceinline__ float reduce_rows(const RecRows<L>& S, const float (&k)[L::kKeys],
                                             const float (&q)[L::kKeys], int lane) {
  float red[2 * L::kRows];
#pragma unroll
  for (int j = 0; j < L::kRows; ++j) {
    float dot_k[L::kLeaves], dot_q[L::kLeaves];
#pragma unroll
    for (int c = 0; c < L::kLeaves; ++c) {
      dot_k[c] = dot_q[c] = 0.0f;
#pragma unroll
      for (int e = 0; e < L::NPL; ++e) {
        const int i = c * L::NPL + e;
        dot_k[c] = fmaf(S[j][i], k[i], dot_k[c]);
        dot_q[c] = fmaf(S[j][i], q[i], dot_q[c]);
      }
    }
    red[j] = piece_sum(dot_k);
    red[L::kRows + j] = piece_sum(dot_q);
  }
  return transposed_warp_sum<2 * L::kRows, L::kLanes / 2>(red, lane);
}

// S += k u for every row of the group; the delta u of the lane's row j is held by lane u_lane + (j << kShift).
template <class L, int kShift>
__device__ __forceinline__ void update_rows(RecRows<L>& S, const float (&k)[L::kKeys], float u_mine, int u_lane) {
#pragma unroll
  for (int j = 0; j < L::kRows; ++j) {
    const float u = __shfl_sync(0xffffffffu, u_mine, u_lane + (j << kShift));
#pragma unroll
    for (int i = 0; i < L::kKeys; ++i) S[j][i] = __fmaf_rn(k[i], u, S[j][i]);
  }
}

// After a group's tokens: slots past the captured prefix are zero (our rule, docs/op-contract.md#capture-rules;
// the decay and key slots by the first group of the warps that capture them, the delta slots by every group),
// the group's state goes out, and the staged next group moves in. `dk`: as in decay_rows.
template <class L>
__device__ __forceinline__ void finish_group(const GdnParams& p, int dk, float* cap, float* delta_cap, int m, int h,
                                             int hk, int lane, bool zero_decay, bool zero_key, bool zero_delta,
                                             bool vec_out, size_t head_base, int c0, bool more, RecRows<L>& S,
                                             const RecStage<L>& next) {
  if (cap != nullptr) {
    for (int t = m; t < p.capacity; ++t) {
      if (zero_decay && lane == 0) cap[(size_t)t * p.hv + h] = 0.0f;
      if (zero_key)
        for (int r = lane; r < dk; r += 32) cap[gdn_capsule_key(p) + ((size_t)t * p.hk + hk) * dk + r] = 0.0f;
      if (zero_delta) delta_cap[(size_t)t * p.hv * p.dv] = 0.0f;
    }
  }
  if (p.state_out != nullptr) store_rows<L>(p, vec_out, head_base, c0, lane, S);
  if (more) unstage_rows<L>(next, lane, S);
}

// A warp serves p.row_groups consecutive groups of ROWS value rows of one (request, head), staging the next
// group's state and values while it computes the current one, so its memory traffic does not wait on its
// arithmetic.
// Everything it computes for a value row is independent of ROWS and row_groups (the reductions add in one
// fixed pairing whatever the layout), so a row's result does not depend on the launch shape or the batch.
template <typename T, int NPL, int ROWS, bool DECODE_LOOP>
__device__ __forceinline__ void gdn_recurrent(const GdnParams& p) {
  // The row groups' layout: 8 lanes per row (fewer instructions per token), or 16 for 2 rows, except in the
  // general 4-row kernels, which hold the whole group in every lane (one piece per lane): at 5 blocks per SM (96
  // registers) they spilled with 8 lanes per row, and 2 rows spilled with 32 (ptxas, CUDA 13.0, sm_90). Every
  // layout gives a row the same bits (the file's head).
  using L = RecLayout<NPL, ROWS, ROWS == 4 && !DECODE_LOOP ? 32 : (ROWS >= 4 ? 8 : 32 / ROWS)>;
  // The per-token prologue's layout: one piece per lane, the fewest registers; its values reach the row groups
  // through the stash, in key order, so the two layouts need not agree.
  using P = RecLayout<NPL, 1, 32>;
  using Shared = RecShared<L, DECODE_LOOP>;
  using Token = RecToken<NPL>;
  // Tokens per chunk of the general loop. The decode kernels take their rows of more than one token (rare in a
  // launch of at most one token per row) one at a time: their 4-token loop, beside the decode loop, spilled at
  // 8 lanes per row (ptxas, CUDA 13.0, sm_90).
  constexpr int kTokens = DECODE_LOOP ? 1 : Shared::kChunk;
  constexpr int KPL = L::kKeys;
  // After the reduction of 2 kRows values, lane sub of a row's lanes holds value sub >> kShift: retrieval S'.k
  // of the lane's row (sub >> kShift) in the row's lower half of lanes, output S'.q of its row
  // (sub >> kShift) - kRows in the upper half.
  constexpr int kShift = log2_int(L::kLanes) - log2_int(2 * L::kRows);
  constexpr int kHalf = L::kLanes / 2;  // lane offset from a row's retrieval lanes to its output lanes
  // One stage per warp: the next group's copies go out once the current group's rows read from it have been
  // consumed (general loop: by the first token's decay; decode loop: by its reduction). A second buffer would
  // exceed the 48 KB of static shared memory at R = 8.
  __shared__ Shared sh;

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int c_warp = (blockIdx.x * kRecWarps + warp) * ROWS * p.row_groups;
  // A warp without rows leaves at once; the one barrier (short rows, below) counts the others.
  if (c_warp >= p.dv) return;
  const int dk = p.dk;
  Token* const warp_stash = sh.stash.warp[warp];
  float (&v_stash)[Shared::kBlockTokens][32] = sh.v[warp];
  RecStage<L>& stage = sh.stage[warp];
  const int slot = L::sub(lane) >> kShift;                    // which reduced value this lane holds
  const bool first_copy = (lane & ((1 << kShift) - 1)) == 0;  // the lane that writes it
  const int my_row = L::row(lane, slot % L::kRows);
  const bool out_lane = (lane & kHalf) != 0;  // holds an output (S'.q); the others a retrieval (S'.k)
  const int u_lane = lane & ~(L::kLanes - 1);  // the lane holding the delta of the lane's first row
  const bool vec_in = vector_rows<NPL>(p.state_in, dk);
  const bool vec_out = vector_rows<NPL>(p.state_out, dk);

  // A block's start waits for its inputs, so every load whose address does not depend on the offsets goes out first
  // and together, with no arithmetic on a loaded value and no branch until the last is issued: ptxas then waits for
  // them once (Nsight Compute found each waited for before the next went out, 22-27% of the recurrent kernels' stall
  // samples; docs/design-notes.md#block-start-loads-issued-together). They are the row's offsets and capture count,
  // the gate constants, the inputs of the token this warp's prologue starts with, and this lane's value row of the
  // chunk's tokens, the last two at the guessed row start b T / B (right when every row has the same length; what the
  // offsets contradict is loaded again). The prologue starts with that token in decode, and with token `warp` of the
  // row when rows may be longer (the block's warps share the prologue of short rows, from their own token). The
  // state, needed only after the prologue, goes out after them (kStageFirst, below). The guess comes first: its
  // 64-bit division is a call, before which ptxas waits for every load in flight.
  const int guess = p.total_tokens > 0 ? (int)((long long)b * p.total_tokens / p.batch) : -1;
  const int hk = h / (p.hv / p.hk);
  const T* qb = static_cast<const T*>(p.q) + (size_t)hk * dk;
  const T* kb = static_cast<const T*>(p.k) + (size_t)hk * dk;
  // A chunk's values come from one coalesced load per token: lane l holds row c_warp + l (the plans keep
  // ROWS * row_groups <= 32), and each group reads its rows from the warp's stash. A load per group was waited
  // for at the group's start whatever was issued ahead (ptxas, sm_90;
  // docs/design-notes.md#next-row-group-through-a-shared-memory-stage).
  const T* v_lane = static_cast<const T*>(p.v) + (size_t)h * p.dv + c_warp + lane;  // + token * v_stride
  const bool lane_row_ok = lane < ROWS * p.row_groups && c_warp + lane < p.dv;
  const int tok_off = DECODE_LOOP || p.total_tokens <= p.batch ? 0 : warp;
  // guess < total_tokens (b < batch), so decode's first token is the guess itself, as before the shared prologue.
  const int first_tok = tok_off == 0 ? guess : (guess >= 0 && guess + tok_off < p.total_tokens ? guess + tok_off : -1);
  const RowOffsets offsets = row_offsets(p.cu_seqlens, b);
  const int capture_count = gdn_capture_count(p, b);
  const float a_log = ld_global_if(p.a_log + h, p.gate_qwen);
  const float dt_bias = ld_global_if(p.dt_bias + h, p.gate_qwen);
  TokenInputs<T, P> first;  // the inputs of token first_tok
  load_token<T, P>(p, max(first_tok, 0), first_tok >= 0, h, lane, qb, kb, first);
  T v_raw[kTokens];  // this lane's value row of tokens start + t (start: the guess, then the row's start)
#pragma unroll
  for (int t = 0; t < kTokens; ++t)  // past the row, the next rows' tokens (not used), not past the call's
    v_raw[t] = ld_global_if(v_lane + (size_t)(guess + t) * p.v_stride,
                            lane_row_ok && guess >= 0 && guess + t < p.total_tokens);

  const size_t head_base = ((size_t)b * p.hv + h) * p.dv;
  // The general kernels copy the first group's state into the stage: loaded into registers, it shared the inputs'
  // scoreboards, so the gate and the prologue waited for the state's DRAM latency too (4% of verify's samples on the
  // gate's first instruction; docs/design-notes.md#first-row-group-staged). The second group's copy then goes out in
  // the first group, after its first token's decay, as every later group's does. The decode kernels keep the first
  // group in registers (the plan gives them one group per warp; with more, the second goes to the stage): their group
  // is one token, too short to cover a copy.
  constexpr bool kStageFirst = !DECODE_LOOP;
  RecRows<L> S;
  if constexpr (kStageFirst) {
    stage_rows<L>(p, vec_in, head_base, c_warp, lane, stage);
  } else {
    load_rows<L>(p, vec_in, head_base, c_warp, lane, S);
    if (p.row_groups > 1 && c_warp + ROWS < p.dv)
      stage_rows<L>(p, vec_in, head_base, c_warp + ROWS, lane, stage);
  }
  const HeadGate gate = {p.gate_qwen ? -expf(a_log) : 0.0f, dt_bias};

  const RowSpan span = row_span(p.cu_seqlens, offsets, p.uniform_len, b, p.total_tokens);
  if (p.tail_only && !gdn_row_is_sequential(p, b, span.len)) {
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy may land in shared memory after the warp exits
    return;
  }
  const int m = gdn_captured_prefix(p, capture_count, span.len);
  float* cap = p.capsule != nullptr ? p.capsule + (size_t)b * gdn_capsule_row(p) : nullptr;
  // The decay slot of a head is written by the warp holding row 0; the key slot of a key head by the warp
  // holding row 0 of value head hk * group (docs/op-contract.md#capsule-layout).
  const bool capture_decay = c_warp == 0;
  const bool capture_key = capture_decay && (h % (p.hv / p.hk) == 0);

  if (DECODE_LOOP && span.len == 1) {  // only decode instantiations hold this loop (see the file's head)
    // Decode: the warp's own prologue (its k and q reach the row groups' layout through its stash), and the
    // output and delta pointer steps by ROWS per group. The arithmetic is the general loop's, in the same order.
    if (span.start != guess) {  // first_tok is the guess in decode kernels
      load_token<T, P>(p, span.start, true, h, lane, qb, kb, first);
      v_raw[0] = lane_row_ok ? v_lane[(size_t)span.start * p.v_stride] : from_f32<T>(0.0f);
    }
    TokenValues<P> tv;
    token_values<T, P>(p, first, gate, tv);
    if (m > 0) capture_token<P>(p, tv, 0, h, hk, lane, cap, capture_decay, capture_key);
    // k, q and the per-key decay into the row groups' layout through the warp's stash, with the scalars and the
    // value rows: each group reads them there. Held in registers across the groups, the scalars and values made
    // the loop spill at 128 registers once the start's loads went out together (ptxas, CUDA 13.0, sm_90).
    Token& tok = warp_stash[0];
    stash_put<P>(tok.vec[0], lane, tv.k);
    stash_put<P>(tok.vec[1], lane, tv.q);
    if (p.decay_per_key) key_decay<T, P>(p, span.start, h, lane, tv.alpha, tok.vec[2]);
    if (lane == 0) {
      tok.scalar[0] = tv.alpha;
      tok.scalar[1] = token_beta<T, P>(p, first);
      tok.scalar[2] = tv.qk();
    }
    v_stash[0][lane] = to_f32(v_raw[0]);
    __syncwarp();
    // One pointer per lane, stepped by ROWS per group: the output (output lanes) or the delta-capsule slot
    // (retrieval lanes; null without a capsule). Two, with the capture flag, spilled at 128 registers (ptxas).
    T* og = static_cast<T*>(p.out) + (size_t)span.start * p.hv * p.dv + (size_t)h * p.dv + c_warp + my_row;
    float* dg = cap != nullptr ? cap + gdn_capsule_delta(p) + (size_t)h * p.dv + c_warp + my_row : nullptr;
    char* sp = out_lane ? reinterpret_cast<char*>(og) : reinterpret_cast<char*>(dg);
    const int sstep = ROWS * (out_lane ? (int)sizeof(T) : (int)sizeof(float));
    for (int rg = 0; rg < p.row_groups; ++rg) {
      const int g = rg * ROWS;  // the group's first row, counted from the warp's
      const int c0 = c_warp + g;
      if (c0 >= p.dv) break;
      const bool more = rg + 1 < p.row_groups && c0 + ROWS < p.dv;
      const bool row_ok = c0 + my_row < p.dv;
      const float v = v_stash[0][g + my_row];
      const float alpha_head = tok.scalar[0], beta = tok.scalar[1], qk = tok.scalar[2];
      decay_rows<L>(p, tok.vec[2], lane, alpha_head, S);  // before k and q are read: fewer registers
      float k[KPL], q[KPL];
      stash_get<L>(tok.vec[0], lane, k);
      stash_get<L>(tok.vec[1], lane, q);
      const float x = reduce_rows<L>(S, k, q, lane);
      if (more && rg > 0) stage_rows<L>(p, vec_in, head_base, c0 + ROWS, lane, stage);
      // Retrieval lanes: the delta of their row; output lanes take their row's delta from lane l - kHalf.
      const float u_mine = p.has_delta ? beta * (v - x) : v;
      const float u_pair = __shfl_xor_sync(0xffffffffu, u_mine, kHalf);
      if (first_copy && row_ok && (out_lane || m > 0)) {
        if (out_lane) {
          *reinterpret_cast<T*>(sp) = from_f32<T>(fmaf(u_pair, qk, x));
        } else {
          *reinterpret_cast<float*>(sp) = u_mine;
        }
      }
      update_rows<L, kShift>(S, k, u_mine, u_lane);
      finish_group<L>(p, dk, cap, reinterpret_cast<float*>(sp), m, h, hk, lane, rg == 0 && capture_decay,
                      rg == 0 && capture_key, !out_lane && first_copy && row_ok && cap != nullptr, vec_out, head_base,
                      c0, more, S, stage);
      sp += sstep;
    }
    return;
  }

  // Short rows (decode, verify) run the prologue once, for every row group: up to kBlockTokens tokens in the
  // general kernels, whose block's warps share it: warp w computes tokens w, w + block_warps, ... into the
  // block's stash, so each warp's start waits for one or two tokens' inputs and butterflies, not for every
  // token's, and the output and delta addresses step per chunk (below). Run per warp and row group, chunk by
  // chunk, rows of 8 tokens took 2.8x the time of rows of 4 (H200). The decode kernels keep a prologue per warp
  // and per-token addresses (their rows of more than one token are rare): with the general kernels' code their
  // decode loop's SASS moved, and decode B=32 measured about 1% slower on the H200
  // (docs/design-notes.md#shared-per-token-prologue).
  constexpr bool kSharedPrologue = !DECODE_LOOP;
  const bool one_prologue = span.len <= (kSharedPrologue ? Shared::kBlockTokens : kTokens);
  // Longer rows share each chunk's prologue in the same way where a warp has one row group (block_chunks, below;
  // the plan's choice for such calls): its state then stays in registers from chunk to chunk. With more groups, a
  // warp walks the row once per group, running the prologue itself for each chunk.
  Token* const prologue_stash = kSharedPrologue ? sh.stash.block : warp_stash;
  if (one_prologue && span.len > 0) {
    if (span.start != guess) {
      if (!kSharedPrologue) load_token<T, P>(p, span.start, true, h, lane, qb, kb, first);
#pragma unroll
      for (int t = 0; t < kTokens; ++t)
        v_raw[t] = lane_row_ok && t < span.len ? v_lane[(size_t)(span.start + t) * p.v_stride] : from_f32<T>(0.0f);
    }
    // The warp's value rows of the row's tokens go through its own stash (ordered by the barrier below), each
    // group reading its rows there: held in registers across the groups, they made the verify loop spill at 128
    // registers once the start's loads went out together (ptxas, CUDA 13.0, sm_90).
#pragma unroll
    for (int t = 0; t < kTokens; ++t) v_stash[t][lane] = to_f32(v_raw[t]);
    if (kSharedPrologue && span.len > kTokens) {  // the second chunk's (loaded here: rare, and off the start)
#pragma unroll
      for (int t = kTokens; t < Shared::kBlockTokens; ++t)
        v_stash[t][lane] =
            lane_row_ok && t < span.len ? to_f32(v_lane[(size_t)(span.start + t) * p.v_stride]) : 0.0f;
    }
    if constexpr (kSharedPrologue) {
      const int c_block = blockIdx.x * kRecWarps * ROWS * p.row_groups;
      const int block_warps = rec_block_warps(p, ROWS * p.row_groups);
      // The warp index through a shuffle: the compiler then knows it is the same in every lane, so the
      // prologue's butterflies (whose trip count depends on it) need no fallback for a diverged warp (ptxas).
      const int w = __shfl_sync(0xffffffffu, warp, 0);  // this warp's first token of the row
      if (w < span.len && span.start + w != first_tok)
        load_token<T, P>(p, span.start + w, true, h, lane, qb, kb, first);
      // The capsule's decay and key slots: written by whichever warp computes the token, in the block that holds
      // value row 0 (of a head of the key head's group, for the key).
      token_prologue<T, P>(p, prologue_stash, first, span.start, 0, w, block_warps, span.len, h, hk, gate, lane, qb,
                           kb, m, cap, c_block == 0, c_block == 0 && h % (p.hv / p.hk) == 0);
      // Every warp of the block that holds rows: the stash (lanes' vectors, lane 0's scalars) is complete.
      named_barrier_sync(1, 32 * block_warps);
    } else {
      token_prologue<T, P>(p, warp_stash, first, span.start, 0, 0, 1, span.len, h, hk, gate, lane, qb, kb, m, cap,
                           capture_decay, capture_key);
      __syncwarp();  // the scalars lane 0 wrote are read by every lane
    }
  }

  const size_t tok_stride = (size_t)p.hv * p.dv;  // between one token's outputs (and delta slots) and the next's
  if constexpr (kStageFirst) unstage_rows<L>(stage, lane, S);
  for (int rg = 0; rg < p.row_groups; ++rg) {
    const int c0 = c_warp + rg * ROWS;
    if (c0 >= p.dv) break;
    const bool more = rg + 1 < p.row_groups && c0 + ROWS < p.dv;
    const bool row_ok = c0 + my_row < p.dv;
    // The next group's state is requested after this group's first decay (kStageFirst: the first group's too;
    // else it went out at the start).
    bool staged = !(more && (kStageFirst || rg > 0));
    // This lane's output element and delta-capsule slot of the row's first token (general kernels; decode
    // kernels: token 0's, indexed per token, see kSharedPrologue).
    T* ob = static_cast<T*>(p.out) + (size_t)h * p.dv + c0 + my_row;
    if (kSharedPrologue) ob += (size_t)span.start * tok_stride;
    float* delta_cap = cap != nullptr ? cap + gdn_capsule_delta(p) + (size_t)h * p.dv + c0 + my_row : nullptr;
    float* db = delta_cap;
    // General kernels: one store per lane and token, through a byte pointer stepped by a token (Hv Dv elements):
    // the output (output lanes) or the delta-capsule slot (retrieval lanes). A 64-bit token * Hv * Dv offset per
    // store, on two branches, cost about 9 more instructions per token (SASS, sm_90).
    char* sp = out_lane ? reinterpret_cast<char*>(ob) : reinterpret_cast<char*>(db);
    const size_t sstep = tok_stride * (out_lane ? sizeof(T) : sizeof(float));

    for (int t0 = 0; t0 < span.len; t0 += kTokens) {
      const int n = min(kTokens, span.len - t0);
      // Tested here, not held across the loop: held, it made ptxas spill 12 B in the r8 general kernels (CUDA 13.0,
      // sm_90), and verify 4 measured 2-5% slower at B = 32 (H200; docs/design-notes.md#shared-per-token-prologue).
      const bool block_chunks = kSharedPrologue && !one_prologue && p.row_groups == 1;
      // The chunk's first slot in the stashes: rows of one prologue hold every token; longer rows the chunk's, in
      // the block's stash alternately in its two halves (t0 is a multiple of kTokens).
      const int c = one_prologue ? t0 : (block_chunks ? t0 & kTokens : 0);
      if (!one_prologue) {
        if constexpr (kSharedPrologue) {
          // With block_chunks, warp w computes the chunk's token w (and w + block warps, ...) into the half of the
          // block's stash that the previous chunk does not use: that half's last readers (of the chunk before)
          // are past the previous chunk's barrier. Otherwise the warp computes every token into its own stash.
          // One code path serves both: a path for each spilled 16 B in the r8 general kernels (ptxas, CUDA 13.0,
          // sm_90).
          const int step = block_chunks ? rec_block_warps(p, ROWS) : 1;
          const int first = block_chunks ? __shfl_sync(0xffffffffu, warp, 0) : 0;
          const bool block_row0 = block_chunks && blockIdx.x == 0;  // the block holds value row 0
          if (!block_chunks) __syncwarp();  // the previous chunk's stash reads are done
          TokenInputs<T, P> cur;
          load_token<T, P>(p, span.start + t0 + first, first < n, h, lane, qb, kb, cur);
          // The chunk's value rows of the warp (lane l: row c_warp + l), as the start does for short rows. Written
          // out here and at the start: one helper for the three loads changed every general kernel's SASS.
#pragma unroll
          for (int t = 0; t < kTokens; ++t)
            v_stash[c + t][lane] =
                lane_row_ok && t < n ? to_f32(v_lane[(size_t)(span.start + t0 + t) * p.v_stride]) : 0.0f;
          token_prologue<T, P>(p, (block_chunks ? prologue_stash : warp_stash) + c, cur, span.start, t0, first, step,
                               n, h, hk, gate, lane, qb, kb, m, cap, block_row0 || (capture_decay && rg == 0),
                               block_chunks ? block_row0 && h % (p.hv / p.hk) == 0 : capture_key && rg == 0);
          if (block_chunks) {
            named_barrier_sync(1, 32 * step);
          } else {
            __syncwarp();  // the scalars lane 0 wrote, and the value rows, are read by every lane
          }
        } else {  // the decode kernels' rows of more than one token: kept apart, so their SASS stays as measured
          __syncwarp();  // the previous chunk's stash reads are done
          TokenInputs<T, P> cur;
          load_token<T, P>(p, span.start + t0, true, h, lane, qb, kb, cur);
#pragma unroll
          for (int t = 0; t < kTokens; ++t)
            v_stash[t][lane] =
                lane_row_ok && t < n ? to_f32(v_lane[(size_t)(span.start + t0 + t) * p.v_stride]) : 0.0f;
          token_prologue<T, P>(p, warp_stash, cur, span.start, t0, 0, 1, n, h, hk, gate, lane, qb, kb, m, cap,
                               capture_decay && rg == 0, capture_key && rg == 0);
          __syncwarp();  // the scalars lane 0 wrote, and the value rows, are read by every lane
        }
      }
      // This lane's value row of each token, read in the token's step: gathered into registers here, with a
      // branch per token, the group's start took about 120 instructions (docs/design-notes.md#first-row-group-staged).
      const float* v_row = &v_stash[c][rg * ROWS + my_row];
      const Token* toks = (one_prologue || block_chunks ? prologue_stash : warp_stash) + c;

#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t >= n) break;
        const int tok = span.start + t0 + t;
        decay_rows<L>(p, toks[t].vec[2], lane, toks[t].scalar[0], S);  // before k, q: fewer registers
        // Every state register is an operand of the decay, so the stage has been read: the next group's copy can
        // go out. Here rather than after the reduction, it is in flight for one reduction longer: verify with
        // capture at B = 32 measured 1-4% faster (B = 128 level to 1%; H200), and ptxas needed fewer registers at
        // R = 8 (124 -> 115, CUDA 13.0, sm_90a; docs/design-notes.md#next-copy-after-the-first-decay).
        if (!staged) {
          stage_rows<L>(p, vec_in, head_base, c0 + ROWS, lane, stage);
          staged = true;
        }
        float k[KPL], q[KPL];
        stash_get<L>(toks[t].vec[0], lane, k);
        stash_get<L>(toks[t].vec[1], lane, q);
        const float beta = toks[t].scalar[1];
        const float qk = toks[t].scalar[2];
        const float x = reduce_rows<L>(S, k, q, lane);
        // Retrieval lanes: the delta of their row; output lanes take their row's delta from lane l - kHalf.
        const float v = v_row[t * 32];
        const float u_mine = p.has_delta ? beta * (v - x) : v;
        const float u_pair = __shfl_xor_sync(0xffffffffu, u_mine, kHalf);
        if constexpr (kSharedPrologue) {
          if (first_copy && row_ok && (out_lane || t0 + t < m)) {
            if (out_lane) {
              *reinterpret_cast<T*>(sp) = from_f32<T>(fmaf(u_pair, qk, x));
            } else {
              __stcs(reinterpret_cast<float*>(sp), u_mine);  // a delta slot (capture_token says why streaming)
            }
          }
          sp += sstep;
        } else if (first_copy && row_ok) {
          if (out_lane) {
            ob[(size_t)tok * p.hv * p.dv] = from_f32<T>(fmaf(u_pair, qk, x));
          } else if (t0 + t < m) {
            db[(size_t)(t0 + t) * p.hv * p.dv] = u_mine;
          }
        }
        update_rows<L, kShift>(S, k, u_mine, u_lane);
      }
    }
    if (!staged) stage_rows<L>(p, vec_in, head_base, c0 + ROWS, lane, stage);  // no tokens
    if (kSharedPrologue)  // recomputed: held across the tokens it cost registers (spills at K = 128, ptxas)
      delta_cap = cap != nullptr ? cap + gdn_capsule_delta(p) + (size_t)h * p.dv + c0 + my_row : nullptr;
    finish_group<L>(p, dk, cap, delta_cap, m, h, hk, lane, rg == 0 && capture_decay, rg == 0 && capture_key,
                    !out_lane && first_copy && row_ok, vec_out, head_base, c0, more, S, stage);
  }
}

}  // namespace ohk
// Instantiations: gdn_recurrent_<type>_k<max key size>_r<value rows per warp>[_decode]; the planner picks one
// (cuda/launch_plan.cc) from launch_config.h's tables, which the static_asserts below hold to this list.
#define OHK_GDN_RECURRENT_KERNEL(NAME, T, NPL, ROWS, DECODE_LOOP)                                   \
  extern "C" __global__ void __launch_bounds__(ohk::kRecWarps * 32, ohk::rec_min_blocks(NPL, ROWS))  \
      NAME(const GdnParams p) {                                                                    \
    ohk::wait_for_inputs();                                                                        \
    ohk::gdn_recurrent<T, NPL, ROWS, DECODE_LOOP>(p);                                              \
  }
#define OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, ROWS) \
  OHK_GDN_RECURRENT_KERNEL(gdn_recurrent_##TNAME##_k##KMAX##_r##ROWS, T, NPL, ROWS, false)
#define OHK_GDN_RECURRENT_DECODE(TNAME, T, NPL, KMAX, ROWS) \
  OHK_GDN_RECURRENT_KERNEL(gdn_recurrent_##TNAME##_k##KMAX##_r##ROWS##_decode, T, NPL, ROWS, true)

#define OHK_GDN_RECURRENT_ROWS(TNAME, T, NPL, KMAX) \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 1)         \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 2)         \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 4)         \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 8)

#define OHK_GDN_RECURRENT_ALL_K(TNAME, T)  \
  OHK_GDN_RECURRENT_ROWS(TNAME, T, 1, 32)  \
  OHK_GDN_RECURRENT_ROWS(TNAME, T, 2, 64)  \
  OHK_GDN_RECURRENT_ROWS(TNAME, T, 4, 128) \
  OHK_GDN_RECURRENT(TNAME, T, 8, 256, 2)   \
  OHK_GDN_RECURRENT(TNAME, T, 8, 256, 4)   \
  OHK_GDN_RECURRENT(TNAME, T, 16, 512, 1)  \
  OHK_GDN_RECURRENT(TNAME, T, 16, 512, 2)

OHK_GDN_RECURRENT_ALL_K(f32, float)
OHK_GDN_RECURRENT_ALL_K(f16, __half)
OHK_GDN_RECURRENT_ALL_K(bf16, __nv_bfloat16)
// Decode instantiations only where the real models are (launch_config.h kRecDecodeTypes, kRecDecodeRows: K = 128,
// the plan's two rows per warp): each adds a second loop, and for all shapes they grew the image by 66%.
OHK_GDN_RECURRENT_DECODE(f16, __half, 4, 128, 4)
OHK_GDN_RECURRENT_DECODE(f16, __half, 4, 128, 8)
OHK_GDN_RECURRENT_DECODE(bf16, __nv_bfloat16, 4, 128, 4)
OHK_GDN_RECURRENT_DECODE(bf16, __nv_bfloat16, 4, 128, 8)

// The planner sizes its calls' row groups by each key size's tokens per block pass (launch_config.h).
namespace ohk {
__host__ __device__ constexpr bool block_tokens_are_the_planners() {
  for (int i = 0; i < launch_config::kRecKeyCount; ++i)
    if (launch_config::kRecBlockTokens[i] != 2 * rec_chunk_tokens(launch_config::kRecKeySizes[i] / 32)) return false;
  return true;
}
static_assert(block_tokens_are_the_planners(), "launch_config.h kRecBlockTokens: RecShared::kBlockTokens per key size");
}  // namespace ohk
