// LinearRows: y [1, N] = x [1, K] @ w^T for w [N, K]: a decode step's projection, where the weights are nearly all of
// the bytes and the product is a read of w at the copy rate (docs/design-notes.md#linearrows). With swiglu, w is
// [2N, K] (gate rows, then up rows) and y = SiLU(gate) * up; linear_swiglu_* does that last step after cuBLAS.
#include "common.cuh"

constexpr int kLinearWarps = launch_config::kLinearWarps;
constexpr int kLinearAhead = launch_config::kLinearAhead;

// SiLU(gate) * up of two fp32 products, with expf and IEEE division (docs/op-contract.md#linear).
__device__ __forceinline__ float linear_swiglu_value(float gate, float up) { return gate / (1.f + expf(-gate)) * up; }

// One output feature n (a row of w; with SWIGLU rows n and N + n) per `splits` warps; the warps of a feature take
// interleaved 16-byte pieces of K, each lane one piece per step (8 elements), with kLinearAhead pieces of each row
// requested before any is used; fp32 sums, the warps of a feature added in warp order. The first pieces of w are
// requested before waiting for the previous kernel (programmatic dependent launch): weights are never a kernel's
// output, and every thread still waits before it reads x or returns.
template <typename T, bool SWIGLU>
__device__ __forceinline__ void linear_rows(const LinearParams& p) {
  constexpr int kPiece = 8;  // elements per 16-byte piece
  constexpr int kRows = SWIGLU ? 2 : 1;  // weight rows per output feature
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int features_per_block = kLinearWarps / p.splits;
  const int n = blockIdx.x * features_per_block + warp / p.splits;
  const int split = warp % p.splits;
  const bool live = n < p.n;
  const int pieces = p.k / kPiece;
  const int stride = 32 * p.splits;
  const uint4* w[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r)
    w[r] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.w) + ((size_t)r * p.n + (live ? n : 0)) * p.k);
  const uint4* x = reinterpret_cast<const uint4*>(p.x);

  float acc[kRows] = {};
  int i = split * 32 + lane;
  uint4 ahead[kRows][kLinearAhead];
#pragma unroll
  for (int a = 0; a < kLinearAhead; ++a)
#pragma unroll
    for (int r = 0; r < kRows; ++r) ahead[r][a] = live && i + a * stride < pieces ? w[r][i + a * stride] : uint4{};
  ohk::wait_for_inputs();
  if (live) {
    for (; i < pieces; i += kLinearAhead * stride) {
#pragma unroll
      for (int a = 0; a < kLinearAhead; ++a) {
        const int piece = i + a * stride;
        if (piece < pieces) {
          const int next = piece + kLinearAhead * stride;
          const uint4 xv = __ldg(x + piece);
          const T* xt = reinterpret_cast<const T*>(&xv);
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const uint4 wv = ahead[r][a];
            ahead[r][a] = next < pieces ? w[r][next] : uint4{};
            const T* wt = reinterpret_cast<const T*>(&wv);
#pragma unroll
            for (int e = 0; e < kPiece; ++e) acc[r] = __fmaf_rn(ohk::to_f32(wt[e]), ohk::to_f32(xt[e]), acc[r]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = ohk::warp_sum(acc[r]);

  T* y = static_cast<T*>(p.y);
  if (p.splits > 1) {
    __shared__ float partial[kRows][kLinearWarps];
    if (lane == 0) {
#pragma unroll
      for (int r = 0; r < kRows; ++r) partial[r][warp] = acc[r];
    }
    __syncthreads();
    if (split != 0) return;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      acc[r] = 0.f;
      for (int s = 0; s < p.splits; ++s) acc[r] += partial[r][warp + s];
    }
  }
  if (!live || lane != 0) return;
  int column = n;  // within its part's output (output_features); unrolled: a variable index would copy the
                   // parameter arrays to the stack (ptxas)
#pragma unroll
  for (int j = 0; j < int(sizeof(p.part_start) / sizeof(p.part_start[0])); ++j)
    if (j + 1 < p.parts && n >= p.part_start[j]) y = static_cast<T*>(p.y_rest[j]), column = n - p.part_start[j];
  y[column] = ohk::from_f32<T>(SWIGLU ? linear_swiglu_value(acc[0], acc[kRows - 1]) : acc[0]);
}

// y [rows, N] = SiLU(gate) * up from the [rows, 2N] fp32 products of a cuBLAS call (calls LinearRows does not take).
template <typename T>
__device__ __forceinline__ void linear_swiglu(const LinearParams& p) {
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= (size_t)p.rows * p.n) return;
  const size_t row = i / p.n, f = i % p.n;
  const float* s = p.sums + row * 2 * p.n;
  static_cast<T*>(p.y)[i] = ohk::from_f32<T>(linear_swiglu_value(s[f], s[p.n + f]));
}

#define OHK_LINEAR_KERNELS(TNAME, T)                                                                       \
  extern "C" __global__ void __launch_bounds__(kLinearWarps * 32) linear_rows_##TNAME(const LinearParams p) { \
    linear_rows<T, false>(p);                                                                                \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(kLinearWarps * 32)                                            \
      linear_rows_swiglu_##TNAME(const LinearParams p) {                                                     \
    linear_rows<T, true>(p);                                                                                 \
  }
OHK_LINEAR_KERNELS(f16, __half)
OHK_LINEAR_KERNELS(bf16, __nv_bfloat16)

#define OHK_LINEAR_SWIGLU_KERNEL(TNAME, T)                                                                 \
  extern "C" __global__ void __launch_bounds__(launch_config::kLinearSwigluThreads)                        \
      linear_swiglu_##TNAME(const LinearParams p) {                                                          \
    ohk::wait_for_inputs();                                                                                  \
    linear_swiglu<T>(p);                                                                                     \
  }
OHK_LINEAR_SWIGLU_KERNEL(f32, float)
OHK_LINEAR_SWIGLU_KERNEL(f16, __half)
OHK_LINEAR_SWIGLU_KERNEL(bf16, __nv_bfloat16)
