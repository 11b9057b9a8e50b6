// One call of each op on a CUDA stream, shared by ORT's CUDA kernels (ort_kernels.cc) and the library's C
// entry points for arrays the caller owns (ort/custom_ops.cc, which onnx_hybrid.cuda_ops calls): the
// kernels' parameters are filled here and nowhere else.
#pragma once

#include <vector>

#include "cuda/driver.h"
#include "cuda/launch_plan.h"
#include "shapes/conv_shapes.h"
#include "shapes/gdn_shapes.h"

namespace onnx_hybrid {

// GatedDeltaNet's parameters from its inputs by contract port (device pointers, except state_update_active,
// a host pointer) and its outputs; params.workspace is left null.
GdnParams MakeGdnParams(const GdnGeometry& geo, const GdnAttributes& attrs, ElemType type, bool gates_act,
                        const void* const* inputs, void* out, float* final_state, float* capsule);

// VarlenCausalConvWithState's parameters, likewise.
ConvParams MakeConvParams(const ConvGeometry& geo, const ConvAttributes& attrs, const void* const* inputs,
                          void* out, void* final_state, void* capsule);

// Linear's parameters (LinearRows; splits are the plan's).
LinearParams MakeLinearParams(const LinearGeometry& geo, const void* const* inputs, void* const* outputs);
// QuantizedLinear's: Linear's fields, w the packed weight, and its scales, zero points and blocks.
LinearParams MakeQuantizedLinearParams(const QuantizedLinearGeometry& geo, const void* const* inputs,
                                       void* const* outputs);

// The workspace the call's plan needs in params.workspace: the chunked engine's scratch, else 0.
int64_t GdnWorkspaceBytes(const GdnGeometry& geo, ElemType type, const GdnParams& params,
                          const cuda::DeviceInfo& device, GdnCudaEngine engine);

template <class Params>
void Enqueue(cuda::Launcher& launcher, const std::vector<CudaLaunch<Params>>& launches) {
  for (const auto& l : launches) launcher.Launch(l.kernel.c_str(), l.grid, l.block, l.smem, &l.params);
}

}  // namespace onnx_hybrid
