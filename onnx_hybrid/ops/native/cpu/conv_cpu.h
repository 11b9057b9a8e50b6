// VarlenCausalConvWithState on the CPU (docs/op-contract.md#varlencausalconvwithstate): fp32 accumulation
// rounded once to T, parallel over (request, channel tile).
#pragma once

#include <vector>

#include "common.h"
#include "shapes/conv_shapes.h"

namespace onnx_hybrid {

struct ConvTensors {
  ElemType type;
  const void *input, *weight, *bias, *initial_state;
  const int32_t* capture_count;
  void *output, *final_state, *state_update;
};

void RunConvCpu(const ConvGeometry& geo, const ConvAttributes& attrs, const std::vector<RequestRow>& rows,
                const ConvTensors& t, const ParallelFor& parallel);

}  // namespace onnx_hybrid
