// ORT custom-op glue: op declarations (one object per op and element type), CPU kernels that read
// and validate inputs and call the engines, registration, and the ctypes control ABI.
#include <pthread.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "cpu/conv_cpu.h"
#include "cpu/cpu_kernels.h"
#include "ort/c_api.h"
#include "cuda/calls.h"
#include "cuda/driver.h"
#include "cuda/ort_kernels.h"
#include "cuda/launch_plan.h"
#include "cpu/float_mode.h"
#include "cpu/gdn_cpu.h"
#include "cpu/linear_cpu.h"
#include "cpu/paged_attention_cpu.h"
#include "ort/ort_api.h"
#include "ort/ort_glue.h"

#define ONNX_HYBRID_STR_(x) #x
#define ONNX_HYBRID_STR(x) ONNX_HYBRID_STR_(x)
#define ONNX_HYBRID_EXPORT extern "C" __attribute__((visibility("default")))

namespace onnx_hybrid {
namespace {

constexpr int kAbiVersion = 4;  // 2: onnx_hybrid_set_cuda_image; 3: _has_image; 4: the shape checks and CUDA calls
                                // of ort/c_api.h (the struct layout and plan inspection functions went)
constexpr char kCpuProvider[] = "CPUExecutionProvider";

std::atomic<bool> g_register_com_microsoft{false};
std::atomic<bool> g_lend_input_shapes{true};  // the input_shapes option: auto (lent where ORT >= 1.24) or copied
// One-time initialisation uses function-local statics (thread-safe, __cxa_guard) and per-thread data
// uses pthread keys: thread_local and std::call_once (libstdc++ keeps its callable in TLS) would add
// ld-linux (__tls_get_addr) to the library's NEEDED entries.

// onnx_hybrid_last_error's per-thread message, and the contract's name for it when it is a rejection.
struct LastErrorRecord {
  std::string message;
  const char* key = "";
};

LastErrorRecord& LastErrorState() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    pthread_key_create(&k, [](void* p) { delete static_cast<LastErrorRecord*>(p); });
    return k;
  }();
  auto* record = static_cast<LastErrorRecord*>(pthread_getspecific(key));
  if (!record) {
    record = new LastErrorRecord();
    pthread_setspecific(key, record);
  }
  return *record;
}

// The message to write (an error that is no contract rejection).
std::string& LastError() {
  LastErrorRecord& record = LastErrorState();
  record.key = "";
  return record.message;
}

// Runs the body of a control function: an exception (std::bad_alloc, say) becomes -1 and the last error
// instead of crossing the C ABI, which would terminate the host process.
template <class Body>
int Guarded(const char* function, Body body) noexcept {
  try {
    return body();
  } catch (const std::exception& e) {
    try {
      LastError() = std::string(function) + ": " + e.what();
    } catch (...) {
    }
    return -1;
  }
}

bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// ORT's intra-op thread pool. Exceptions stay on the worker and are rethrown on the calling thread. Work items
// run with subnormals flushed (float_mode.h).
class OrtParallelFor : public ParallelFor {
 public:
  explicit OrtParallelFor(const OrtKernelContext* context) : context_(context) {}
  void Run(size_t n, const std::function<void(size_t)>& fn) const override {
    if (n == 0) return;
    struct Shared {
      const std::function<void(size_t)>* fn;
      std::mutex mutex;
      std::string error;
      bool failed = false;
    } shared{&fn, {}, {}, false};
    auto trampoline = [](void* user, size_t i) {
      auto* s = static_cast<Shared*>(user);
      try {
        const FlushSubnormalsScope mode;  // per work item, on whichever thread runs it (float_mode.h)
        (*s->fn)(i);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(s->mutex);
        if (!s->failed) s->error = e.what();
        s->failed = true;
      }
    };
    if (n == 1)
      trampoline(&shared, 0);
    else
      Ort::ThrowOnError(Ort::GetApi().KernelContext_ParallelFor(context_, trampoline, n, 0, &shared));
    if (shared.failed) throw std::runtime_error(shared.error);
  }

 private:
  const OrtKernelContext* context_;
};

// ---------------------------------------------------------------------------------------------
// Kernels
// ---------------------------------------------------------------------------------------------

