// fp32 building blocks of the CPU engines, selected once at load time for the host's instruction set
// (AVX-512, else AVX2 + FMA, else portable C++). Every variant obeys the same rounding rule for
// the recurrent state update (docs/op-contract.md#state-update-rounding: S' = fl(S*a), p = fl(k*u),
// S = fl(S'+p), no FMA);
// FMA is used only in dot products and matrix products, whose rounding the contract leaves free.
#pragma once

#include <cstdint>

namespace onnx_hybrid {

// The stored state follows the update rule in IEEE fp32 with gradual underflow (replays compute it so),
// also while the thread flushes subnormals (float_mode.h). The engines update with flushing, then recompute
// with ExactStateStep every element whose result is below kExactStateAbove or whose decay exceeds 1. Why
// the rest is exact: a decay <= 1 and the flush change fl(S*a) and fl(k*u) by at most FLT_MIN each, and
// only when that operand underflowed (or S was subnormal); a flushed sum of at least 2^-100 is then the
// other operand, whose half ulp (>= 2^-124) absorbs the IEEE operand just as well. Decays are never
// subnormal (gdn_cpu.cc flushes them), keys and deltas come from flushed arithmetic. The recurrence's
// dot products (delta and output) read the flushed values: their rounding is the kernels' choice.
constexpr float kExactStateAbove = 0x1p-100f;
// fl(fl(s * a) + fl(k * u)) in IEEE fp32 with gradual underflow, whatever the thread's MXCSR.
float ExactStateStep(float s, float a, float k, float u);
// after[j] = ExactStateStep(before[j], a_j, key[j], u) for each j < n with |after[j]| < kExactStateAbove or
// a_j > 1, where a_j = alpha[j] (per_key) or alpha[0]; `before` is the row's state before the token.
void RepairStateRow(const float* before, float* after, int64_t n, const float* alpha, bool per_key, const float* key,
                    float u);

// `rows` state rows c, c + 1, ... (Dk floats each) of one value head, advanced over n tokens by the sequential
// engine. Row i reads state_in + i * state_in_row_stride (0: one row, e.g. zeros, for all) and writes
// state_out + i * Dk, value + i, out + i and delta + i; every row's arithmetic is that of the row alone.
struct RecurrentRowArgs {
  const float* state_in;  // row i at state_in + i * state_in_row_stride; may equal state_out (read before written)
  float* state_out;       // [rows, Dk]
  int64_t rows, state_in_row_stride;
  int64_t n, dk;
  const float* keys;      // [n, Dk], after the L2 norm
  const float* queries;   // [n, Dk], after the L2 norm
  const float* alpha;     // multiplicative decay: [n] (scalar per token) or [n, Dk] (per key)
  bool per_key_alpha;
  const float* beta;      // [n] after the activation; null for rules without delta retrieval
  const float* value;     // value[t * value_stride] is v_c of token t
  int64_t value_stride;
  float scale;
  float* out;             // out[t * out_stride] = o_c of token t (scaled)
  float* delta;           // delta[t * out_stride] = u_c of token t
  int64_t out_stride;
};

// Row i of a RecurrentRowArgs as a call of its own (rows = 1).
inline RecurrentRowArgs RecurrentRowOf(const RecurrentRowArgs& r, int64_t i) {
  RecurrentRowArgs one = r;
  one.rows = 1;
  one.state_in = r.state_in + i * r.state_in_row_stride;
  one.state_out = r.state_out + i * r.dk;
  one.value = r.value + i;
  one.out = r.out + i;
  one.delta = r.delta + i;
  return one;
}

// QuantizedLinear's int8 products (accuracy level 4, docs/op-contract.md#quantizedlinear): input rows quantized
// per chunk of kInt8Chunk elements, 4-bit codes packed per group of kInt8GroupRows weight rows (cpu/qlinear_int8.h).
// out[r * ldo + 8 * g + i] = sum over chunks c of fl(float(isum - zero * q_sum) * fl(q_scale * w_scale)), summed
// in chunk order with FMA, where isum is the chunk's exact integer sum of code * q: every variant gives the same bits.
constexpr int64_t kInt8Chunk = 32;
constexpr int64_t kInt8GroupRows = 8;
constexpr int64_t kInt8ChunkBytes = kInt8Chunk * kInt8GroupRows / 2;  // one group's codes for one chunk
struct Int8DotsArgs {
  const int8_t* q;         // [rows, chunks * kInt8Chunk]
  const float* q_scale;    // [rows, chunks]
  const int32_t* q_sum;    // [rows, chunks]: each chunk's sum of q
  int64_t rows, chunks;
  const uint8_t* codes;    // [groups, chunks, kInt8ChunkBytes]: in each 32 bytes, byte 4i + t holds element t of
                           // 4-element step 2j of row i (low nibble) and of step 2j + 1 (high nibble), j < 4
  const float* w_scale;    // [groups, blocks, kInt8GroupRows]
  const int32_t* w_zero;   // [groups, blocks, kInt8GroupRows]; null: every zero point is 8
  int64_t groups, chunks_per_block;
  int64_t columns;         // live output columns (the last group may be partial)
  float* out;
  int64_t ldo;
};

// One chunk of an input row as QuantizedLinear's int8 products take it (docs/op-contract.md#quantizedlinear): the
// n <= kInt8Chunk elements of x, the rest of the chunk's kInt8Chunk codes zero; m the largest magnitude, scale
// fl(m / 127) and codes rint(x * fl(127 / m)); a chunk with m below kInt8TinyChunk is zeros (scale 0), one with a
// NaN or infinity gets scale NaN and zero codes. Returns the codes' sum. Every variant's chunks equal this one's.
constexpr float kInt8TinyChunk = 0x1p-100f;
int32_t QuantizeInt8Chunk(const float* x, int64_t n, int8_t* q, float* scale);

struct CpuKernels {
  const char* name;
  // C[M,N] = A[M,K] B[K,N] (or C += A B when accumulate), row-major with leading dimensions.
  void (*gemm)(int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
               float* c, int64_t ldc, bool accumulate);
  void (*recurrent_rows)(const RecurrentRowArgs& args);
  float (*sum_squares)(const float* x, int64_t n);
  float (*dot)(const float* x, const float* y, int64_t n);
  // out[r * ldo + i] = dot(a + r * lda, b + i * ldb, n) for r < m, i < k, every element bit-identical to
  // dot()'s (register tiles share the loads, not the arithmetic).
  void (*dots)(int64_t m, int64_t k, int64_t n, const float* a, int64_t lda, const float* b, int64_t ldb, float* out,
               int64_t ldo);
  // y = x * s (elementwise; y may equal x). With s = 1 an exact copy.
  void (*scale)(const float* x, float s, float* y, int64_t n);
  // out = b * (v - e * w), each operation rounded in that order.
  void (*delta_rhs)(const float* v, const float* w, float e, float b, float* out, int64_t n);
  // acc += a * b elementwise, the product rounded, then the sum (no FMA).
  void (*mul_add)(const float* a, const float* b, float* acc, int64_t n);
  // x = x * sigmoid(x) = x / (1 + e^-x) in place; each element's result depends on its value alone.
  void (*silu)(float* x, int64_t n);
  void (*int8_dots)(const Int8DotsArgs& args);
  // An input row of n elements as `chunks` chunks of QuantizeInt8Chunk (chunks * kInt8Chunk >= n).
  void (*int8_quantize)(const float* x, int64_t n, int64_t chunks, int8_t* q, float* scale, int32_t* sum);
};

const CpuKernels& GenericKernels();
// Null when the CPU (or the build) has no AVX-512; with `vnni`, the VNNI int8 products where the CPU has them.
const CpuKernels* Avx512Kernels(bool vnni);
const CpuKernels* Avx2Kernels();    // null when the CPU (or the build) has no AVX2 + FMA
// The variant this process uses: the widest the CPU supports, or the one ONNX_HYBRID_CPU_ISA names
// ("avx512" without VNNI, "avx2" or "generic") when the CPU supports it.
const CpuKernels& Kernels();

}  // namespace onnx_hybrid
