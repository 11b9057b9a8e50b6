#include "cpu/qlinear_int8.h"

#include <algorithm>

namespace onnx_hybrid {

Int8Weight::Int8Weight(ElemType type, int64_t weight_rows, int64_t blocks, int64_t block_size, bool swiglu,
                       const uint8_t* weight, const void* scales, const uint8_t* zero_points)
    : half_rows_(swiglu ? weight_rows / 2 : weight_rows),
      half_groups_((half_rows_ + kInt8GroupRows - 1) / kInt8GroupRows),
      blocks_(blocks),
      chunks_(blocks * block_size / kInt8Chunk),
      chunks_per_block_(block_size / kInt8Chunk),
      sources_{weight, scales, zero_points} {
  const int64_t groups = (swiglu ? 2 : 1) * half_groups_, block_bytes = block_size / 2;
  codes_.assign(static_cast<size_t>(groups * chunks_ * kInt8ChunkBytes), 0);
  scales_.assign(static_cast<size_t>(groups * blocks_ * kInt8GroupRows), 0.0f);  // padding rows: zero weights
  if (zero_points) zeros_.assign(scales_.size(), 0);
  std::vector<float> row_scales(static_cast<size_t>(blocks_));
  for (int64_t group = 0; group < groups; ++group) {
    const int64_t first = (group / half_groups_) * half_rows_ + (group % half_groups_) * kInt8GroupRows;
    const int64_t live = std::min(kInt8GroupRows, (group / half_groups_ + 1) * half_rows_ - first);
    for (int64_t i = 0; i < live; ++i) {
      const int64_t n = first + i;
      LoadAsFloat(type, scales, n * blocks_, blocks_, row_scales.data());
      for (int64_t b = 0; b < blocks_; ++b) {
        const int64_t at = (group * blocks_ + b) * kInt8GroupRows + i;
        scales_[at] = row_scales[b];
        if (zero_points) zeros_[at] = Nibble(zero_points + n * ((blocks_ + 1) / 2), b);
      }
      const uint8_t* row = weight + n * blocks_ * block_bytes;  // whole blocks: chunks never straddle them
      for (int64_t c = 0; c < chunks_; ++c) {
        const uint8_t* bytes = row + c * kInt8Chunk / 2;
        uint8_t* chunk = codes_.data() + (group * chunks_ + c) * kInt8ChunkBytes;
        for (int64_t j = 0; j < 4; ++j)
          for (int64_t t = 0; t < 4; ++t) {  // elements 8j + t (low nibble) and 8j + 4 + t (high)
            const int low = Nibble(bytes, 8 * j + t), high = Nibble(bytes, 8 * j + 4 + t);
            chunk[32 * j + 4 * i + t] = static_cast<uint8_t>(low | high << 4);
          }
      }
    }
  }
}

Int8DotsArgs Int8Weight::Dots(int64_t row, int64_t columns) const {
  const int64_t group = (row / half_rows_) * half_groups_ + (row % half_rows_) / kInt8GroupRows;
  Int8DotsArgs args{};
  args.codes = codes_.data() + group * chunks_ * kInt8ChunkBytes;
  args.w_scale = scales_.data() + group * blocks_ * kInt8GroupRows;
  args.w_zero = zeros_.empty() ? nullptr : zeros_.data() + group * blocks_ * kInt8GroupRows;
  args.chunks = chunks_;
  args.chunks_per_block = chunks_per_block_;
  args.groups = (columns + kInt8GroupRows - 1) / kInt8GroupRows;
  args.columns = columns;
  return args;
}

void Int8Rows::Quantize(const float* x, int64_t row_count, int64_t in_features, int64_t chunk_count,
                        const ParallelFor& parallel) {
  rows = row_count;
  chunks = chunk_count;
  const int64_t width = chunks * kInt8Chunk;
  q.resize(static_cast<size_t>(rows * width));
  scale.resize(static_cast<size_t>(rows * chunks));
  sum.resize(scale.size());
  parallel.Run(static_cast<size_t>(rows), [&](size_t index) {
    const int64_t r = static_cast<int64_t>(index);
    Kernels().int8_quantize(x + r * in_features, in_features, chunks, q.data() + r * width, scale.data() + r * chunks,
                            sum.data() + r * chunks);
  });
}

void Int8Rows::Bind(Int8DotsArgs& args) const {
  args.q = q.data();
  args.q_scale = scale.data();
  args.q_sum = sum.data();
  args.rows = rows;
}

}  // namespace onnx_hybrid
