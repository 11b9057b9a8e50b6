#include "cpu/gdn_cpu.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "cpu/cpu_kernels.h"

namespace onnx_hybrid {
namespace {

std::atomic<EngineChoice> g_engine_choice{EngineChoice::kAuto};

constexpr int64_t kSequentialBlock = 64;  // tokens staged at a time by the sequential engine
constexpr int64_t kSolveBlock = 16;       // rows substituted directly inside the chunk's triangular solve

// Uninitialised work memory of one work item.
std::unique_ptr<float[]> Scratch(size_t floats) { return std::unique_ptr<float[]>(new float[floats]); }

struct WorkItem {
  const GdnGeometry& geo;
  const GdnAttributes& attrs;
  const GdnTensors& t;
  const CpuKernels& kern;
  float scale;
  int64_t b, hv, hk, start, n;
  int64_t captured;  // m_b: capsule slots this row writes

  // Query/key head of token tok, widened to fp32 and L2-normalised when asked. One function for
  // every engine and every value head, so heads sharing a key head see bit-identical keys.
  void LoadQk(const void* src, int64_t stride, int64_t offset, int64_t tok, float* dst) const {
    const int64_t dk = geo.head_size_k, at = tok * stride + offset + hk * dk;
    const float* x = dst;
    if (t.type == ElemType::kFloat)
      x = static_cast<const float*>(src) + at;
    else
      LoadAsFloat(t.type, src, at, dk, dst);
    const float inv = attrs.qk_l2_norm ? 1.0f / std::sqrt(kern.sum_squares(x, dk) + contract::kL2NormEps) : 1.0f;
    kern.scale(x, inv, dst, dk);
  }
  void LoadV(int64_t tok, float* dst) const {
    const int64_t dv = geo.head_size_v, at = tok * t.qkv.v_token_stride + t.qkv.v_offset + hv * dv;
    if (t.type == ElemType::kFloat)
      kern.scale(static_cast<const float*>(t.value) + at, 1.0f, dst, dv);
    else
      LoadAsFloat(t.type, t.value, at, dv, dst);
  }

  // Log-space gate g of token tok (column r for per-key decay).
  float LogGate(int64_t tok, int64_t r) const {
    const int64_t hvs = geo.num_heads_v;
    const float x = geo.per_key_decay ? t.decay[(tok * hvs + hv) * geo.head_size_k + r] : t.decay[tok * hvs + hv];
    if (!attrs.qwen_gate) return x;
    const float z = x + t.dt_bias[hv];
    const float softplus = z > contract::kSoftplusThreshold ? z : std::log1p(std::exp(z));
    return -std::exp(t.a_log[hv]) * softplus;
  }
  // Multiplicative decay of the sequential engine and the capsule: never subnormal (an underflowing gate
  // decays to exactly 0), which the exact state update relies on (cpu_kernels.h, kExactStateAbove).
  float Decay(int64_t tok, int64_t r) const {
    const float a = std::exp(LogGate(tok, r));
    return a < std::numeric_limits<float>::min() ? 0.0f : a;
  }
  float Beta(int64_t tok) const {
    const float x = t.beta[tok * geo.num_heads_v + hv];
    return attrs.sigmoid_beta ? 1.0f / (1.0f + std::exp(-x)) : x;
  }

  const float* InitialState() const {
    return t.initial_state ? t.initial_state + (b * geo.num_heads_v + hv) * geo.head_size_v * geo.head_size_k
                           : nullptr;
  }
  float* FinalState() const {
    return t.final_state ? t.final_state + (b * geo.num_heads_v + hv) * geo.head_size_v * geo.head_size_k : nullptr;
  }
  // Output row of token tok, multiplied by `factor` on the way (o is scratch and may be modified).
  void StoreOutput(int64_t tok, float* o, float factor) const {
    const int64_t dv = geo.head_size_v, at = (tok * geo.num_heads_v + hv) * dv;
    if (t.type == ElemType::kFloat) return kern.scale(o, factor, static_cast<float*>(t.output) + at, dv);
    if (factor != 1.0f) kern.scale(o, factor, o, dv);
    StoreFromFloat(t.type, o, dv, t.output, at);
  }

