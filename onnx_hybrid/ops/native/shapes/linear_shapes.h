// Linear: shape resolution, shared by every execution provider and by onnx_hybrid.ops.contract.resolve_linear
// (through ort/c_api.h).
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