class GdnCpuKernel {
 public:
  GdnCpuKernel(const OrtKernelInfo* info, ElemType type) : type_(type), attrs_(ReadGdnAttributes(info)) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    namespace g = contract::gdn;
    try {
      const Inputs<g::kNumInputs> in(context, g::kInputPorts);
      const GdnGeometry geo = ResolveGdn(in, attrs_);
      const std::vector<RequestRow> rows = GdnRows(geo, static_cast<const int32_t*>(in.data[g::kInputCuSeqlens]));
      GdnTensors t{};
      t.type = type_;
      t.query = in.data[g::kInputQuery];
      t.key = geo.packed() ? t.query : in.data[g::kInputKey];
      t.value = geo.packed() ? t.query : in.data[g::kInputValue];
      t.qkv = MakeQkvLayout(geo);
      t.decay = static_cast<const float*>(in.data[g::kInputDecay]);
      t.beta = static_cast<const float*>(in.data[g::kInputBeta]);
      std::vector<float> widened;  // decay and beta given in the activation type, in fp32 for the engines
      if (GdnGatesInActivationType(in, type_)) {
        const int64_t per_token = geo.total_tokens * geo.num_heads_v;
        const int64_t n_decay = in.present[g::kInputDecay] ? per_token * (geo.per_key_decay ? geo.head_size_k : 1) : 0;
        const int64_t n_beta = in.present[g::kInputBeta] ? per_token : 0;
        widened.resize(static_cast<size_t>(n_decay + n_beta));
        if (n_decay) LoadAsFloat(type_, in.data[g::kInputDecay], 0, n_decay, widened.data());
        if (n_beta) LoadAsFloat(type_, in.data[g::kInputBeta], 0, n_beta, widened.data() + n_decay);
        t.decay = n_decay ? widened.data() : nullptr;
        t.beta = n_beta ? widened.data() + n_decay : nullptr;
      }
      t.initial_state = static_cast<const float*>(in.data[g::kInputInitialState]);
      t.a_log = static_cast<const float*>(in.data[g::kInputALog]);
      t.dt_bias = static_cast<const float*>(in.data[g::kInputDtBias]);
      t.capture_count = static_cast<const int32_t*>(in.data[g::kInputCaptureCount]);
      const auto* active = static_cast<const int32_t*>(in.data[g::kInputStateUpdateActive]);
      t.capture_active = active == nullptr || active[0] != 0;
      t.output = Output(context, g::kOutputOutput, geo.output_shape);
      t.final_state = static_cast<float*>(Output(context, g::kOutputFinalState, geo.state_shape));
      t.state_update = static_cast<float*>(Output(context, g::kOutputStateUpdate, geo.capsule_shape()));
      RunGdnCpu(geo, attrs_, rows, t, OrtParallelFor(context));
      return nullptr;
    } catch (const std::exception& e) {
      return ToStatus(e, contract::gdn::kName);
    }
  }

 private:
  ElemType type_;
  GdnAttributes attrs_;
};

class ConvCpuKernel {
 public:
  ConvCpuKernel(const OrtKernelInfo* info, ElemType type) : type_(type), attrs_(ReadConvAttributes(info)) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    namespace cv = contract::conv;
    try {
      const Inputs<cv::kNumInputs> in(context, cv::kInputPorts);
      const ConvGeometry geo = ResolveConv(in, attrs_);
      const std::vector<RequestRow> rows =
          ConvRows(geo, static_cast<const int32_t*>(in.data[cv::kInputCumulativeSequenceLength]));
      ConvTensors t{};
      t.type = type_;
      t.input = in.data[cv::kInputInput];
      t.weight = in.data[cv::kInputWeight];
      t.bias = in.data[cv::kInputBias];
      t.initial_state = in.data[cv::kInputInitialState];
      t.capture_count = static_cast<const int32_t*>(in.data[cv::kInputCaptureCount]);
      t.output = Output(context, cv::kOutputOutput, geo.output_shape());
      t.final_state = Output(context, cv::kOutputFinalState, geo.state_shape());
      t.state_update = Output(context, cv::kOutputStateUpdate, geo.capsule_shape());
      RunConvCpu(geo, attrs_, rows, t, OrtParallelFor(context));
      return nullptr;
    } catch (const std::exception& e) {
      return ToStatus(e, contract::conv::kName);
    }
  }

 private:
  ElemType type_;
  ConvAttributes attrs_;
};

class PagedAttentionCpuKernel {
 public:
  PagedAttentionCpuKernel(const OrtKernelInfo* info, ElemType type) : type_(type) {
    namespace pa = contract::paged;
    attrs_ = MakePagedAttentionAttributes(IntAttribute(info, pa::kAttrNumHeads, pa::kDefaultNumHeads),
                                          IntAttribute(info, pa::kAttrKvNumHeads, pa::kDefaultKvNumHeads),
                                          FloatAttribute(info, pa::kAttrScale, pa::kDefaultScale));
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    namespace pa = contract::paged;
    try {
      const Inputs<pa::kNumInputs> in(context, pa::kInputPorts);
      const PagedAttentionGeometry geo = ResolvePagedAttention(in, attrs_);
      PagedAttentionTensors t{};
      t.type = type_;
      t.block_table = static_cast<const int32_t*>(in.data[pa::kInputBlockTable]);
      const std::vector<PagedRow> rows =
          PagedRows(geo, static_cast<const int32_t*>(in.data[pa::kInputCumulativeSequenceLengths]),
                    static_cast<const int32_t*>(in.data[pa::kInputPastSequenceLengths]), t.block_table);
      t.query = in.data[pa::kInputQuery];
      t.key = in.data[pa::kInputKey];
      t.value = in.data[pa::kInputValue];
      t.key_cache = in.data[pa::kInputKeyCache];
      t.value_cache = in.data[pa::kInputValueCache];
      t.output = Output(context, pa::kOutputOutput, in.shape[pa::kInputQuery]);
      t.key_cache_out = Output(context, pa::kOutputKeyCacheOut, geo.cache_shape());
      t.value_cache_out = Output(context, pa::kOutputValueCacheOut, geo.cache_shape());
      RunPagedAttentionCpu(geo, rows, t, OrtParallelFor(context));
      return nullptr;
    } catch (const std::exception& e) {
      return ToStatus(e, contract::paged::kName);
    }
  }

 private:
  ElemType type_;
  PagedAttentionAttributes attrs_;
};

class LinearCpuKernel {
 public:
  LinearCpuKernel(const OrtKernelInfo* info, ElemType type) : type_(type), attrs_(ReadLinearAttributes(info)) {}

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    namespace ln = contract::linear;
    try {
      const Inputs<ln::kNumInputs> in(context, ln::kInputPorts);
      const LinearGeometry geo = ResolveLinear(in, attrs_);
      const LinearOutputs out = LinearOutputs::Make(context, geo);
      RunLinearCpu(geo, type_, in.data[ln::kInputInput], in.data[ln::kInputWeight], out.data,
                   OrtParallelFor(context));
      return nullptr;
    } catch (const std::exception& e) {
      return ToStatus(e, ln::kName);
    }
  }

 private:
  ElemType type_;
  LinearAttributes attrs_;
};

