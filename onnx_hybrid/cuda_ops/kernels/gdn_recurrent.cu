// GatedDeltaNet sequential engine (spec/ops.md §2.6, §2.8): decode, verify, capture, and every shape the
// chunked engine does not serve. One warp per (request, value head, ROWS value rows); lanes span the key
// axis (NPL consecutive key columns per lane), so a row's dot products are warp reductions and the state
// of the warp's rows stays in registers across the request's tokens.
//
// State rounding is the CUDA rule of spec/ops.md §2.10: S' = __fmul_rn(S, decay), S = __fmaf_rn(key, delta, S').
// The capsule stores exactly the decay, key and delta used here, so a replay is bit-exact.
#include "common.cuh"

namespace ohk {

constexpr int kRecWarps = 4;  // warps per block; value rows per warp (ROWS) is a template parameter
// Resident blocks per SM the register allocation must allow: decode is latency-bound, so warps in flight
// matter; the bounds are the highest at which ptxas (CUDA 13.0, sm_90) does not spill.
__host__ __device__ constexpr int rec_min_blocks(int npl, int rows) {
  return npl >= 8 ? 1 : (npl * rows >= 32 ? 4 : (npl * rows == 16 && npl == 4 ? 5 : 6));
}

template <int NPL>
__device__ __forceinline__ void load_state_row(const float* row, int lane, int dk, float (&s)[NPL]) {
  const int r0 = lane * NPL;
  if constexpr (NPL % 4 == 0) {
    if (dk == 32 * NPL && (reinterpret_cast<size_t>(row) & 15) == 0) {
#pragma unroll
      for (int i = 0; i < NPL; i += 4) {
        const float4 x = *reinterpret_cast<const float4*>(row + r0 + i);
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
        *reinterpret_cast<float4*>(row + r0 + i) = make_float4(s[i], s[i + 1], s[i + 2], s[i + 3]);
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

// One token's inputs, loaded a token ahead so the loads overlap the previous token's reductions.
template <int NPL, int ROWS>
struct TokenInputs {
  float q[NPL], k[NPL], v[ROWS];
  float decay;  // raw decay input (scalar-decay rules)
  float beta;   // raw beta input
};

template <typename T, int NPL, int ROWS>
__device__ __forceinline__ void load_token(const GdnParams& p, int tok, int h, int c0, int lane, const T* qb,
                                           const T* kb, const T* vb, TokenInputs<NPL, ROWS>& in) {
  load_head<T, NPL>(qb + (size_t)tok * p.q_stride, lane, p.dk, in.q);
  load_head<T, NPL>(kb + (size_t)tok * p.k_stride, lane, p.dk, in.k);
#pragma unroll
  for (int j = 0; j < ROWS; ++j) in.v[j] = (c0 + j < p.dv) ? to_f32(vb[(size_t)tok * p.v_stride + j]) : 0.0f;
  in.decay = (p.has_decay && !p.decay_per_key) ? p.decay[(size_t)tok * p.hv + h] : 0.0f;
  in.beta = p.has_delta ? p.beta[(size_t)tok * p.hv + h] : 0.0f;
}

template <int NPL, int ROWS>
__device__ __forceinline__ void load_rows(const GdnParams& p, size_t head_base, int c0, int lane, float (&S)[ROWS][NPL]) {
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

// A warp serves p.row_groups consecutive groups of ROWS value rows of one (request, head), loading the next
// group's state while it computes the current one, so its memory traffic does not wait on its arithmetic.
template <typename T, int NPL, int ROWS>
__device__ __forceinline__ void gdn_recurrent(const GdnParams& p) {
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int b = blockIdx.z;
  const int h = blockIdx.y;
  const int c_warp = (blockIdx.x * kRecWarps + warp) * ROWS * p.row_groups;
  if (c_warp >= p.dv) return;  // the kernel has no block-wide barrier
  const int dk = p.dk;

  // The first state loads go out before the offsets are read: their addresses do not depend on them.
  const size_t head_base = ((size_t)b * p.hv + h) * p.dv;
  float S[ROWS][NPL];
  load_rows<NPL, ROWS>(p, head_base, c_warp, lane, S);
  const RowSpan span = row_span(p.cu_seqlens, p.uniform_len, b, p.total_tokens);
  if (p.tail_only && !gdn_row_is_sequential(p, b, span.len)) return;

  const int group = p.hv / p.hk;
  const int hk = h / group;
  const int m = gdn_captured_prefix(p, b, span.len);
  float* cap = p.capsule != nullptr ? p.capsule + (size_t)b * gdn_capsule_row(p) : nullptr;
  const size_t key_off = gdn_capsule_key(p);
  const size_t delta_off = gdn_capsule_delta(p);
  // Per-head gate constants (qwen: g = -exp(a_log) * softplus(x + dt_bias)).
  const float neg_a = p.gate_qwen ? -expf(p.a_log[h]) : 0.0f;
  const float dt_bias = p.gate_qwen ? p.dt_bias[h] : 0.0f;
  const T* qb = static_cast<const T*>(p.q) + (size_t)hk * dk;
  const T* kb = static_cast<const T*>(p.k) + (size_t)hk * dk;

  for (int rg = 0; rg < p.row_groups; ++rg) {
    const int c0 = c_warp + rg * ROWS;
    if (c0 >= p.dv) break;
    float Sn[ROWS][NPL];
    const bool more = rg + 1 < p.row_groups && c0 + ROWS < p.dv;
    if (more) load_rows<NPL, ROWS>(p, head_base, c0 + ROWS, lane, Sn);

    // The decay slot of a head and the key slot of a key head are written by the group holding row 0; the
    // key slot by value head hk * group (spec/ops.md §2.9).
    const bool first_rows = c0 == 0;
    const bool owns_key = first_rows && (h % group == 0);
    const T* vb = static_cast<const T*>(p.v) + (size_t)h * p.dv + c0;
    T* ob = static_cast<T*>(p.out) + (size_t)h * p.dv + c0;

    TokenInputs<NPL, ROWS> cur, nxt;
    if (span.len > 0) load_token<T, NPL, ROWS>(p, span.start, h, c0, lane, qb, kb, vb, cur);
    for (int t = 0; t < span.len; ++t) {
      const int tok = span.start + t;
      if (t + 1 < span.len) load_token<T, NPL, ROWS>(p, tok + 1, h, c0, lane, qb, kb, vb, nxt);

      float alpha[NPL];
      float alpha_head = 1.0f;
      if (p.has_decay && !p.decay_per_key) {
        float g = cur.decay;
        if (p.gate_qwen) {
          const float z = g + dt_bias;
          g = neg_a * (z > 20.0f ? z : log1pf(expf(z)));
        }
        alpha_head = expf(g);
      }
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        const int r = lane * NPL + i;
        alpha[i] = (p.decay_per_key && r < dk) ? expf(gdn_log_gate(p, tok, h, r)) : alpha_head;
      }
      const float beta = p.has_delta ? (p.beta_sigmoid ? 1.0f / (1.0f + expf(-cur.beta)) : cur.beta) : 1.0f;

      // Retrieval dot products on the raw key; the q and k norms reduce alongside them and scale afterwards.
      float red[ROWS + 2];
      float sq = 0.0f, sk = 0.0f;
#pragma unroll
      for (int i = 0; i < NPL; ++i) {
        sq = fmaf(cur.q[i], cur.q[i], sq);
        sk = fmaf(cur.k[i], cur.k[i], sk);
      }
      red[ROWS] = sq;
      red[ROWS + 1] = sk;
#pragma unroll
      for (int j = 0; j < ROWS; ++j) {
        float d = 0.0f;
#pragma unroll
        for (int i = 0; i < NPL; ++i) {
          S[j][i] = __fmul_rn(S[j][i], alpha[i]);
          d = fmaf(S[j][i], cur.k[i], d);
        }
        red[j] = d;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < ROWS + 2; ++j) red[j] += __shfl_xor_sync(0xffffffffu, red[j], off);
      }
      const float inv_q = p.l2norm ? rsqrtf(red[ROWS] + 1e-12f) : 1.0f;
      const float inv_k = p.l2norm ? rsqrtf(red[ROWS + 1] + 1e-12f) : 1.0f;
      float k[NPL];
#pragma unroll
      for (int i = 0; i < NPL; ++i) k[i] = p.l2norm ? cur.k[i] * inv_k : cur.k[i];

      float u[ROWS], o[ROWS];
#pragma unroll
      for (int j = 0; j < ROWS; ++j) {
        u[j] = p.has_delta ? beta * (cur.v[j] - red[j] * inv_k) : cur.v[j];
        float acc = 0.0f;
#pragma unroll
        for (int i = 0; i < NPL; ++i) {
          S[j][i] = __fmaf_rn(k[i], u[j], S[j][i]);
          acc = fmaf(S[j][i], cur.q[i], acc);
        }
        o[j] = acc;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < ROWS; ++j) o[j] += __shfl_xor_sync(0xffffffffu, o[j], off);
      }

      float mine_o = 0.0f, mine_u = 0.0f;  // lane j < ROWS writes row c0 + j
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
        if (lane == j) { mine_o = o[j]; mine_u = u[j]; }
      const bool row_lane = lane < ROWS && c0 + lane < p.dv;
      if (row_lane) ob[(size_t)tok * p.hv * p.dv + lane] = from_f32<T>(p.scale * inv_q * mine_o);
      if (t < m) {
        if (first_rows && lane == 0) cap[(size_t)t * p.hv + h] = alpha_head;
        if (owns_key) {
#pragma unroll
          for (int i = 0; i < NPL; ++i) {
            const int r = lane * NPL + i;
            if (r < dk) cap[key_off + ((size_t)t * p.hk + hk) * dk + r] = k[i];
          }
        }
        if (row_lane) cap[delta_off + ((size_t)t * p.hv + h) * p.dv + c0 + lane] = mine_u;
      }
      if (t + 1 < span.len) cur = nxt;
    }

    // Slots beyond the captured prefix are zero (project rule, spec/ops.md §2.9).
    if (cap != nullptr) {
      for (int t = m; t < p.capacity; ++t) {
        if (first_rows && lane == 0) cap[(size_t)t * p.hv + h] = 0.0f;
        if (owns_key)
          for (int r = lane; r < dk; r += 32) cap[key_off + ((size_t)t * p.hk + hk) * dk + r] = 0.0f;
        if (lane < ROWS && c0 + lane < p.dv) cap[delta_off + ((size_t)t * p.hv + h) * p.dv + c0 + lane] = 0.0f;
      }
    }

    if (p.state_out != nullptr) {
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
        if (c0 + j < p.dv) store_state_row<NPL>(p.state_out + (head_base + c0 + j) * dk, lane, dk, S[j]);
    }
    if (more) {
#pragma unroll
      for (int j = 0; j < ROWS; ++j)
#pragma unroll
        for (int i = 0; i < NPL; ++i) S[j][i] = Sn[j][i];
    }
  }
}

}  // namespace ohk

// Instantiations: gdn_recurrent_<type>_k<max key size>_r<value rows per warp>; plan.py picks one.
#define OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, ROWS)                                                \
  extern "C" __global__ void __launch_bounds__(ohk::kRecWarps * 32, ohk::rec_min_blocks(NPL, ROWS))  \
      gdn_recurrent_##TNAME##_k##KMAX##_r##ROWS(const GdnParams p) {                              \
    ohk::gdn_recurrent<T, NPL, ROWS>(p);                                                           \
  }

#define OHK_GDN_RECURRENT_ROWS(TNAME, T, NPL, KMAX) \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 1)         \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 2)         \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 4)         \
  OHK_GDN_RECURRENT(TNAME, T, NPL, KMAX, 8)

#define OHK_GDN_RECURRENT_ALL_K(TNAME, T)      \
  OHK_GDN_RECURRENT_ROWS(TNAME, T, 1, 32)      \
  OHK_GDN_RECURRENT_ROWS(TNAME, T, 2, 64)      \
  OHK_GDN_RECURRENT_ROWS(TNAME, T, 4, 128)     \
  OHK_GDN_RECURRENT(TNAME, T, 8, 256, 2)       \
  OHK_GDN_RECURRENT(TNAME, T, 8, 256, 4)       \
  OHK_GDN_RECURRENT(TNAME, T, 16, 512, 1)      \
  OHK_GDN_RECURRENT(TNAME, T, 16, 512, 2)

OHK_GDN_RECURRENT_ALL_K(f32, float)
OHK_GDN_RECURRENT_ALL_K(f16, __half)
OHK_GDN_RECURRENT_ALL_K(bf16, __nv_bfloat16)
