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
  static constexpr unsigned kMagic = 0x6400u;  // 1024.0: 1024 + q is exact for q < 1024, its bits 0x6400 | q
  // The bits of -(64 + zero_point): with the nibble left in place (1024 + 16 q), (1024 + 16 q) / 16 - (64 + z) is
  // q - z, exact in one fused multiply-add, so a word's nibbles 1 and 3 of each byte need no shift.
  __device__ static constexpr unsigned high_zero(unsigned zero_point) { return 0xD400u + (zero_point << 4); }
};
template <> struct Pair<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static constexpr unsigned kMagic = 0x4300u;  // 128.0: 128 + q is exact for q < 128, its bits 0x4300 | q
  // Unused: bf16's 7 mantissa bits cannot hold 16 q.
  __device__ static constexpr unsigned high_zero(unsigned) { return 0; }
};

// Word i (0..3) of a 16-byte piece.
__device__ __forceinline__ unsigned word(const uint4& v, int i) {
  return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w;
}

// Both halves of a pair set to the 16-bit pattern `bits`.
__device__ __forceinline__ unsigned splat(unsigned bits) { return bits * 0x00010001u; }

// Nibbles m and m + 4 of `word` (bits 4m and 16 + 4m: elements k + m and k + m + 4) as a pair of T, dequantized:
// (magic + q) - (magic + zero_point) is exact, the product by the scale rounds once. `biased_zero` and `scale` are
// pairs of bits (splat).
template <typename T>
__device__ __forceinline__ unsigned dequantize_pair(unsigned word, int m, unsigned biased_zero, unsigned scale) {
  using P = typename Pair<T>::type;
  unsigned bits;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;\n"
      : "=r"(bits)
      : "r"(word >> (4 * m)), "r"(0x000F000Fu), "r"(splat(Pair<T>::kMagic)));
  const P q = *reinterpret_cast<const P*>(&bits);
  const P z = *reinterpret_cast<const P*>(&biased_zero), s = *reinterpret_cast<const P*>(&scale);
  const P v = __hmul2(__hsub2(q, z), s);
  return *reinterpret_cast<const unsigned*>(&v);
}

// The four pairs (m, m + 4), m = 0..3, of the 8 nibbles of `word`, dequantized as dequantize_pair does.
template <typename T>
__device__ __forceinline__ void dequantize_word(unsigned word, unsigned biased_zero, unsigned high_zero,
                                                unsigned scale, unsigned (&pairs)[4]) {
#pragma unroll
  for (int m = 0; m < 4; ++m) pairs[m] = dequantize_pair<T>(word, m, biased_zero, scale);
}
// fp16: one shift for the word; nibbles 1 and 3 of each byte pair stay in place (see Pair<__half>::high_zero).
template <>
__device__ __forceinline__ void dequantize_word<__half>(unsigned word, unsigned biased_zero, unsigned high_zero,
                                                        unsigned scale, unsigned (&pairs)[4]) {
  const unsigned upper = word >> 8, magic = splat(Pair<__half>::kMagic);
  const __half2 z = *reinterpret_cast<const __half2*>(&biased_zero), zh = *reinterpret_cast<const __half2*>(&high_zero);
  const __half2 s = *reinterpret_cast<const __half2*>(&scale), sixteenth = __float2half2_rn(0.0625f);
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    unsigned bits;
    asm("lop3.b32 %0, %1, %2, %3, 0xea;\n"
        : "=r"(bits)
        : "r"(m < 2 ? word : upper), "r"(m % 2 ? 0x00F000F0u : 0x000F000Fu), "r"(magic));
    const __half2 q = *reinterpret_cast<const __half2*>(&bits);
    const __half2 v = __hmul2(m % 2 ? __hfma2(q, sixteenth, zh) : __hsub2(q, z), s);
    pairs[m] = *reinterpret_cast<const unsigned*>(&v);
  }
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

// The zero point of block `block` from a row's packed zero points (two blocks a byte, low nibble first), or 8.
__device__ __forceinline__ unsigned qlinear_zero_point(const unsigned char* row_zero_points, int block) {
  if (row_zero_points == nullptr) return 8;
  return (__ldg(row_zero_points + (block >> 1)) >> ((block & 1) * 4)) & 15;
}

}  // namespace ohk

// One weight row as a lane reads it from segment seg0 on: its 16-byte pieces (this lane's quarter of each
// 128-element segment), scales and zero points. A dead row (past n) reads row 0 with its scales masked to zero, so
// that its A values are zero and no load needs a predicate for it.
template <typename T>
struct QlinearRow {
  const uint4* w;                   // segment seg0's piece
  const unsigned short* scales;     // the row's
  const unsigned char* zero_points;  // the row's, or null (8)
  unsigned live;                    // all ones, or zero for a dead row