class QuantizedLinearCpuKernel {
 public:
  QuantizedLinearCpuKernel(const OrtKernelInfo* info, ElemType type)
      : type_(type), attrs_(ReadQuantizedLinearAttributes(info)) {
    if (UsesInt8()) packed_ = PackConstantWeight(info);
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    namespace ql = contract::qlinear;
    try {
      const Inputs<ql::kNumInputs> in(context, ql::kInputPorts);
      const QuantizedLinearGeometry geo = ResolveQuantizedLinear(in, attrs_);
      const LinearOutputs out = LinearOutputs::Make(context, geo);
      const auto* weight = static_cast<const uint8_t*>(in.data[ql::kInputWeight]);
      const auto* zero_points = static_cast<const uint8_t*>(in.data[ql::kInputZeroPoints]);
      const void* scales = in.data[ql::kInputScales];
      if (!UsesInt8()) {
        RunQuantizedLinearCpu(geo, type_, in.data[ql::kInputInput], weight, scales, zero_points, out.data,
                              OrtParallelFor(context));
      } else if (packed_ && packed_->PackedFrom(weight, scales, zero_points)) {
        RunQuantizedLinearInt8Cpu(geo, type_, in.data[ql::kInputInput], *packed_, out.data, OrtParallelFor(context));
      } else {  // a weight that is not an initializer: packed for this call
        const Int8Weight packed(type_, geo.weight_rows(), geo.blocks, geo.block_size, geo.swiglu, weight, scales,
                                zero_points);
        RunQuantizedLinearInt8Cpu(geo, type_, in.data[ql::kInputInput], packed, out.data, OrtParallelFor(context));
      }
      return nullptr;
    } catch (const std::exception& e) {
      return ToStatus(e, ql::kName);
    }
  }

 private:
  bool UsesInt8() const {
    return attrs_.accuracy_level == contract::kQlinearInt8Level && Int8ProductsFit(attrs_.block_size);
  }

  // The weight packed once when it, its scales and zero points are initializers of consistent shapes; else null
  // (ComputeV2 then checks the shapes and packs per call).
  std::unique_ptr<Int8Weight> PackConstantWeight(const OrtKernelInfo* info) const {
    namespace ql = contract::qlinear;
    const Ort::ConstKernelInfo kernel_info(info);
    const void* data[ql::kNumInputs] = {};
    std::vector<int64_t> shape[ql::kNumInputs];
    for (int port : {ql::kInputWeight, ql::kInputScales, ql::kInputZeroPoints}) {
      if (port >= static_cast<int>(kernel_info.GetInputCount())) continue;
      int constant = 0;
      const Ort::ConstValue value = kernel_info.GetTensorConstantInput(port, &constant);
      if (!constant) {
        if (port == ql::kInputZeroPoints && kernel_info.GetInputName(port).empty()) continue;  // omitted
        return nullptr;
      }
      data[port] = value.GetTensorRawData();
      shape[port] = value.GetTensorTypeAndShapeInfo().GetShape();
    }
    const std::vector<int64_t>& w = shape[ql::kInputWeight];
    const int64_t bs = attrs_.block_size;
    if (w.size() != 3 || w[2] != bs / 2 || shape[ql::kInputScales] != std::vector<int64_t>{w[0], w[1]} ||
        (data[ql::kInputZeroPoints] && shape[ql::kInputZeroPoints] != std::vector<int64_t>{w[0], (w[1] + 1) / 2}) ||
        (attrs_.linear.swiglu && w[0] % 2 != 0))
      return nullptr;
    return std::make_unique<Int8Weight>(type_, w[0], w[1], bs, attrs_.linear.swiglu,
                                        static_cast<const uint8_t*>(data[ql::kInputWeight]), data[ql::kInputScales],
                                        static_cast<const uint8_t*>(data[ql::kInputZeroPoints]));
  }

  ElemType type_;
  QuantizedLinearAttributes attrs_;
  std::unique_ptr<Int8Weight> packed_;
};

// ---------------------------------------------------------------------------------------------
// Op declarations: the ports come from the contract; one object per (op, execution provider, element
// type), all objects of an op under one name (docs/native-library.md#one-name-several-kernels).
// ---------------------------------------------------------------------------------------------

struct GdnSpec {
  static constexpr const char* kName = contract::gdn::kName;
  static constexpr const auto& kInputs = contract::gdn::kInputPorts;
  static constexpr const auto& kOutputs = contract::gdn::kOutputPorts;
  static constexpr const auto& kInplace = contract::gdn::kInplace;
};

struct ConvSpec {
  static constexpr const char* kName = contract::conv::kName;
  static constexpr const auto& kInputs = contract::conv::kInputPorts;
  static constexpr const auto& kOutputs = contract::conv::kOutputPorts;
  static constexpr const auto& kInplace = contract::conv::kInplace;
};

struct PagedAttentionSpec {
  static constexpr const char* kName = contract::paged::kName;
  static constexpr const auto& kInputs = contract::paged::kInputPorts;
  static constexpr const auto& kOutputs = contract::paged::kOutputPorts;
  static constexpr const auto& kInplace = contract::paged::kInplace;
};

struct LinearSpec {
  static constexpr const char* kName = contract::linear::kName;
  static constexpr const auto& kInputs = contract::linear::kInputPorts;
  static constexpr const auto& kOutputs = contract::linear::kOutputPorts;
  static constexpr const auto& kInplace = contract::linear::kInplace;
};

