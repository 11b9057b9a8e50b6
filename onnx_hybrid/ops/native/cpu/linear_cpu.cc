#include "cpu/linear_cpu.h"

#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "cpu/cpu_kernels.h"

namespace onnx_hybrid {
namespace {
constexpr int64_t kFeatureTile = 64;  // output features per work item

// `n` floats at element `offset` of `src`: the data itself for fp32, else widened into `buffer`.
const float* AsFloat(ElemType type, const void* src, int64_t offset, int64_t n, std::unique_ptr<float[]>& buffer) {
  if (type == ElemType::kFloat) return static_cast<const float*>(src) + offset;
  buffer.reset(new float[static_cast<size_t>(std::max<int64_t>(n, 1))]);
  LoadAsFloat(type, src, offset, n, buffer.get());
  return buffer.get();
}

// Columns [f0, f0 + width) of the rows' outputs, from `y` [rows, width], into the outputs that hold them.
void StoreColumns(const LinearGeometry& geo, ElemType type, const float* y, int64_t f0, int64_t width,
                  void* const* outputs) {
  int64_t start = 0;
  for (size_t j = 0; j < geo.parts.size(); start += geo.parts[j], ++j) {
    const int64_t lo = std::max(f0, start), hi = std::min(f0 + width, start + geo.parts[j]);
    for (int64_t r = 0; hi > lo && r < geo.rows; ++r)
      StoreFromFloat(type, y + r * width + (lo - f0), hi - lo, outputs[j], r * geo.parts[j] + (lo - start));
  }
}

// y[r * ldy + i] for every input row r and i < count: the fp32 products of the rows with weight rows
// [row, row + count).
using TileProducts = std::function<void(int64_t row, int64_t count, float* y, int64_t ldy)>;

void RunProducts(const LinearGeometry& geo, ElemType type, const TileProducts& products, void* const* outputs,
                 const ParallelFor& parallel) {
  const int64_t rows = geo.rows, out = geo.out_features;
  const int64_t tiles = (out + kFeatureTile - 1) / kFeatureTile;
  parallel.Run(static_cast<size_t>(tiles), [&](size_t index) {
    const int64_t f0 = static_cast<int64_t>(index) * kFeatureTile;
    const int64_t width = std::min(kFeatureTile, out - f0);
    if (type == ElemType::kFloat && !geo.swiglu && geo.parts.size() == 1) {  // fp32 sums are the output
      products(f0, width, static_cast<float*>(outputs[0]) + f0, out);
      return;
    }
    std::unique_ptr<float[]> y(new float[static_cast<size_t>(rows * width)]);
    products(f0, width, y.get(), width);
    if (geo.swiglu) {  // the tile's gate sums are in y; its up rows are `out` rows further down the weight
      std::unique_ptr<float[]> up(new float[static_cast<size_t>(rows * width)]);
      products(out + f0, width, up.get(), width);
      Kernels().silu(y.get(), rows * width);
      for (int64_t i = 0; i < rows * width; ++i) y[i] *= up[i];
    }
    StoreColumns(geo, type, y.get(), f0, width, outputs);
  });
}

// The fp32 products of the input with weight rows that `weight_rows` returns as floats (the data itself for
// fp32, else a buffer it fills).
using WeightRows = std::function<const float*(int64_t row, int64_t count, std::unique_ptr<float[]>& buffer)>;

void RunFloatProducts(const LinearGeometry& geo, ElemType type, const void* input, const WeightRows& weight_rows,
                      void* const* outputs, const ParallelFor& parallel) {
  const int64_t rows = geo.rows, in = geo.in_features;
  if (rows == 0 || geo.out_features == 0) return;
  std::unique_ptr<float[]> x_buffer;  // the input widened once, shared by every work item
  const float* x = AsFloat(type, input, 0, rows * in, x_buffer);
  RunProducts(geo, type, [&](int64_t row, int64_t count, float* y, int64_t ldy) {
    std::unique_ptr<float[]> w_buffer;
    Kernels().dots(rows, count, in, x, in, weight_rows(row, count, w_buffer), in, y, ldy);
  }, outputs, parallel);
}
}  // namespace

void RunLinearCpu(const LinearGeometry& geo, ElemType type, const void* input, const void* weight,
                  void* const* outputs, const ParallelFor& parallel) {
  const int64_t in = geo.in_features;
  RunFloatProducts(geo, type, input, [&](int64_t row, int64_t count, std::unique_ptr<float[]>& buffer) {
    return AsFloat(type, weight, row * in, count * in, buffer);
  }, outputs, parallel);
}

void RunQuantizedLinearCpu(const QuantizedLinearGeometry& geo, ElemType type, const void* input,
                           const uint8_t* weight, const void* scales, const uint8_t* zero_points,
                           void* const* outputs, const ParallelFor& parallel) {
  const int64_t in = geo.in_features, blocks = geo.blocks, bs = geo.block_size;
  const int64_t row_bytes = blocks * bs / 2, zero_point_bytes = (blocks + 1) / 2;
  RunFloatProducts(geo, type, input, [&](int64_t row, int64_t count, std::unique_ptr<float[]>& buffer) {
    buffer.reset(new float[static_cast<size_t>(std::max<int64_t>(count * in, 1))]);
    std::unique_ptr<float[]> scale(new float[static_cast<size_t>(blocks)]);
    std::vector<uint16_t> rounded(type == ElemType::kFloat ? 0 : static_cast<size_t>(in));
    for (int64_t r = 0; r < count; ++r) {
      const int64_t w_row = row + r;
      LoadAsFloat(type, scales, w_row * blocks, blocks, scale.get());
      const uint8_t* packed = weight + w_row * row_bytes;
      float* dst = buffer.get() + r * in;
      for (int64_t block = 0; block < blocks; ++block) {
        const int zero = zero_points ? Nibble(zero_points + w_row * zero_point_bytes, block) : 8;
        // The block's 16 values, rounded once: in fp32 for fp32; exact for 16-bit scales (at most 11 + 4 bits),
        // then rounded to T below. A byte holds elements k (low nibble) and k + 1 (k even: block sizes are).
        float value[16];
        for (int q = 0; q < 16; ++q) value[q] = static_cast<float>(q - zero) * scale[block];
        const int64_t k0 = block * bs, k1 = std::min(in, k0 + bs);
        const uint8_t* bytes = packed + k0 / 2;
        int64_t k = k0;
        for (; k + 1 < k1; k += 2, ++bytes) {
          dst[k] = value[*bytes & 15];
          dst[k + 1] = value[*bytes >> 4];
        }
        if (k < k1) dst[k] = value[*bytes & 15];
      }
      if (type != ElemType::kFloat) {  // T((q - zero_point) * scale): one rounding, as the CUDA kernels'
        StoreFromFloat(type, dst, in, rounded.data(), 0);
        LoadAsFloat(type, rounded.data(), 0, in, dst);
      }
    }
    return static_cast<const float*>(buffer.get());
  }, outputs, parallel);
}

void RunQuantizedLinearInt8Cpu(const QuantizedLinearGeometry& geo, ElemType type, const void* input,
                               const Int8Weight& weight, void* const* outputs, const ParallelFor& parallel) {
  const int64_t rows = geo.rows, in = geo.in_features;
  if (rows == 0 || geo.out_features == 0) return;
  std::unique_ptr<float[]> x_buffer;
  Int8Rows quantized;
  quantized.Quantize(AsFloat(type, input, 0, rows * in, x_buffer), rows, in, geo.blocks * geo.block_size / kInt8Chunk,
                     parallel);
  RunProducts(geo, type, [&](int64_t row, int64_t count, float* y, int64_t ldy) {
    Int8DotsArgs args = weight.Dots(row, count);
    quantized.Bind(args);
    args.out = y;
    args.ldo = ldy;
    Kernels().int8_dots(args);
  }, outputs, parallel);
}

}  // namespace onnx_hybrid
