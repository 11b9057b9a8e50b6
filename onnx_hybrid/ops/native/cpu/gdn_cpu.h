// GatedDeltaNet on the CPU: the sequential engine (docs/op-contract.md#sequential-definition, with the CPU
// rounding of #state-update-rounding) and the chunked engine (#chunked-engine), chosen per #engine-selection.
#pragma once

#include <vector>

#include "common.h"
#include "shapes/gdn_shapes.h"

namespace onnx_hybrid {

// Host pointers of one call; null for absent tensors. k and v point into q for packed QKV.
struct GdnTensors {
  ElemType type;
  const void *query, *key, *value;
  QkvLayout qkv;
  const float *decay, *beta, *initial_state, *a_log, *dt_bias;
  const int32_t* capture_count;
  bool capture_active;
  void* output;
  float *final_state, *state_update;
};

enum class EngineChoice { kAuto, kSequential, kChunked };
// Test hook (set through onnx_hybrid_set_option("cpu_engine", ...)): kSequential runs every row on the
// recurrence; kChunked also sends short rows to the chunked engine. Capture rows and per-key decay always
// run sequentially.
void SetCpuEngineChoice(EngineChoice choice);

void RunGdnCpu(const GdnGeometry& geo, const GdnAttributes& attrs, const std::vector<RequestRow>& rows,
               const GdnTensors& t, const ParallelFor& parallel);

}  // namespace onnx_hybrid
