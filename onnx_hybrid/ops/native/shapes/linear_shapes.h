// Linear: attributes and shape resolution, shared by its CPU and CUDA kernels.
#pragma once

#include <string>
#include <vector>

#include "common.h"

namespace onnx_hybrid {

struct LinearAttributes {
  bool swiglu = false;  // weight rows: gate rows, then up rows; output SiLU(gate) * up (docs/op-contract.md#linear)
  std::vector<int64_t> parts;  // output_features: the columns of each output; empty: one output of them all
};

// `outputs`: how many outputs the node has.
LinearAttributes MakeLinearAttributes(const std::string& activation, const std::vector<int64_t>& output_features,
                                      int outputs);

using LinearInputShapes = InputShapes<contract::linear::kNumInputs>;

struct LinearGeometry {
  int64_t rows, in_features, out_features;  // out_features: all output columns (half the weight rows with swiglu)
  bool swiglu;
  std::vector<int64_t> parts;  // the columns of each output, in order; one entry (out_features) without them
  Shape output_shape(size_t part) const { return {rows, parts[part]}; }
  int64_t weight_rows() const { return swiglu ? 2 * out_features : out_features; }
};

LinearGeometry ResolveLinear(const LinearInputShapes& shapes, const LinearAttributes& attrs);

}  // namespace onnx_hybrid