struct QuantizedLinearSpec {
  static constexpr const char* kName = contract::qlinear::kName;
  static constexpr const auto& kInputs = contract::qlinear::kInputPorts;
  static constexpr const auto& kOutputs = contract::qlinear::kOutputPorts;
  static constexpr const auto& kInplace = contract::qlinear::kInplace;
};

template <class Spec, class Kernel, const char* kProvider>
struct KernelOp : Ort::CustomOpBase<KernelOp<Spec, Kernel, kProvider>, Kernel, /*WithStatus=*/true> {
  explicit KernelOp(ElemType type) : type_(type) {
    OrtCustomOp::GetMayInplace = [](int** inputs, int** outputs) -> size_t {
      constexpr size_t n = sizeof(Spec::kInplace) / sizeof(Spec::kInplace[0]);
      *inputs = static_cast<int*>(std::malloc(sizeof(int) * n));
      *outputs = static_cast<int*>(std::malloc(sizeof(int) * n));
      for (size_t i = 0; i < n; ++i) {
        (*inputs)[i] = Spec::kInplace[i][0];
        (*outputs)[i] = Spec::kInplace[i][1];
      }
      return n;
    };
    OrtCustomOp::ReleaseMayInplace = [](int* inputs, int* outputs) {
      std::free(inputs);
      std::free(outputs);
    };
  }

  const char* GetName() const { return Spec::kName; }
  const char* GetExecutionProviderType() const { return kProvider; }
  size_t GetInputTypeCount() const { return std::size(Spec::kInputs); }
  size_t GetOutputTypeCount() const { return std::size(Spec::kOutputs); }
  ONNXTensorElementDataType GetInputType(size_t i) const { return PortElementType(Spec::kInputs[i].type, type_); }
  ONNXTensorElementDataType GetOutputType(size_t i) const { return PortElementType(Spec::kOutputs[i].type, type_); }
  OrtCustomOpInputOutputCharacteristic GetInputCharacteristic(size_t i) const {
    return Spec::kInputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  OrtCustomOpInputOutputCharacteristic GetOutputCharacteristic(size_t i) const {
    return Spec::kOutputs[i].optional ? INPUT_OUTPUT_OPTIONAL : INPUT_OUTPUT_REQUIRED;
  }
  // Host-memory ports (GDN's state_update_active) arrive as host pointers on every EP.
  OrtMemType GetInputMemoryType(size_t i) const {
    return Spec::kInputs[i].host_memory ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new Kernel(info, type_);
      return nullptr;
    } catch (const std::exception& e) {
      return ToStatus(e, Spec::kName);
    }
  }

 private:
  ElemType type_;
};

constexpr ElemType kTypes[] = {ElemType::kFloat, ElemType::kFloat16, ElemType::kBFloat16};

// Op objects and domains live until the process ends (ORT keeps the library loaded), so they are
// allocated once and never freed. A CUDA variant in a CPU-only ORT is never chosen, so registering it
// there is harmless. PagedAttention (CPU-only) and Linear are only in our domain: PagedAttention's I/O is a subset
// of com.microsoft::PagedAttention's, so it must not shadow ORT's CUDA kernel under that name.
struct Registry {
  std::vector<OrtCustomOp*> state_ops;  // GatedDeltaNet and VarlenCausalConvWithState, CPU and CUDA
  std::vector<OrtCustomOp*> own_ops;    // PagedAttention (CPU), Linear and QuantizedLinear (CPU and CUDA)
  OrtCustomOpDomain* hybrid = nullptr;
  OrtCustomOpDomain* microsoft = nullptr;

  Registry() {
    for (ElemType t : kTypes) {
      state_ops.push_back(new KernelOp<GdnSpec, GdnCpuKernel, kCpuProvider>(t));
      state_ops.push_back(new KernelOp<GdnSpec, GdnCudaKernel, kCudaProvider>(t));
      state_ops.push_back(new KernelOp<ConvSpec, ConvCpuKernel, kCpuProvider>(t));
      state_ops.push_back(new KernelOp<ConvSpec, ConvCudaKernel, kCudaProvider>(t));
      own_ops.push_back(new KernelOp<PagedAttentionSpec, PagedAttentionCpuKernel, kCpuProvider>(t));
      own_ops.push_back(new KernelOp<LinearSpec, LinearCpuKernel, kCpuProvider>(t));
      own_ops.push_back(new KernelOp<LinearSpec, LinearCudaKernel, kCudaProvider>(t));
      own_ops.push_back(new KernelOp<QuantizedLinearSpec, QuantizedLinearCpuKernel, kCpuProvider>(t));
      // fp16 and bf16 on CUDA (the tensor-core kernels' types); ORT runs an fp32 node on the CPU.
      if (t != ElemType::kFloat)
        own_ops.push_back(new KernelOp<QuantizedLinearSpec, QuantizedLinearCudaKernel, kCudaProvider>(t));
    }
    hybrid = MakeDomain(contract::kDomain);
    for (OrtCustomOp* op : own_ops) Ort::ThrowOnError(Ort::GetApi().CustomOpDomain_Add(hybrid, op));
    microsoft = MakeDomain(contract::kMsDomain);
  }

  // The state ops, under `name`.
  OrtCustomOpDomain* MakeDomain(const char* name) {
    const OrtApi& api = Ort::GetApi();
    OrtCustomOpDomain* domain = nullptr;
    Ort::ThrowOnError(api.CreateCustomOpDomain(name, &domain));
    for (OrtCustomOp* op : state_ops) Ort::ThrowOnError(api.CustomOpDomain_Add(domain, op));
    return domain;
  }
};

const Registry& TheRegistry() {
  static const Registry* registry = new Registry();  // populated once, on the first registration
  return *registry;
}

}  // namespace

