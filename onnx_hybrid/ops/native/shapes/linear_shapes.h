// Linear: attributes and shape resolution, shared by its CPU and CUDA kernels.
#pragma once

#include <string>

#include "common.h"

namespace onnx_hybrid {

struct LinearAttributes {
  bool swiglu = false;  // weight rows: gate rows, then up rows; output SiLU(gate) * up (docs/op-contract.md#linear)
};

LinearAttributes MakeLinearAttributes(const std::string& activation);

using LinearInputShapes = InputShapes<contract::linear::kNumInputs>;

struct LinearGeometry {
  int64_t rows, in_features, out_features;  // out_features: the output's columns (half the weight rows with swiglu)
  bool swiglu;
  Shape output_shape() const { return {rows, out_features}; }
  int64_t weight_rows() const { return swiglu ? 2 * out_features : out_features; }
};

LinearGeometry ResolveLinear(const LinearInputShapes& shapes, const LinearAttributes& attrs);

}  // namespace onnx_hybrid
