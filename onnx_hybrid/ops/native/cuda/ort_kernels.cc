#include "cuda/ort_kernels.h"

#include <optional>
#include <stdexcept>
#include <string>

#include "cuda/calls.h"
#include "cuda/cublas.h"
#include "cuda/kernels/launch_config.h"
#include "ort/ort_glue.h"

namespace onnx_hybrid {
namespace {

void* Stream(OrtKernelContext* context) {
  void* stream = nullptr;
  Ort::ThrowOnError(Ort::GetApi().KernelContext_GetGPUComputeStream(context, &stream));
  return stream;
}

// Scratch from the EP's allocator for the duration of one Compute. Freed once the launches are enqueued, as
// ORT's own CUDA kernels do: the arena hands the memory out again only to work enqueued later on the same
// compute stream (docs/native-library.md#scratch-memory).
class Scratch {
 public:
  Scratch(OrtKernelContext* context, OrtAllocator* allocator, size_t bytes) : allocator_(allocator) {
    const OrtMemoryInfo* info = nullptr;
    Ort::ThrowOnError(Ort::GetApi().AllocatorGetInfo(allocator, &info));
    Ort::ThrowOnError(Ort::GetApi().KernelContext_GetScratchBuffer(context, info, bytes, &data_));
  }
  ~Scratch() {
    if (data_ != nullptr) allocator_->Free(allocator_, data_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  void* data() const { return data_; }

 private:
  OrtAllocator* allocator_;
  void* data_ = nullptr;
};

// The cuBLAS handle ORT keeps for the kernel's compute stream (its CudaResource::cublas_handle_t, version 1 on).
void* CublasHandle(OrtKernelContext* context) {
  constexpr int kCudaResourceVersion = 1, kCublasHandle = 10002;
  void* handle = nullptr;
  Ort::ThrowOnError(Ort::GetApi().KernelContext_GetResource(context, kCudaResourceVersion, kCublasHandle, &handle));
  if (handle == nullptr) throw std::runtime_error("ORT lent no cuBLAS handle to the kernel");
  return handle;
}

}  // namespace

GdnCudaKernel::GdnCudaKernel(const OrtKernelInfo* info, ElemType type)
    : type_(type), attrs_(ReadGdnAttributes(info)) {
  Ort::ThrowOnError(Ort::GetApi().KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator_));
}

GdnCudaKernel::~GdnCudaKernel() {
  if (allocator_ != nullptr) Ort::GetApi().ReleaseAllocator(allocator_);
}

OrtStatusPtr GdnCudaKernel::ComputeV2(OrtKernelContext* context) {
  namespace g = contract::gdn;
  try {
    const Inputs<g::kNumInputs> in(context, g::kInputPorts);
    const GdnGeometry geo = ResolveGdn(in, attrs_);
    const bool gates_act = GdnGatesInActivationType(in, type_);
    void* out = Output(context, g::kOutputOutput, geo.output_shape);
    auto* final_state = static_cast<float*>(Output(context, g::kOutputFinalState, geo.state_shape));
    auto* capsule = static_cast<float*>(Output(context, g::kOutputStateUpdate, geo.capsule_shape()));
    // state_update_active is declared OrtMemTypeCPUInput: a host pointer even on this EP.
    GdnParams p = MakeGdnParams(geo, attrs_, type_, gates_act, in.data, out, final_state, capsule);
    cuda::Launcher launcher(Stream(context));
    GdnPlanKnobs knobs;
    knobs.engine = GetGdnCudaEngine();
    std::optional<Scratch> workspace;
    if (const int64_t bytes = GdnWorkspaceBytes(geo, type_, p, launcher.device(), knobs.engine)) {
      workspace.emplace(context, allocator_, static_cast<size_t>(bytes));
      p.workspace = workspace->data();
    }
    Enqueue(launcher, PlanGdn(geo, type_, p, launcher.device().arch, launcher.device().smem_optin, knobs));
    return nullptr;
  } catch (const std::exception& e) {
    return ToStatus(e, g::kName);
  }
}

ConvCudaKernel::ConvCudaKernel(const OrtKernelInfo* info, ElemType type)
    : type_(type), attrs_(ReadConvAttributes(info)) {}

OrtStatusPtr ConvCudaKernel::ComputeV2(OrtKernelContext* context) {
  namespace cv = contract::conv;
  try {
    const Inputs<cv::kNumInputs> in(context, cv::kInputPorts);
    const ConvGeometry geo = ResolveConv(in, attrs_);
    void* out = Output(context, cv::kOutputOutput, geo.output_shape());
    void* final_state = Output(context, cv::kOutputFinalState, geo.state_shape());
    void* capsule = Output(context, cv::kOutputStateUpdate, geo.capsule_shape());
    cuda::Launcher launcher(Stream(context));
    Enqueue(launcher, PlanConv(geo, type_, MakeConvParams(geo, attrs_, in.data, out, final_state, capsule)));
    return nullptr;
  } catch (const std::exception& e) {
    return ToStatus(e, cv::kName);
  }
}

// Linear's products through cuBLAS (ORT's handle): one per output, from its rows of p.w; with swiglu fp32 products
// of the gate and up rows, then SiLU(gate) * up rounded once.
void RunLinearCublas(OrtKernelContext* context, OrtAllocator* allocator, ElemType type, const LinearGeometry& geo,
                     LinearParams p, const LinearOutputs& out) {
  if (!geo.swiglu) {
    const char* w = static_cast<const char*>(p.w);
    for (size_t j = 0; j < geo.parts.size(); w += geo.parts[j] * geo.in_features * ElemSize(type), ++j)
      cublas::LinearGemm(CublasHandle(context), type, p.x, w, out.data[j], geo.rows, geo.in_features, geo.parts[j],
                         type);
    return;
  }
  Scratch sums(context, allocator, static_cast<size_t>(geo.rows * geo.weight_rows()) * sizeof(float));
  cublas::LinearGemm(CublasHandle(context), type, p.x, p.w, sums.data(), geo.rows, geo.in_features,
                     geo.weight_rows(), ElemType::kFloat);
  p.sums = static_cast<const float*>(sums.data());
  cuda::Launcher launcher(Stream(context));
  Enqueue(launcher, PlanLinearSwiglu(type, p));
}

LinearCudaKernel::LinearCudaKernel(const OrtKernelInfo* info, ElemType type)
    : type_(type), attrs_(ReadLinearAttributes(info)) {
  Ort::ThrowOnError(Ort::GetApi().KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator_));
}

LinearCudaKernel::~LinearCudaKernel() {
  if (allocator_ != nullptr) Ort::GetApi().ReleaseAllocator(allocator_);
}

OrtStatusPtr LinearCudaKernel::ComputeV2(OrtKernelContext* context) {
  namespace ln = contract::linear;
  try {
    const Inputs<ln::kNumInputs> in(context, ln::kInputPorts);
    const LinearGeometry geo = ResolveLinear(in, attrs_);
    const LinearOutputs out = LinearOutputs::Make(context, geo);
    if (geo.rows == 0 || geo.out_features == 0) return nullptr;
    LinearParams p = MakeLinearParams(geo, in.data, out.data);
    // The launcher loads the kernel image; a session of cuBLAS calls alone never needs it.
    if (LinearUsesRows(type_, p)) {
      cuda::Launcher launcher(Stream(context));
      Enqueue(launcher, PlanLinear(type_, p));
    } else {
      RunLinearCublas(context, allocator_, type_, geo, p, out);
    }
    return nullptr;
  } catch (const std::exception& e) {
    return ToStatus(e, ln::kName);
  }
}

QuantizedLinearCudaKernel::QuantizedLinearCudaKernel(const OrtKernelInfo* info, ElemType type)
    : type_(type), attrs_(ReadQuantizedLinearAttributes(info)) {
  Ort::ThrowOnError(Ort::GetApi().KernelInfoGetAllocator(info, OrtMemTypeDefault, &allocator_));
}

QuantizedLinearCudaKernel::~QuantizedLinearCudaKernel() {
  if (allocator_ != nullptr) Ort::GetApi().ReleaseAllocator(allocator_);
}

OrtStatusPtr QuantizedLinearCudaKernel::ComputeV2(OrtKernelContext* context) {
  namespace ql = contract::qlinear;
  try {
    const Inputs<ql::kNumInputs> in(context, ql::kInputPorts);
    const QuantizedLinearGeometry geo = ResolveQuantizedLinear(in, attrs_);
    const LinearOutputs out = LinearOutputs::Make(context, geo);
    if (geo.rows == 0 || geo.out_features == 0) return nullptr;
    LinearParams p = MakeQuantizedLinearParams(geo, in.data, out.data);
    cuda::Launcher launcher(Stream(context));
    if (QuantizedLinearUsesMma(type_, p)) {
      Enqueue(launcher, PlanQuantizedLinear(type_, p));
      return nullptr;
    }
    if (geo.in_features % 8 != 0 || geo.in_features > INT32_MAX)
      throw std::invalid_argument(
          "on CUDA, calls the tensor-core kernel does not take (more than " +
          std::to_string(launch_config::kQlinearMaxRowTiles * 8) +
          " rows, in_features or block_size not a multiple of 32, an input not 16-byte aligned) need in_features a "
          "multiple of 8 (at most 2^31 - 1); got " + std::to_string(geo.in_features));
    // More rows: the weight dequantized into scratch (the same values the tensor-core kernel forms), then cuBLAS.
    Scratch weight(context, allocator_, static_cast<size_t>(geo.weight_rows() * geo.in_features) * ElemSize(type_));
    p.dequantized = weight.data();
    Enqueue(launcher, PlanQuantizedLinearDequantize(type_, p));
    p.w = weight.data();
    RunLinearCublas(context, allocator_, type_, geo, p, out);
    return nullptr;
  } catch (const std::exception& e) {
    return ToStatus(e, ql::kName);
  }
}

}  // namespace onnx_hybrid
