// Portable variant of the CPU building blocks, the exact state step, and the run-time selection.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cpu/cpu_kernels.h"

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
    const float* alpha = r.per_key_alpha ? r.alpha + t * dk : r.alpha + t;
    float retrieved = 0.0f;
    for (int64_t j = 0; j < dk; ++j) retrieved += s[j] * alpha[r.per_key_alpha ? j : 0] * k[j];
    const float v = r.value[t * r.value_stride];
    const float u = r.beta ? r.beta[t] * (v - retrieved) : v;
    float o = 0.0f;
    for (int64_t j = 0; j < dk; ++j) {
      const float a = alpha[r.per_key_alpha ? j : 0];
      const float p = k[j] * u;
      float next = s[j] * a + p;  // fl(fl(S * a) + fl(k * u)): no contraction in this library
      if (std::fabs(next) < kExactStateAbove || a > 1.0f) next = ExactStateStep(s[j], a, k[j], u);
      s[j] = next;
      o += next * q[j];
    }
    r.out[t * r.out_stride] = o * r.scale;
    r.delta[t * r.out_stride] = u;
  }
}

void RecurrentRows(const RecurrentRowArgs& r) {
  for (int64_t i = 0; i < r.rows; ++i) RecurrentRow(RecurrentRowOf(r, i));
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

void MulAdd(const float* a, const float* b, float* acc, int64_t n) {
  for (int64_t j = 0; j < n; ++j) acc[j] += a[j] * b[j];
}

void Silu(float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) x[j] = x[j] / (1.0f + std::exp(-x[j]));
}

void Int8Dots(const Int8DotsArgs& a) {
  const int64_t blocks = a.chunks / a.chunks_per_block;
  for (int64_t r = 0; r < a.rows; ++r) {
    const int8_t* q = a.q + r * a.chunks * kInt8Chunk;
    for (int64_t col = 0; col < a.columns; ++col) {
      const int64_t g = col / kInt8GroupRows, i = col % kInt8GroupRows;
      float acc = 0.0f;
      for (int64_t c = 0; c < a.chunks; ++c) {
        const uint8_t* codes = a.codes + (g * a.chunks + c) * kInt8ChunkBytes;
        int32_t sum = 0;
        for (int64_t e = 0; e < kInt8Chunk; ++e) {  // element e: step e / 4, in byte 32 (e / 8) + 4 i + e % 4
          const uint8_t byte = codes[32 * (e / 8) + 4 * i + e % 4];
          sum += ((e / 4) % 2 ? byte >> 4 : byte & 15) * q[c * kInt8Chunk + e];
        }
        const int64_t at = (g * blocks + c / a.chunks_per_block) * kInt8GroupRows + i, qc = r * a.chunks + c;
        const float scale = a.q_scale[qc] * a.w_scale[at];
        const int32_t zero = a.w_zero ? a.w_zero[at] : 8;
        acc = std::fma(static_cast<float>(sum - zero * a.q_sum[qc]), scale, acc);
      }
      a.out[r * a.ldo + col] = acc;
    }
  }
}

void Int8Quantize(const float* x, int64_t n, int64_t chunks, int8_t* q, float* scale, int32_t* sum) {
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t k0 = c * kInt8Chunk, live = n - k0 < kInt8Chunk ? (n > k0 ? n - k0 : 0) : kInt8Chunk;
    sum[c] = QuantizeInt8Chunk(x + k0, live, q + k0, scale + c);
  }
}

const CpuKernels kGeneric = {"generic", Gemm, RecurrentRows, SumSquares, Dot, Dots, Scale, DeltaRhs, MulAdd, Silu,
                             Int8Dots, Int8Quantize};

const CpuKernels& Select() {
  const char* forced = std::getenv("ONNX_HYBRID_CPU_ISA");
  const std::string cap = forced ? forced : "";
  if (cap == "generic") return kGeneric;
  if (cap != "avx2")
    if (const CpuKernels* k = Avx512Kernels(/*vnni=*/cap != "avx512")) return *k;
  if (const CpuKernels* k = Avx2Kernels()) return *k;
  return kGeneric;
}

// A float as a double, subnormals included: DAZ would read a subnormal as zero, its integer significand does not.
double WidenExact(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude == 0 || magnitude >= 0x00800000u) return x;
  const double value = static_cast<double>(magnitude) * 0x1p-149;
  return bits >> 31 ? -value : value;
}

// r rounded once to fp32 (to nearest even), subnormal results included. Results below FLT_MIN are rounded
// as integers in units of 2^-149, whose bit pattern is the subnormal's (2^23 units is FLT_MIN itself).
float NarrowExact(double r) {
  const double magnitude = std::fabs(r);
  if (!(magnitude < 0x1p-126)) return static_cast<float>(r);  // normal, infinite or NaN
  const uint32_t bits = static_cast<uint32_t>(std::nearbyint(magnitude * 0x1p149)) | (std::signbit(r) ? 0x80000000u : 0u);
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}

}  // namespace

// Products of two floats are exact in double; a double sum rounded again to fp32 is rounded correctly
// (53 >= 2 * 24 + 2), and a sum that lands below FLT_MIN is exact. No fp32 subnormal enters the FPU.
float ExactStateStep(float s, float a, float k, float u) {
  const float decayed = NarrowExact(WidenExact(s) * WidenExact(a));
  const float product = NarrowExact(WidenExact(k) * WidenExact(u));
  return NarrowExact(WidenExact(decayed) + WidenExact(product));
}

void RepairStateRow(const float* before, float* after, int64_t n, const float* alpha, bool per_key, const float* key,
                    float u) {
  for (int64_t j = 0; j < n; ++j) {
    const float a = alpha[per_key ? j : 0];
    if (std::fabs(after[j]) < kExactStateAbove || a > 1.0f) after[j] = ExactStateStep(before[j], a, key[j], u);
  }
}

int32_t QuantizeInt8Chunk(const float* x, int64_t n, int8_t* q, float* scale) {
  std::memset(q, 0, kInt8Chunk);
  float largest = 0.0f;
  bool finite = true;
  for (int64_t k = 0; k < n; ++k) {
    const float magnitude = std::fabs(x[k]);
    finite = finite && magnitude <= FLT_MAX;
    largest = std::max(largest, magnitude);
  }
  *scale = finite ? 0.0f : NAN;
  if (!finite || largest < kInt8TinyChunk) return 0;
  *scale = largest / 127.0f;
  const float inverse = 127.0f / largest;
  int32_t total = 0;
  for (int64_t k = 0; k < n; ++k) {  // |x * inverse| <= 127 (1 + 2^-23): never past 127 after rounding
    q[k] = static_cast<int8_t>(std::nearbyint(x[k] * inverse));
    total += q[k];
  }
  return total;
}

const CpuKernels& GenericKernels() { return kGeneric; }

const CpuKernels& Kernels() {
  static const CpuKernels& selected = Select();
  return selected;
}

}  // namespace onnx_hybrid
