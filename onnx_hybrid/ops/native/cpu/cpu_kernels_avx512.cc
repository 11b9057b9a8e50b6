// AVX-512 variant of the CPU building blocks. Only this file is compiled for AVX-512 (by the pragmas
// below), and it is entered only after the CPU reported avx512f and avx512dq; its int8 products use VNNI where the
// CPU also reports avx512vnni, avx512vl and avx512bw. It includes no standard library headers after the pragmas, so
// no inline library code is emitted with AVX-512 instructions.
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,fma")
// GCC 12's _mm512_reduce_add_ps reads a deliberately undefined register half and warns about it.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace onnx_hybrid {
namespace avx512 {

struct Vec {
  using Reg = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kRegisters = 32;
  static constexpr int kMaxRows = 8;  // 8 x 2 accumulators + 2 B vectors + 1 broadcast
  static Reg Zero() { return _mm512_setzero_ps(); }
  static Reg Set1(float x) { return _mm512_set1_ps(x); }
  static Reg Load(const float* p) { return _mm512_loadu_ps(p); }
  static void Store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static __mmask16 Mask(int64_t n) { return __mmask16((1u << n) - 1); }
  static Reg LoadPartial(const float* p, int64_t n) { return _mm512_maskz_loadu_ps(Mask(n), p); }
  static void StorePartial(float* p, Reg v, int64_t n) { _mm512_mask_storeu_ps(p, Mask(n), v); }
  static Reg Add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg Sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg Mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg Abs(Reg a) { return _mm512_abs_ps(a); }
  static Reg Max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg MinAbs(Reg a, Reg b) { return _mm512_range_ps(a, b, 0x0a); }  // min magnitude, sign cleared: one op
  static unsigned BelowMask(Reg a, Reg b) { return _mm512_cmp_ps_mask(a, b, _CMP_NGE_UQ); }
  static float Sum(Reg v) { return _mm512_reduce_add_ps(v); }
  static Reg Min(Reg a, Reg b) { return _mm512_min_ps(a, b); }
  static Reg Div(Reg a, Reg b) { return _mm512_div_ps(a, b); }
  static Reg Round(Reg a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Reg Times2ToThe(Reg a, Reg n) { return _mm512_scalef_ps(a, n); }  // a * 2^n, n integral
};

#include "cpu/cpu_kernels_simd.inc"
#include "cpu/int8_dots_avx2.inc"

const CpuKernels kKernels = {"avx512", Gemm, RecurrentRows, SumSquares, Dot, Dots, Scale, DeltaRhs, MulAdd, Silu,
                             Int8Dots, Int8Quantize};

}  // namespace avx512
}  // namespace onnx_hybrid

#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx512f,avx512dq,avx512vl,avx512bw,avx512vnni,fma")

namespace onnx_hybrid {
namespace avx512_vnni {

#include "cpu/int8_dots.inc"

// vpdpbusd adds 4 code-times-input byte products into each int32 lane at once (EVEX on 256 bits, so the packing
// and the tiles stay those of AVX2; 32 registers hold tiles of 8 rows).
struct Dpbusd {
  using Sum = __m256i;
  static Sum Zero() { return _mm256_setzero_si256(); }
  static Sum Add(Sum sum, __m256i codes, __m256i inputs) { return _mm256_dpbusd_epi32(sum, codes, inputs); }
  static __m256i Widen(Sum sum) { return sum; }
};

void Int8Dots(const Int8DotsArgs& a) { Int8DotsWith<Dpbusd, 8>(a); }

}  // namespace avx512_vnni
}  // namespace onnx_hybrid

#pragma GCC pop_options

namespace onnx_hybrid {
namespace avx512 {
const CpuKernels kVnniKernels = {"avx512-vnni", Gemm, RecurrentRows, SumSquares, Dot, Dots, Scale, DeltaRhs, MulAdd,
                                 Silu, avx512_vnni::Int8Dots, Int8Quantize};
}  // namespace avx512

const CpuKernels* Avx512Kernels(bool vnni) {
  if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512dq")) return nullptr;
  const bool has_vnni = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl") &&
                        __builtin_cpu_supports("avx512bw");
  return vnni && has_vnni ? &avx512::kVnniKernels : &avx512::kKernels;
}
}  // namespace onnx_hybrid

#else
namespace onnx_hybrid {
const CpuKernels* Avx512Kernels(bool) { return nullptr; }
}  // namespace onnx_hybrid
#endif
