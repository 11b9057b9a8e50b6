#include "cpu/linear_cpu.h"

#include <algorithm>
#include <memory>

#include "cpu/cpu_kernels.h"

namespace onnx_hybrid {
namespace {
constexpr int64_t kFeatureTile = 64;  // weight rows widened to fp32 per work item
}  // namespace

void RunLinearCpu(const LinearGeometry& geo, ElemType type, const void* input, const void* weight, void* output,
                  const ParallelFor& parallel) {
  const int64_t rows = geo.rows, in = geo.in_features, out = geo.out_features;
  if (rows == 0 || out == 0) return;
  const CpuKernels& kernels = Kernels();
  // The input widened once, shared by every work item.
  std::unique_ptr<float[]> x(new float[static_cast<size_t>(std::max<int64_t>(rows * in, 1))]);
  LoadAsFloat(type, input, 0, rows * in, x.get());
  const int64_t tiles = (out + kFeatureTile - 1) / kFeatureTile;
  parallel.Run(static_cast<size_t>(tiles), [&](size_t index) {
    const int64_t f0 = static_cast<int64_t>(index) * kFeatureTile;
    const int64_t width = std::min(kFeatureTile, out - f0);
    std::unique_ptr<float[]> w(new float[static_cast<size_t>(std::max<int64_t>(width * in, 1))]);
    std::unique_ptr<float[]> y(new float[static_cast<size_t>(rows * width)]);
    LoadAsFloat(type, weight, f0 * in, width * in, w.get());
    kernels.dots(rows, width, in, x.get(), in, w.get(), in, y.get(), width);
    for (int64_t r = 0; r < rows; ++r) StoreFromFloat(type, y.get() + r * width, width, output, r * out + f0);
  });
}

}  // namespace onnx_hybrid
