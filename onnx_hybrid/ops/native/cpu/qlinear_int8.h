// QuantizedLinear at accuracy level 4 on the CPU (docs/op-contract.md#quantizedlinear): the 4-bit weight repacked
// once for the int8 products of cpu_kernels.h (Int8DotsArgs), and the input rows quantized to int8 per call.
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"
#include "cpu/cpu_kernels.h"

namespace onnx_hybrid {

// Element k of 4-bit values stored two a byte, the even one in the low nibble (QuantizedLinear's codes and zero
// points, MatMulNBits' layout).
inline int Nibble(const uint8_t* bytes, int64_t k) { return (bytes[k / 2] >> (4 * (k & 1))) & 15; }

// Whether a node with this block size takes the int8 path at accuracy level 4: chunks of the input must not
// straddle weight blocks.
inline bool Int8ProductsFit(int64_t block_size) { return block_size % kInt8Chunk == 0; }

// A QuantizedLinear weight ([weight rows, blocks, block_size / 2] codes, [weight rows, blocks] scales of `type`,
// optional zero points) in groups of kInt8GroupRows rows. With `swiglu` the gate and up halves are grouped apart,
// so that a tile of features finds its gate and up rows at the same offset in each half.
class Int8Weight {
 public:
  Int8Weight(ElemType type, int64_t weight_rows, int64_t blocks, int64_t block_size, bool swiglu,
             const uint8_t* weight, const void* scales, const uint8_t* zero_points);

  // The arguments of Int8Dots for `columns` weight rows from `row` (a multiple of kInt8GroupRows within its half).
  Int8DotsArgs Dots(int64_t row, int64_t columns) const;
  // Whether this was packed from these tensors (a kernel packs constant initializers once).
  bool PackedFrom(const void* weight, const void* scales, const void* zero_points) const {
    return sources_[0] == weight && sources_[1] == scales && sources_[2] == zero_points;
  }

 private:
  int64_t half_rows_, half_groups_, blocks_, chunks_, chunks_per_block_;
  const void* sources_[3];
  std::vector<uint8_t> codes_;
  std::vector<float> scales_;
  std::vector<int32_t> zeros_;  // empty without zero points (8)
};

// Input rows quantized per chunk of kInt8Chunk (QuantizeInt8Chunk in cpu_kernels.h).
struct Int8Rows {
  std::vector<int8_t> q;
  std::vector<float> scale;
  std::vector<int32_t> sum;
  int64_t rows = 0, chunks = 0;
  // Fill the first rows, `chunks` chunks each (the input's `in_features` zero-padded), from x [rows, in_features].
  void Quantize(const float* x, int64_t rows, int64_t in_features, int64_t chunks, const ParallelFor& parallel);
  // `args` with these rows as its input.
  void Bind(Int8DotsArgs& args) const;
};

}  // namespace onnx_hybrid