  QlinearRow() = default;
  __device__ __forceinline__ QlinearRow(const LinearParams& p, int row, bool is_live, int q, int seg0,
                                        int block_shift) {
    row = is_live ? row : 0;
    const size_t row_bytes = (size_t)p.k_blocks << (block_shift - 1);
    w = reinterpret_cast<const uint4*>(static_cast<const unsigned char*>(p.w) + row * row_bytes + q * 16) + seg0 * 4;
    scales = static_cast<const unsigned short*>(p.scales) + (size_t)row * p.k_blocks;
    zero_points = p.zero_points ? p.zero_points + (size_t)row * ((p.k_blocks + 1) / 2) : nullptr;
    live = is_live ? 0xFFFFFFFFu : 0u;
  }
};

// A row's share of a segment for this lane: 16 bytes of codes (32 elements of one block), and the block's scale and
// zero point as pairs of bits (ohk::dequantize_word's operands); the scale zero where the lane's elements are past
// in_features.
struct QlinearPiece {
  uint4 w;
  unsigned scale, biased_zero, high_zero;
};

// Segment seg0 + index of `row`. ALIGNED calls (in_features a multiple of 128, blocks of at most 128, no zero
// points) have every lane's piece inside in_features and its block at block0 + index * (128 / block_size); past
// the warp's run (never used) they read segment seg0's piece, inside the row since every warp has a segment.
// Otherwise `valid` says whether the lane's 32 elements are inside in_features; a piece that is not (or is past the
// warp's run) is read from the row's first 16 bytes and first scale, which every row has, with its scale zeroed:
// plain loads that stay inside the tensors, which the compiler may schedule freely.
template <typename T, bool ALIGNED>
__device__ __forceinline__ QlinearPiece qlinear_load(const QlinearRow<T>& row, int index, int q, bool valid,
                                                     int seg0, int block_shift) {
  QlinearPiece piece;
  if (ALIGNED) {
    const int block0 = (seg0 * 128 + q * 32) >> block_shift, at = valid ? index : 0;
    piece.w = __ldg(row.w + at * 4);
    piece.scale = ohk::splat(__ldg(row.scales + block0 + (at << (7 - block_shift)))) & row.live;
    piece.biased_zero = ohk::splat(ohk::Pair<T>::kMagic + 8);
    piece.high_zero = ohk::splat(ohk::Pair<T>::high_zero(8));
    return piece;
  }
  const int row_start = -(seg0 * 4 + q);  // from row.w back to the row's first piece, in 16-byte units
  const int block = valid ? ((seg0 + index) * 128 + q * 32) >> block_shift : 0;
  piece.w = __ldg(row.w + (valid ? index * 4 : row_start));
  piece.scale = ohk::splat(__ldg(row.scales + block)) & (valid ? row.live : 0u);
  const unsigned zero = ohk::qlinear_zero_point(row.zero_points, block);  // null: uniform across the grid
  piece.biased_zero = ohk::splat(ohk::Pair<T>::kMagic + zero);
  piece.high_zero = ohk::splat(ohk::Pair<T>::high_zero(zero));
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

template <typename T, bool SWIGLU, int TILES, bool ALIGNED>
__device__ __forceinline__ void qlinear_mma(const LinearParams& p) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane >> 2, q = lane & 3;
  // Weight row tiles (m16) a warp takes (launch_config.h): each x load serves MT times the weights. The warps of a
  // group and their segments depend on n and k only, so a row's sums are the same for every MT.
  constexpr int MT = ALIGNED && TILES == launch_config::kQlinearTwoWeightTilesAt ? 2 : 1;
  constexpr int kTileFeatures = SWIGLU ? 8 : 16;  // output features per weight row tile
  const int f0 = (blockIdx.x * (kQlinearWarps / p.splits) + warp / p.splits) * kTileFeatures * MT;
  const int split = warp % p.splits;
  // Each warp of a group takes a contiguous run of segments (the group adds them in split order below).
  const int segments = (p.k + 127) >> 7;
  // As even as can be; the plan gives a warp at least two segments (an empty run would read past its row, see
  // qlinear_load).
  const int seg0 = split * segments / p.splits, count = (split + 1) * segments / p.splits - seg0;
  const int block_shift = __ffs(p.block_size) - 1;  // block_size is a power of two
  const int k_lane = p.k - q * 32;  // this lane's quarter of segment s is inside in_features when s * 128 < k_lane
  // Tile m's A rows r and r + 8: features fm + r and fm + r + 8, or gate row fm + r and its up row n + fm + r.
  QlinearRow<T> rows[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int fm = f0 + m * kTileFeatures;
    const bool live_lo = fm + r < p.n, live_hi = SWIGLU ? live_lo : fm + r + 8 < p.n;
    rows[m][0] = QlinearRow<T>(p, fm + r, live_lo, q, seg0, block_shift);
    rows[m][1] = QlinearRow<T>(p, SWIGLU ? p.n + fm + r : fm + r + 8, live_hi, q, seg0, block_shift);
  }

  QlinearPiece ahead[kQlinearAhead][MT][2];
#pragma unroll
  for (int a = 0; a < kQlinearAhead; ++a) {
    const bool valid = a < count && (seg0 + a) * 128 < k_lane;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h) ahead[a][m][h] = qlinear_load<T, ALIGNED>(rows[m][h], a, q, valid, seg0, block_shift);
  }
  ohk::wait_for_inputs();

  // B rows: x row t * 8 + r (rows past the call's read row 0: their columns of the product are never stored).
  const uint4* x_rows[TILES];
