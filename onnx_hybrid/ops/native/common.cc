#include "common.h"

#include <cmath>
#include <cstring>

#include "ort/ort_api.h"

namespace onnx_hybrid {

MessageArg::MessageArg(const Shape& shape) {
  text_ = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) text_ += ", ";
    text_ += std::to_string(shape[i]);
  }
  text_ += "]";
}

const char* MessageKeyOf(const char* templ) {
  for (const auto& entry : contract::kMessageKeys)
    if (entry.templ == templ) return entry.key;
  return "";
}

std::string FormatMessage(const char* op, const char* templ, const std::vector<MessageArg>& args) {
  std::string out = std::string(op) + ": ";
  for (const char* p = templ; *p;) {
    if (p[0] == '{' && p[1] >= '0' && p[1] <= '9') {
      const char* end = p + 1;
      size_t index = 0;
      while (*end >= '0' && *end <= '9') index = index * 10 + static_cast<size_t>(*end++ - '0');
      if (*end == '}' && index < args.size()) {
        out += args[index].text();
        p = end + 1;
        continue;
      }
    }
    out += *p++;
  }
  return out;
}

void RequireFinite(const char* attribute, float value) {
  if (!std::isfinite(value))
    throw std::runtime_error(std::string("attribute ") + attribute + " must be finite, got " + std::to_string(value));
}

float HalfToFloat(uint16_t bits) { return Ort::Float16_t::FromBits(bits).ToFloat(); }
uint16_t FloatToHalf(float value) { return Ort::Float16_t(value).val; }
uint16_t FloatToBFloat16(float value) { return Ort::BFloat16_t(value).val; }

size_t ElemSize(ElemType type) { return type == ElemType::kFloat ? 4 : 2; }

void LoadAsFloat(ElemType type, const void* src, int64_t offset, int64_t n, float* dst) {
  switch (type) {
    case ElemType::kFloat:
      std::memcpy(dst, static_cast<const float*>(src) + offset, static_cast<size_t>(n) * 4);
      break;
    case ElemType::kFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = HalfToFloat(s[i]);
      break;
    }
    case ElemType::kBFloat16: {
      const uint16_t* s = static_cast<const uint16_t*>(src) + offset;
      for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16ToFloat(s[i]);
      break;
    }
  }
}

void StoreFromFloat(ElemType type, const float* src, int64_t n, void* dst, int64_t offset) {
  switch (type) {
    case ElemType::kFloat:
      std::memcpy(static_cast<float*>(dst) + offset, src, static_cast<size_t>(n) * 4);
      break;
    case ElemType::kFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToHalf(src[i]);
      break;
    }
    case ElemType::kBFloat16: {
      uint16_t* d = static_cast<uint16_t*>(dst) + offset;
      for (int64_t i = 0; i < n; ++i) d[i] = FloatToBFloat16(src[i]);
      break;
    }
  }
}

}  // namespace onnx_hybrid
