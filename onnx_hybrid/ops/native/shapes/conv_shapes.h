// VarlenCausalConvWithState: attributes, shape resolution and per-request rows, shared by every
// execution provider and by onnx_hybrid.ops.contract.resolve_conv (through ort/c_api.h).
#pragma once

#include <vector>

#include "common.h"
#include "shapes/gdn_shapes.h"  // RequestRow

namespace onnx_hybrid {

struct ConvAttributes {
  bool silu = false;
  int64_t dilation = 1;
  int capacity = 0;
};

ConvAttributes MakeConvAttributes(const std::string& activation, int64_t dilation, int64_t capacity);

using ConvInputShapes = InputShapes<contract::conv::kNumInputs>;

struct ConvGeometry {
  int64_t batch, total_tokens, channels, kernel_size, state_length;
  int capacity;
  // The shapes of the three outputs, shared by the CPU and CUDA kernels.
  Shape output_shape() const { return {total_tokens, channels}; }
  Shape state_shape() const { return {batch, channels, state_length}; }
  Shape capsule_shape() const { return {batch, capacity, channels}; }
};

ConvGeometry ResolveConv(const ConvInputShapes& shapes, const ConvAttributes& attrs);

std::vector<RequestRow> ConvRows(const ConvGeometry& geometry, const int32_t* offsets);

}  // namespace onnx_hybrid
