// Portable variant of the CPU building blocks, and the run-time selection.
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu_kernels.h"

namespace onnx_hybrid {
namespace {

void Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  for (int64_t i = 0; i < m; ++i) {
    float* ci = c + i * ldc;
    if (!accumulate) std::memset(ci, 0, sizeof(float) * n);
    for (int64_t p = 0; p < k; ++p) {
      const float aip = a[i * lda + p];
      const float* bp = b + p * ldb;
      for (int64_t j = 0; j < n; ++j) ci[j] += aip * bp[j];
    }
  }
}

void RecurrentRow(const RecurrentRowArgs& r) {
  const int64_t dk = r.dk;
  float* s = r.state_out;
  if (s != r.state_in) std::memcpy(s, r.state_in, sizeof(float) * dk);
  for (int64_t t = 0; t < r.n; ++t) {
    const float* k = r.keys + t * dk;
    const float* q = r.queries + t * dk;
    const float* per_key = r.per_key_alpha ? r.alpha + t * dk : nullptr;  // else r.alpha[t] for every key
    float retrieved = 0.0f;
    for (int64_t j = 0; j < dk; ++j) {
      s[j] = s[j] * (per_key ? per_key[j] : r.alpha[t]);
      retrieved += s[j] * k[j];
    }
    const float v = r.value[t * r.value_stride];
    const float u = r.beta ? r.beta[t] * (v - retrieved) : v;
    float o = 0.0f;
    for (int64_t j = 0; j < dk; ++j) {
      const float p = k[j] * u;
      s[j] = s[j] + p;
      o += s[j] * q[j];
    }
    r.out[t * r.out_stride] = o * r.scale;
    r.delta[t * r.out_stride] = u;
  }
}

float SumSquares(const float* x, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * x[i];
  return acc;
}

float Dot(const float* x, const float* y, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += x[i] * y[i];
  return acc;
}

void Dots(int64_t m, int64_t k, int64_t n, const float* a, int64_t lda, const float* b, int64_t ldb, float* out,
          int64_t ldo) {
  for (int64_t r = 0; r < m; ++r)
    for (int64_t i = 0; i < k; ++i) out[r * ldo + i] = Dot(a + r * lda, b + i * ldb, n);
}

void Scale(const float* x, float s, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * s;
}

void DeltaRhs(const float* v, const float* w, float e, float b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = b * (v[i] - e * w[i]);
}

const CpuKernels kGeneric = {"generic", Gemm, RecurrentRow, SumSquares, Dot, Dots, Scale, DeltaRhs};

const CpuKernels& Select() {
  const char* forced = std::getenv("ONNX_HYBRID_CPU_ISA");
  const std::string cap = forced ? forced : "";
  if (cap == "generic") return kGeneric;
  if (cap != "avx2")
    if (const CpuKernels* k = Avx512Kernels()) return *k;
  if (const CpuKernels* k = Avx2Kernels()) return *k;
  return kGeneric;
}

}  // namespace

const CpuKernels& GenericKernels() { return kGeneric; }

const CpuKernels& Kernels() {
  static const CpuKernels& selected = Select();
  return selected;
}

}  // namespace onnx_hybrid
