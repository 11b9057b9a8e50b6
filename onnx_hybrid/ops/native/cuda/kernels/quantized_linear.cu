// QuantizedLinear: y [rows, N] = x [rows, K] @ dequantize(w)^T for 4-bit block-quantized weights in
// com.microsoft::MatMulNBits' layout (docs/op-contract.md#quantizedlinear). Each weight element dequantizes to
// T((q - zero_point) * scale), rounded once in T; the products sum in fp32.
//
// qlinear_mma_*: rows <= 8 * kQlinearMaxRowTiles. A warp takes 16 weight rows (16 output features, or with swiglu 8
// gate rows and their 8 up rows) as the A operand of mma.m16n8k16 and up to 8 rows of x per row tile as B, so the
// weights are read once whatever the number of rows, at the copy rate for the one row of a decode step. Lane
// (r = lane / 4, q = lane % 4) loads 16 bytes of weight rows r and r + 8 per 128-element segment: the 32 elements
// [128 s + 32 q, + 32), which are in one quantization block (block sizes are multiples of 32). A dot product does
// not care in which order its k terms come, so each lane's 32 elements serve as its A-fragment k positions over 8
// mma steps, and the B fragments (x) are loaded in the same order; the nibble and pair shuffles below implement
// that order. The per-row result depends neither on the number of rows nor on the row tile: a verify call's
// rows equal one-row calls'. qlinear_dequantize_*: the same values, written out for cuBLAS (more rows).
#include "common.cuh"

constexpr int kQlinearWarps = launch_config::kQlinearWarps;
constexpr int kQlinearAhead = launch_config::kQlinearAhead;

namespace ohk {

template <typename T> struct Pair;
template <> struct Pair<__half> {
  using type = __half2;
  static constexpr unsigned kMagic = 0x64006400u;  // 1024.0 in each half: 1024 + q is exact for q < 1024
  static __device__ __forceinline__ __half2 biased(float zero_point) {  // 1024 + zero_point, in both halves
    return __float2half2_rn(1024.f + zero_point);
  }
};
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static constexpr unsigned kMagic = 0x43004300u;  // 128.0 in each half: 128 + q is exact for q < 128
  static __device__ __forceinline__ __nv_bfloat162 biased(float zero_point) {
    return __float2bfloat162_rn(128.f + zero_point);
  }
};

template <typename T>
__device__ __forceinline__ unsigned as_bits(typename Pair<T>::type v) {
  return *reinterpret_cast<const unsigned*>(&v);
}

// Nibbles m and m + 4 of `word` (bits 4m and 16 + 4m: elements k + m and k + m + 4) as a pair of T, dequantized:
// ((magic + q) - (magic + zero_point)) is exact, the product by the scale rounds once.
template <typename T>
__device__ __forceinline__ unsigned dequantize_pair(unsigned word, int m, typename Pair<T>::type biased_zero,
                                                    typename Pair<T>::type scale) {
  using P = typename Pair<T>::type;
  unsigned bits;
  const unsigned shifted = word >> (4 * m);
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n" : "=r"(bits) : "r"(shifted), "r"(0x000F000Fu), "r"(Pair<T>::kMagic));
  const P q = *reinterpret_cast<const P*>(&bits);
  return as_bits<T>(__hmul2(__hsub2(q, biased_zero), scale));
}

template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]);
template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const unsigned (&a)[4],
                                                         const unsigned (&b)[2]) {
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
               "{%0,%1,%2,%3};\n"
               : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// The zero point of weight row `row`, block `block`: its nibble of the packed [rows, ceil(blocks / 2)] bytes, or 8.
__device__ __forceinline__ unsigned qlinear_zero_point(const LinearParams& p, int row, int block) {
  if (p.zero_points == nullptr) return 8;
  const unsigned char z = __ldg(p.zero_points + (size_t)row * ((p.k_blocks + 1) / 2) + block / 2);
  return (block & 1) ? z >> 4 : z & 15;
}

}  // namespace ohk

// One weight row's share of a segment for this lane: 16 bytes (32 elements of one block), the block's scale and
// zero point; all zero where out of range (a zero scale makes the lane's A values zero).
template <typename T>
struct QlinearPiece {
  uint4 w;
  T scale;
  unsigned zero_point;
};

template <typename T>
__device__ __forceinline__ QlinearPiece<T> qlinear_load(const LinearParams& p, int row, int seg, int q, bool valid) {
  QlinearPiece<T> piece{uint4{}, ohk::from_f32<T>(0.f), 8};
  if (!valid) return piece;
  const int k0 = seg * 128 + q * 32, block = k0 / p.block_size;
  const size_t row_bytes = (size_t)p.k_blocks * p.block_size / 2;
  piece.w = __ldg(reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(p.w) + row * row_bytes + k0 / 2));
  piece.scale = static_cast<const T*>(p.scales)[(size_t)row * p.k_blocks + block];
  piece.zero_point = ohk::qlinear_zero_point(p, row, block);
  return piece;
}