// GetTensorElementTypeAndShapeDataReference is the last member of API 24's OrtApi, index 414; the table only
// ever grows at its end, so the slot is fixed for every later ORT. Our API-21 table is its first 285 members.
void SetLentShapeReader(const OrtApiBase* api_base, bool use) {
  static_assert(sizeof(OrtApi) == 285 * sizeof(void*), "the API-21 OrtApi has 285 members");
  constexpr int kLentShapeApi = 24, kLentShapeSlot = 414;
  int major = 0, minor = 0;
  const char* version = api_base->GetVersionString();
  const bool has_api = version && std::sscanf(version, "%d.%d", &major, &minor) == 2 &&
                       (major > 1 || (major == 1 && minor >= kLentShapeApi));
  // Asked only where the version says it exists: GetApi logs to stderr when refusing one.
  const OrtApi* api = use && has_api ? api_base->GetApi(kLentShapeApi) : nullptr;
  const auto* slots = reinterpret_cast<void* const*>(api);
  TheLentShapeReader().store(api ? reinterpret_cast<LentShapeReader>(slots[kLentShapeSlot]) : nullptr);
}

}  // namespace onnx_hybrid

using namespace onnx_hybrid;

ONNX_HYBRID_EXPORT OrtStatus* ORT_API_CALL RegisterCustomOps(OrtSessionOptions* options, const OrtApiBase* api_base) {
  const OrtApi* api = api_base->GetApi(ORT_API_VERSION);
  if (!api) {
    return api_base->GetApi(1)->CreateStatus(
        ORT_FAIL, "onnx_hybrid: needs ONNX Runtime API " ONNX_HYBRID_STR(ORT_API_VERSION) " (ORT >= 1." ONNX_HYBRID_STR(
                      ORT_API_VERSION) ")");
  }
  Ort::InitApi(api);
  try {
    SetLentShapeReader(api_base, g_lend_input_shapes.load());
    const Registry& registry = TheRegistry();
    Ort::ThrowOnError(api->AddCustomOpDomain(options, registry.hybrid));
    if (g_register_com_microsoft.load() || EnvFlag("ONNX_HYBRID_REGISTER_COM_MICROSOFT"))
      Ort::ThrowOnError(api->AddCustomOpDomain(options, registry.microsoft));
    return nullptr;
  } catch (const std::exception& e) {
    return api->CreateStatus(ORT_FAIL, (std::string("onnx_hybrid: registration failed: ") + e.what()).c_str());
  }
}

ONNX_HYBRID_EXPORT int onnx_hybrid_abi_version(void) { return kAbiVersion; }

// Returns 0 on success; otherwise -1 and onnx_hybrid_last_error() says why.
ONNX_HYBRID_EXPORT int onnx_hybrid_set_option(const char* key, const char* value) {
  return Guarded("onnx_hybrid_set_option", [&] {
    const std::string k = key ? key : "", v = value ? value : "";
    if (k == "register_com_microsoft" && (v == "0" || v == "1")) {
      g_register_com_microsoft.store(v == "1");
      return 0;
    }
    if (k == "cpu_engine" && (v == "auto" || v == "sequential" || v == "chunked")) {
      SetCpuEngineChoice(v == "auto" ? EngineChoice::kAuto : v == "sequential" ? EngineChoice::kSequential
                                                                                 : EngineChoice::kChunked);
      return 0;
    }
    if (k == "cuda_gdn_engine" && (v == "auto" || v == "chunked" || v == "recurrent")) {
      SetGdnCudaEngine(v == "auto" ? GdnCudaEngine::kAuto : v == "chunked" ? GdnCudaEngine::kChunked
                                                                            : GdnCudaEngine::kRecurrent);
      return 0;
    }
    if (k == "cuda_programmatic_launch" && (v == "auto" || v == "off")) {
      cuda::SetProgrammaticLaunch(v == "auto");
      return 0;
    }
    if (k == "input_shapes" && (v == "auto" || v == "copied")) {
      g_lend_input_shapes.store(v == "auto");  // takes effect at the next registration
      return 0;
    }
    LastError() = "onnx_hybrid_set_option: unknown key or value: '" + k + "' = '" + v +
                   "'; known: register_com_microsoft = 0|1, cpu_engine = auto|sequential|chunked, "
                   "cuda_gdn_engine = auto|chunked|recurrent, cuda_programmatic_launch = auto|off, "
                   "input_shapes = auto|copied";
    return -1;
  });
}

ONNX_HYBRID_EXPORT const char* onnx_hybrid_last_error(void) {
  try {
    return LastErrorState().message.c_str();
  } catch (...) {  // no message could be allocated for this thread
    return "";
  }
}

// The contract's name (contract.MESSAGES key) of the last error when it was a contract rejection, else "".
ONNX_HYBRID_EXPORT const char* onnx_hybrid_last_error_key(void) {
  try {
    return LastErrorState().key;
  } catch (...) {
    return "";
  }
}

// How Compute reads input shapes: "lent" (ORT >= 1.24's shape reference) or "copied" (API 21), as set by
// the latest registration.
ONNX_HYBRID_EXPORT const char* onnx_hybrid_input_shapes(void) {
  return TheLentShapeReader().load() ? "lent" : "copied";
}

// Which variant of the CPU building blocks this process runs ("avx512", "avx2" or "generic").
ONNX_HYBRID_EXPORT const char* onnx_hybrid_cpu_isa(void) { return Kernels().name; }

