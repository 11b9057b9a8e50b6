// GatedDeltaNet sequential engine (spec/ops.md §2.6, §2.8): decode, verify, capture, and every shape the
// chunked engine does not serve. One warp per (request, value head, ROWS value rows); lanes span the key
// axis (NPL consecutive key columns per lane), so a row's dot products are warp reductions and the state
// of the warp's rows stays in registers across the request's tokens.
//
// Per token a prologue that does not depend on the state (normalised q and k, decay, beta, q.k) runs once for
// all row groups, into a stash in shared memory: in the general kernels, for rows of one chunk (verify), the
// block's warps share it, one token each; otherwise each warp runs its own (chunk by chunk for longer rows).
// Each row group then needs one reduction per token: with S' = S * decay, the retrieval S'.k and the pre-update
// output S'.q reduce together, and the output follows as S'.q + u (k.q), because the update adds k u.
//
// The decode instantiations (DECODE_LOOP) give rows of one token a loop of their own: the token's values stay
// in registers (no stash) and the chunk bookkeeping goes. In one kernel with the general loop that made ptxas
// recompute predicates and addresses inside the verify loop (BENCHMARKS.md), so the general instantiations
// leave it out and plan.py picks a decode one only for calls of at most one token per row. The decode loop
// runs the general loop's operations in the same order: a row's bits do not depend on the choice.
//
// State rounding is the CUDA rule of spec/ops.md §2.10: S' = __fmul_rn(S, decay), S = __fmaf_rn(key, delta, S').
// The capsule stores exactly the decay, key and delta used here, so a replay is bit-exact.
#include "common.cuh"

