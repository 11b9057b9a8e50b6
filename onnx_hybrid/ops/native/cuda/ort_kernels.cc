#include "cuda/ort_kernels.h"

#include <optional>

#include "cuda/calls.h"
#include "cuda/cublas.h"
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
    } else if (!geo.swiglu) {  // one product per output, from its rows of the weight
      const char* w = static_cast<const char*>(p.w);
      for (size_t j = 0; j < geo.parts.size(); w += geo.parts[j] * geo.in_features * ElemSize(type_), ++j)
        cublas::LinearGemm(CublasHandle(context), type_, p.x, w, out.data[j], geo.rows, geo.in_features,
                           geo.parts[j], type_);
    } else {  // fp32 products of the gate and up rows, then SiLU(gate) * up rounded once
      Scratch sums(context, allocator_, static_cast<size_t>(geo.rows * geo.weight_rows()) * sizeof(float));
      cublas::LinearGemm(CublasHandle(context), type_, p.x, p.w, sums.data(), geo.rows, geo.in_features,
                         geo.weight_rows(), ElemType::kFloat);
      p.sums = static_cast<const float*>(sums.data());
      cuda::Launcher launcher(Stream(context));
      Enqueue(launcher, PlanLinearSwiglu(type_, p));
    }
    return nullptr;
  } catch (const std::exception& e) {
    return ToStatus(e, ln::kName);
  }
}

}  // namespace onnx_hybrid
