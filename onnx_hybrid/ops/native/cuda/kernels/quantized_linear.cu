// QuantizedLinear: y [rows, N] = x [rows, K] @ dequantize(w)^T for 4-bit block-quantized weights in
// com.microsoft::MatMulNBits' layout (docs/op-contract.md#quantizedlinear). Each weight element dequantizes to
// T((q - zero_point) * scale), rounded once in T; the products sum in fp32.
//
// qlinear_mma_*: rows <= 8 * kQlinearMaxRowTiles. A warp takes 16 weight rows (16 output features, or with swiglu 8
// gate rows and their 8 up rows) as the A operand of mma.m16n8k16 and up to 8 rows of x per row tile as B, so the
// weights are read once whatever the number of rows. Lane (r = lane / 4, q = lane % 4) loads 16 bytes of weight
// rows r and r + 8 per 128-element segment: the 32 elements [128 s + 32 q, + 32), which are in one quantization
// block (block sizes are multiples of 32). A dot product does not care in which order its k terms come, so each
// lane's 32 elements serve as its A-fragment k positions over 8 mma steps, and the B fragments (x) are loaded in the
// same order; the nibble and pair shuffles below implement that order. A row's k is split among `splits` warps,
// split j taking segments j, j + splits, ... in that order, and their sums are added in split order.
//
// qlinear_row_*: one row of x (a decode step at batch 1), the same sums laid out for reading. The mma is the same,
// but each lane group r (lanes 4r .. 4r + 3) is a split of its own: its A rows r and r + 8 are two weight rows of
// one feature pair, B column r is x at that split's segment, and only C[r][r] and C[r + 8][r] are used. The splits
// of a pair sit in neighbouring lane groups, so a warp's load reads splits x 64 contiguous bytes of a weight row
// (where qlinear_mma reads 64 bytes of each of 16 rows), and a pair's lane groups add their sums in split order
// through shuffles. Since each sum sees the same operands in the same mma positions and order as in qlinear_mma,
// the bits are the same: a verify call's rows still equal the one-row calls of the decode steps they stand for.
// qlinear_dequantize_*: the same values, written out for cuBLAS (more rows).
#include "common.cuh"

constexpr int kQlinearWarps = launch_config::kQlinearWarps;
constexpr int kQlinearAhead = launch_config::kQlinearAhead;
constexpr int kQlinearRowPairs = launch_config::kQlinearRowPairs;

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

// 16 bytes of weights, which a call reads once: they skip L1, where x (read by every row tile or lane group) stays.
// On an H100 the 9B projections read 3-14% faster so at one row, 4-5% at 16 (docs/design-notes.md, qlinear_row).
__device__ __forceinline__ uint4 load_weights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// The zero point of block `block` from a row's packed zero points (two blocks a byte, low nibble first), or 8.
__device__ __forceinline__ unsigned qlinear_zero_point(const unsigned char* row_zero_points, int block) {
  if (row_zero_points == nullptr) return 8;
  return (__ldg(row_zero_points + (block >> 1)) >> ((block & 1) * 4)) & 15;
}

}  // namespace ohk

// One weight row as a lane reads it in the segments seg0, seg0 + splits, ...: its 16-byte pieces (this lane's
// quarter of each 128-element segment), scales and zero points. A dead row (past n) reads row 0 with its scales
// masked to zero, so that its A values are zero and no load needs a predicate for it.
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