namespace ohk {

constexpr int kRecWarps = 4;  // warps per block; value rows per warp (ROWS) is a template parameter
// Resident blocks per SM the register allocation must allow: decode is latency-bound, so warps in flight
// matter; the bounds are the highest at which ptxas (CUDA 13.0, sm_90) does not spill.
__host__ __device__ constexpr int rec_min_blocks(int npl, int rows) {
  if (npl >= 8) return 1;
  if (rows == 8) return npl == 1 ? 5 : 4;
  if (rows == 4) return npl == 1 ? 6 : 5;
  return npl == 4 && rows == 1 ? 5 : 6;
}

// State rows are touched once per call: streaming (evict-first) loads and stores keep them from pushing the
// inputs and offsets, which each call's dependent chain waits on, out of L2 (measured: decode and verify
// 3-20% faster on the H200, BENCHMARKS.md).
template <int NPL>
__device__ __forceinline__ void load_state_row(const float* row, int lane, int dk, float (&s)[NPL]) {
  const int r0 = lane * NPL;
  if constexpr (NPL % 4 == 0) {
    if (dk == 32 * NPL && (reinterpret_cast<size_t>(row) & 15) == 0) {
#pragma unroll
      for (int i = 0; i < NPL; i += 4) {
        const float4 x = __ldcs(reinterpret_cast<const float4*>(row + r0 + i));
        s[i] = x.x; s[i + 1] = x.y; s[i + 2] = x.z; s[i + 3] = x.w;
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < NPL; ++i) s[i] = (r0 + i < dk) ? row[r0 + i] : 0.0f;
}

template <int NPL>
__device__ __forceinline__ void store_state_row(float* row, int lane, int dk, const float (&s)[NPL]) {
  const int r0 = lane * NPL;
  if constexpr (NPL % 4 == 0) {
    if (dk == 32 * NPL && (reinterpret_cast<size_t>(row) & 15) == 0) {
#pragma unroll
      for (int i = 0; i < NPL; i += 4)
        __stcs(reinterpret_cast<float4*>(row + r0 + i), make_float4(s[i], s[i + 1], s[i + 2], s[i + 3]));
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < NPL; ++i)
    if (r0 + i < dk) row[r0 + i] = s[i];
}

template <typename T, int NPL>
__device__ __forceinline__ void load_head(const T* base, int lane, int dk, float (&x)[NPL]) {
  const int r0 = lane * NPL;
  if constexpr (NPL % 4 == 0 && sizeof(T) == 2) {
    if (dk == 32 * NPL && (reinterpret_cast<size_t>(base) & 7) == 0) {  // 8-byte loads of 4 halves
#pragma unroll
      for (int i = 0; i < NPL; i += 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(base + r0 + i);
        const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
        for (int j = 0; j < 4; ++j) x[i + j] = to_f32(e[j]);
      }
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < NPL; ++i) x[i] = (r0 + i < dk) ? to_f32(base[r0 + i]) : 0.0f;
}

// Whole 16-byte key rows (dk == 32 NPL, 16-byte aligned base, so every row is aligned too): tested once per
// warp; a row group that lies inside the head then loads and stores through one base address, untested per row.
template <int NPL>
__device__ __forceinline__ bool vector_rows(const float* base, int dk) {
  return NPL % 4 == 0 && dk == 32 * NPL && base != nullptr && (reinterpret_cast<size_t>(base) & 15) == 0;
}

template <int NPL, int ROWS>
__device__ __forceinline__ void load_rows(const GdnParams& p, bool vec, size_t head_base, int c0, int lane,
                                          float (&S)[ROWS][NPL]) {
  if constexpr (NPL % 4 == 0) {
    if (vec && c0 + ROWS <= p.dv) {
      constexpr int kDk = 32 * NPL;
      const float* base = p.state_in + (head_base + c0) * kDk + lane * NPL;
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
#pragma unroll
        for (int i = 0; i < NPL; i += 4) {
          const float4 x = __ldcs(reinterpret_cast<const float4*>(base + j * kDk + i));
          S[j][i] = x.x; S[j][i + 1] = x.y; S[j][i + 2] = x.z; S[j][i + 3] = x.w;
        }
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < ROWS; ++j) {
    if (p.state_in != nullptr && c0 + j < p.dv) {
      load_state_row<NPL>(p.state_in + (head_base + c0 + j) * p.dk, lane, p.dk, S[j]);
    } else {
#pragma unroll
      for (int i = 0; i < NPL; ++i) S[j][i] = 0.0f;
    }
  }
}

template <int NPL, int ROWS>
__device__ __forceinline__ void store_rows(const GdnParams& p, bool vec, size_t head_base, int c0, int lane,
                                           const float (&S)[ROWS][NPL]) {
  if constexpr (NPL % 4 == 0) {
    if (vec && c0 + ROWS <= p.dv) {
      constexpr int kDk = 32 * NPL;
      float* base = p.state_out + (head_base + c0) * kDk + lane * NPL;
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
#pragma unroll
        for (int i = 0; i < NPL; i += 4)
          __stcs(reinterpret_cast<float4*>(base + j * kDk + i),
                 make_float4(S[j][i], S[j][i + 1], S[j][i + 2], S[j][i + 3]));
      return;
    }
  }
#pragma unroll
  for (int j = 0; j < ROWS; ++j)
    if (c0 + j < p.dv) store_state_row<NPL>(p.state_out + (head_base + c0 + j) * p.dk, lane, p.dk, S[j]);
}

template <int NPL>
struct RecVec {
  static constexpr int kVec = NPL % 4 == 0 ? 4 : NPL;  // floats per shared-memory access
};

// A warp's per-token values that do not depend on the state, for up to kTokens tokens. Each lane reads back
// only what it wrote (its own key columns), laid out so a warp's access is one contiguous span per vector.
template <int NPL>
struct RecStash {
  // Tokens per prologue: 4 (a verify step of 4 tokens runs it once). More made the small-key instantiations
  // spill (each row group holds the chunk's values in registers); wide keys take fewer, so the vectors stay
  // within 4 KB per warp.
  static constexpr int kTokens = NPL >= 16 ? 1 : (NPL >= 8 ? 2 : 4);
  static constexpr int kVec = RecVec<NPL>::kVec;
  // [token][kept, sent][part][lane][element]: lanes 0-15 keep k and send q in the reduction's first step,
  // lanes 16-31 the reverse (transposed_warp_sum_kept), so each lane stores the two in its own order.
  float vec[kTokens][2][NPL / kVec][32][kVec];
  float scalar[kTokens][4];                                 // decay (scalar rules), beta, q.k
};

template <int NPL>
__device__ __forceinline__ void stash_put(float (&dst)[NPL / RecStash<NPL>::kVec][32][RecStash<NPL>::kVec],
                                          int lane, const float (&x)[NPL]) {
  constexpr int V = RecStash<NPL>::kVec;
#pragma unroll
  for (int c = 0; c < NPL / V; ++c) {
    if constexpr (V == 4) {
      *reinterpret_cast<float4*>(dst[c][lane]) = make_float4(x[4 * c], x[4 * c + 1], x[4 * c + 2], x[4 * c + 3]);
    } else if constexpr (V == 2) {
      *reinterpret_cast<float2*>(dst[c][lane]) = make_float2(x[2 * c], x[2 * c + 1]);
    } else {
      dst[c][lane][0] = x[c];
    }
  }
}

template <int NPL>
__device__ __forceinline__ void stash_get(const float (&src)[NPL / RecStash<NPL>::kVec][32][RecStash<NPL>::kVec],
                                          int lane, float (&x)[NPL]) {
  constexpr int V = RecStash<NPL>::kVec;
#pragma unroll
  for (int c = 0; c < NPL / V; ++c) {
    if constexpr (V == 4) {
      const float4 y = *reinterpret_cast<const float4*>(src[c][lane]);
      x[4 * c] = y.x; x[4 * c + 1] = y.y; x[4 * c + 2] = y.z; x[4 * c + 3] = y.w;
    } else if constexpr (V == 2) {
      const float2 y = *reinterpret_cast<const float2*>(src[c][lane]);
      x[2 * c] = y.x; x[2 * c + 1] = y.y;
    } else {
      x[c] = src[c][lane][0];
    }
  }
}

// The next row group's state goes through a per-warp shared-memory stage, copied by cp.async: its completion
// is a cp.async group, not a register scoreboard. Prefetched into registers, it was waited for inside the
// current group (ptxas, CUDA 13.0, sm_90: at a branch at the group's start in the general loop, and through a
// scoreboard shared with the group's own loads and shuffles in the decode loop), so every group exposed one
// full memory latency (Nsight Compute, BENCHMARKS.md session 12).
__device__ __forceinline__ unsigned long long l2_evict_first_policy() {
  unsigned long long policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// 16 bytes global -> shared, evict-first in L2 like the state's other accesses (__ldcs, __stcs).
__device__ __forceinline__ void stage_copy16(float* dst, const float* src, unsigned long long policy) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "l"(policy)
               : "memory");
}

// One row group's state, [row][part][lane][element]: each lane reads back only what it copied, so the stage
// needs no warp barrier.
template <int NPL, int ROWS>
using RecStage = float[ROWS][NPL / RecVec<NPL>::kVec][32][RecVec<NPL>::kVec];

// Requests the rows [c0, c0 + ROWS) into the stage (one cp.async group). Partial groups and rows that are not
// whole 16-byte vectors are loaded here and written to the stage (rare shapes; the same values).
template <int NPL, int ROWS>
__device__ __forceinline__ void stage_rows(const GdnParams& p, bool vec, size_t head_base, int c0, int lane,
                                           RecStage<NPL, ROWS>& stage, unsigned long long policy) {
  bool copied = false;
  if constexpr (NPL % 4 == 0) {
    if (vec && c0 + ROWS <= p.dv) {
      constexpr int kDk = 32 * NPL;
      const float* base = p.state_in + (head_base + c0) * kDk + lane * NPL;
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
#pragma unroll
        for (int c = 0; c < NPL / 4; ++c) stage_copy16(stage[j][c][lane], base + j * kDk + 4 * c, policy);
      copied = true;
    }
  }
  if (!copied) {
    float S[ROWS][NPL];
    load_rows<NPL, ROWS>(p, false, head_base, c0, lane, S);
#pragma unroll
    for (int j = 0; j < ROWS; ++j) stash_put<NPL>(stage[j], lane, S[j]);
  }
  cp_async_commit();
}

// The staged rows into registers, once their copies have landed.
template <int NPL, int ROWS>
__device__ __forceinline__ void unstage_rows(const RecStage<NPL, ROWS>& stage, int lane, float (&S)[ROWS][NPL]) {
  cp_async_wait<0>();
#pragma unroll
  for (int j = 0; j < ROWS; ++j) stash_get<NPL>(stage[j], lane, S[j]);
}

// One token's raw inputs for the prologue, loaded a token ahead.
template <int NPL>
struct TokenInputs {
  float q[NPL], k[NPL];
  float decay;  // raw decay input (scalar-decay rules)
  float beta;   // raw beta input
};

template <typename T, int NPL>
__device__ __forceinline__ void load_token(const GdnParams& p, int tok, int h, int lane, const T* qb, const T* kb,
                                           TokenInputs<NPL>& in) {
  load_head<T, NPL>(qb + (size_t)tok * p.q_stride, lane, p.dk, in.q);
  load_head<T, NPL>(kb + (size_t)tok * p.k_stride, lane, p.dk, in.k);
  in.decay = (p.has_decay && !p.decay_per_key) ? p.decay[(size_t)tok * p.hv + h] : 0.0f;
  in.beta = p.has_delta ? p.beta[(size_t)tok * p.hv + h] : 0.0f;
}

// Sum over the warp of N values per lane (N a power of two <= 32) in N - 1 + 5 - log2(N) shuffles: each
// halving step (lane offset OFF) sends the half a lane does not keep. Lane l ends with value
// l >> (5 - log2 N), summed in the same pairing order as a full butterfly, so the result does not depend on N.
template <int N, int OFF = 16>
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

// The same sum when the caller already holds, in x[0, N/2), the values this lane keeps in the first step
// (lane offset 16) and in x[N/2, N) those it sends: that step then needs no selects.
template <int N>
__device__ __forceinline__ float transposed_warp_sum_kept(float* x, int lane) {
#pragma unroll
  for (int j = 0; j < N / 2; ++j) x[j] += __shfl_xor_sync(0xffffffffu, x[j + N / 2], 16);
  return transposed_warp_sum<N / 2, 8>(x, lane);
}

__host__ __device__ constexpr int log2_int(int n) { return n <= 1 ? 0 : 1 + log2_int(n / 2); }

// Per-head gate constants (qwen: g = -exp(a_log) * softplus(x + dt_bias)).
struct HeadGate {
  float neg_a, dt_bias;
};

// One token's values that do not depend on the state: normalised k and q, the head's decay, beta and q.k.
// The scalars come out of butterfly sums, so every lane holds the same bits.
template <int NPL>
struct TokenValues {
  float k[NPL], q[NPL];
  float alpha;
  // q.k = sqk * inv_k * q_scale, and beta (token_beta), are formed where they are used: the prologue forms
  // them in lane 0 only; formed in every lane here, they changed the general loop's code (ptxas, sm_90).
  float sqk, inv_k, q_scale;
  __device__ __forceinline__ float qk() const { return sqk * inv_k * q_scale; }
};

// The token's beta (delta rules), from its raw input.
template <int NPL>
__device__ __forceinline__ float token_beta(const GdnParams& p, const TokenInputs<NPL>& cur) {
  return p.has_delta ? (p.beta_sigmoid ? 1.0f / (1.0f + expf(-cur.beta)) : cur.beta) : 1.0f;
}

template <int NPL>
__device__ __forceinline__ void token_values(const GdnParams& p, const TokenInputs<NPL>& cur, HeadGate gate,
                                             TokenValues<NPL>& tv) {
  float sq = 0.0f, sk = 0.0f, sqk = 0.0f;
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    sq = fmaf(cur.q[i], cur.q[i], sq);
    sk = fmaf(cur.k[i], cur.k[i], sk);
    sqk = fmaf(cur.q[i], cur.k[i], sqk);
  }
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    sq += __shfl_xor_sync(0xffffffffu, sq, off);
    sk += __shfl_xor_sync(0xffffffffu, sk, off);
    sqk += __shfl_xor_sync(0xffffffffu, sqk, off);
  }
  const float inv_k = p.l2norm ? rsqrtf(sk + 1e-12f) : 1.0f;
  const float q_scale = p.scale * (p.l2norm ? rsqrtf(sq + 1e-12f) : 1.0f);
#pragma unroll
  for (int i = 0; i < NPL; ++i) {
    tv.k[i] = p.l2norm ? cur.k[i] * inv_k : cur.k[i];
    tv.q[i] = cur.q[i] * q_scale;
  }
  tv.alpha = 1.0f;
  if (p.has_decay && !p.decay_per_key) {
    float g = cur.decay;
    if (p.gate_qwen) {
      const float z = g + gate.dt_bias;
      g = gate.neg_a * (z > 20.0f ? z : log1pf(expf(z)));
    }
    tv.alpha = expf(g);
  }
  tv.sqk = sqk;
  tv.inv_k = inv_k;
  tv.q_scale = q_scale;
}

// The captured decay and key of the token in slot `slot` (spec/ops.md §2.9).
template <int NPL>
__device__ __forceinline__ void capture_token(const GdnParams& p, const TokenValues<NPL>& tv, int slot, int h,
                                              int hk, int lane, float* cap, bool capture_decay, bool capture_key) {
  if (capture_decay && lane == 0) cap[(size_t)slot * p.hv + h] = tv.alpha;
  if (capture_key) {
    float* key = cap + gdn_capsule_key(p) + ((size_t)slot * p.hk + hk) * p.dk;
#pragma unroll
    for (int i = 0; i < NPL; ++i)
      if (lane * NPL + i < p.dk) key[lane * NPL + i] = tv.k[i];
  }
}

// The prologue of tokens t0 + t, t = first, first + step, ... < n (n <= kTokens) of a row into a stash; `cur`
// holds token t0 + first's inputs on entry. A warp alone runs every token (first 0, step 1); the warps of a
// block share one stash for a row of one chunk (first = warp, step = its warps). With `capture_decay` /
// `capture_key` (the warps holding value row 0 of the head, or of the key head's group) it also writes the
// captured decay and key slots. The caller orders the stash writes before their reads (warp or block barrier).
template <typename T, int NPL>
__device__ __forceinline__ void token_prologue(const GdnParams& p, RecStash<NPL>& st, TokenInputs<NPL> cur,
                                               int start, int t0, int first, int step, int n, int h, int hk,
                                               HeadGate gate, int lane, const T* qb, const T* kb, int m, float* cap,
                                               bool capture_decay, bool capture_key) {
  TokenInputs<NPL> nxt;
  for (int t = first; t < n; t += step) {
    if (t + step < n) load_token<T, NPL>(p, start + t0 + t + step, h, lane, qb, kb, nxt);
    TokenValues<NPL> tv;
    token_values<NPL>(p, cur, gate, tv);
    stash_put<NPL>(st.vec[t][lane >> 4], lane, tv.k);
    stash_put<NPL>(st.vec[t][1 - (lane >> 4)], lane, tv.q);
    if (lane == 0) {
      st.scalar[t][0] = tv.alpha;
      st.scalar[t][1] = token_beta<NPL>(p, cur);
      st.scalar[t][2] = tv.qk();
    }
    if (t0 + t < m) capture_token<NPL>(p, tv, t0 + t, h, hk, lane, cap, capture_decay, capture_key);
    if (t + step < n) cur = nxt;
  }
}

// The decay of the token at `tok` per key column (per-key rules) or the head's (scalar rules). `dk` is the
// kernel's copy of p.dk: reading p.dk here (and in finish_group) changed the general loop's code (ptxas, sm_90).
template <int NPL>
__device__ __forceinline__ void token_decay(const GdnParams& p, int dk, int tok, int h, int lane, float alpha_head,
                                            float (&alpha)[NPL]) {
  if (p.decay_per_key) {  // one uniform branch: the per-element test cost ~8 instructions per key column
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      const int r = lane * NPL + i;
      alpha[i] = r < dk ? expf(gdn_log_gate(p, tok, h, r)) : alpha_head;
    }
  } else {
#pragma unroll
    for (int i = 0; i < NPL; ++i) alpha[i] = alpha_head;
  }
}

// Decays a group's rows (S' = S * decay) and reduces S'.k and S'.q of every row together; returns the value this
// lane holds afterwards (gdn_recurrent's kShift). `kept` / `sent`: k and q in this lane's order (RecStash::vec).
template <int NPL, int ROWS>
__device__ __forceinline__ float decay_and_reduce(float (&S)[ROWS][NPL], const float (&alpha)[NPL],
                                                  const float (&kept)[NPL], const float (&sent)[NPL], int lane) {
  // red[j] is what this lane keeps of row j (S'.k in lanes 0-15, S'.q in 16-31), red[ROWS + j] the other.
  float red[2 * ROWS];
#pragma unroll
  for (int j = 0; j < ROWS; ++j) {
    float dot_kept = 0.0f, dot_sent = 0.0f;
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      S[j][i] = __fmul_rn(S[j][i], alpha[i]);
      dot_kept = fmaf(S[j][i], kept[i], dot_kept);
      dot_sent = fmaf(S[j][i], sent[i], dot_sent);
    }
    red[j] = dot_kept;
    red[ROWS + j] = dot_sent;
  }
  return transposed_warp_sum_kept<2 * ROWS>(red, lane);
}

// S += k u for every row of the group; row j's delta u is held by lane j << kShift.
template <int NPL, int ROWS, int kShift>
__device__ __forceinline__ void update_rows(float (&S)[ROWS][NPL], const float (&k)[NPL], float u_mine) {
#pragma unroll
  for (int j = 0; j < ROWS; ++j) {
    const float u = __shfl_sync(0xffffffffu, u_mine, j << kShift);
#pragma unroll
    for (int i = 0; i < NPL; ++i) S[j][i] = __fmaf_rn(k[i], u, S[j][i]);
  }
}

// After a group's tokens: capsule slots beyond the captured prefix are zero (project rule, spec/ops.md §2.9;
// the decay and key slots by the first group of the warps that capture them, the delta slots by every group),
// the group's state goes out, and the staged next group moves in. `dk`: as in token_decay.
template <int NPL, int ROWS>
__device__ __forceinline__ void finish_group(const GdnParams& p, int dk, float* cap, float* delta_cap, int m, int h,
                                             int hk, int lane, bool zero_decay, bool zero_key, bool zero_delta,
                                             bool vec_out, size_t head_base, int c0, bool more, float (&S)[ROWS][NPL],
                                             const RecStage<NPL, ROWS>& next) {
  if (cap != nullptr) {
    for (int t = m; t < p.capacity; ++t) {
      if (zero_decay && lane == 0) cap[(size_t)t * p.hv + h] = 0.0f;
      if (zero_key)
        for (int r = lane; r < dk; r += 32) cap[gdn_capsule_key(p) + ((size_t)t * p.hk + hk) * dk + r] = 0.0f;
      if (zero_delta) delta_cap[(size_t)t * p.hv * p.dv] = 0.0f;
    }
  }
  if (p.state_out != nullptr) store_rows<NPL, ROWS>(p, vec_out, head_base, c0, lane, S);
  if (more) unstage_rows<NPL, ROWS>(next, lane, S);
}

// A warp serves p.row_groups consecutive groups of ROWS value rows of one (request, head), staging the next
// group's state and values while it computes the current one, so its memory traffic does not wait on its
// arithmetic.
// Everything it computes for a value row is independent of ROWS and row_groups (the reduction pairs lanes in
// one fixed order), so a row's result does not depend on the launch shape or the batch.
template <typename T, int NPL, int ROWS, bool DECODE_LOOP>
__device__ __forceinline__ void gdn_recurrent(const GdnParams& p) {
  using Stash = RecStash<NPL>;
  constexpr int kTokens = Stash::kTokens;
  // After the reduction of 2 ROWS values lane l holds value l >> kShift: retrieval S'.k of row (l >> kShift)
  // in lanes 0-15, output S'.q of row (l >> kShift) - ROWS in lanes 16-31.
  constexpr int kShift = 5 - log2_int(2 * ROWS);
  __shared__ Stash stash_all[kRecWarps];
  // One stage per warp: the next group's copies go out after the current group's first reduction, which has
  // consumed the rows read from it (a second buffer would exceed the 48 KB of static shared memory at R = 8).
  __shared__ RecStage<NPL, ROWS> stage_all[kRecWarps];

  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int c_warp = (blockIdx.x * kRecWarps + warp) * ROWS * p.row_groups;
  // A warp without rows leaves at once; the one barrier (rows of one chunk, below) counts the others.
  if (c_warp >= p.dv) return;
  const int dk = p.dk;
  Stash& stash = stash_all[warp];
  RecStage<NPL, ROWS>& stage = stage_all[warp];
  const int slot = lane >> kShift;                            // which reduced value this lane holds
  const bool first_copy = (lane & ((1 << kShift) - 1)) == 0;  // the lane that writes it
  const int my_row = slot % ROWS;
  const bool vec_in = vector_rows<NPL>(p.state_in, dk);
  const bool vec_out = vector_rows<NPL>(p.state_out, dk);

  // Every load whose address does not depend on the offsets goes out before them: the first two groups'
  // state, the gate constants, and the inputs of the token this warp's prologue starts with if row b starts
  // at b * T / B (every row of the same length): that token for decode, and token `warp` of the row when rows
  // may be longer (the block's warps share the prologue of rows of one chunk, one token each). They are loaded
  // again only when the offsets say otherwise.
  // The guess comes first: its 64-bit division is a call, before which ptxas waits for every load in flight.
  const int guess = p.total_tokens > 0 ? (int)((long long)b * p.total_tokens / p.batch) : -1;
  const size_t head_base = ((size_t)b * p.hv + h) * p.dv;
  const unsigned long long evict_first = l2_evict_first_policy();
  float S[ROWS][NPL];
  load_rows<NPL, ROWS>(p, vec_in, head_base, c_warp, lane, S);
  if (p.row_groups > 1 && c_warp + ROWS < p.dv)
    stage_rows<NPL, ROWS>(p, vec_in, head_base, c_warp + ROWS, lane, stage, evict_first);
  const HeadGate gate = {p.gate_qwen ? -expf(p.a_log[h]) : 0.0f, p.gate_qwen ? p.dt_bias[h] : 0.0f};
  const int hk = h / (p.hv / p.hk);
  const T* qb = static_cast<const T*>(p.q) + (size_t)hk * dk;
  const T* kb = static_cast<const T*>(p.k) + (size_t)hk * dk;
  const T* vh = static_cast<const T*>(p.v) + (size_t)h * p.dv + my_row;  // + token * v_stride + row group
  // Rows of one chunk take their values from one coalesced load per token: lane l holds row c_warp + l (the
  // plans keep ROWS * row_groups <= 32), and each group gets its rows by shuffle. A load per group was
  // waited for at the group's start whatever was issued ahead (ptxas, sm_90; BENCHMARKS.md session 12).
  const T* v_lane = static_cast<const T*>(p.v) + (size_t)h * p.dv + c_warp + lane;  // + token * v_stride
  const bool lane_row_ok = lane < ROWS * p.row_groups && c_warp + lane < p.dv;
  const int tok_off = DECODE_LOOP || p.total_tokens <= p.batch ? 0 : warp;
  // guess < total_tokens (b < batch), so decode's first token is the guess itself, as before the shared prologue.
  const int first_tok = tok_off == 0 ? guess : (guess >= 0 && guess + tok_off < p.total_tokens ? guess + tok_off : -1);
  TokenInputs<NPL> first;  // the inputs of token first_tok
  float v_first = 0.0f;    // this lane's row of token `guess`
  if (guess >= 0) {
    if (first_tok >= 0) load_token<T, NPL>(p, first_tok, h, lane, qb, kb, first);
    if (lane_row_ok) v_first = to_f32(v_lane[(size_t)guess * p.v_stride]);
  }

  const RowSpan span = row_span(p.cu_seqlens, p.uniform_len, b, p.total_tokens);
  if (p.tail_only && !gdn_row_is_sequential(p, b, span.len)) {
    asm volatile("cp.async.wait_all;\n" ::: "memory");  // no copy may land in shared memory after the warp exits
    return;
  }
  const int m = gdn_captured_prefix(p, b, span.len);
  float* cap = p.capsule != nullptr ? p.capsule + (size_t)b * gdn_capsule_row(p) : nullptr;
  // The decay slot of a head is written by the warp holding row 0; the key slot of a key head by the warp
  // holding row 0 of value head hk * group (spec/ops.md §2.9).
  const bool capture_decay = c_warp == 0;
  const bool capture_key = capture_decay && (h % (p.hv / p.hk) == 0);

  if (DECODE_LOOP && span.len == 1) {  // only decode instantiations hold this loop (see the file's head)
    // Decode: the token's values stay in registers across the row groups (no stash), and its value, output
    // and delta pointers step by ROWS per group. The arithmetic is the general loop's, in the same order.
    if (span.start != guess) {  // first_tok is the guess in decode kernels
      load_token<T, NPL>(p, span.start, h, lane, qb, kb, first);
      v_first = lane_row_ok ? to_f32(v_lane[(size_t)span.start * p.v_stride]) : 0.0f;
    }
    TokenValues<NPL> tv;
    token_values<NPL>(p, first, gate, tv);
    const float beta = token_beta<NPL>(p, first);
    const float qk = tv.qk();
    if (m > 0) capture_token<NPL>(p, tv, 0, h, hk, lane, cap, capture_decay, capture_key);
    float kept[NPL], sent[NPL];
#pragma unroll
    for (int i = 0; i < NPL; ++i) {
      kept[i] = lane < 16 ? tv.k[i] : tv.q[i];
      sent[i] = lane < 16 ? tv.q[i] : tv.k[i];
    }
    T* og = static_cast<T*>(p.out) + (size_t)span.start * p.hv * p.dv + (size_t)h * p.dv + c_warp + my_row;
    float* dg = cap != nullptr ? cap + gdn_capsule_delta(p) + (size_t)h * p.dv + c_warp + my_row : nullptr;
    for (int rg = 0; rg < p.row_groups; ++rg) {
      const int g = rg * ROWS;  // the group's first row, counted from the warp's
      const int c0 = c_warp + g;
      if (c0 >= p.dv) break;
      const bool more = rg + 1 < p.row_groups && c0 + ROWS < p.dv;
      const bool row_ok = c0 + my_row < p.dv;
      const float v = __shfl_sync(0xffffffffu, v_first, g + my_row);
      float alpha[NPL];  // per group, as in the general loop: held across groups it costs registers
      token_decay<NPL>(p, dk, span.start, h, lane, tv.alpha, alpha);
      const float x = decay_and_reduce<NPL, ROWS>(S, alpha, kept, sent, lane);
      if (more && rg > 0) stage_rows<NPL, ROWS>(p, vec_in, head_base, c0 + ROWS, lane, stage, evict_first);
      // Lanes 0-15: the delta of their row; lanes 16-31 take their row's delta from lane l - 16.
      const float u_mine = p.has_delta ? beta * (v - x) : v;
      const float u_pair = __shfl_xor_sync(0xffffffffu, u_mine, 16);
      if (first_copy && row_ok) {
        if (lane >= 16) {
          og[g] = from_f32<T>(fmaf(u_pair, qk, x));
        } else if (m > 0) {
          dg[g] = u_mine;
        }
      }
      update_rows<NPL, ROWS, kShift>(S, tv.k, u_mine);
      finish_group<NPL, ROWS>(p, dk, cap, cap != nullptr ? dg + g : nullptr, m, h, hk, lane,
                              rg == 0 && capture_decay, rg == 0 && capture_key, lane < 16 && first_copy && row_ok,
                              vec_out, head_base, c0, more, S, stage);
    }
    return;
  }

  // Rows of at most kTokens tokens (decode, verify) run the prologue once, for every row group. In the general
  // kernels the block's warps share it: warp w computes tokens w, w + block_warps, ... into the block's stash
  // (that of warp 0), so each warp's start waits for one token's inputs and butterflies, not for every token's,
  // and the output and delta addresses step per chunk (below). The decode kernels keep a prologue per warp and
  // per-token addresses (their rows of more than one token are rare): with the general kernels' code their
  // decode loop's SASS moved, and decode B=32 measured about 1% slower on the H200 (BENCHMARKS.md, session 13).
  constexpr bool kSharedPrologue = !DECODE_LOOP;
  const bool one_chunk = span.len <= kTokens;
  Stash& chunk_stash = one_chunk && kSharedPrologue ? stash_all[0] : stash;
  float v_lanes[kTokens];  // rows of one chunk: this lane's row of each token
  if (one_chunk && span.len > 0) {
    if (span.start != guess) {
      if (!kSharedPrologue) load_token<T, NPL>(p, span.start, h, lane, qb, kb, first);
      v_first = lane_row_ok ? to_f32(v_lane[(size_t)span.start * p.v_stride]) : 0.0f;
    }
    v_lanes[0] = v_first;
#pragma unroll
    for (int t = 1; t < kTokens; ++t) {
      if (t >= span.len) break;  // a branch, not predicated loads: decode issues none of them
      v_lanes[t] = lane_row_ok ? to_f32(v_lane[(size_t)(span.start + t) * p.v_stride]) : 0.0f;
    }
    if constexpr (kSharedPrologue) {
      // The block's warps that hold rows (warp 0 always does: the grid is ceil(dv / rows per block)), counted, not
      // divided: ptxas (sm_90) put an integer division for it before the first state loads, and decode measured
      // about 1% slower with it (BENCHMARKS.md, session 13).
      const int c_block = blockIdx.x * kRecWarps * ROWS * p.row_groups;
      int block_warps = 1;
#pragma unroll
      for (int w = 1; w < kRecWarps; ++w) block_warps += c_block + w * ROWS * p.row_groups < p.dv;
      // The warp index through a shuffle: the compiler then knows it is the same in every lane, so the
      // prologue's butterflies (whose trip count depends on it) need no fallback for a diverged warp (ptxas).
      const int w = __shfl_sync(0xffffffffu, warp, 0);  // this warp's first token of the row
      if (w < span.len && span.start + w != first_tok) load_token<T, NPL>(p, span.start + w, h, lane, qb, kb, first);
      // The capsule's decay and key slots: written by whichever warp computes the token, in the block that holds
      // value row 0 (of a head of the key head's group, for the key).
      token_prologue<T, NPL>(p, chunk_stash, first, span.start, 0, w, block_warps, span.len, h, hk, gate, lane, qb,
                             kb, m, cap, c_block == 0, c_block == 0 && h % (p.hv / p.hk) == 0);
      // Every warp of the block that holds rows: the stash (lanes' vectors, lane 0's scalars) is complete.
      named_barrier_sync(1, 32 * block_warps);
    } else {
      token_prologue<T, NPL>(p, stash, first, span.start, 0, 0, 1, span.len, h, hk, gate, lane, qb, kb, m, cap,
                             capture_decay, capture_key);
      __syncwarp();  // the scalars lane 0 wrote are read by every lane
    }
  }

  const size_t tok_stride = (size_t)p.hv * p.dv;  // between one token's outputs (and delta slots) and the next's
  for (int rg = 0; rg < p.row_groups; ++rg) {
    const int c0 = c_warp + rg * ROWS;
    if (c0 >= p.dv) break;
    const bool more = rg + 1 < p.row_groups && c0 + ROWS < p.dv;
    const bool row_ok = c0 + my_row < p.dv;
    bool staged = !(more && rg > 0);  // the next group's state is requested after this group's first reduction
    // General kernels: this lane's output element and delta-capsule slot of the chunk's first token, stepped by a
    // chunk after each: token t of the chunk is t Hv Dv elements on (t known at compile time), with no 64-bit
    // token * Hv * Dv product per token. Decode kernels: token 0's, indexed per token (see kSharedPrologue).
    T* ob = static_cast<T*>(p.out) + (size_t)h * p.dv + c0 + my_row;
    if (kSharedPrologue) ob += (size_t)span.start * tok_stride;
    float* delta_cap = cap != nullptr ? cap + gdn_capsule_delta(p) + (size_t)h * p.dv + c0 + my_row : nullptr;
    float* db = delta_cap;

    for (int t0 = 0; t0 < span.len; t0 += kTokens) {
      const int n = min(kTokens, span.len - t0);
      if (!one_chunk) {
        __syncwarp();  // the previous chunk's stash reads are done
        TokenInputs<NPL> cur;
        load_token<T, NPL>(p, span.start + t0, h, lane, qb, kb, cur);
        token_prologue<T, NPL>(p, stash, cur, span.start, t0, 0, 1, n, h, hk, gate, lane, qb, kb, m, cap,
                               capture_decay && rg == 0, capture_key && rg == 0);
        __syncwarp();  // the scalars lane 0 wrote are read by every lane
      }
      float v[kTokens];
#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t >= n) break;
        v[t] = one_chunk ? __shfl_sync(0xffffffffu, v_lanes[t], rg * ROWS + my_row)
                         : (row_ok ? to_f32(vh[(size_t)(span.start + t0 + t) * p.v_stride + c0]) : 0.0f);
      }

#pragma unroll
      for (int t = 0; t < kTokens; ++t) {
        if (t >= n) break;
        const int tok = span.start + t0 + t;
        float kept[NPL], sent[NPL], alpha[NPL];
        stash_get<NPL>(chunk_stash.vec[t][0], lane, kept);
        stash_get<NPL>(chunk_stash.vec[t][1], lane, sent);
        const float beta = chunk_stash.scalar[t][1];
        const float qk = chunk_stash.scalar[t][2];
        token_decay<NPL>(p, dk, tok, h, lane, chunk_stash.scalar[t][0], alpha);
        const float x = decay_and_reduce<NPL, ROWS>(S, alpha, kept, sent, lane);
        if (!staged) {
          stage_rows<NPL, ROWS>(p, vec_in, head_base, c0 + ROWS, lane, stage, evict_first);
          staged = true;
        }
        // Lanes 0-15: the delta of their row; lanes 16-31 take their row's delta from lane l - 16.
        const float u_mine = p.has_delta ? beta * (v[t] - x) : v[t];
        const float u_pair = __shfl_xor_sync(0xffffffffu, u_mine, 16);
        if (first_copy && row_ok) {
          if (lane >= 16) {
            ob[kSharedPrologue ? t * tok_stride : (size_t)tok * p.hv * p.dv] = from_f32<T>(fmaf(u_pair, qk, x));
          } else if (t0 + t < m) {
            db[kSharedPrologue ? t * tok_stride : (size_t)(t0 + t) * p.hv * p.dv] = u_mine;
          }
        }
        float k[NPL];  // the update's key: kept in lanes 0-15, sent in 16-31 (RecStash::vec)
#pragma unroll
        for (int i = 0; i < NPL; ++i) k[i] = lane >= 16 ? sent[i] : kept[i];
        update_rows<NPL, ROWS, kShift>(S, k, u_mine);
      }
      if (kSharedPrologue) {
        ob += kTokens * tok_stride;
        if (t0 + kTokens < m) db += kTokens * tok_stride;  // past the capsule only once no slot is left
      }
    }
    if (!staged) stage_rows<NPL, ROWS>(p, vec_in, head_base, c0 + ROWS, lane, stage, evict_first);  // no tokens
    if (kSharedPrologue)  // recomputed: held across the tokens it cost registers (spills at K = 128, ptxas)
      delta_cap = cap != nullptr ? cap + gdn_capsule_delta(p) + (size_t)h * p.dv + c0 + my_row : nullptr;
    finish_group<NPL, ROWS>(p, dk, cap, delta_cap, m, h, hk, lane, rg == 0 && capture_decay, rg == 0 && capture_key,
                            lane < 16 && first_copy && row_ok, vec_out, head_base, c0, more, S, stage);
  }
}

}  // namespace ohk
// Instantiations: gdn_recurrent_<type>_k<max key size>_r<value rows per warp>[_decode]; plan.py picks one.
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
// Decode instantiations only where the real models are (plan.py REC_DECODE_TYPES, REC_DECODE_ROWS: K = 128,
// the plan's two rows per warp): each adds a second loop, and for all shapes they grew the image by 66%.
OHK_GDN_RECURRENT_DECODE(f16, __half, 4, 128, 4)
OHK_GDN_RECURRENT_DECODE(f16, __half, 4, 128, 8)
OHK_GDN_RECURRENT_DECODE(bf16, __nv_bfloat16, 4, 128, 4)
OHK_GDN_RECURRENT_DECODE(bf16, __nv_bfloat16, 4, 128, 8)
