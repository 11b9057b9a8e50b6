// AVX2 + FMA variant of the CPU building blocks (x86-64 CPUs without AVX-512). Compiled for AVX2 by
// the pragma below and entered only after the CPU reported avx2 and fma.
#include <cfloat>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cpu/cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx2,fma")

namespace onnx_hybrid {
namespace avx2 {

struct Vec {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kRegisters = 16;
  static constexpr int kMaxRows = 6;  // 6 x 2 accumulators + 2 B vectors + 1 broadcast of 16 registers
  static Reg Zero() { return _mm256_setzero_ps(); }
  static Reg Set1(float x) { return _mm256_set1_ps(x); }
  static Reg Load(const float* p) { return _mm256_loadu_ps(p); }
  static void Store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static __m256i Mask(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(n)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Reg LoadPartial(const float* p, int64_t n) { return _mm256_maskload_ps(p, Mask(n)); }
  static void StorePartial(float* p, Reg v, int64_t n) { _mm256_maskstore_ps(p, Mask(n), v); }
  static Reg Add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg Sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg Mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg Fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg Abs(Reg a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static Reg Max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg MinAbs(Reg a, Reg b) { return _mm256_min_ps(Abs(a), b); }
  static unsigned BelowMask(Reg a, Reg b) { return unsigned(_mm256_movemask_ps(_mm256_cmp_ps(a, b, _CMP_NGE_UQ))); }
  static float Sum(Reg v) {
    const __m128 half = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
    return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
  }
  static Reg Min(Reg a, Reg b) { return _mm256_min_ps(a, b); }
  static Reg Div(Reg a, Reg b) { return _mm256_div_ps(a, b); }
  static Reg Round(Reg a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Reg Times2ToThe(Reg a, Reg n) {  // a * 2^n for integral n in [-126, 127]: n + 127 as the exponent field
    const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(a, _mm256_castsi256_ps(bits));
  }
};

#include "cpu/cpu_kernels_simd.inc"
#include "cpu/int8_dots_avx2.inc"

const CpuKernels kKernels = {"avx2", Gemm, RecurrentRows, SumSquares, Dot, Dots, Scale, DeltaRhs, MulAdd, Silu,
                             Int8Dots, Int8Quantize};

}  // namespace avx2
}  // namespace onnx_hybrid

#pragma GCC pop_options

namespace onnx_hybrid {
const CpuKernels* Avx2Kernels() {
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") ? &avx2::kKernels : nullptr;
}
}  // namespace onnx_hybrid

#else
namespace onnx_hybrid {
const CpuKernels* Avx2Kernels() { return nullptr; }
}  // namespace onnx_hybrid
#endif