#pragma unroll
  for (int t = 0; t < TILES; ++t)
    x_rows[t] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) +
                                               (size_t)(t * 8 + r < p.rows ? t * 8 + r : 0) * p.k + q * 32) + seg0 * 16;
  float acc[TILES][MT][4] = {};
  for (int base = 0; base < count; base += kQlinearAhead) {
#pragma unroll
    for (int a = 0; a < kQlinearAhead; ++a) {
      const int index = base + a;
      if (index < count) {  // uniform across the warp
        const bool valid = ALIGNED || (seg0 + index) * 128 < k_lane;
        const uint4* x_seg[TILES];  // this segment's x pieces
#pragma unroll
        for (int t = 0; t < TILES; ++t) x_seg[t] = x_rows[t] + (valid ? index * 16 : 0);
#pragma unroll
        for (int i = 0; i < 4; ++i) {  // word i: elements 8 i .. 8 i + 7 of this lane's 32
          // Step 2i takes elements (0, 4) and (1, 5) of the word, step 2i + 1 (2, 6) and (3, 7).
          unsigned a_even[MT][4], a_odd[MT][4];
#pragma unroll
          for (int m = 0; m < MT; ++m) {
            const QlinearPiece& lo = ahead[a][m][0];
            const QlinearPiece& hi = ahead[a][m][1];
            unsigned lo_pairs[4], hi_pairs[4];
            ohk::dequantize_word<T>(ohk::word(lo.w, i), lo.biased_zero, lo.high_zero, lo.scale, lo_pairs);
            ohk::dequantize_word<T>(ohk::word(hi.w, i), hi.biased_zero, hi.high_zero, hi.scale, hi_pairs);
#pragma unroll
            for (int j = 0; j < 2; ++j) {  // mma's A registers: row r, row r + 8, then the same for the next k pair
              a_even[m][2 * j] = lo_pairs[j], a_even[m][2 * j + 1] = hi_pairs[j];
              a_odd[m][2 * j] = lo_pairs[2 + j], a_odd[m][2 * j + 1] = hi_pairs[2 + j];
            }
          }
#pragma unroll
          for (int t = 0; t < TILES; ++t) {  // B: the same elements of x row t * 8 + r, paired as A's
            // An invalid lane's A values are zero, but 0 * inf or NaN is not: its B values are zero too (what lies
            // past a row's in_features, or past the input, is not its data).
            const uint4 v = valid ? __ldg(x_seg[t] + i) : make_uint4(0, 0, 0, 0);
            const unsigned b_even[2] = {__byte_perm(v.x, v.z, 0x5410), __byte_perm(v.x, v.z, 0x7632)};
            const unsigned b_odd[2] = {__byte_perm(v.y, v.w, 0x5410), __byte_perm(v.y, v.w, 0x7632)};
#pragma unroll
            for (int m = 0; m < MT; ++m) {
              ohk::mma_16816<T>(acc[t][m], a_even[m], b_even);
              ohk::mma_16816<T>(acc[t][m], a_odd[m], b_odd);
            }
          }
        }
        // The segment kQlinearAhead on, into the registers this one has just freed.
        const int next = index + kQlinearAhead;
        const bool next_valid = next < count && (ALIGNED || (seg0 + next) * 128 < k_lane);
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            ahead[a][m][h] = qlinear_load<T, ALIGNED>(rows[m][h], next, q, next_valid, seg0, block_shift);
      }
    }
  }

  if (p.splits > 1) {  // the warps of a group add their sums in split order
    __shared__ float partial[kQlinearWarps][TILES * MT * 4][32];
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int c = 0; c < 4; ++c) partial[warp][(t * MT + m) * 4 + c][lane] = acc[t][m][c];
    __syncthreads();
    if (split != 0) return;
