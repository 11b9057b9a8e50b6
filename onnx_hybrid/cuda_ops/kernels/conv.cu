// VarlenCausalConvWithState (spec/ops.md §3) and both capsule replays (§2.10, §3.7).
#include "common.cuh"

namespace ohk {

constexpr int kConvThreads = 128;  // channels per block

// One output: token `pos` of request b (row span `span`) on channel c. Taps before the row's first token read
// the request's incoming state.
template <typename T>
__device__ __forceinline__ T conv_value(const ConvParams& p, int b, RowSpan span, int pos, int c, float bias) {
  const T* x = static_cast<const T*>(p.x);
  const T* w = static_cast<const T*>(p.weight) + (size_t)c * p.kernel_size;
  const T* st = static_cast<const T*>(p.state_in);
  float z = bias;
  for (int j = 0; j < p.kernel_size; ++j) {
    const int src = pos - (p.kernel_size - 1 - j) * p.dilation;
    const float xv = src >= 0 ? to_f32(x[(size_t)(span.start + src) * p.channels + c])
                              : to_f32(st[((size_t)b * p.channels + c) * p.state_len + p.state_len + src]);
    z = fmaf(to_f32(w[j]), xv, z);
  }
  if (p.silu) z = z / (1.f + expf(-z));
  return from_f32<T>(z);
}

template <typename T>
__device__ __forceinline__ float conv_bias(const ConvParams& p, int c) {
  return p.bias != nullptr ? to_f32(static_cast<const T*>(p.bias)[c]) : 0.f;
}

// Output pass: thread = (channel, run of consecutive tokens of the packed axis; the run's length follows
// from the grid's height, which the plan picks: plan.py conv_tokens_per_block). Each token's
// request is found by binary search over the clamped offsets; tokens outside every request (malformed
// offsets only) are left unwritten. Reads the incoming state, writes none of it, so it runs before the
// state pass even when initial_state and final_state alias.
template <typename T>
__device__ __forceinline__ void conv_output(const ConvParams& p) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  if (c >= p.channels) return;
  const int tokens_per_block = (p.total_tokens + gridDim.y - 1) / gridDim.y;
  const int t_begin = blockIdx.y * tokens_per_block;
  const int t_end = min(t_begin + tokens_per_block, p.total_tokens);
  T* out = static_cast<T*>(p.out);
  const float bias = conv_bias<T>(p, c);

  // last request whose clamped start is <= t_begin
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (row_span(p.cu_seqlens, 0, mid, p.total_tokens).start <= t_begin) lo = mid; else hi = mid - 1;
  }
  int b = lo;
  RowSpan span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
  for (int t = t_begin; t < t_end; ++t) {
    while (b + 1 < p.batch) {
      const RowSpan next = row_span(p.cu_seqlens, 0, b + 1, p.total_tokens);
      if (next.start > t) break;
      b += 1;
      span = next;
    }
    const int pos = t - span.start;
    if (pos < 0 || pos >= span.len) continue;
    out[(size_t)t * p.channels + c] = conv_value<T>(p, b, span, pos, c, bias);
  }
}

// State of (request b, channel c): final[i] = X[n - SL + i] over the virtual sequence (old state, then the
// request's inputs). Ascending i reads index n + i >= i of the old state before writing index i, so aliasing
// is safe. Also writes the capsule row: inputs for t < m, zeros after.
template <typename T>
__device__ __forceinline__ void conv_state_of(const ConvParams& p, int b, RowSpan span, int c) {
  const T* x = static_cast<const T*>(p.x);
  const T* st = static_cast<const T*>(p.state_in) + ((size_t)b * p.channels + c) * p.state_len;
  T* so = static_cast<T*>(p.state_out) + ((size_t)b * p.channels + c) * p.state_len;
  for (int i = 0; i < p.state_len; ++i) {
    const int src = span.len - p.state_len + i;
    so[i] = src < 0 ? st[p.state_len + src] : x[(size_t)(span.start + src) * p.channels + c];
  }
  if (p.capsule != nullptr) {
    const int m = max(0, min(p.capture_count[b], min(p.capacity, span.len)));
    T* cap = static_cast<T*>(p.capsule) + (size_t)b * p.capacity * p.channels + c;
    for (int t = 0; t < p.capacity; ++t)
      cap[(size_t)t * p.channels] = t < m ? x[(size_t)(span.start + t) * p.channels + c] : from_f32<T>(0.f);
  }
}

