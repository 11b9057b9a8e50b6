// Shared helpers of the native library: contract errors with the contract's message text, shapes,
// and element conversions. Nothing here depends on an execution provider.
#pragma once

#include <cstdint>
#include <functional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "contract_generated.h"

namespace onnx_hybrid {

using Shape = std::vector<int64_t>;

// One argument of a message template, rendered like contract._fmt renders its Python counterpart:
// integers in decimal, shapes as "[a, b]", strings verbatim.
class MessageArg {
 public:
  MessageArg(const char* s) : text_(s) {}
  MessageArg(std::string s) : text_(std::move(s)) {}
  MessageArg(int64_t v) : text_(std::to_string(v)) {}
  MessageArg(int v) : text_(std::to_string(v)) {}
  MessageArg(const Shape& shape);
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

// "Op: " + template with {0}, {1}, ... replaced, exactly as contract.format_message builds it.
std::string FormatMessage(const char* op, const char* templ, const std::vector<MessageArg>& args);

// An input that violates the operator contract. Kernels turn it into an ORT status; it never crosses
// the C ABI.
class ContractError : public std::runtime_error {
 public:
  ContractError(const char* op, const char* templ, std::vector<MessageArg> args = {})
      : std::runtime_error(FormatMessage(op, templ, args)) {}
};

inline const char* Presence(const void* p) { return p ? "present" : "absent"; }

// Float attributes must be finite (contract._check_attribute); the message lacks the op name, which the
// caller's ToStatus puts in front.
void RequireFinite(const char* attribute, float value);

// The input shapes of one call by input index; present[i] false means input i is absent.
template <int N>
struct InputShapes {
  Shape shape[N];
  bool present[N] = {};
};

// Element types of the activation tensor T.
enum class ElemType { kFloat, kFloat16, kBFloat16 };

float HalfToFloat(uint16_t bits);
uint16_t FloatToHalf(float value);  // round to nearest even
inline float BFloat16ToFloat(uint16_t bits) {
  uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
uint16_t FloatToBFloat16(float value);  // round to nearest even, NaN stays NaN

// Widen n elements of type `type` at src + offset (in elements) into dst.
void LoadAsFloat(ElemType type, const void* src, int64_t offset, int64_t n, float* dst);
// Round n floats once to `type` and store them at dst + offset (in elements).
void StoreFromFloat(ElemType type, const float* src, int64_t n, void* dst, int64_t offset);
size_t ElemSize(ElemType type);

// Runs fn(0) ... fn(n-1), possibly concurrently; provided by the execution provider (ORT's intra-op
// thread pool on the CPU EP).
class ParallelFor {
 public:
  virtual ~ParallelFor() = default;
  virtual void Run(size_t n, const std::function<void(size_t)>& fn) const = 0;
};

}  // namespace onnx_hybrid