// The CUDA kernels' image (cubin or PTX) for compute capability cc_major.cc_minor; the bytes are copied.
// Returns 0, or -1 (empty image, or a different image already set for that capability) with the reason
// in onnx_hybrid_last_error().
ONNX_HYBRID_EXPORT int onnx_hybrid_set_cuda_image(int cc_major, int cc_minor, const void* data, size_t size) {
  return Guarded("onnx_hybrid_set_cuda_image", [&] {
    std::string error;
    if (cuda::SetImage(cc_major, cc_minor, data, size, &error)) return 0;
    LastError() = error;
    return -1;
  });
}

namespace {

// Copies `text` (NUL-terminated, truncated to `size`) and returns the length it needs, as snprintf does.
int WriteText(const std::string& text, char* out, size_t size) {
  if (out && size > 0) {
    const size_t n = std::min(text.size(), size - 1);
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return static_cast<int>(text.size());
}

}  // namespace

// The compute capabilities that have an image, as "sm_80, sm_90". Returns the text's length.
ONNX_HYBRID_EXPORT int onnx_hybrid_cuda_images(char* out, size_t size) {
  return Guarded("onnx_hybrid_cuda_images", [&] { return WriteText(cuda::ImageList(), out, size); });
}

// 1 when a device of compute capability cc_major.cc_minor would get a kernel image (handed over or found in the
// image folders), 0 when not, -1 on an internal error.
ONNX_HYBRID_EXPORT int onnx_hybrid_cuda_has_image(int cc_major, int cc_minor) {
  return Guarded("onnx_hybrid_cuda_has_image", [&] { return cuda::HasImageFor(cc_major, cc_minor) ? 1 : 0; });
}

// --- CUDA calls on arrays the caller owns (onnx_hybrid.cuda_ops) ------------------------------------------------

namespace onnx_hybrid {
namespace {

// The C entry points' results: 0 launched; 1 nothing launched, the call wants its outputs (their shapes are in
// the call) or a larger workspace (workspace_needed); 2 nothing launched, the given outputs' shapes (in the call)
// are not the resolved ones, which replace them; negative: an error, its text in onnx_hybrid_last_error: -2 the
// operator contract's (the message as ORT reports it), -3 a knob no kernel serves, -1 anything else.
constexpr int kLaunched = 0, kNeedsMemory = 1, kOutputShapes = 2, kFailed = -1, kContractViolation = -2,
              kBadKnob = -3;

template <int N>
InputShapes<N> ShapesOf(const OhArray (&arrays)[N], const void* (&data)[N]) {
  InputShapes<N> shapes;
  for (int i = 0; i < N; ++i) {
    data[i] = arrays[i].data;
    shapes.present[i] = arrays[i].data != nullptr;
    if (shapes.present[i]) {
      if (arrays[i].rank < 0 || arrays[i].rank > OH_MAX_RANK)
        throw std::length_error("onnx_hybrid: a shape of rank " + std::to_string(arrays[i].rank) + " (at most " +
                                std::to_string(OH_MAX_RANK) + ")");
      shapes.shape[i] = Shape(arrays[i].dims, arrays[i].dims + arrays[i].rank);
      shapes.elem[i] = arrays[i].elem_type;
    }
  }
  return shapes;
}

bool SameShape(const Shape& shape, const int64_t (&dims)[4], int32_t rank) {
  return static_cast<size_t>(rank) == shape.size() && std::equal(shape.begin(), shape.end(), dims);
}

void WriteShape(const Shape& shape, int64_t (&dims)[4], int32_t* rank) {
  *rank = static_cast<int32_t>(shape.size());
  for (size_t i = 0; i < shape.size() && i < 4; ++i) dims[i] = shape[i];
}

// Writes the three resolved output shapes into an OhGdnCall / OhConvCall; kLaunched when all three outputs are
// given with those shapes (the caller wrote theirs), else what the entry point returns: kNeedsMemory (one is
// missing) or kOutputShapes (given with other shapes).
template <class Call>
int ReportOutputs(Call* call, const Shape& output, const Shape& state, const Shape& capsule) {
  const bool given = call->outputs[0] && call->outputs[1] && call->outputs[2];
  const bool match = given && SameShape(output, call->output_dims[0], call->output_ranks[0]) &&
                     SameShape(state, call->output_dims[1], call->output_ranks[1]) &&
                     SameShape(capsule, call->output_dims[2], call->output_ranks[2]);
  WriteShape(output, call->output_dims[0], &call->output_ranks[0]);
  WriteShape(state, call->output_dims[1], &call->output_ranks[1]);
  WriteShape(capsule, call->output_dims[2], &call->output_ranks[2]);
  return !given ? kNeedsMemory : match ? kLaunched : kOutputShapes;
}

// The plan's launches whose kernel names start with one of the comma-separated prefixes (null: all of them).
template <class Params>
std::vector<CudaLaunch<Params>> OnlyKernels(std::vector<CudaLaunch<Params>> launches, const char* prefixes) {
  if (!prefixes) return launches;
  std::vector<CudaLaunch<Params>> kept;
  for (auto& l : launches) {
    for (const char* p = prefixes; *p;) {
      const char* end = std::strchr(p, ',');
      const size_t n = end ? size_t(end - p) : std::strlen(p);
      if (n > 0 && std::strncmp(l.kernel.c_str(), p, n) == 0) {
        kept.push_back(l);
        break;
      }
      p += n + (end ? 1 : 0);
    }
  }
  return kept;
}

// A call's attributes, checked as at kernel creation.
GdnAttributes AttributesOf(const OhGdnCall& call) {
  return MakeGdnAttributes(call.update_rule, call.scale, call.gate_activation, call.beta_activation, call.qk_l2_norm,
                           call.chunk_size, call.state_update_capacity);
}

ConvAttributes AttributesOf(const OhConvCall& call) {
  return MakeConvAttributes(call.activation, call.dilation, call.state_update_capacity);
}

ElemType CheckedType(int32_t type) {
  if (type < 0 || type > 2) throw std::invalid_argument("element type must be 0, 1 or 2, got " + std::to_string(type));
  return static_cast<ElemType>(type);
}

// Runs a C entry point's body: exceptions become the codes above, with the message of ORT's status.
template <class Body>
int EntryPoint(const char* op, Body body) noexcept {
  try {
    return body();
  } catch (const ContractError& e) {
    try {
      LastError() = e.what();
      LastErrorState().key = e.key();
    } catch (...) {
    }
    return kContractViolation;
  } catch (const std::invalid_argument& e) {
    try { LastError() = std::string(op) + ": " + e.what(); } catch (...) {}
    return kBadKnob;
  } catch (const std::exception& e) {
    try { LastError() = std::string(op) + ": " + e.what(); } catch (...) {}
    return kFailed;
  }
}

}  // namespace
}  // namespace onnx_hybrid

using namespace onnx_hybrid;

// The shape checks of each op on input shapes alone (OhGdnCall's inputs and attributes, and its type with the
// inputs' elem_type for GatedDeltaNet's gate ports; its other fields are ignored): 0 with the geometry written, or
// -2 with the contract's message (as ORT reports it) in onnx_hybrid_last_error. onnx_hybrid.ops.contract's
// resolve_* are these, so the rules exist once.
ONNX_HYBRID_EXPORT int onnx_hybrid_resolve_gdn(const OhGdnCall* call, OhGdnGeometry* out) {
  namespace g = contract::gdn;
  return EntryPoint(g::kName, [&] {
    const GdnAttributes attrs = AttributesOf(*call);
    const void* data[g::kNumInputs];
    const GdnInputShapes shapes = ShapesOf(call->inputs, data);
    const GdnGeometry geo = ResolveGdn(shapes, attrs);
    GdnGatesInActivationType(shapes, CheckedType(call->type));
    *out = OhGdnGeometry{};
    out->layout = static_cast<int32_t>(geo.layout);
    out->per_key_decay = geo.per_key_decay;
    out->capacity = geo.capacity;
    out->batch = geo.batch;
    out->total_tokens = geo.total_tokens;
    out->num_heads_q = geo.num_heads_q;
    out->num_heads_k = geo.num_heads_k;
    out->num_heads_v = geo.num_heads_v;
    out->head_size_k = geo.head_size_k;
    out->head_size_v = geo.head_size_v;
    out->capsule_width = geo.capsule_width;
    WriteShape(geo.output_shape, out->output_dims, &out->output_rank);
    return 0;
  });
}

ONNX_HYBRID_EXPORT int onnx_hybrid_resolve_conv(const OhConvCall* call, OhConvGeometry* out) {
  namespace cv = contract::conv;
  return EntryPoint(cv::kName, [&] {
    const ConvAttributes attrs = AttributesOf(*call);
    const void* data[cv::kNumInputs];
    const ConvGeometry geo = ResolveConv(ShapesOf(call->inputs, data), attrs);
    *out = OhConvGeometry{geo.batch, geo.total_tokens, geo.channels, geo.kernel_size, geo.state_length, geo.capacity};
    return 0;
  });
}

ONNX_HYBRID_EXPORT int onnx_hybrid_resolve_paged_attention(const OhPagedAttentionCall* call,
                                                           OhPagedAttentionGeometry* out) {
  namespace pa = contract::paged;
  static_assert(sizeof(call->inputs) / sizeof(call->inputs[0]) == pa::kNumInputs, "PagedAttention's inputs");
  return EntryPoint(pa::kName, [&] {
    const PagedAttentionAttributes attrs = MakePagedAttentionAttributes(call->num_heads, call->kv_num_heads,
                                                                        call->scale);
    const void* data[pa::kNumInputs];
    const PagedAttentionGeometry geo = ResolvePagedAttention(ShapesOf(call->inputs, data), attrs);
    *out = OhPagedAttentionGeometry{geo.batch,      geo.num_tokens, geo.num_heads,
                                    geo.kv_num_heads, geo.head_size, geo.num_blocks, geo.block_size,
                                    geo.max_num_blocks, geo.scale};
    return 0;
  });
}

// The checks of host-resident offsets (GatedDeltaNet's cu_seqlens, the conv's cumulative_sequence_length) as the
// CPU kernels run them: `batch` rows (start, length) into `rows` (2 int64 each), or -2 with the contract's message.
ONNX_HYBRID_EXPORT int onnx_hybrid_check_offsets(const char* op, const int32_t* offsets, int64_t batch,
                                                 int64_t total_tokens, int64_t* rows) {
  const std::string name = op ? op : "";
  return EntryPoint(name.c_str(), [&] {
    std::vector<RequestRow> found;
    if (name == contract::gdn::kName) {
      GdnGeometry geo{};
      geo.layout = GdnLayout::kRagged;
      geo.batch = batch;
      geo.total_tokens = total_tokens;
      found = GdnRows(geo, offsets);
    } else if (name == contract::conv::kName) {
      ConvGeometry geo{};
      geo.batch = batch;
      geo.total_tokens = total_tokens;
      found = ConvRows(geo, offsets);
    } else {
      throw std::runtime_error("onnx_hybrid_check_offsets: no host offsets for op '" + name + "'");
    }
    for (size_t b = 0; b < found.size(); ++b) {
      rows[2 * b] = found[b].start;
      rows[2 * b + 1] = found[b].length;
    }
    return 0;
  });
}

// PagedAttention's host-side checks (offsets, past lengths, every block_table entry a request reaches, the table
// [batch, max_num_blocks] int32) as its CPU kernel runs them: rows (start, length, past) into `rows` (3 int64
// each), or -2 with the contract's message.
ONNX_HYBRID_EXPORT int onnx_hybrid_check_paged_rows(const OhPagedAttentionGeometry* g, const int32_t* offsets,
                                                    const int32_t* past, const int32_t* block_table, int64_t* rows) {
  return EntryPoint(contract::paged::kName, [&] {
    const PagedAttentionGeometry geo{g->batch,      g->num_tokens, g->num_heads,  g->kv_num_heads, g->head_size,
                                     g->num_blocks, g->block_size, g->max_num_blocks, g->scale};
    const std::vector<PagedRow> found = PagedRows(geo, offsets, past, block_table);
    for (size_t b = 0; b < found.size(); ++b) {
      rows[3 * b] = found[b].start;
      rows[3 * b + 1] = found[b].length;
      rows[3 * b + 2] = found[b].past;
    }
    return 0;
  });
}

// GatedDeltaNet on the caller's stream (OhGdnCall in ort/c_api.h).
ONNX_HYBRID_EXPORT int onnx_hybrid_cuda_gated_delta_net(OhGdnCall* call) {
  namespace g = contract::gdn;
  return EntryPoint(g::kName, [&] {
    const ElemType type = CheckedType(call->type);
    const GdnAttributes attrs = AttributesOf(*call);
    const void* data[g::kNumInputs];
    const GdnInputShapes shapes = ShapesOf(call->inputs, data);
    const GdnGeometry geo = ResolveGdn(shapes, attrs);
    const bool gates_act = GdnGatesInActivationType(shapes, type);
    call->workspace_needed = 0;
    const int outputs = ReportOutputs(call, geo.output_shape, geo.state_shape, geo.capsule_shape());
    if (outputs != kLaunched) return outputs;
    if (call->engine < 0 || call->engine > 2)
      throw std::invalid_argument("engine must be 0 (auto), 1 (chunked) or 2 (recurrent)");
    GdnPlanKnobs knobs;
    knobs.engine = static_cast<GdnCudaEngine>(call->engine);
    knobs.rec_rows = call->rec_rows;
    knobs.rec_groups = call->rec_groups;
    knobs.scan_width = call->scan_width;
    knobs.prep_heads = call->prep_heads;
    GdnParams p = MakeGdnParams(geo, attrs, type, gates_act, data, call->outputs[0],
                                static_cast<float*>(call->outputs[1]), static_cast<float*>(call->outputs[2]));
    cuda::Launcher launcher(call->stream);
    call->workspace_needed = GdnWorkspaceBytes(geo, type, p, launcher.device(), knobs.engine);
    if (call->workspace_needed > 0) {
      if (!call->workspace || call->workspace_bytes < call->workspace_needed) return kNeedsMemory;
      p.workspace = call->workspace;
    }
    Enqueue(launcher, OnlyKernels(PlanGdn(geo, type, p, launcher.device().arch, launcher.device().smem_optin, knobs),
                                  call->only_kernels));
    return kLaunched;
  });
}

// VarlenCausalConvWithState on the caller's stream (OhConvCall in ort/c_api.h).
ONNX_HYBRID_EXPORT int onnx_hybrid_cuda_varlen_causal_conv(OhConvCall* call) {
  namespace cv = contract::conv;
  return EntryPoint(cv::kName, [&] {
    const ElemType type = CheckedType(call->type);
    const ConvAttributes attrs = AttributesOf(*call);
    const void* data[cv::kNumInputs];
    const ConvGeometry geo = ResolveConv(ShapesOf(call->inputs, data), attrs);
    const int outputs = ReportOutputs(call, geo.output_shape(), geo.state_shape(), geo.capsule_shape());
    if (outputs != kLaunched) return outputs;
    cuda::Launcher launcher(call->stream);
    const ConvParams p = MakeConvParams(geo, attrs, data, call->outputs[0], call->outputs[1], call->outputs[2]);
    Enqueue(launcher, OnlyKernels(PlanConv(geo, type, p), call->only_kernels));
    return kLaunched;
  });
}

// The GatedDeltaNet replay of accepted[b] captured transitions onto the committed state (in place when
// state_out is state_in); shapes checked by the caller (onnx_hybrid.cuda_ops.replay_gdn).
ONNX_HYBRID_EXPORT int onnx_hybrid_cuda_replay_gdn(const float* state_in, float* state_out, const float* capsule,
                                                   const int32_t* accepted, int batch, int hk, int hv, int dk, int dv,
                                                   int capacity, void* stream) {
  return EntryPoint("replay_gdn", [&] {
    const GdnReplayParams p{state_in, state_out, capsule, accepted, batch, hk, hv, dk, dv, capacity};
    cuda::Launcher launcher(stream);
    Enqueue(launcher, PlanGdnReplay(p));
    return kLaunched;
  });
}

// The conv replay, likewise (onnx_hybrid.cuda_ops.replay_conv).
ONNX_HYBRID_EXPORT int onnx_hybrid_cuda_replay_conv(int type, const void* state_in, void* state_out,
                                                    const void* capsule, const int32_t* accepted, int batch,
                                                    int channels, int state_len, int capacity, void* stream) {
  return EntryPoint("replay_conv", [&] {
    const ConvReplayParams p{state_in, state_out, capsule, accepted, batch, channels, state_len, capacity};
    cuda::Launcher launcher(stream);
    Enqueue(launcher, PlanConvReplay(CheckedType(type), p));
    return kLaunched;
  });
}