// The output and column of `feature`, and that output's row length (output_features: one output per part).
template <typename T>
__device__ __forceinline__ T* qlinear_output(const LinearParams& p, int feature, int& column, int& width) {
  T* y = static_cast<T*>(p.y);
  column = feature;
  width = p.parts > 1 ? p.part_start[0] : p.n;
#pragma unroll
  for (int j = 0; j < int(sizeof(p.part_start) / sizeof(p.part_start[0])); ++j)
    if (j + 1 < p.parts && feature >= p.part_start[j]) {
      y = static_cast<T*>(p.y_rest[j]);
      column = feature - p.part_start[j];
      width = (j + 2 < p.parts ? p.part_start[j + 1] : p.n) - p.part_start[j];
    }
  return y;
}

template <typename T, bool SWIGLU, int TILES>
__device__ __forceinline__ void qlinear_mma(const LinearParams& p) {
  using P = typename ohk::Pair<T>::type;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane >> 2, q = lane & 3;
  constexpr int kFeatures = SWIGLU ? 8 : 16;  // output features per group of warps
  const int f0 = (blockIdx.x * (kQlinearWarps / p.splits) + warp / p.splits) * kFeatures;
  const int split = warp % p.splits;
  // A rows r and r + 8: features f0 + r and f0 + r + 8, or gate row f0 + r and its up row n + f0 + r.
  const int row_lo = f0 + r, row_hi = SWIGLU ? p.n + f0 + r : f0 + r + 8;
  const bool live_lo = f0 + r < p.n, live_hi = SWIGLU ? live_lo : f0 + r + 8 < p.n;
  const int segments = (p.k + 127) / 128;
  // This lane's quarter of a segment is in range when its 32 elements are (k is a multiple of 32).
  auto in_range = [&](int seg) { return seg < segments && seg * 128 + q * 32 < p.k; };

  QlinearPiece<T> ahead[kQlinearAhead][2];
#pragma unroll
  for (int a = 0; a < kQlinearAhead; ++a) {
    const int seg = split + a * p.splits;
    ahead[a][0] = qlinear_load<T>(p, row_lo, seg, q, live_lo && in_range(seg));
    ahead[a][1] = qlinear_load<T>(p, row_hi, seg, q, live_hi && in_range(seg));
  }
  ohk::wait_for_inputs();

  float acc[TILES][4] = {};
  const T* x = static_cast<const T*>(p.x);
  for (int base = split; base < segments; base += kQlinearAhead * p.splits) {
#pragma unroll
    for (int a = 0; a < kQlinearAhead; ++a) {
      const int seg = base + a * p.splits;
      if (seg < segments) {  // uniform across the warp
        const QlinearPiece<T> lo = ahead[a][0], hi = ahead[a][1];
        const int next = seg + kQlinearAhead * p.splits;
        ahead[a][0] = qlinear_load<T>(p, row_lo, next, q, live_lo && in_range(next));
        ahead[a][1] = qlinear_load<T>(p, row_hi, next, q, live_hi && in_range(next));
        const bool valid = in_range(seg);
        const int k0 = seg * 128 + q * 32;  // this lane's 32 elements
        const P scale_lo(lo.scale, lo.scale), scale_hi(hi.scale, hi.scale);
        const P zero_lo = ohk::Pair<T>::biased(float(lo.zero_point)), zero_hi = ohk::Pair<T>::biased(float(hi.zero_point));
        const unsigned wl[4] = {lo.w.x, lo.w.y, lo.w.z, lo.w.w}, wh[4] = {hi.w.x, hi.w.y, hi.w.z, hi.w.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // word i: elements k0 + 8 i .. + 7
          // Step 2i takes elements (0, 4) and (1, 5) of the word, step 2i + 1 (2, 6) and (3, 7).
          const unsigned a_even[4] = {ohk::dequantize_pair<T>(wl[i], 0, zero_lo, scale_lo),
                                      ohk::dequantize_pair<T>(wh[i], 0, zero_hi, scale_hi),
                                      ohk::dequantize_pair<T>(wl[i], 1, zero_lo, scale_lo),
                                      ohk::dequantize_pair<T>(wh[i], 1, zero_hi, scale_hi)};
          const unsigned a_odd[4] = {ohk::dequantize_pair<T>(wl[i], 2, zero_lo, scale_lo),
                                     ohk::dequantize_pair<T>(wh[i], 2, zero_hi, scale_hi),
                                     ohk::dequantize_pair<T>(wl[i], 3, zero_lo, scale_lo),
                                     ohk::dequantize_pair<T>(wh[i], 3, zero_hi, scale_hi)};
#pragma unroll
          for (int t = 0; t < TILES; ++t) {
            // B: x row t * 8 + r, this lane's elements k0 + 8 i .. + 7, paired as the A fragments are.
            const int xrow = t * 8 + r;
            uint4 xv = uint4{};
            if (valid && xrow < p.rows)
              xv = __ldg(reinterpret_cast<const uint4*>(x + (size_t)xrow * p.k + k0 + 8 * i));
            const unsigned b_even[2] = {__byte_perm(xv.x, xv.z, 0x5410), __byte_perm(xv.x, xv.z, 0x7632)};
            const unsigned b_odd[2] = {__byte_perm(xv.y, xv.w, 0x5410), __byte_perm(xv.y, xv.w, 0x7632)};
            ohk::mma_16816<T>(acc[t], a_even, b_even);
            ohk::mma_16816<T>(acc[t], a_odd, b_odd);
          }
        }
      }
    }
  }

  if (p.splits > 1) {  // the warps of a group add their sums in split order
    __shared__ float partial[kQlinearWarps][TILES * 4][32];
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) partial[warp][t * 4 + c][lane] = acc[t][c];
    __syncthreads();
    if (split != 0) return;
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        float sum = 0.f;
        for (int s = 0; s < p.splits; ++s) sum += partial[warp + s][t * 4 + c][lane];
        acc[t][c] = sum;
      }
  }

  // C: acc[t][0..1] hold A row r at x rows t * 8 + 2q and + 1, acc[t][2..3] A row r + 8.
