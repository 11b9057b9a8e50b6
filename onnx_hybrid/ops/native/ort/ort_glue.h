// Glue between ORT's kernel API and our kernels, shared by every execution provider: attribute readers,
// the inputs of one Compute call, outputs, and turning exceptions into statuses.
#pragma once

#include <atomic>
#include <string>

#include "common.h"
#include "shapes/conv_shapes.h"
#include "shapes/gdn_shapes.h"
#include "shapes/linear_shapes.h"
#include "ort/ort_api.h"

namespace onnx_hybrid {

// Every error of an op starts with the op's name; contract errors already carry it.
inline OrtStatusPtr ToStatus(const std::exception& e, const char* op) {
  if (dynamic_cast<const ContractError*>(&e)) return Ort::GetApi().CreateStatus(ORT_INVALID_ARGUMENT, e.what());
  OrtErrorCode code = ORT_FAIL;
  if (auto* ort = dynamic_cast<const Ort::Exception*>(&e)) code = ort->GetOrtErrorCode();
  return Ort::GetApi().CreateStatus(code, (std::string(op) + ": " + e.what()).c_str());
}

inline ONNXTensorElementDataType OnnxType(ElemType t) {
  switch (t) {
    case ElemType::kFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16;
    case ElemType::kBFloat16: return ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
  }
}

// An input's element type as an ElemType code (InputShapes::elem), kOtherElemType for the rest.
inline int ElemTypeCode(ONNXTensorElementDataType t) {
  switch (t) {
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT: return static_cast<int>(ElemType::kFloat);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16: return static_cast<int>(ElemType::kFloat16);
    case ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16: return static_cast<int>(ElemType::kBFloat16);
    default: return kOtherElemType;
  }
}

inline ONNXTensorElementDataType PortElementType(contract::PortType port, ElemType activation) {
  switch (port) {
    case contract::PortType::kActivation: return OnnxType(activation);
    case contract::PortType::kFloat: return ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT;
    case contract::PortType::kGate: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;  // any: the kernel checks it
    case contract::PortType::kUint8: return ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8;
    default: return ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32;
  }
}

// Attribute readers: an absent attribute takes the contract's default.
inline std::string StringAttribute(const OrtKernelInfo* info, const char* name, const char* fallback) {
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

// An int or float attribute through its OrtApi getter (KernelInfoGetAttribute_int64 or _float).
template <class T, class Getter>
T ScalarAttribute(Getter get, const OrtKernelInfo* info, const char* name, T fallback) {
  T value = fallback;
  if (OrtStatus* st = get(info, name, &value)) {
    Ort::GetApi().ReleaseStatus(st);
    return fallback;
  }
  return value;
}

inline int64_t IntAttribute(const OrtKernelInfo* info, const char* name, int64_t fallback) {
  return ScalarAttribute(Ort::GetApi().KernelInfoGetAttribute_int64, info, name, fallback);
}

inline float FloatAttribute(const OrtKernelInfo* info, const char* name, float fallback) {
  return ScalarAttribute(Ort::GetApi().KernelInfoGetAttribute_float, info, name, fallback);
}

// ORT 1.24 (API 24) added GetTensorElementTypeAndShapeDataReference, which lends a tensor's shape; the
// API-21 path copies it into a heap object per input per call, about 90 ns each on a 2-core host. Our
// headers are API 21 (Debian's libonnxruntime-dev), so RegisterCustomOps takes this entry from its slot in
// the append-only OrtApi table (SetLentShapeReader) when the running ORT offers API 24; null otherwise.
using LentShapeReader = OrtStatus*(ORT_API_CALL*)(const OrtValue* value, ONNXTensorElementDataType* elem_type,
                                                  const int64_t** shape_data, size_t* shape_data_count);
inline std::atomic<LentShapeReader>& TheLentShapeReader() {
  static std::atomic<LentShapeReader> reader{nullptr};
  return reader;
}

// Called by RegisterCustomOps; `use` false forces the API-21 copy (the input_shapes option, for tests).
void SetLentShapeReader(const OrtApiBase* api_base, bool use);

// The inputs of one Compute call: present flag, shape and data pointer by index (device memory on a GPU
// EP, except inputs declared OrtMemTypeCPUInput). Trailing omitted inputs are not counted by ORT; omitted
// inputs in the middle come back as null values. Shapes are read straight into the inline Shape: this runs
// on every call, and on a GPU EP its host time is the node's cost.
template <int N>
struct Inputs : InputShapes<N> {
  const void* data[N] = {};

  Inputs(OrtKernelContext* context, const contract::PortSpec (&ports)[N]) {
    const OrtApi& api = Ort::GetApi();
    const LentShapeReader lent = TheLentShapeReader().load(std::memory_order_relaxed);
    size_t count = 0;
    Ort::ThrowOnError(api.KernelContext_GetInputCount(context, &count));
    for (size_t i = 0; i < count && i < size_t(N); ++i) {
      const OrtValue* value = nullptr;
      Ort::ThrowOnError(api.KernelContext_GetInput(context, i, &value));
      if (!value) continue;
      this->present[i] = true;
      ONNXTensorElementDataType type = ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
      if (lent) {
        const int64_t* dims = nullptr;
        size_t rank = 0;
        Ort::ThrowOnError(lent(value, &type, &dims, &rank));
        CheckRank(rank, ports[i].name);
        this->shape[i] = Shape(dims, dims + rank);
      } else {
        CopyShape(api, value, ports[i].name, &this->shape[i], &type);
      }
      this->elem[i] = ElemTypeCode(type);
      Ort::ThrowOnError(api.GetTensorMutableData(const_cast<OrtValue*>(value), const_cast<void**>(&data[i])));
    }
  }

 private:
  static void CheckRank(size_t rank, const char* name) {
    if (rank > Shape::kMaxRank)
      throw std::runtime_error(std::string("input '") + name + "' has rank " + std::to_string(rank) +
                               "; the contract's tensors have rank 4 at most");
  }

  static void CopyShape(const OrtApi& api, const OrtValue* value, const char* name, Shape* shape,
                        ONNXTensorElementDataType* type) {
    OrtTensorTypeAndShapeInfo* info = nullptr;
    Ort::ThrowOnError(api.GetTensorTypeAndShape(value, &info));
    size_t rank = 0;
    OrtStatus* status = api.GetTensorElementType(info, type);
    if (!status) status = api.GetDimensionsCount(info, &rank);
    if (!status && rank <= Shape::kMaxRank) {
      shape->resize(rank);
      status = api.GetDimensions(info, shape->data(), rank);
    }
    api.ReleaseTensorTypeAndShapeInfo(info);
    Ort::ThrowOnError(status);
    CheckRank(rank, name);
  }
};

// Output `index` with `shape`, or null when the node omits it.
inline void* Output(OrtKernelContext* context, size_t index, const Shape& shape) {
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

// The node's attributes, validated when the kernel is created (an absent one takes its default).
inline GdnAttributes ReadGdnAttributes(const OrtKernelInfo* info) {
  namespace g = contract::gdn;
  return MakeGdnAttributes(StringAttribute(info, g::kAttrUpdateRule, g::kDefaultUpdateRule),
                           FloatAttribute(info, g::kAttrScale, g::kDefaultScale),
                           StringAttribute(info, g::kAttrGateActivation, g::kDefaultGateActivation),
                           StringAttribute(info, g::kAttrBetaActivation, g::kDefaultBetaActivation),
                           IntAttribute(info, g::kAttrQkL2Norm, g::kDefaultQkL2Norm),
                           IntAttribute(info, g::kAttrChunkSize, g::kDefaultChunkSize),
                           IntAttribute(info, g::kAttrStateUpdateCapacity, g::kDefaultStateUpdateCapacity));
}

inline ConvAttributes ReadConvAttributes(const OrtKernelInfo* info) {
  namespace cv = contract::conv;
  return MakeConvAttributes(StringAttribute(info, cv::kAttrActivation, cv::kDefaultActivation),
                            IntAttribute(info, cv::kAttrDilation, cv::kDefaultDilation),
                            IntAttribute(info, cv::kAttrStateUpdateCapacity, cv::kDefaultStateUpdateCapacity));
}

// A Linear node's outputs, one per part of geo.parts.
struct LinearOutputs {
  void* data[contract::linear::kNumOutputs] = {};
  static LinearOutputs Make(OrtKernelContext* context, const LinearGeometry& geo) {
    LinearOutputs out;
    for (size_t j = 0; j < geo.parts.size(); ++j) out.data[j] = Output(context, j, geo.output_shape(j));
    return out;
  }
};

// An ints attribute (KernelInfoGetAttributeArray_int64); absent: empty, the contract's default.
inline std::vector<int64_t> IntsAttribute(const OrtKernelInfo* info, const char* name) {
  const OrtApi& api = Ort::GetApi();
  size_t size = 0;
  if (OrtStatus* st = api.KernelInfoGetAttributeArray_int64(info, name, nullptr, &size)) {
    api.ReleaseStatus(st);
    return {};
  }
  std::vector<int64_t> values(size);
  if (size > 0) Ort::ThrowOnError(api.KernelInfoGetAttributeArray_int64(info, name, values.data(), &size));
  return values;
}

// The node's outputs that exist (a named output; an omitted optional one has an empty name), if they are its
// first ones; else -1.
inline int LeadingOutputs(const OrtKernelInfo* info) {
  const OrtApi& api = Ort::GetApi();
  size_t count = 0;
  Ort::ThrowOnError(api.KernelInfo_GetOutputCount(info, &count));
  int leading = 0, named = 0;
  for (size_t i = 0; i < count; ++i) {
    size_t size = 0;
    Ort::ThrowOnError(api.KernelInfo_GetOutputName(info, i, nullptr, &size));
    const bool exists = size > 1;  // size counts the terminating NUL
    named += exists;
    if (exists && leading == static_cast<int>(i)) ++leading;
  }
  return named == leading ? leading : -1;
}

inline LinearAttributes ReadLinearAttributes(const OrtKernelInfo* info) {
  namespace ln = contract::linear;
  return MakeLinearAttributes(StringAttribute(info, ln::kAttrActivation, ln::kDefaultActivation),
                              IntsAttribute(info, ln::kAttrOutputFeatures), LeadingOutputs(info));
}

inline QuantizedLinearAttributes ReadQuantizedLinearAttributes(const OrtKernelInfo* info) {
  namespace ql = contract::qlinear;
  return MakeQuantizedLinearAttributes(StringAttribute(info, ql::kAttrActivation, ql::kDefaultActivation),
                                       IntsAttribute(info, ql::kAttrOutputFeatures), LeadingOutputs(info),
                                       IntAttribute(info, ql::kAttrBlockSize, ql::kDefaultBlockSize),
                                       IntAttribute(info, ql::kAttrBits, ql::kDefaultBits),
                                       IntAttribute(info, ql::kAttrAccuracyLevel, ql::kDefaultAccuracyLevel));
}

}  // namespace onnx_hybrid