// Segment seg0 + index * splits of `row`. ALIGNED calls (in_features a multiple of 128, blocks of at most 128, no
// zero points) have every lane's piece inside in_features and its block at block0 + index * splits * (128 /
// block_size); past the split's run they read segment seg0's piece, inside the row since every split has a segment,
// with its scale zeroed. Otherwise `valid` says whether the lane's 32 elements are inside in_features; a piece that
// is not (or is past the split's run) is read from the row's first 16 bytes and first scale, which every row has,
// with its scale zeroed: loads that stay inside the tensors, with no predicate.
template <typename T, bool ALIGNED>
__device__ __forceinline__ QlinearPiece qlinear_load(const QlinearRow<T>& row, int index, int q, bool valid,
                                                     int seg0, int splits, int block_shift) {
  QlinearPiece piece;
  if (ALIGNED) {
    const int block0 = (seg0 * 128 + q * 32) >> block_shift, at = valid ? index * splits : 0;
    piece.w = ohk::load_weights(row.w + at * 4);
    piece.scale = ohk::splat(__ldg(row.scales + block0 + (at << (7 - block_shift)))) & (valid ? row.live : 0u);
    piece.biased_zero = ohk::splat(ohk::Pair<T>::kMagic + 8);
    piece.high_zero = ohk::splat(ohk::Pair<T>::high_zero(8));
    return piece;
  }
  const int row_start = -(seg0 * 4 + q);  // from row.w back to the row's first piece, in 16-byte units
  const int block = valid ? ((seg0 + index * splits) * 128 + q * 32) >> block_shift : 0;
  piece.w = ohk::load_weights(row.w + (valid ? index * splits * 4 : row_start));
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

// ROW_PAIRS = 0: qlinear_mma_*, TILES row tiles of x. ROW_PAIRS > 0: qlinear_row_*, one row of x, each lane group
// taking ROW_PAIRS feature pairs (a gate row and its up row with swiglu) that share its x loads.
template <typename T, bool SWIGLU, int TILES, bool ALIGNED, int ROW_PAIRS>
__device__ __forceinline__ void qlinear_mma(const LinearParams& p) {
  constexpr bool ONE_ROW = ROW_PAIRS > 0;
  static_assert(!ONE_ROW || TILES == 1, "qlinear_row_* takes one row of x");
  static_assert(kQlinearWarps <= launch_config::kQlinearLaneGroups,
                "qlinear_row_* gives each split (at most kQlinearWarps) a lane group of its own");
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int r = lane >> 2, q = lane & 3;
  // Weight row tiles (m16) a warp takes (launch_config.h), or a lane group's feature pairs: each x load serves MT
  // times the weights. The splits and their segments depend on n and k only, so a row's sums are the same for every
  // MT, row count and kernel.
  constexpr int MT = ONE_ROW ? ROW_PAIRS : ALIGNED && TILES == launch_config::kQlinearTwoWeightTilesAt ? 2 : 1;
  constexpr int kTileFeatures = SWIGLU ? 8 : 16;  // output features per weight row tile
  const int split = ONE_ROW ? r % p.splits : warp % p.splits;
  const int f0 = (blockIdx.x * (kQlinearWarps / p.splits) + warp / p.splits) * kTileFeatures * MT;
  const int pair0 = ((blockIdx.x * kQlinearWarps + warp) * (launch_config::kQlinearLaneGroups / p.splits) +
                     r / p.splits) * MT;
  // Split j takes the segments j, j + splits, ... (the plan gives each at least two: an empty run would read past
  // its row, see qlinear_load).
  const int segments = (p.k + 127) >> 7;
  const int seg0 = split, count = (segments - split + p.splits - 1) / p.splits;
  // mma.sync needs the whole warp: qlinear_row_*'s lane groups, whose splits may have one segment more or less,
  // all run split 0's count, the extra segment with zeros for A and B (which leave a sum as it was).
  const int warp_count = ONE_ROW ? (segments + p.splits - 1) / p.splits : count;
  const int block_shift = __ffs(p.block_size) - 1;  // block_size is a power of two
  const int k_lane = p.k - q * 32;  // this lane's quarter of segment s is inside in_features when s * 128 < k_lane
  // Tile m's A rows r and r + 8: features fm + r and fm + r + 8, or gate row fm + r and its up row n + fm + r. One
  // row: pair m's features 2 pair and 2 pair + 1, or gate row pair and its up row.
  QlinearRow<T> rows[MT][2];
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    const int lo = ONE_ROW ? (SWIGLU ? pair0 + m : 2 * (pair0 + m)) : f0 + m * kTileFeatures + r;
    const int hi = SWIGLU ? p.n + lo : ONE_ROW ? lo + 1 : lo + 8;
    const bool live_lo = lo < p.n, live_hi = SWIGLU ? live_lo : hi < p.n;
    rows[m][0] = QlinearRow<T>(p, lo, live_lo, q, seg0, block_shift);
    rows[m][1] = QlinearRow<T>(p, hi, live_hi, q, seg0, block_shift);
  }

  QlinearPiece ahead[kQlinearAhead][MT][2];
#pragma unroll
  for (int a = 0; a < kQlinearAhead; ++a) {
    const bool valid = a < count && (seg0 + a * p.splits) * 128 < k_lane;
#pragma unroll
    for (int m = 0; m < MT; ++m)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        ahead[a][m][h] = qlinear_load<T, ALIGNED>(rows[m][h], a, q, valid, seg0, p.splits, block_shift);
  }
  ohk::wait_for_inputs();

  // B rows: x row t * 8 + r (rows past the call's read row 0: their columns of the product are never stored).
  const uint4* x_rows[TILES];
#pragma unroll
  for (int t = 0; t < TILES; ++t)
    x_rows[t] = reinterpret_cast<const uint4*>(static_cast<const T*>(p.x) +
                                               (size_t)(t * 8 + r < p.rows ? t * 8 + r : 0) * p.k + q * 32) + seg0 * 16;
  float acc[TILES][MT][4] = {};
  for (int base = 0; base < warp_count; base += kQlinearAhead) {
#pragma unroll
    for (int a = 0; a < kQlinearAhead; ++a) {
      const int index = base + a;
      if (index < warp_count) {  // uniform across the warp
        const bool valid = index < count && (ALIGNED || (seg0 + index * p.splits) * 128 < k_lane);
        const uint4* x_seg[TILES];  // this segment's x pieces
#pragma unroll
        for (int t = 0; t < TILES; ++t) x_seg[t] = x_rows[t] + (valid ? index * p.splits * 16 : 0);
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
        const bool next_valid = next < count && (ALIGNED || (seg0 + next * p.splits) * 128 < k_lane);
#pragma unroll
        for (int m = 0; m < MT; ++m)
#pragma unroll
          for (int h = 0; h < 2; ++h)
            ahead[a][m][h] = qlinear_load<T, ALIGNED>(rows[m][h], next, q, next_valid, seg0, p.splits, block_shift);
      }
    }
  }

  if (ONE_ROW) {
    // C[r][r] and C[r + 8][r] (pair m's two sums for this lane group's split) are on lane q = r / 2, in acc[0][m][r %
    // 2] and acc[0][m][2 + r % 2]. The splits of a pair are lane groups first .. first + splits - 1, added in split
    // order as qlinear_mma's warps are.
    const int first = r - split;
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      float sums[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const float mine = r & 1 ? acc[0][m][2 * h + 1] : acc[0][m][2 * h];  // constant indices: registers
        sums[h] = mine;
        if (p.splits > 1) {
          sums[h] = 0.f;
          for (int s = 0; s < p.splits; ++s) {
            const int g = first + s;
            sums[h] += __shfl_sync(0xFFFFFFFFu, mine, 4 * g + (g >> 1));
          }
        }
      }
      if (split != 0 || q != (r >> 1)) continue;
      const int lo = SWIGLU ? pair0 + m : 2 * (pair0 + m);
#pragma unroll
      for (int h = 0; h < (SWIGLU ? 1 : 2); ++h) {
        const int feature = lo + h;
        if (feature >= p.n) continue;
        int column, width;
        T* y = qlinear_output<T>(p, feature, column, width);
        y[column] = ohk::from_f32<T>(SWIGLU ? linear_swiglu_value(sums[0], sums[1]) : sums[h]);
      }
    }
    return;
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

// qlinear_mma_{swiglu_}<type>_t<row tiles>{_aligned}, qlinear_row_{swiglu_}<type>{_aligned}
#define OHK_QLINEAR_KERNEL(NAME, T, SWIGLU, TILES, ALIGNED, ROW_PAIRS)                                         \
  extern "C" __global__ void __launch_bounds__(kQlinearWarps * 32) NAME(const LinearParams p) {                \
    qlinear_mma<T, SWIGLU, TILES, ALIGNED, ROW_PAIRS>(p);                                                      \
  }
#define OHK_QLINEAR_KERNELS(TNAME, T, TILES)                                                                   \
  OHK_QLINEAR_KERNEL(qlinear_mma_##TNAME##_t##TILES, T, false, TILES, false, 0)                                \
  OHK_QLINEAR_KERNEL(qlinear_mma_swiglu_##TNAME##_t##TILES, T, true, TILES, false, 0)                          \
  OHK_QLINEAR_KERNEL(qlinear_mma_##TNAME##_t##TILES##_aligned, T, false, TILES, true, 0)                       \
  OHK_QLINEAR_KERNEL(qlinear_mma_swiglu_##TNAME##_t##TILES##_aligned, T, true, TILES, true, 0)
#define OHK_QLINEAR_ROW_KERNELS(TNAME, T)                                                                      \
  OHK_QLINEAR_KERNEL(qlinear_row_##TNAME, T, false, 1, false, kQlinearRowPairs)                                \
  OHK_QLINEAR_KERNEL(qlinear_row_swiglu_##TNAME, T, true, 1, false, kQlinearRowPairs)                          \
  OHK_QLINEAR_KERNEL(qlinear_row_##TNAME##_aligned, T, false, 1, true, kQlinearRowPairs)                       \
  OHK_QLINEAR_KERNEL(qlinear_row_swiglu_##TNAME##_aligned, T, true, 1, true, kQlinearRowPairs)
#define OHK_QLINEAR_TYPE(TNAME, T)                                                                             \
  OHK_QLINEAR_ROW_KERNELS(TNAME, T)                                                                            \
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