#pragma unroll
    for (int t = 0; t < TILES; ++t)
#pragma unroll
      for (int m = 0; m < MT; ++m)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          float sum = 0.f;
          for (int s = 0; s < p.splits; ++s) sum += partial[warp + s][(t * MT + m) * 4 + c][lane];
          acc[t][m][c] = sum;
        }
  }

  // C: acc[t][m][0..1] hold tile m's A row r at x rows t * 8 + 2q and + 1, acc[t][m][2..3] its A row r + 8.
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int h = 0; h < (SWIGLU ? 1 : 2); ++h) {
      const int feature = f0 + m * kTileFeatures + r + 8 * h;
      if (feature >= p.n) continue;
      int column, width;
      T* y = qlinear_output<T>(p, feature, column, width);
#pragma unroll
      for (int t = 0; t < TILES; ++t)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int row = t * 8 + 2 * q + e;
          if (row >= p.rows) continue;
          const float v = SWIGLU ? linear_swiglu_value(acc[t][m][e], acc[t][m][2 + e]) : acc[t][m][2 * h + e];
          y[(size_t)row * width + column] = ohk::from_f32<T>(v);
        }
    }
}

// Each thread dequantizes one 32-bit word (8 elements) of the packed weight into `dequantized` [weight rows, k].
template <typename T>
__device__ __forceinline__ void qlinear_dequantize(const LinearParams& p) {
  const size_t words_per_row = (size_t)p.k / 8;
  const size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  const int weight_rows = p.swiglu ? 2 * p.n : p.n;
  if (i >= words_per_row * weight_rows) return;
  const int row = int(i / words_per_row), word = int(i % words_per_row);
  const int block_shift = __ffs(p.block_size) - 1;
  const int block = (word * 8) >> block_shift;
  const size_t row_bytes = (size_t)p.k_blocks << (block_shift - 1);
  const unsigned w = __ldg(reinterpret_cast<const unsigned*>(static_cast<const unsigned char*>(p.w) + row * row_bytes) +
                           word);
  const unsigned scale =
      ohk::splat(__ldg(static_cast<const unsigned short*>(p.scales) + (size_t)row * p.k_blocks + block));
  const unsigned char* zero_points = p.zero_points ? p.zero_points + (size_t)row * ((p.k_blocks + 1) / 2) : nullptr;
  const unsigned zero = ohk::splat(ohk::Pair<T>::kMagic + ohk::qlinear_zero_point(zero_points, block));
  const unsigned e04 = ohk::dequantize_pair<T>(w, 0, zero, scale), e15 = ohk::dequantize_pair<T>(w, 1, zero, scale);
  const unsigned e26 = ohk::dequantize_pair<T>(w, 2, zero, scale), e37 = ohk::dequantize_pair<T>(w, 3, zero, scale);
  uint4 out;
  out.x = __byte_perm(e04, e15, 0x5410);  // elements 0, 1
  out.y = __byte_perm(e26, e37, 0x5410);  // 2, 3
  out.z = __byte_perm(e04, e15, 0x7632);  // 4, 5
  out.w = __byte_perm(e26, e37, 0x7632);  // 6, 7
  reinterpret_cast<uint4*>(static_cast<T*>(p.dequantized) + (size_t)row * p.k)[word] = out;
}

// qlinear_mma_{swiglu_}<type>_t<row tiles>{_aligned}
#define OHK_QLINEAR_KERNEL(NAME, T, SWIGLU, TILES, ALIGNED)                                                    \
  extern "C" __global__ void __launch_bounds__(kQlinearWarps * 32) NAME(const LinearParams p) {                \
    qlinear_mma<T, SWIGLU, TILES, ALIGNED>(p);                                                                 \
  }
#define OHK_QLINEAR_KERNELS(TNAME, T, TILES)                                                                   \
  OHK_QLINEAR_KERNEL(qlinear_mma_##TNAME##_t##TILES, T, false, TILES, false)                                   \
  OHK_QLINEAR_KERNEL(qlinear_mma_swiglu_##TNAME##_t##TILES, T, true, TILES, false)                             \
  OHK_QLINEAR_KERNEL(qlinear_mma_##TNAME##_t##TILES##_aligned, T, false, TILES, true)                          \
  OHK_QLINEAR_KERNEL(qlinear_mma_swiglu_##TNAME##_t##TILES##_aligned, T, true, TILES, true)
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
