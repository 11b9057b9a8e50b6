// GatedDeltaNet's capsule replay (docs/op-contract.md#gateddeltanet-replay): the committed state advanced by the
// first accepted transitions a verify call captured, bit for bit as the recurrent kernel would have.
#include "common.cuh"

// Warps per block of the GDN replay. Both sizes fit 16 warps per SM (117 registers), but a block's slot frees
// only when its last warp ends: 2 warps per block took 52.4 / 198.9 us at 27B, B = 32 / 128 with 2 of 4 tokens
// accepted, 4 warps 57.7 / 218.1 us (H200; docs/design-notes.md#gdn-replay-layout).
constexpr int kReplayWarps = launch_config::kReplayWarps;
constexpr int kReplayRowsPerWarp = launch_config::kReplayRows;
constexpr int kReplayAhead = 4;        // tokens whose capsule values are requested with the state

// GDN replay, docs/op-contract.md#gateddeltanet-replay.
// A warp per kReplayRowsPerWarp value rows of (request b, head h), lanes across
// the key axis in 16-byte pieces; CUDA rounding S = fma(key, delta, S * decay), token by token. A token's decay
// and key row are shared by the warp's rows, its delta is one value per row. The first kReplayAhead tokens'
// values and the rows' state are all requested before any is used, so a warp waits for memory once. A thread per
// state element, which found its (request, head, row, column) by 64-bit divisions, took 1.3 ms at 27B, B = 128
// (15% of the byte floor); a warp per row, 379 us (51%; H200; docs/design-notes.md#gdn-replay-layout).
extern "C" __global__ void __launch_bounds__(kReplayWarps * 32) gdn_replay_f32(const GdnReplayParams p) {
  constexpr int R = kReplayRowsPerWarp, A = kReplayAhead;
  ohk::wait_for_inputs();
  const int lane = threadIdx.x & 31;
  const int c0 = (blockIdx.x * kReplayWarps + (threadIdx.x >> 5)) * R;
  const int h = blockIdx.y;
  const int b = blockIdx.z;
  if (c0 >= p.dv) return;
  const int hk = h / (p.hv / p.hk);
  const int n = max(0, min(p.accepted[b], p.capacity));
  const int rows = min(R, p.dv - c0);
  const float* cap = p.capsule + (size_t)b * p.capacity * (p.hv + (size_t)p.hk * p.dk + (size_t)p.hv * p.dv);
  const float* decay = cap + h;                                                    // slot t at t Hv
  const float* key = cap + (size_t)p.capacity * p.hv + (size_t)hk * p.dk;          // slot t at t Hk Dk
  const float* delta = key + (size_t)p.capacity * p.hk * p.dk - (size_t)hk * p.dk  // slot t at t Hv Dv
                       + (size_t)h * p.dv + c0;
  const size_t first = (((size_t)b * p.hv + h) * p.dv + c0) * p.dk;
  const float* in = p.state_in + first;
  float* out = p.state_out + first;
  const size_t key_step = (size_t)p.hk * p.dk, delta_step = (size_t)p.hv * p.dv;
  if (p.dk % 4 == 0 && ohk::aligned16(in) && ohk::aligned16(out) && ohk::aligned16(key)) {
    for (int r = 4 * lane; r < p.dk; r += 128) {
      float a[A], u[A][R];
      float4 k[A], s[R];
#pragma unroll
      for (int t = 0; t < A; ++t) {
        const bool live = t < n;
        a[t] = live ? decay[(size_t)t * p.hv] : 0.f;
        k[t] = live ? *reinterpret_cast<const float4*>(key + t * key_step + r) : float4{};
#pragma unroll
        for (int j = 0; j < R; ++j) u[t][j] = live && j < rows ? delta[t * delta_step + j] : 0.f;
      }
#pragma unroll
      for (int j = 0; j < R; ++j)
        s[j] = j < rows ? *reinterpret_cast<const float4*>(in + (size_t)j * p.dk + r) : float4{};
      auto step = [&](float at, float4 kt, const float (&ut)[R]) {
#pragma unroll
        for (int j = 0; j < R; ++j) {
          s[j].x = __fmaf_rn(kt.x, ut[j], __fmul_rn(s[j].x, at));
          s[j].y = __fmaf_rn(kt.y, ut[j], __fmul_rn(s[j].y, at));
          s[j].z = __fmaf_rn(kt.z, ut[j], __fmul_rn(s[j].z, at));
          s[j].w = __fmaf_rn(kt.w, ut[j], __fmul_rn(s[j].w, at));
        }
      };
#pragma unroll
      for (int t = 0; t < A; ++t)
        if (t < n) step(a[t], k[t], u[t]);
      for (int t = A; t < n; ++t) {
        float ut[R];
#pragma unroll
        for (int j = 0; j < R; ++j) ut[j] = j < rows ? delta[t * delta_step + j] : 0.f;
        step(decay[(size_t)t * p.hv], *reinterpret_cast<const float4*>(key + t * key_step + r), ut);
      }
#pragma unroll
      for (int j = 0; j < R; ++j)
        if (j < rows) *reinterpret_cast<float4*>(out + (size_t)j * p.dk + r) = s[j];
    }
    return;
  }
  for (int j = 0; j < rows; ++j)
    for (int r = lane; r < p.dk; r += 32) {
      float s = in[(size_t)j * p.dk + r];
      for (int t = 0; t < n; ++t)
        s = __fmaf_rn(key[t * key_step + r], delta[t * delta_step + j], __fmul_rn(s, decay[(size_t)t * p.hv]));
      out[(size_t)j * p.dk + r] = s;
    }
}
