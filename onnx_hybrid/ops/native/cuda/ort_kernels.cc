#include "cuda/ort_kernels.h"

#include <cmath>
#include <optional>

#include "cuda/driver.h"
#include "cuda/launch_plan.h"
#include "ort/ort_glue.h"

namespace onnx_hybrid {
namespace {

void* Stream(OrtKernelContext* context) {
  void* stream = nullptr;
  Ort::ThrowOnError(Ort::GetApi().KernelContext_GetGPUComputeStream(context, &stream));
  return stream;
}

template <class Params>
void Enqueue(cuda::Launcher& launcher, const std::vector<CudaLaunch<Params>>& launches) {
  for (const auto& l : launches) launcher.Launch(l.kernel.c_str(), l.grid, l.block, l.smem, &l.params);
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
    void* out = Output(context, g::kOutputOutput, geo.output_shape);
    auto* final_state = static_cast<float*>(Output(context, g::kOutputFinalState, geo.state_shape));
    auto* capsule = static_cast<float*>(Output(context, g::kOutputStateUpdate, geo.capsule_shape()));
    // state_update_active is declared OrtMemTypeCPUInput: a host pointer even on this EP.
    const auto* active = static_cast<const int32_t*>(in.data[g::kInputStateUpdateActive]);

    const QkvLayout qkv = MakeQkvLayout(geo);
    const size_t es = ElemSize(type_);
    const auto* query = static_cast<const char*>(in.data[g::kInputQuery]);
    GdnParams p{};
    p.q = query + qkv.q_offset * es;
    p.k = geo.packed() ? query + qkv.k_offset * es : in.data[g::kInputKey];
    p.v = geo.packed() ? query + qkv.v_offset * es : in.data[g::kInputValue];
    p.cu_seqlens = static_cast<const int*>(in.data[g::kInputCuSeqlens]);
    p.decay = static_cast<const float*>(in.data[g::kInputDecay]);
    p.beta = static_cast<const float*>(in.data[g::kInputBeta]);
    p.state_in = static_cast<const float*>(in.data[g::kInputInitialState]);
    p.a_log = static_cast<const float*>(in.data[g::kInputALog]);
    p.dt_bias = static_cast<const float*>(in.data[g::kInputDtBias]);
    p.capture_count = static_cast<const int*>(in.data[g::kInputCaptureCount]);
    p.out = out;
    p.state_out = final_state;
    p.capsule = geo.capacity > 0 ? capsule : nullptr;
    p.q_stride = qkv.q_token_stride;
    p.k_stride = qkv.k_token_stride;
    p.v_stride = qkv.v_token_stride;
    p.batch = static_cast<int>(geo.batch);
    p.total_tokens = static_cast<int>(geo.total_tokens);
    p.uniform_len = geo.ragged() || geo.batch == 0 ? 0 : static_cast<int>(geo.total_tokens / geo.batch);
    p.hk = static_cast<int>(geo.num_heads_k);
    p.hv = static_cast<int>(geo.num_heads_v);
    p.dk = static_cast<int>(geo.head_size_k);
    p.dv = static_cast<int>(geo.head_size_v);
    p.has_decay = attrs_.has_decay;
    p.has_delta = attrs_.has_delta;
    p.gate_qwen = attrs_.qwen_gate;
    p.beta_sigmoid = attrs_.sigmoid_beta;
    p.l2norm = attrs_.qk_l2_norm;
    p.decay_per_key = geo.per_key_decay;
    p.capacity = geo.capacity;
    p.capture_active = geo.capacity > 0 && (active == nullptr || active[0] != 0);
    p.tail_only = 0;
    p.row_groups = 1;
    // Like cuda_ops.api: the default scale rounded once from double.
    p.scale = attrs_.scale != 0.0f ? attrs_.scale : static_cast<float>(1.0 / std::sqrt(double(geo.head_size_k)));

    cuda::Launcher launcher(Stream(context));
    const cuda::DeviceInfo& device = launcher.device();
    const GdnCudaEngine engine = GetGdnCudaEngine();
    std::optional<Scratch> workspace;
    const int64_t workspace_bytes = ChunkWorkspaceBytes(geo);
    if (workspace_bytes > 0 && GdnUsesChunked(geo, type_, p, device.arch, device.smem_optin, engine)) {
      workspace.emplace(context, allocator_, static_cast<size_t>(workspace_bytes));
      p.workspace = workspace->data();
    }
    Enqueue(launcher, PlanGdn(geo, type_, p, device.arch, device.smem_optin, engine));
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
    ConvParams p{};
    p.x = in.data[cv::kInputInput];
    p.weight = in.data[cv::kInputWeight];
    p.bias = in.data[cv::kInputBias];
    p.state_in = in.data[cv::kInputInitialState];
    p.cu_seqlens = static_cast<const int*>(in.data[cv::kInputCumulativeSequenceLength]);
    p.capture_count = static_cast<const int*>(in.data[cv::kInputCaptureCount]);
    p.out = Output(context, cv::kOutputOutput, geo.output_shape());
    p.state_out = Output(context, cv::kOutputFinalState, geo.state_shape());
    void* capsule = Output(context, cv::kOutputStateUpdate, geo.capsule_shape());
    p.capsule = geo.capacity > 0 ? capsule : nullptr;
    p.batch = static_cast<int>(geo.batch);
    p.total_tokens = static_cast<int>(geo.total_tokens);
    p.channels = static_cast<int>(geo.channels);
    p.kernel_size = static_cast<int>(geo.kernel_size);
    p.dilation = static_cast<int>(attrs_.dilation);
    p.state_len = static_cast<int>(geo.state_length);
    p.capacity = geo.capacity;
    p.silu = attrs_.silu;

    cuda::Launcher launcher(Stream(context));
    Enqueue(launcher, PlanConv(geo, type_, p));
    return nullptr;
  } catch (const std::exception& e) {
    return ToStatus(e, cv::kName);
  }
}

}  // namespace onnx_hybrid
