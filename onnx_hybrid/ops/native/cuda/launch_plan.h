// Launch plans of the CUDA variants: which kernels of the image run, with what grid, block, dynamic
// shared memory and parameters. A C++ mirror of onnx_hybrid/cuda_ops/plan.py (gdn_plan, conv_plan) built
// on that file's own constants (cuda_plan_generated.h) and the kernels' parameter structs (params.cuh);
// tests/cuda/test_native_cuda_cpu.py compares the two plans on many geometries.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shapes/conv_shapes.h"
#include "cuda/driver.h"
#include "shapes/gdn_shapes.h"
#include "cuda/kernels/params.cuh"

namespace onnx_hybrid {

// A kernel's extern "C" name, built in place: plans are made on every Compute call, and on a GPU EP that
// call's host time is the node's whole cost.
class KernelName {
 public:
  KernelName(const char* prefix, ElemType type);  // e.g. ("gdn_recurrent_", kFloat16): "gdn_recurrent_f16"
  KernelName& Append(const char* text);
  KernelName& Append(int value);
  const char* c_str() const { return text_; }

 private:
  char text_[48] = {};
  size_t size_ = 0;
};

template <class Params>
struct CudaLaunch {
  KernelName kernel;
  cuda::Dim3 grid, block;
  int smem;
  Params params;
};

enum class GdnCudaEngine { kAuto, kChunked, kRecurrent };

// The engine the CUDA GatedDeltaNet uses (a test knob; ``auto`` by default).
void SetGdnCudaEngine(GdnCudaEngine engine);
GdnCudaEngine GetGdnCudaEngine();

// Test and tuning knobs of PlanGdn; 0 leaves a choice to the plan. A value no kernel is instantiated for throws
// std::invalid_argument naming the knob.
struct GdnPlanKnobs {
  GdnCudaEngine engine = GdnCudaEngine::kAuto;
  int rec_rows = 0;    // value rows per warp of the recurrent kernel
  int rec_groups = 0;  // row groups per warp of the recurrent kernel
  int scan_width = 0;  // value columns per CTA of the chunked scan
  int prep_heads = 0;  // value heads per block of the chunked prep kernel
};

// plan.gdn_uses_chunked: whether PlanGdn launches the chunked kernels (the shape, device and alignment
// allow them and the batch averages at least kSequentialMinTokens tokens per row, or the engine forces them).
bool GdnUsesChunked(const GdnGeometry& geo, ElemType type, const GdnParams& params, int arch, int smem_optin,
                    GdnCudaEngine engine);

// plan.chunk_workspace_bytes: the scratch params.workspace must hold when the chunked kernels run.
int64_t ChunkWorkspaceBytes(const GdnGeometry& geo);

// plan.gdn_plan: the chunked kernels (prep, then scan) where GdnUsesChunked, then the recurrent kernel (a
// tail pass over the rows they skip, decided on the device); or the recurrent kernel alone.
std::vector<CudaLaunch<GdnParams>> PlanGdn(const GdnGeometry& geo, ElemType type, const GdnParams& params, int arch,
                                           int smem_optin, const GdnPlanKnobs& knobs);

// plan.conv_states_overlap: whether final_state shares memory with initial_state.
bool ConvStatesOverlap(const ConvGeometry& geo, ElemType type, const ConvParams& params);

// plan.conv_plan: short rows in one launch; else the output pass with the state and capsule pass as its grid's
// first rows, or after it when the two states overlap.
std::vector<CudaLaunch<ConvParams>> PlanConv(const ConvGeometry& geo, ElemType type, const ConvParams& params);

// plan.gdn_replay_plan: warps of kReplayRows value rows of one (request, head).
std::vector<CudaLaunch<GdnReplayParams>> PlanGdnReplay(const GdnReplayParams& params);

// plan.conv_replay_plan: a thread per 16 bytes of channels, a row of blocks per request.
std::vector<CudaLaunch<ConvReplayParams>> PlanConvReplay(ElemType type, const ConvReplayParams& params);

}  // namespace onnx_hybrid
