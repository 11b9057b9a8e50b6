// Shared helpers of the native library: contract errors with the contract's message text, shapes,
// and element conversions. Nothing here depends on an execution provider.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "contract_generated.h"

namespace onnx_hybrid {

// A tensor shape held inline: every Compute call reads a dozen shapes and builds a few, and on a GPU EP the
// host time of that call is the node's whole cost, so shapes never touch the heap. The contract's tensors
// have rank 4 at most; Inputs rejects a deeper one by name before it would overflow.
class Shape {
 public:
  static constexpr size_t kMaxRank = 8;

  Shape() = default;
  Shape(std::initializer_list<int64_t> dims) : Shape(dims.begin(), dims.end()) {}
  Shape(const int64_t* begin, const int64_t* end) {
    for (; begin != end; ++begin) push_back(*begin);
  }

  void push_back(int64_t dim) {
    if (size_ == kMaxRank) throw std::length_error("onnx_hybrid: a shape of rank above 8");
    dims_[size_++] = dim;
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  int64_t operator[](size_t i) const { return dims_[i]; }
  int64_t back() const { return dims_[size_ - 1]; }
  const int64_t* data() const { return dims_; }
  int64_t* data() { return dims_; }
  const int64_t* begin() const { return dims_; }
  const int64_t* end() const { return dims_ + size_; }
  // Sets the rank; the first `rank` dims are then written through data().
  void resize(size_t rank) {
    if (rank > kMaxRank) throw std::length_error("onnx_hybrid: a shape of rank above 8");
    size_ = rank;
  }

  friend bool operator==(const Shape& a, const Shape& b) { return std::equal(a.begin(), a.end(), b.begin(), b.end()); }
  friend bool operator!=(const Shape& a, const Shape& b) { return !(a == b); }

 private:
  int64_t dims_[kMaxRank] = {};
  size_t size_ = 0;
};

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

// The name of a message template in contract.MESSAGES ("" for a template that is not one of them).
const char* MessageKeyOf(const char* templ);

// An input that violates the operator contract. Kernels turn it into an ORT status; the C entry points report
// its message and key (contract.ContractError's).
class ContractError : public std::runtime_error {
 public:
  ContractError(const char* op, const char* templ, std::vector<MessageArg> args = {})
      : std::runtime_error(FormatMessage(op, templ, args)), key_(MessageKeyOf(templ)) {}
  const char* key() const { return key_; }

 private:
  const char* key_;
};

inline const char* Presence(const void* p) { return p ? "present" : "absent"; }

// Float attributes must be finite (contract._check_attribute); the message lacks the op name, which the
// caller's ToStatus puts in front.
void RequireFinite(const char* attribute, float value);

// Element types of the activation tensor T (the codes of ort/c_api.h's elem_type).
enum class ElemType { kFloat, kFloat16, kBFloat16 };
constexpr int kOtherElemType = -1;  // an input of another element type (int32, double, ...)

// The input shapes of one call by input index; present[i] false means input i is absent. elem[i]: input i's
// element type (an ElemType, or kOtherElemType), which only the ports of more than one allowed type need.
template <int N>
struct InputShapes {
  Shape shape[N];
  bool present[N] = {};
  int elem[N] = {};
};

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
