// LinearRows: y [1, N] = x [1, K] @ w^T for w [N, K]: a decode step's projection, where the weights are nearly all of
// the bytes and the product is a read of w at the copy rate (docs/design-notes.md#linearrows).
#include "common.cuh"

constexpr int kLinearWarps = launch_config::kLinearWarps;
constexpr int kLinearAhead = launch_config::kLinearAhead;

// One output feature n (a row of w) per `splits` warps; the warps of a feature take interleaved 16-byte pieces of
// K, each lane one piece per step (8 elements), with kLinearAhead pieces of w requested before any is used; fp32
// sums, the warps of a feature added in warp order. The first pieces of w are requested before waiting for the
// previous kernel (programmatic dependent launch): weights are never a kernel's output, and every thread still
// waits before it reads x or returns.
template <typename T>
__device__ __forceinline__ void linear_rows(const LinearParams& p) {
  constexpr int kPiece = 8;  // elements per 16-byte piece
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int features_per_block = kLinearWarps / p.splits;
  const int n = blockIdx.x * features_per_block + warp / p.splits;
  const int split = warp % p.splits;
  const bool live = n < p.n;
  const int pieces = p.k / kPiece;
  const int stride = 32 * p.splits;
  const uint4* w = reinterpret_cast<const uint4*>(static_cast<const T*>(p.w) + (size_t)(live ? n : 0) * p.k);
  const uint4* x = reinterpret_cast<const uint4*>(p.x);

  float acc = 0.f;
  int i = split * 32 + lane;
  uint4 ahead[kLinearAhead];
#pragma unroll
  for (int a = 0; a < kLinearAhead; ++a) ahead[a] = live && i + a * stride < pieces ? w[i + a * stride] : uint4{};
  ohk::wait_for_inputs();
  if (live) {
    for (; i < pieces; i += kLinearAhead * stride) {
#pragma unroll
      for (int a = 0; a < kLinearAhead; ++a) {
        const int piece = i + a * stride;
        if (piece < pieces) {
          const uint4 wv = ahead[a];
          const int next = piece + kLinearAhead * stride;
          ahead[a] = next < pieces ? w[next] : uint4{};
          const T* wt = reinterpret_cast<const T*>(&wv);
          const uint4 xv = __ldg(x + piece);
          const T* xt = reinterpret_cast<const T*>(&xv);
#pragma unroll
          for (int e = 0; e < kPiece; ++e) acc = __fmaf_rn(ohk::to_f32(wt[e]), ohk::to_f32(xt[e]), acc);
        }
      }
    }
  }
  acc = ohk::warp_sum(acc);

  T* y = static_cast<T*>(p.y);
  if (p.splits == 1) {
    if (live && lane == 0) y[n] = ohk::from_f32<T>(acc);
    return;
  }
  __shared__ float partial[kLinearWarps];
  if (lane == 0) partial[warp] = acc;
  __syncthreads();
  if (live && split == 0 && lane == 0) {
    float sum = 0.f;
    for (int s = 0; s < p.splits; ++s) sum += partial[warp + s];
    y[n] = ohk::from_f32<T>(sum);
  }
}

extern "C" __global__ void __launch_bounds__(kLinearWarps * 32) linear_rows_f16(const LinearParams p) {
  linear_rows<__half>(p);
}
extern "C" __global__ void __launch_bounds__(kLinearWarps * 32) linear_rows_bf16(const LinearParams p) {
  linear_rows<__nv_bfloat16>(p);
}
