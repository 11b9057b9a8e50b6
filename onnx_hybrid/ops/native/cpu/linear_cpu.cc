#include "cpu/linear_cpu.h"

#include <algorithm>
#include <memory>

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
}  // namespace

void RunLinearCpu(const LinearGeometry& geo, ElemType type, const void* input, const void* weight,
                  void* const* outputs, const ParallelFor& parallel) {
  const int64_t rows = geo.rows, in = geo.in_features, out = geo.out_features;
  if (rows == 0 || out == 0) return;
  const CpuKernels& kernels = Kernels();
  std::unique_ptr<float[]> x_buffer;  // the input widened once, shared by every work item
  const float* x = AsFloat(type, input, 0, rows * in, x_buffer);
  const int64_t tiles = (out + kFeatureTile - 1) / kFeatureTile;
  parallel.Run(static_cast<size_t>(tiles), [&](size_t index) {
    const int64_t f0 = static_cast<int64_t>(index) * kFeatureTile;
    const int64_t width = std::min(kFeatureTile, out - f0);
    std::unique_ptr<float[]> w_buffer;
    const float* w = AsFloat(type, weight, f0 * in, width * in, w_buffer);
    if (type == ElemType::kFloat && !geo.swiglu && geo.parts.size() == 1) {  // fp32 sums are the output
      kernels.dots(rows, width, in, x, in, w, in, static_cast<float*>(outputs[0]) + f0, out);
      return;
    }
    std::unique_ptr<float[]> y(new float[static_cast<size_t>(rows * width)]);
    kernels.dots(rows, width, in, x, in, w, in, y.get(), width);
    if (geo.swiglu) {  // the tile's gate sums are in y; its up rows are `out` rows further down the weight
      std::unique_ptr<float[]> up_buffer;
      const float* w_up = AsFloat(type, weight, (out + f0) * in, width * in, up_buffer);
      std::unique_ptr<float[]> up(new float[static_cast<size_t>(rows * width)]);
      kernels.dots(rows, width, in, x, in, w_up, in, up.get(), width);
      kernels.silu(y.get(), rows * width);
      for (int64_t i = 0; i < rows * width; ++i) y[i] *= up[i];
    }
    StoreColumns(geo, type, y.get(), f0, width, outputs);
  });
}

}  // namespace onnx_hybrid
