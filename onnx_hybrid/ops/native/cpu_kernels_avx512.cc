// AVX-512 variant of the CPU building blocks. Only this file is compiled for AVX-512 (by the pragma
// below), and it is entered only after the CPU reported avx512f. It includes no standard library
// headers after the pragma, so no inline library code is emitted with AVX-512 instructions.
#include <cstdint>
#include <cstring>

#include "cpu_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>

#pragma GCC push_options
#pragma GCC target("avx512f,fma")
// GCC 12's _mm512_reduce_add_ps reads a deliberately undefined register half and warns about it.
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace onnx_hybrid {
namespace {

constexpr int kRowsPerTile = 8;  // 8 rows x 32 columns: 16 accumulators of the 32 zmm registers

__mmask16 TailMask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : remaining <= 0 ? __mmask16(0) : __mmask16((1u << remaining) - 1);
}

template <int MR>
void GemmTile(int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc,
              __mmask16 m0, __mmask16 m1, bool accumulate) {
  __m512 c0[MR], c1[MR];
  for (int i = 0; i < MR; ++i) {
    c0[i] = accumulate ? _mm512_maskz_loadu_ps(m0, c + i * ldc) : _mm512_setzero_ps();
    c1[i] = accumulate ? _mm512_maskz_loadu_ps(m1, c + i * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    const __m512 b0 = _mm512_maskz_loadu_ps(m0, b + p * ldb);
    const __m512 b1 = _mm512_maskz_loadu_ps(m1, b + p * ldb + 16);
    for (int i = 0; i < MR; ++i) {
      const __m512 ai = _mm512_set1_ps(a[i * lda + p]);
      c0[i] = _mm512_fmadd_ps(ai, b0, c0[i]);
      c1[i] = _mm512_fmadd_ps(ai, b1, c1[i]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    _mm512_mask_storeu_ps(c + i * ldc, m0, c0[i]);
    _mm512_mask_storeu_ps(c + i * ldc + 16, m1, c1[i]);
  }
}

using TileFn = void (*)(int64_t, const float*, int64_t, const float*, int64_t, float*, int64_t, __mmask16, __mmask16,
                        bool);
constexpr TileFn kTiles[kRowsPerTile + 1] = {nullptr,      GemmTile<1>, GemmTile<2>, GemmTile<3>, GemmTile<4>,
                                             GemmTile<5>, GemmTile<6>, GemmTile<7>, GemmTile<8>};

void Gemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb, float* c,
          int64_t ldc, bool accumulate) {
  for (int64_t j = 0; j < n; j += 32) {
    const __mmask16 m0 = TailMask(n - j), m1 = TailMask(n - j - 16);
    for (int64_t i = 0; i < m; i += kRowsPerTile) {
      const int64_t mr = m - i < kRowsPerTile ? m - i : kRowsPerTile;
      kTiles[mr](k, a + i * lda, lda, b + j, ldb, c + i * ldc + j, ldc, m0, m1, accumulate);
    }
  }
}

// Sequential engine for Dk = 16 * NV: the state row lives in NV registers across all tokens.
template <int NV>
void RecurrentRowRegisters(const RecurrentRowArgs& r) {
  __m512 s[NV];
  for (int v = 0; v < NV; ++v) s[v] = _mm512_loadu_ps(r.state_in + 16 * v);
  for (int64_t t = 0; t < r.n; ++t) {
    const float* k = r.keys + t * r.dk;
    const float* q = r.queries + t * r.dk;
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      const __m512 a = r.per_key_alpha ? _mm512_loadu_ps(r.alpha + t * r.dk + 16 * v) : _mm512_set1_ps(r.alpha[t]);
      s[v] = _mm512_mul_ps(s[v], a);  // S' = fl(S * alpha)
      if (v & 1)
        acc1 = _mm512_fmadd_ps(s[v], _mm512_loadu_ps(k + 16 * v), acc1);
      else
        acc0 = _mm512_fmadd_ps(s[v], _mm512_loadu_ps(k + 16 * v), acc0);
    }
    const float v_c = r.value[t * r.value_stride];
    const float u = r.beta ? r.beta[t] * (v_c - _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1))) : v_c;
    const __m512 uu = _mm512_set1_ps(u);
    acc0 = _mm512_setzero_ps();
    acc1 = _mm512_setzero_ps();
    for (int v = 0; v < NV; ++v) {
      const __m512 p = _mm512_mul_ps(_mm512_loadu_ps(k + 16 * v), uu);  // p = fl(k * u)
      s[v] = _mm512_add_ps(s[v], p);                                     // S = fl(S' + p)
      if (v & 1)
        acc1 = _mm512_fmadd_ps(s[v], _mm512_loadu_ps(q + 16 * v), acc1);
      else
        acc0 = _mm512_fmadd_ps(s[v], _mm512_loadu_ps(q + 16 * v), acc0);
    }
    r.out[t * r.out_stride] = _mm512_reduce_add_ps(_mm512_add_ps(acc0, acc1)) * r.scale;
    r.delta[t * r.out_stride] = u;
  }
  for (int v = 0; v < NV; ++v) _mm512_storeu_ps(r.state_out + 16 * v, s[v]);
}