#pragma unroll
  for (int h = 0; h < (SWIGLU ? 1 : 2); ++h) {
    const int feature = f0 + r + 8 * h;
    if (feature >= p.n) continue;
    int column, width;
    T* y = qlinear_output<T>(p, feature, column, width);
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int row = t * 8 + 2 * q + e;
        if (row >= p.rows) continue;
        const float v = SWIGLU ? linear_swiglu_value(acc[t][e], acc[t][2 + e]) : acc[t][2 * h + e];
        y[(size_t)row * width + column] = ohk::from_f32<T>(v);
      }
  }
}

// Each thread dequantizes one 32-bit word (8 elements) of the packed weight into `dequantized` [weight rows, k].
template <typename T>
__device__ __forceinline__ void qlinear_dequantize(const LinearParams& p) {
  using P = typename ohk::Pair<T>::type;
  const size_t words_per_row = (size_t)p.k / 8;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int weight_rows = p.swiglu ? 2 * p.n : p.n;
  if (i >= words_per_row * weight_rows) return;
  const int row = int(i / words_per_row), word = int(i % words_per_row);
  const int block = word * 8 / p.block_size;
  const size_t row_bytes = (size_t)p.k_blocks * p.block_size / 2;
  const unsigned w = __ldg(reinterpret_cast<const unsigned*>(static_cast<const unsigned char*>(p.w) +
                                                             row * row_bytes) + word);
  const T s = static_cast<const T*>(p.scales)[(size_t)row * p.k_blocks + block];
  const P scale(s, s), zero = ohk::Pair<T>::biased(float(ohk::qlinear_zero_point(p, row, block)));
  uint4 out;
  const unsigned e04 = ohk::dequantize_pair<T>(w, 0, zero, scale), e15 = ohk::dequantize_pair<T>(w, 1, zero, scale);
  const unsigned e26 = ohk::dequantize_pair<T>(w, 2, zero, scale), e37 = ohk::dequantize_pair<T>(w, 3, zero, scale);
  out.x = __byte_perm(e04, e15, 0x5410);  // elements 0, 1
  out.y = __byte_perm(e26, e37, 0x5410);  // 2, 3
  out.z = __byte_perm(e04, e15, 0x7632);  // 4, 5
  out.w = __byte_perm(e26, e37, 0x7632);  // 6, 7
  reinterpret_cast<uint4*>(static_cast<T*>(p.dequantized) + (size_t)row * p.k)[word] = out;
}

#define OHK_QLINEAR_KERNELS(TNAME, T, TILES)                                                                   \
  extern "C" __global__ void __launch_bounds__(kQlinearWarps * 32) qlinear_mma_##TNAME##_t##TILES(             \
      const LinearParams p) {                                                                                  \
    qlinear_mma<T, false, TILES>(p);                                                                           \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(kQlinearWarps * 32) qlinear_mma_swiglu_##TNAME##_t##TILES(      \
      const LinearParams p) {                                                                                  \
    qlinear_mma<T, true, TILES>(p);                                                                            \
  }
#define OHK_QLINEAR_TYPE(TNAME, T)                                                                             \
  OHK_QLINEAR_KERNELS(TNAME, T, 1)                                                                             \
  OHK_QLINEAR_KERNELS(TNAME, T, 2)                                                                             \
  OHK_QLINEAR_KERNELS(TNAME, T, 4)                                                                             \
  OHK_QLINEAR_KERNELS(TNAME, T, 8)                                                                             \
  extern "C" __global__ void __launch_bounds__(launch_config::kQlinearDequantizeThreads)                      \
      qlinear_dequantize_##TNAME(const LinearParams p) {                                                       \
    ohk::wait_for_inputs();                                                                                    \
    qlinear_dequantize<T>(p);                                                                                  \
  }
OHK_QLINEAR_TYPE(f16, __half)
OHK_QLINEAR_TYPE(bf16, __nv_bfloat16)
