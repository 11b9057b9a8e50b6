// LinearRows: y [M, N] = x [M, K] @ w^T for w [N, K], a few rows at a time (decode and verify steps), where
// the weights are nearly all of the bytes and the product is a read of w at the copy rate.
#include "common.cuh"

constexpr int kLinearWarps = launch_config::kLinearWarps;
constexpr int kLinearAhead = launch_config::kLinearAhead;

// One output column n (a row of w) per `splits` warps; the warps of a column take interleaved 16-byte pieces of
// K, each lane one piece per step (8 elements), with kLinearAhead pieces of w requested before any is used.
// fp32 accumulation in a fixed order that depends on K and `splits` only, never on M: a row's result is the same
// bits whichever rows share its call, as a speculative verify step needs (docs/design-notes.md#linearrows).
// The first pieces of w are requested before waiting for the previous kernel (programmatic dependent launch):
// weights are never a kernel's output, and every thread still waits before it reads x or returns.
template <typename T, int R>
__device__ __forceinline__ void linear_rows(const LinearParams& p) {
  constexpr int kPiece = 8;  // elements per 16-byte piece
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int columns_per_block = kLinearWarps / p.splits;
  const int n = blockIdx.x * columns_per_block + warp / p.splits;
  const int split = warp % p.splits;
  const bool live = n < p.n;
  const int pieces = p.k / kPiece;
  const int stride = 32 * p.splits;
  const uint4* w = reinterpret_cast<const uint4*>(static_cast<const T*>(p.w) + (size_t)(live ? n : 0) * p.k);
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  const int x_row = pieces;  // x rows are contiguous: K elements apart

  float acc[R];
#pragma unroll
  for (int j = 0; j < R; ++j) acc[j] = 0.f;

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
#pragma unroll
          for (int j = 0; j < R; ++j) {
            if (j < p.rows) {
              const uint4 xv = __ldg(x + (size_t)j * x_row + piece);
              const T* xt = reinterpret_cast<const T*>(&xv);
#pragma unroll
              for (int e = 0; e < kPiece; ++e) acc[j] = __fmaf_rn(ohk::to_f32(wt[e]), ohk::to_f32(xt[e]), acc[j]);
            }
          }
        }
      }
    }
  }
#pragma unroll
  for (int j = 0; j < R; ++j) acc[j] = ohk::warp_sum(acc[j]);

  T* y = static_cast<T*>(p.y);
  if (p.splits == 1) {
    if (live && lane < R && lane < p.rows) {
#pragma unroll
      for (int j = 0; j < R; ++j)
        if (j == lane) y[(size_t)j * p.n + n] = ohk::from_f32<T>(acc[j]);
    }
    return;
  }
  // The splits of a column add up in warp order.
  __shared__ float partial[kLinearWarps][R];
  if (lane == 0) {
#pragma unroll
    for (int j = 0; j < R; ++j) partial[warp][j] = acc[j];
  }
  __syncthreads();
  if (live && split == 0 && lane < R && lane < p.rows) {
    float sum = 0.f;
    for (int s = 0; s < p.splits; ++s) sum += partial[warp + s][lane];
    y[(size_t)lane * p.n + n] = ohk::from_f32<T>(sum);
  }
}

#define OHK_LINEAR_KERNEL(T, SUFFIX, R)                                                                    \
  extern "C" __global__ void __launch_bounds__(kLinearWarps * 32) linear_rows_##SUFFIX##_r##R(const LinearParams p) { \
    linear_rows<T, R>(p);                                                                                  \
  }
OHK_LINEAR_KERNEL(__half, f16, 1)
OHK_LINEAR_KERNEL(__half, f16, 2)
OHK_LINEAR_KERNEL(__half, f16, 4)
OHK_LINEAR_KERNEL(__half, f16, 8)
OHK_LINEAR_KERNEL(__nv_bfloat16, bf16, 1)
OHK_LINEAR_KERNEL(__nv_bfloat16, bf16, 2)
OHK_LINEAR_KERNEL(__nv_bfloat16, bf16, 4)
OHK_LINEAR_KERNEL(__nv_bfloat16, bf16, 8)
#undef OHK_LINEAR_KERNEL