// Any Dk: the row stays in the output buffer (L1), the last vector masked.
void RecurrentRowAny(const RecurrentRowArgs& r) {
  const int64_t dk = r.dk;
  float* s = r.state_out;
  if (s != r.state_in) std::memmove(s, r.state_in, sizeof(float) * dk);
  for (int64_t t = 0; t < r.n; ++t) {
    const float* k = r.keys + t * dk;
    const float* q = r.queries + t * dk;
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < dk; j += 16) {
      const __mmask16 m = TailMask(dk - j);
      const __m512 a = r.per_key_alpha ? _mm512_maskz_loadu_ps(m, r.alpha + t * dk + j) : _mm512_set1_ps(r.alpha[t]);
      const __m512 sj = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), a);
      _mm512_mask_storeu_ps(s + j, m, sj);
      acc = _mm512_fmadd_ps(sj, _mm512_maskz_loadu_ps(m, k + j), acc);
    }
    const float v_c = r.value[t * r.value_stride];
    const float u = r.beta ? r.beta[t] * (v_c - _mm512_reduce_add_ps(acc)) : v_c;
    const __m512 uu = _mm512_set1_ps(u);
    acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < dk; j += 16) {
      const __mmask16 m = TailMask(dk - j);
      const __m512 p = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, k + j), uu);
      const __m512 sj = _mm512_add_ps(_mm512_maskz_loadu_ps(m, s + j), p);
      _mm512_mask_storeu_ps(s + j, m, sj);
      acc = _mm512_fmadd_ps(sj, _mm512_maskz_loadu_ps(m, q + j), acc);
    }
    r.out[t * r.out_stride] = _mm512_reduce_add_ps(acc) * r.scale;
    r.delta[t * r.out_stride] = u;
  }
}

void RecurrentRow(const RecurrentRowArgs& r) {
  switch (r.dk) {
    case 64: return RecurrentRowRegisters<4>(r);
    case 128: return RecurrentRowRegisters<8>(r);
    default: return RecurrentRowAny(r);
  }
}

float SumSquares(const float* x, int64_t n) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __m512 v = _mm512_maskz_loadu_ps(TailMask(n - j), x + j);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  return _mm512_reduce_add_ps(acc);
}

void Scale(const float* x, float s, float* y, int64_t n) {
  const __m512 ss = _mm512_set1_ps(s);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = TailMask(n - j);
    _mm512_mask_storeu_ps(y + j, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + j), ss));
  }
}

void DeltaRhs(const float* v, const float* w, float e, float b, float* out, int64_t n) {
  const __m512 ee = _mm512_set1_ps(e), bb = _mm512_set1_ps(b);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = TailMask(n - j);
    const __m512 ew = _mm512_mul_ps(ee, _mm512_maskz_loadu_ps(m, w + j));
    _mm512_mask_storeu_ps(out + j, m, _mm512_mul_ps(bb, _mm512_sub_ps(_mm512_maskz_loadu_ps(m, v + j), ew)));
  }
}

const CpuKernels kAvx512 = {"avx512", Gemm, RecurrentRow, SumSquares, Scale, DeltaRhs};

}  // namespace
}  // namespace onnx_hybrid

#pragma GCC pop_options

namespace onnx_hybrid {
const CpuKernels* Avx512Kernels() { return __builtin_cpu_supports("avx512f") ? &kAvx512 : nullptr; }
}  // namespace onnx_hybrid

#else
namespace onnx_hybrid {
const CpuKernels* Avx512Kernels() { return nullptr; }
}  // namespace onnx_hybrid
#endif