// State pass: thread = (request, channel).
template <typename T>
__device__ __forceinline__ void conv_state(const ConvParams& p) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const int b = blockIdx.y;
  if (c >= p.channels) return;
  conv_state_of<T>(p, b, row_span(p.cu_seqlens, 0, b, p.total_tokens), c);
}

// Both passes in one launch for short rows (decode, verify): thread = (request, channel) computes its row's
// outputs, which read the old state, and only then writes the new state, so one thread owns every access to
// its (request, channel) state and initial_state may alias final_state. One launch instead of two is most of
// the node's host cost at these sizes.
template <typename T>
__device__ __forceinline__ void conv_rows(const ConvParams& p) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const int b = blockIdx.y;
  if (c >= p.channels) return;
  const RowSpan span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
  T* out = static_cast<T*>(p.out);
  const float bias = conv_bias<T>(p, c);
  for (int pos = 0; pos < span.len; ++pos)
    out[(size_t)(span.start + pos) * p.channels + c] = conv_value<T>(p, b, span, pos, c, bias);
  conv_state_of<T>(p, b, span, c);
}

// Conv replay: after n accepted steps the state is the last SL samples of (old state, capsule[0:n)).
template <typename T>
__device__ __forceinline__ void conv_replay(const ConvReplayParams& p) {
  const int c = blockIdx.x * kConvThreads + threadIdx.x;
  const int b = blockIdx.y;
  if (c >= p.channels) return;
  const int n = max(0, min(p.accepted[b], p.capacity));
  const T* st = static_cast<const T*>(p.state_in) + ((size_t)b * p.channels + c) * p.state_len;
  T* so = static_cast<T*>(p.state_out) + ((size_t)b * p.channels + c) * p.state_len;
  const T* cap = static_cast<const T*>(p.capsule) + (size_t)b * p.capacity * p.channels + c;
  for (int i = 0; i < p.state_len; ++i) {
    const int src = n + i;
    so[i] = src < p.state_len ? st[src] : cap[(size_t)(src - p.state_len) * p.channels];
  }
}

}  // namespace ohk

constexpr int kReplayThreads = 256;

// GDN replay (spec/ops.md §2.10): thread = one state element; CUDA rounding S = fma(key, delta, S * decay).
extern "C" __global__ void __launch_bounds__(kReplayThreads) gdn_replay_f32(const GdnReplayParams p) {
  ohk::wait_for_inputs();
  const size_t per_row = (size_t)p.hv * p.dv * p.dk;
  const size_t i = (size_t)blockIdx.x * kReplayThreads + threadIdx.x;
  if (i >= per_row * p.batch) return;
  const int b = (int)(i / per_row);
  const size_t e = i % per_row;
  const int h = (int)(e / ((size_t)p.dv * p.dk));
  const int c = (int)(e / p.dk % p.dv);
  const int r = (int)(e % p.dk);
  const int hk = h / (p.hv / p.hk);
  const int n = max(0, min(p.accepted[b], p.capacity));
  const float* cap = p.capsule + (size_t)b * p.capacity * (p.hv + (size_t)p.hk * p.dk + (size_t)p.hv * p.dv);
  const float* key = cap + (size_t)p.capacity * p.hv;
  const float* delta = key + (size_t)p.capacity * p.hk * p.dk;
  float s = p.state_in[i];
  for (int t = 0; t < n; ++t) {
    const float sd = __fmul_rn(s, cap[(size_t)t * p.hv + h]);
    s = __fmaf_rn(key[((size_t)t * p.hk + hk) * p.dk + r], delta[((size_t)t * p.hv + h) * p.dv + c], sd);
  }
  p.state_out[i] = s;
}

#define OHK_CONV(TNAME, T)                                                                                   \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads) conv_output_##TNAME(const ConvParams p) { \
    ohk::wait_for_inputs();                                                                                  \
    ohk::conv_output<T>(p);                                                                                  \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads) conv_state_##TNAME(const ConvParams p) {  \
    ohk::wait_for_inputs();                                                                                  \
    ohk::conv_state<T>(p);                                                                                   \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads) conv_rows_##TNAME(const ConvParams p) {   \
    ohk::wait_for_inputs();                                                                                  \
    ohk::conv_rows<T>(p);                                                                                    \
  }                                                                                                          \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads) conv_replay_##TNAME(const ConvReplayParams p) { \
    ohk::wait_for_inputs();                                                                                  \
    ohk::conv_replay<T>(p);                                                                                  \
  }

OHK_CONV(f32, float)
OHK_CONV(f16, __half)
OHK_CONV(bf16, __nv_bfloat16)
