// The planner: which kernels of the image a call runs, with what grid, block, dynamic shared memory and
// parameters. The one planner of the project: ORT's CUDA kernels (cuda/ort_kernels.cc) and onnx_hybrid.cuda_ops
// (through the C entry points of ort/c_api.h) both plan here. Its numbers come from kernels/launch_config.h,
// which the kernels compile against too; the parameter structs are the kernels' own (kernels/params.cuh).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "shapes/conv_shapes.h"
#include "cuda/driver.h"
#include "shapes/gdn_shapes.h"
#include "shapes/linear_shapes.h"
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

// Whether PlanGdn launches the chunked kernels (the shape, device and alignment
// allow them and the batch averages at least kSequentialMinTokens tokens per row, or the engine forces them).
bool GdnUsesChunked(const GdnGeometry& geo, ElemType type, const GdnParams& params, int arch, int smem_optin,
                    GdnCudaEngine engine);

// The scratch params.workspace must hold when the chunked kernels run.
int64_t ChunkWorkspaceBytes(const GdnGeometry& geo);

// The chunked kernels (prep, then scan) where GdnUsesChunked, then the recurrent kernel (a
// tail pass over the rows they skip, decided on the device); or the recurrent kernel alone.
std::vector<CudaLaunch<GdnParams>> PlanGdn(const GdnGeometry& geo, ElemType type, const GdnParams& params, int arch,
                                           int smem_optin, const GdnPlanKnobs& knobs);

// Whether final_state shares memory with initial_state.
bool ConvStatesOverlap(const ConvGeometry& geo, ElemType type, const ConvParams& params);

// Short rows in one launch; else the output pass with the state and capsule pass as its grid's
// first rows, or after it when the two states overlap.
std::vector<CudaLaunch<ConvParams>> PlanConv(const ConvGeometry& geo, ElemType type, const ConvParams& params);

// Warps of kReplayRows value rows of one (request, head).
std::vector<CudaLaunch<GdnReplayParams>> PlanGdnReplay(const GdnReplayParams& params);

// A thread per 16 bytes of channels, a row of blocks per request.
std::vector<CudaLaunch<ConvReplayParams>> PlanConvReplay(ElemType type, const ConvReplayParams& params);

// Whether LinearRows serves a Linear call: a 16-bit type, one row, in_features a multiple of 8 and 16-byte aligned
// input and weight. Other calls go to cuBLAS (cuda/cublas.h).
bool LinearUsesRows(ElemType type, const LinearParams& params);

// LinearRows with enough warps per output feature to fill the GPU (launch_config.h kLinearMinWarps).
std::vector<CudaLaunch<LinearParams>> PlanLinear(ElemType type, const LinearParams& params);
// swiglu after cuBLAS: SiLU(gate) * up of params.sums into params.y, one element per thread.
std::vector<CudaLaunch<LinearParams>> PlanLinearSwiglu(ElemType type, const LinearParams& params);

// Whether qlinear_mma_* serves a QuantizedLinear call: a 16-bit type, at most kQlinearMaxRowTiles * 8 rows,
// in_features and block_size multiples of 32, x 16-byte aligned.
bool QuantizedLinearUsesMma(ElemType type, const LinearParams& params);

// qlinear_mma_* with row tiles for params.rows and enough warps per 16 features to fill the GPU (kQlinearMinWarps),
// or for one row qlinear_row_* with the same splits. The splits of k depend on n and k only, so a row's sums are the
// same whatever the rows beside it.
std::vector<CudaLaunch<LinearParams>> PlanQuantizedLinear(ElemType type, const LinearParams& params);

// qlinear_dequantize_*: the weight rows into params.dequantized (in_features a multiple of 8).
std::vector<CudaLaunch<LinearParams>> PlanQuantizedLinearDequantize(ElemType type, const LinearParams& params);

}  // namespace onnx_hybrid
