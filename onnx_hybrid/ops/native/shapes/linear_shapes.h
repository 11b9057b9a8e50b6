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

// `outputs`: how many outputs the node has; `op`: the node's op (Linear or QuantizedLinear), for messages.
LinearAttributes MakeLinearAttributes(const std::string& activation, const std::vector<int64_t>& output_features,
                                      int outputs, const char* op = contract::linear::kName);

using LinearInputShapes = InputShapes<contract::linear::kNumInputs>;

struct LinearGeometry {
  int64_t rows, in_features, out_features;  // out_features: all output columns (half the weight rows with swiglu)
  bool swiglu;
  std::vector<int64_t> parts;  // the columns of each output, in order; one entry (out_features) without them
  Shape output_shape(size_t part) const { return {rows, parts[part]}; }
  int64_t weight_rows() const { return swiglu ? 2 * out_features : out_features; }
};

LinearGeometry ResolveLinear(const LinearInputShapes& shapes, const LinearAttributes& attrs);

// QuantizedLinear: Linear's attributes and geometry, and the 4-bit blocks of its weight.
struct QuantizedLinearAttributes {
  LinearAttributes linear;
  int64_t block_size = contract::qlinear::kDefaultBlockSize;
  int64_t accuracy_level = contract::qlinear::kDefaultAccuracyLevel;  // kQlinearInt8Level: int8 input rows (CPU)
};

QuantizedLinearAttributes MakeQuantizedLinearAttributes(const std::string& activation,
                                                        const std::vector<int64_t>& output_features, int outputs,
                                                        int64_t block_size, int64_t bits, int64_t accuracy_level);

using QuantizedLinearInputShapes = InputShapes<contract::qlinear::kNumInputs>;

struct QuantizedLinearGeometry : LinearGeometry {
  int64_t block_size, blocks;  // blocks: ceil(in_features / block_size), per weight row
  bool zero_points;            // given; else every zero point is 8
};

QuantizedLinearGeometry ResolveQuantizedLinear(const QuantizedLinearInputShapes& shapes,
                                               const QuantizedLinearAttributes& attrs);

}  // namespace onnx_hybrid
