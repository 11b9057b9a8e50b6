// Linear: shape resolution, shared by its CPU and CUDA kernels.
#pragma once

#include "common.h"

namespace onnx_hybrid {

using LinearInputShapes = InputShapes<contract::linear::kNumInputs>;

struct LinearGeometry {
  int64_t rows, in_features, out_features;
  Shape output_shape() const { return {rows, out_features}; }
};

LinearGeometry ResolveLinear(const LinearInputShapes& shapes);

}  // namespace onnx_hybrid