  void EmptyRow() const {
    float* fin = FinalState();
    const float* init = InitialState();
    if (!fin || fin == init) return;
    const size_t bytes = sizeof(float) * geo.head_size_v * geo.head_size_k;
    if (init)
      std::memcpy(fin, init, bytes);
    else
      std::memset(fin, 0, bytes);
  }

  void Sequential() const;
  void Chunked(int64_t chunk) const;
};

// The sequential definition token by token. The state row of each value column c advances over a block of tokens in
// registers; the capsule records the first `captured` transitions exactly as they were applied.
void WorkItem::Sequential() const {
  const int64_t dk = geo.head_size_k, dv = geo.head_size_v, hvs = geo.num_heads_v, hks = geo.num_heads_k;
  const int64_t bs = std::min(n, kSequentialBlock);
  const int64_t alpha_width = geo.per_key_decay ? dk : 1;
  auto scratch = Scratch(size_t(2 * bs * dk + bs * dv * 3 + bs * alpha_width + bs + dk + (FinalState() ? 0 : dv * dk)));
  float* keys = scratch.get();
  float* queries = keys + bs * dk;
  float* values = queries + bs * dk;
  float* out = values + bs * dv;
  float* delta = out + bs * dv;
  float* alpha = delta + bs * dv;
  float* beta = alpha + bs * alpha_width;
  float* zeros = beta + bs;
  float* own_state = zeros + dk;
  std::memset(zeros, 0, sizeof(float) * dk);

  const float* init = InitialState();
  float* state = FinalState() ? FinalState() : own_state;
  const int64_t C = geo.capacity;
  float* capsule = t.state_update && captured > 0 ? t.state_update + b * geo.capsule_width : nullptr;
  const bool writes_key = hv % geo.group() == 0;

  for (int64_t t0 = 0; t0 < n; t0 += bs) {
    const int64_t len = std::min(bs, n - t0);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t tok = start + t0 + i;
      LoadQk(t.key, t.qkv.k_token_stride, t.qkv.k_offset, tok, keys + i * dk);
      LoadQk(t.query, t.qkv.q_token_stride, t.qkv.q_offset, tok, queries + i * dk);
      LoadV(tok, values + i * dv);
      for (int64_t r = 0; r < alpha_width; ++r)
        alpha[i * alpha_width + r] = attrs.has_decay ? Decay(tok, r) : 1.0f;
      if (attrs.has_delta) beta[i] = Beta(tok);
    }
    RecurrentRowArgs args{};
    args.n = len;
    args.dk = dk;
    args.keys = keys;
    args.queries = queries;
    args.alpha = alpha;
    args.per_key_alpha = geo.per_key_decay;
    args.beta = attrs.has_delta ? beta : nullptr;
    args.value_stride = dv;
    args.scale = scale;
    args.out_stride = dv;
    args.rows = dv;  // every value column c: state row c
    args.state_in = t0 == 0 ? (init ? init : zeros) : state;
    args.state_in_row_stride = t0 == 0 && !init ? 0 : dk;
    args.state_out = state;
    args.value = values;
    args.out = out;
    args.delta = delta;
    kern.recurrent_rows(args);
    for (int64_t i = 0; i < len; ++i) StoreOutput(start + t0 + i, out + i * dv, 1.0f);
    for (int64_t i = 0; capsule && i < len && t0 + i < captured; ++i) {
      const int64_t slot = t0 + i;
      capsule[slot * hvs + hv] = alpha[i];
      if (writes_key) std::memcpy(capsule + C * hvs + (slot * hks + hk) * dk, keys + i * dk, sizeof(float) * dk);
      std::memcpy(capsule + C * (hvs + hks * dk) + (slot * hvs + hv) * dv, delta + i * dv, sizeof(float) * dv);
    }
  }
}

// The chunked form with chunks of `chunk` tokens, K-major state [Dk, Dv] in scratch, matrix products on the
// GEMM kernel. Only decay ratios e^(γt-γs) <= 1 are formed, never k e^(-γ).
void WorkItem::Chunked(int64_t chunk) const {
  const int64_t dk = geo.head_size_k, dv = geo.head_size_v, bt = chunk;
  const size_t floats = size_t(dk * dv + 2 * bt * dk + bt * dv + dk * bt + 2 * bt * bt + 2 * bt * dv + bt * dv + 3 * bt);
  auto scratch = Scratch(floats);
  float* st = scratch.get();                 // [Dk, Dv]
  float* qk = st + dk * dv;                  // [2L, Dk]: keys then queries
  float* v = qk + 2 * bt * dk;               // [L, Dv]
  float* kt = v + bt * dv;                   // [Dk, BT]: keys transposed
  float* gram = kt + dk * bt;                // [2L, BT]: K K^T then Q K^T
  float* ks = gram + 2 * bt * bt;            // [2L, Dv]: K S0 then Q S0 (becomes the output)
  float* u = ks + 2 * bt * dv;               // [L, Dv]
  float* gamma = u + bt * dv;                // [L] cumulative log decay
  float* egamma = gamma + bt;                // [L] e^γt
  float* betas = egamma + bt;                // [L]

  const float* init = InitialState();
  for (int64_t c = 0; c < dv; ++c)
    for (int64_t r = 0; r < dk; ++r) st[r * dv + c] = init ? init[c * dk + r] : 0.0f;

  for (int64_t t0 = 0; t0 < n; t0 += bt) {
    const int64_t L = std::min(bt, n - t0);
    float* keys = qk;
    float* queries = qk + L * dk;
    float acc = 0.0f;
    for (int64_t i = 0; i < L; ++i) {
      const int64_t tok = start + t0 + i;
      LoadQk(t.key, t.qkv.k_token_stride, t.qkv.k_offset, tok, keys + i * dk);
      LoadQk(t.query, t.qkv.q_token_stride, t.qkv.q_offset, tok, queries + i * dk);
      LoadV(tok, v + i * dv);
      if (attrs.has_decay) acc += LogGate(tok, 0);
      gamma[i] = acc;
      egamma[i] = std::exp(acc);
      if (attrs.has_delta) betas[i] = Beta(tok);
    }
    for (int64_t i = 0; i < L; ++i)
      for (int64_t r = 0; r < dk; ++r) kt[r * bt + i] = keys[i * dk + r];
    // Gram matrices, lower triangles only (row blocks stop at their diagonal).
    float* gkk = gram;
    float* gqk = gram + L * bt;
    for (int64_t r0 = 0; r0 < L; r0 += kSolveBlock) {
      const int64_t rows = std::min(kSolveBlock, L - r0), cols = r0 + rows;
      kern.gemm(rows, cols, dk, keys + r0 * dk, dk, kt, bt, gkk + r0 * bt, bt, false);
      kern.gemm(rows, cols, dk, queries + r0 * dk, dk, kt, bt, gqk + r0 * bt, bt, false);
    }
    kern.gemm(2 * L, dv, dk, qk, dk, st, dv, ks, dv, false);  // [K;Q] S0
    // Decay ratios, shared by M (strictly lower) and P (lower with diagonal).
    for (int64_t i = 0; i < L; ++i) {
      const float b = attrs.has_delta ? -betas[i] : 0.0f;
      for (int64_t s = 0; s <= i; ++s) {
        const float ratio = std::exp(gamma[i] - gamma[s]);
        gqk[i * bt + s] *= ratio;
        gkk[i * bt + s] = s < i ? b * gkk[i * bt + s] * ratio : 0.0f;
      }
      for (int64_t s = i + 1; s < L; ++s) gqk[i * bt + s] = 0.0f;  // read by P U inside the diagonal block
    }
    if (attrs.has_delta) {
      // U = (I + M)^-1 (diag(β) V - diag(β e^γ) K S0): forward substitution, blocked so that most of
      // it runs as matrix products (gkk holds -M).
      for (int64_t i = 0; i < L; ++i) kern.delta_rhs(v + i * dv, ks + i * dv, egamma[i], betas[i], u + i * dv, dv);
      for (int64_t r0 = 0; r0 < L; r0 += kSolveBlock) {
        const int64_t rows = std::min(kSolveBlock, L - r0);
        if (r0 > 0) kern.gemm(rows, dv, r0, gkk + r0 * bt, bt, u, dv, u + r0 * dv, dv, true);
        for (int64_t i = r0 + 1; i < r0 + rows; ++i)
          kern.gemm(1, dv, i - r0, gkk + i * bt + r0, bt, u + r0 * dv, dv, u + i * dv, dv, true);
      }
    } else {
      std::memcpy(u, v, sizeof(float) * L * dv);
    }
    // O = scale (P U + diag(e^γ) Q S0); P is lower triangular, so row block r0 needs U rows < r0 + rows.
    float* o = ks + L * dv;
    for (int64_t i = 0; i < L; ++i) kern.scale(o + i * dv, egamma[i], o + i * dv, dv);
    for (int64_t r0 = 0; r0 < L; r0 += kSolveBlock) {
      const int64_t rows = std::min(kSolveBlock, L - r0);
      kern.gemm(rows, dv, r0 + rows, gqk + r0 * bt, bt, u, dv, o + r0 * dv, dv, true);
    }
    for (int64_t i = 0; i < L; ++i) StoreOutput(start + t0 + i, o + i * dv, scale);
    // S_L = e^γL S0 + Kd^T U with Kd[s] = k_s e^(γL - γs), computed as K^T (diag(e^(γL - γs)) U):
    // U is not needed any more, and scaling its rows is contiguous work.
    const float glast = gamma[L - 1];
    for (int64_t s = 0; s < L; ++s) kern.scale(u + s * dv, std::exp(glast - gamma[s]), u + s * dv, dv);
    if (attrs.has_decay) kern.scale(st, egamma[L - 1], st, dk * dv);
    kern.gemm(dk, dv, L, kt, bt, u, dv, st, dv, true);
  }

  float* fin = FinalState();
  if (fin)
    for (int64_t c = 0; c < dv; ++c)
      for (int64_t r = 0; r < dk; ++r) fin[c * dk + r] = st[r * dv + c];
}

}  // namespace

