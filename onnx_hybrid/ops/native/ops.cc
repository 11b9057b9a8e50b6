// ORT custom-op glue: op declarations (one object per op and element type), CPU kernels that read
// and validate inputs and call the engines, registration, and the ctypes control ABI.
#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "conv_cpu.h"
#include "cpu_kernels.h"
#include "gdn_cpu.h"
#include "paged_attention_cpu.h"
#include "ort_api.h"

#define ONNX_HYBRID_STR_(x) #x
#define ONNX_HYBRID_STR(x) ONNX_HYBRID_STR_(x)
#define ONNX_HYBRID_EXPORT extern "C" __attribute__((visibility("default")))

namespace onnx_hybrid {
namespace {

constexpr int kAbiVersion = 1;
constexpr char kCpuProvider[] = "CPUExecutionProvider";

std::atomic<bool> g_register_com_microsoft{false};
// One-time initialisation uses function-local statics (thread-safe, __cxa_guard) and per-thread data
// uses pthread keys: thread_local and std::call_once (libstdc++ keeps its callable in TLS) would add
// ld-linux (__tls_get_addr) to the library's NEEDED entries.

// onnx_hybrid_last_error's per-thread message.
std::string& LastError() {
  static const pthread_key_t key = [] {
    pthread_key_t k;
    pthread_key_create(&k, [](void* p) { delete static_cast<std::string*>(p); });
    return k;
  }();
  auto* message = static_cast<std::string*>(pthread_getspecific(key));
  if (!message) {
    message = new std::string();
    pthread_setspecific(key, message);
  }
  return *message;
}

bool EnvFlag(const char* name) {
  const char* v = std::getenv(name);
  return v && *v && std::strcmp(v, "0") != 0;
}

// Every error of an op starts with the op's name; contract errors already carry it.
OrtStatusPtr ToStatus(const std::exception& e, const char* op) {
  if (dynamic_cast<const ContractError*>(&e)) return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, e.what());
  OrtErrorCode code = ORT_FAIL;
  if (auto* ort = dynamic_cast<const Ort::Exception*>(&e)) code = ort->GetOrtErrorCode();
  return Ort::GetApi().CreateStatus(code, (std::string(op) + ": " + e.what()).c_str());
}

ONNXTensorElementDataType OnnxType(ElemType t) {
  switch (t) {
    case ElemType::kFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case ElemType::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

ONNXTensorElementDataType PortElementType(contract::PortType port, ElemType activation) {
  switch (port) {
    case contract::PortType::kActivation: return OnnxType(activation);
    case contract::PortType::kFloat: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  }
}

// Attribute readers: an absent attribute takes the contract's default.
std::string StringAttribute(const OrtKernelInfo* info, const char* name, const char* fallback) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  if (OrtStatus* st = api.KernelInfoGetAttribute_string(info, name, nullptr, &size)) {
    api.ReleaseStatus(st);
    return fallback;
  }
  std::string value(size, '\0');
  Ort::ThrowOnError(api.KernelInfoGetAttribute_string(info, name, value.data(), &size));
  value.resize(size > 0 ? size - 1 : 0);  // size counts the terminating NUL
  return value;
}

int64_t IntAttribute(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  int64_t value = fallback;
  if (OrtStatus* st = Ort::GetApi().KernelInfoGetAttribute_int64(info, name, &value)) {
    Ort::GetApi().ReleaseStatus(st);
    return fallback;
  }
  return value;
}

float FloatAttribute(const OrtKernelInfo* info, const char* name, float fallback) {
  float value = fallback;
  if (OrtStatus* st = Ort::GetApi().KernelInfoGetAttribute_float(info, name, &value)) {
    Ort::GetApi().ReleaseStatus(st);
    return fallback;
  }
  return value;
}

// The inputs of one Compute call: present flag, shape and host pointer by index. Trailing omitted
// inputs are not counted by ORT; omitted inputs in the middle come back as null values.
template <int N>
struct Inputs : InputShapes<N> {
  const void* data[N] = {};

  explicit Inputs(OrtKernelContext* context) {
    const OrtApi& api = Ort::GetApi();
    size_t count = 0;
    Ort::ThrowOnError(api.KernelContext_GetInputCount(context, &count));
    for (size_t i = 0; i < count && i < size_t(N); ++i) {
      const OrtValue* value = nullptr;
      Ort::ThrowOnError(api.KernelContext_GetInput(context, i, &value));
      if (!value) continue;
      Ort::ConstValue v(value);
      this->present[i] = true;
      this->shape[i] = v.GetTensorTypeAndShapeInfo().GetShape();
      data[i] = v.GetTensorRawData();
    }
  }
};

// Output `index` with `shape`, or null when the node omits it.
void* Output(OrtKernelContext* context, size_t index, const Shape& shape) {
  const OrtApi& api = Ort::GetApi();
  size_t count = 0;
  Ort::ThrowOnError(api.KernelContext_GetOutputCount(context, &count));
  if (index >= count) return nullptr;
  OrtValue* value = nullptr;
  Ort::ThrowOnError(api.KernelContext_GetOutput(context, index, shape.data(), shape.size(), &value));
  if (!value) return nullptr;
  void* data = nullptr;
  Ort::ThrowOnError(api.GetTensorMutableData(value, &data));
  return data;
}

// ORT's intra-op thread pool. Exceptions stay on the worker and are rethrown on the calling thread.
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
  GdnCpuKernel(const OrtKernelInfo* info, ElemType type) : type_(type) {
    namespace g = contract::gdn;
    attrs_ = MakeGdnAttributes(StringAttribute(info, g::kAttrUpdateRule, g::kDefaultUpdateRule),
                               FloatAttribute(info, g::kAttrScale, g::kDefaultScale),
                               StringAttribute(info, g::kAttrGateActivation, g::kDefaultGateActivation),
                               StringAttribute(info, g::kAttrBetaActivation, g::kDefaultBetaActivation),
                               IntAttribute(info, g::kAttrQkL2Norm, g::kDefaultQkL2Norm),
                               IntAttribute(info, g::kAttrChunkSize, g::kDefaultChunkSize),
                               IntAttribute(info, g::kAttrStateUpdateCapacity, g::kDefaultStateUpdateCapacity));
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    namespace g = contract::gdn;
    try {
      const Inputs<g::kNumInputs> in(context);
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
      t.initial_state = static_cast<const float*>(in.data[g::kInputInitialState]);
      t.a_log = static_cast<const float*>(in.data[g::kInputALog]);
      t.dt_bias = static_cast<const float*>(in.data[g::kInputDtBias]);
      t.capture_count = static_cast<const int32_t*>(in.data[g::kInputCaptureCount]);
      const auto* active = static_cast<const int32_t*>(in.data[g::kInputStateUpdateActive]);
      t.capture_active = active == nullptr || active[0] != 0;
      t.output = Output(context, g::kOutputOutput, geo.output_shape);
      t.final_state = static_cast<float*>(Output(context, g::kOutputFinalState, geo.state_shape));
      t.state_update =
          static_cast<float*>(Output(context, g::kOutputStateUpdate, Shape{geo.batch, geo.capsule_width}));
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
  ConvCpuKernel(const OrtKernelInfo* info, ElemType type) : type_(type) {
    namespace cv = contract::conv;
    attrs_ = MakeConvAttributes(StringAttribute(info, cv::kAttrActivation, cv::kDefaultActivation),
                                IntAttribute(info, cv::kAttrDilation, cv::kDefaultDilation),
                                IntAttribute(info, cv::kAttrStateUpdateCapacity, cv::kDefaultStateUpdateCapacity));
  }

  OrtStatusPtr ComputeV2(OrtKernelContext* context) {
    namespace cv = contract::conv;
    try {
      const Inputs<cv::kNumInputs> in(context);
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
      t.output = Output(context, cv::kOutputOutput, Shape{geo.total_tokens, geo.channels});
      t.final_state = Output(context, cv::kOutputFinalState, Shape{geo.batch, geo.channels, geo.state_length});
      t.state_update = Output(context, cv::kOutputStateUpdate, Shape{geo.batch, geo.capacity, geo.channels});
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
      const Inputs<pa::kNumInputs> in(context);
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

// ---------------------------------------------------------------------------------------------
// Op declarations: the ports come from the contract; one object per (op, element type).
// ---------------------------------------------------------------------------------------------

struct GdnSpec {
  using Kernel = GdnCpuKernel;
  static constexpr const char* kName = contract::gdn::kName;
  static constexpr const auto& kInputs = contract::gdn::kInputPorts;
  static constexpr const auto& kOutputs = contract::gdn::kOutputPorts;
  static constexpr const auto& kInplace = contract::gdn::kInplace;
};

struct ConvSpec {
  using Kernel = ConvCpuKernel;
  static constexpr const char* kName = contract::conv::kName;
  static constexpr const auto& kInputs = contract::conv::kInputPorts;
  static constexpr const auto& kOutputs = contract::conv::kOutputPorts;
  static constexpr const auto& kInplace = contract::conv::kInplace;
};

struct PagedAttentionSpec {
  using Kernel = PagedAttentionCpuKernel;
  static constexpr const char* kName = contract::paged::kName;
  static constexpr const auto& kInputs = contract::paged::kInputPorts;
  static constexpr const auto& kOutputs = contract::paged::kOutputPorts;
  static constexpr const auto& kInplace = contract::paged::kInplace;
};

template <class Spec>
struct CpuOp : Ort::CustomOpBase<CpuOp<Spec>, typename Spec::Kernel, /*WithStatus=*/true> {
  explicit CpuOp(ElemType type) : type_(type) {
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
  const char* GetExecutionProviderType() const { return kCpuProvider; }
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
  OrtMemType GetInputMemoryType(size_t i) const {
    return Spec::kInputs[i].host_memory ? OrtMemTypeCPUInput : OrtMemTypeDefault;
  }

  OrtStatusPtr CreateKernelV2(const OrtApi&, const OrtKernelInfo* info, void** kernel) const {
    try {
      *kernel = new typename Spec::Kernel(info, type_);
      return nullptr;
    } catch (const std::exception& e) {
      return ToStatus(e, Spec::kName);
    }
  }

 private:
  ElemType type_;
};

constexpr ElemType kCpuTypes[] = {ElemType::kFloat, ElemType::kFloat16, ElemType::kBFloat16};

// Op objects and domains live until the process ends (ORT keeps the library loaded), so they are
// allocated once and never freed. PagedAttention is only in our domain: its I/O is a subset of
// com.microsoft::PagedAttention's, so it must not shadow ORT's CUDA kernel under that name.
struct Registry {
  std::vector<std::unique_ptr<CpuOp<GdnSpec>>> gdn;
  std::vector<std::unique_ptr<CpuOp<ConvSpec>>> conv;
  std::vector<std::unique_ptr<CpuOp<PagedAttentionSpec>>> paged;
  OrtCustomOpDomain* hybrid = nullptr;
  OrtCustomOpDomain* microsoft = nullptr;

  Registry() {
    for (ElemType t : kCpuTypes) {
      gdn.emplace_back(new CpuOp<GdnSpec>(t));
      conv.emplace_back(new CpuOp<ConvSpec>(t));
      paged.emplace_back(new CpuOp<PagedAttentionSpec>(t));
    }
    hybrid = MakeDomain(contract::kDomain);
    for (auto& op : paged) Ort::ThrowOnError(Ort::GetApi().CustomOpDomain_Add(hybrid, op.get()));
    microsoft = MakeDomain(contract::kMsDomain);
  }

  // The state ops, under `name`.
  OrtCustomOpDomain* MakeDomain(const char* name) {
    const OrtApi& api = Ort::GetApi();
    OrtCustomOpDomain* domain = nullptr;
    Ort::ThrowOnError(api.CreateCustomOpDomain(name, &domain));
    for (auto& op : gdn) Ort::ThrowOnError(api.CustomOpDomain_Add(domain, op.get()));
    for (auto& op : conv) Ort::ThrowOnError(api.CustomOpDomain_Add(domain, op.get()));
    return domain;
  }
};

const Registry& TheRegistry() {
  static const Registry* registry = new Registry();  // populated once, on the first registration
  return *registry;
}

}  // namespace
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
  LastError() = "onnx_hybrid_set_option: unknown key or value: '" + k + "' = '" + v +
                 "'; known: register_com_microsoft = 0|1, cpu_engine = auto|sequential|chunked";
  return -1;
}

ONNX_HYBRID_EXPORT const char* onnx_hybrid_last_error(void) { return LastError().c_str(); }

// Which variant of the CPU building blocks this process runs ("avx512", "avx2" or "generic").
ONNX_HYBRID_EXPORT const char* onnx_hybrid_cpu_isa(void) { return Kernels().name; }