void SetCpuEngineChoice(EngineChoice choice) { g_engine_choice.store(choice); }

void RunGdnCpu(const GdnGeometry& geo, const GdnAttributes& attrs, const std::vector<RequestRow>& rows,
               const GdnTensors& t, const ParallelFor& parallel) {
  const CpuKernels& kern = Kernels();
  const int64_t hvs = geo.num_heads_v;
  const float scale = attrs.scale != 0.0f ? attrs.scale : 1.0f / std::sqrt(static_cast<float>(geo.head_size_k));
  const bool capture = geo.capacity > 0 && t.capture_active;
  if (t.state_update) std::memset(t.state_update, 0, sizeof(float) * geo.batch * geo.capsule_width);
  // chunk_size is a hint: up to 32 selects 32-token chunks, anything larger 64 (the ORT CUDA convention of a
  // narrow and a wide chunk; on these CPUs the two run within ~10% of each other).
  const int64_t chunk = attrs.chunk_size <= 32 ? 32 : 64;
  const EngineChoice choice = g_engine_choice.load();

  parallel.Run(static_cast<size_t>(geo.batch * hvs), [&](size_t index) {
    const int64_t b = static_cast<int64_t>(index) / hvs, hv = static_cast<int64_t>(index) % hvs;
    const RequestRow& row = rows[b];
    const int64_t cc = capture ? t.capture_count[b] : 0;
    WorkItem item{geo, attrs, t, kern, scale, b, hv, hv / geo.group(), row.start, row.length,
                  std::max<int64_t>(0, std::min<int64_t>({cc, geo.capacity, row.length}))};
    if (row.length == 0) return item.EmptyRow();
    const bool must_recur = cc > 0 || geo.per_key_decay;  // engine rule 1; per-key decay has no chunked form here
    const bool short_row = row.length < contract::kSequentialMinTokens;  // engine rule 2
    bool sequential;
    switch (choice) {
      case EngineChoice::kSequential: sequential = true; break;
      case EngineChoice::kChunked: sequential = must_recur; break;
      default: sequential = must_recur || short_row;
    }
    if (sequential)
      item.Sequential();
    else
      item.Chunked(chunk);
  });
}

}  // namespace onnx_hybrid
