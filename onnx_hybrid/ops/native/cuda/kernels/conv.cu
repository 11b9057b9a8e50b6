// VarlenCausalConvWithState and its capsule replay (docs/op-contract.md#varlencausalconvwithstate,
// #conv-capsule-and-replay).
#include "common.cuh"

namespace ohk {

constexpr int kConvThreads = launch_config::kConvThreads;  // threads per block, each holding kConvVec channels

// SiLU with the fast intrinsics (ex2.approx, rcp.approx): the exact expf and IEEE division made the conv's output
// pass arithmetic-bound, 48% of its byte floor against 63-72% with these (docs/design-notes.md#conv-fast-silu). Their
// relative error (a few 1e-7 here) is far below the outputs' fp16 / bf16 rounding and the fp32 tests' 1e-5.
__device__ __forceinline__ float conv_silu(float z) { return __fdividef(z, 1.f + __expf(-z)); }

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
  if (p.silu) z = conv_silu(z);
  return from_f32<T>(z);
}

template <typename T>
__device__ __forceinline__ float conv_bias(const ConvParams& p, int c) {
  return p.bias != nullptr ? to_f32(static_cast<const T*>(p.bias)[c]) : 0.f;
}

// Each thread owns kConvVec<T> consecutive channels: 16 bytes of them. The real models' convolutions (4 taps,
// dilation 1, channel counts a multiple of 8, allocations 16-byte aligned) take a 16-byte path: one vector
// load or store per token and 16 bytes of channels, and a window of the last three inputs in registers, so each
// input is read once per run of tokens. Element loads and stores made the prefill's output pass read every
// input four times, two bytes at a time (27B, 1 x 4096: 320 us; docs/design-notes.md#conv-16-byte-channel-vectors).
// Every other shape walks the thread's channels one by one through the element path; both do the same
// arithmetic in the same order, so the path never changes a bit.
template <typename T>
constexpr int kConvVec = launch_config::kConvVectorBytes / sizeof(T);
constexpr int kConvTaps = 4;  // the 16-byte path's kernel size (state of 3 samples, dilation 1)
// The output pass gives each thread a run of consecutive tokens (its length follows from the grid's height: the
// planner's kConvShortTokens .. kConvLongTokens rule in launch_config.h). A run inside one row streams its inputs in chunks of kConvChunk, each requested before
// the previous one is used, the addresses clamped to the run, so no per-token check sits among loads in flight
// (one made ptxas wait for them there: a loop over chunks with per-token row checks took 73 us at 27B, 1 x 4096,
// fp16).
constexpr int kConvChunk = 4;
// Tokens whose inputs a thread of conv_rows requests with its state (verify rows; decode requests one).
constexpr int kConvRowsAhead = 4;

// 16 bytes of T as four 32-bit words, narrowed to in pairs (pack2: one conversion instruction per pair). With T[8]
// members the bf16 output pass spilled at 128 registers (62.7 against 48.3 us at 27B, 1 x 4096). Elements widen
// through to_f32 as before: shifting the words instead took conv_decode_bf16 from 96 to 110 registers, one block
// fewer per SM (9.1 against 8.5 us at B = 128; docs/design-notes.md#conv-register-budget). Both conversions are
// exact or round to nearest even, as to_f32 / from_f32 do, so no bit changes.
template <typename T>
struct alignas(16) ConvPack {
  static constexpr int N = kConvVec<T>;
  unsigned w[4];

  __device__ __forceinline__ float at(int i) const { return to_f32(reinterpret_cast<const T*>(w)[i]); }

  __device__ __forceinline__ static ConvPack of(const float (&z)[N]) {
    ConvPack x;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      if constexpr (sizeof(T) == 4)
        x.w[k] = __float_as_uint(z[k]);
      else
        x.w[k] = pack2<T>(z[2 * k], z[2 * k + 1]);
    }
    return x;
  }
};

template <typename T>
__device__ __forceinline__ ConvPack<T> conv_load(const void* base, size_t element) {
  return *reinterpret_cast<const ConvPack<T>*>(static_cast<const T*>(base) + element);
}
template <typename T>
__device__ __forceinline__ void conv_store(void* base, size_t element, const ConvPack<T>& x) {
  *reinterpret_cast<ConvPack<T>*>(static_cast<T*>(base) + element) = x;
}

__device__ __forceinline__ bool aligned16(const void* ptr) { return (reinterpret_cast<size_t>(ptr) & 15) == 0; }

// Decided once per call from its parameters, the same in every thread.
template <typename T>
__device__ __forceinline__ bool conv_vector_path(const ConvParams& p) {
  return p.kernel_size == kConvTaps && p.dilation == 1 && p.state_len == kConvTaps - 1 &&
         p.channels % kConvVec<T> == 0 && aligned16(p.x) && aligned16(p.weight) &&
         (p.bias == nullptr || aligned16(p.bias)) && aligned16(p.state_in) && aligned16(p.out) &&
         aligned16(p.state_out) && (p.capsule == nullptr || aligned16(p.capsule));
}

// Where a window's samples come from: the incoming state [B, Ch, 3], then a row of inputs [tokens, Ch] (the
// row's first at `inputs`: the request's inputs, or a capsule's slots in a replay).
struct ConvSamples {
  const void* state;
  const void* inputs;
  int channels;
};

template <typename T>
__device__ __forceinline__ ConvSamples conv_row_samples(const ConvParams& p, RowSpan span) {
  return {p.state_in, static_cast<const T*>(p.x) + (size_t)span.start * p.channels, p.channels};
}

// A thread's channels c0 .. c0 + kConvVec - 1 in the 16-byte path: taps and bias in fp32, and the window of the
// three inputs before the next token (win[0] the oldest), in fp32.
template <typename T>
struct ConvChannels {
  static constexpr int N = kConvVec<T>;
  float w[N][kConvTaps];
  float bias[N];
  float win[kConvTaps - 1][N];

  __device__ void load_taps(const ConvParams& p, int c0) {
#pragma unroll
    for (int q = 0; q < kConvTaps * N / kConvVec<T>; ++q) {  // [Ch, 1, 4]: the thread's 4 N taps are contiguous
      const ConvPack<T> x = conv_load<T>(p.weight, (size_t)c0 * kConvTaps + q * N);
#pragma unroll
      for (int e = 0; e < N; ++e) w[(q * N + e) / kConvTaps][(q * N + e) % kConvTaps] = x.at(e);
    }
    ConvPack<T> b{};
    if (p.bias != nullptr) b = conv_load<T>(p.bias, c0);
#pragma unroll
    for (int i = 0; i < N; ++i) bias[i] = p.bias != nullptr ? b.at(i) : 0.f;
  }

  // The request's incoming state of these channels ([B, Ch, 3]: 3 N contiguous samples) as the window.
  __device__ void load_state(const ConvSamples& src, int b, int c0) {
    ConvPack<T> s[kConvTaps - 1];
#pragma unroll
    for (int q = 0; q < kConvTaps - 1; ++q)
      s[q] = conv_load<T>(src.state, ((size_t)b * src.channels + c0) * (kConvTaps - 1) + q * N);
#pragma unroll
    for (int k = 0; k < (kConvTaps - 1) * N; ++k)
      win[k % (kConvTaps - 1)][k / (kConvTaps - 1)] = s[k / N].at(k % N);
  }

  // The three inputs before the next token as the window (win[0] the oldest).
  __device__ void set_window(const ConvPack<T> (&x)[kConvTaps - 1]) {
#pragma unroll
    for (int j = 0; j < kConvTaps - 1; ++j)
#pragma unroll
      for (int i = 0; i < N; ++i) win[j][i] = x[j].at(i);
  }

  // The window before input `pos` of the row: earlier inputs of the row, else the incoming state.
  __device__ void load_window(const ConvSamples& src, int b, int pos, int c0) {
    if (pos < kConvTaps - 1) load_state(src, b, c0);
#pragma unroll
    for (int j = 0; j < kConvTaps - 1; ++j) {
      const int at = pos - (kConvTaps - 1) + j;
      if (at >= 0) {
        const ConvPack<T> x = conv_load<T>(src.inputs, (size_t)at * src.channels + c0);
#pragma unroll
        for (int i = 0; i < N; ++i) win[j][i] = x.at(i);
      } else if (pos > 0) {  // the state's newest samples move up to make room for the row's first inputs
        // slot j + pos (>= j, not yet overwritten), chosen by selects: an index computed at run time would put
        // the window in local memory
        const int k = j + pos;
#pragma unroll
        for (int i = 0; i < N; ++i) win[j][i] = k == 2 ? win[2][i] : (k == 1 ? win[1][i] : win[0][i]);
      }
    }
  }

  // Output of the input `x` (the token after the window), as conv_value computes it; then x joins the window.
  __device__ ConvPack<T> step(const ConvParams& p, const ConvPack<T>& x) {
    float out[N];
#pragma unroll
    for (int i = 0; i < N; ++i) {
      const float xi = x.at(i);
      float z = bias[i];
#pragma unroll
      for (int j = 0; j < kConvTaps - 1; ++j) z = fmaf(w[i][j], win[j][i], z);
      z = fmaf(w[i][kConvTaps - 1], xi, z);
      if (p.silu) z = conv_silu(z);
      out[i] = z;
#pragma unroll
      for (int j = 0; j + 1 < kConvTaps - 1; ++j) win[j][i] = win[j + 1][i];
      win[kConvTaps - 2][i] = xi;
    }
    return ConvPack<T>::of(out);
  }

  // The window as the request's new state ([B, Ch, 3]).
  __device__ void store_state(void* state, int channels, int b, int c0) const {
#pragma unroll
    for (int q = 0; q < kConvTaps - 1; ++q) {  // samples of T, so narrowing them is exact
      float s[N];
#pragma unroll
      for (int e = 0; e < N; ++e) s[e] = win[(q * N + e) % (kConvTaps - 1)][(q * N + e) / (kConvTaps - 1)];
      conv_store<T>(state, ((size_t)b * channels + c0) * (kConvTaps - 1) + q * N, ConvPack<T>::of(s));
    }
  }
};

// The captured prefix m of request b's row: its capture count, clamped to the capsule and the row.
__device__ __forceinline__ int conv_captured_prefix(const ConvParams& p, int count, RowSpan span) {
  return max(0, min(count, min(p.capacity, span.len)));
}

// Slot t of the capsule row of (request b, these channels) ([B, capacity, Ch]): input x for t < m, else zeros.
template <typename T>
__device__ __forceinline__ void conv_capture_slot(const ConvParams& p, int b, int c0, int t, int m,
                                                  const ConvPack<T>& x) {
  conv_store<T>(p.capsule, ((size_t)b * p.capacity + t) * p.channels + c0, t < m ? x : ConvPack<T>{});
}

// The whole capsule row of (request b, these channels), its inputs loaded again. Written out rather than through
// conv_capture_slot: the decode kernel, whose rare path this is, compiled to other code that way (sm_90a).
template <typename T>
__device__ __forceinline__ void conv_capture(const ConvParams& p, int b, RowSpan span, int c0) {
  const int m = conv_captured_prefix(p, p.capture_count[b], span);
  for (int t = 0; t < p.capacity; ++t) {
    const ConvPack<T> x = t < m ? conv_load<T>(p.x, (size_t)(span.start + t) * p.channels + c0) : ConvPack<T>{};
    conv_store<T>(p.capsule, ((size_t)b * p.capacity + t) * p.channels + c0, x);
  }
}

// The request whose clamped row holds token t (the last whose start is <= t), by binary search.
__device__ __forceinline__ int conv_row_of(const ConvParams& p, int t) {
  int lo = 0, hi = p.batch - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) >> 1;
    if (row_span(p.cu_seqlens, 0, mid, p.total_tokens).start <= t) lo = mid; else hi = mid - 1;
  }
  return lo;
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
    const int m = conv_captured_prefix(p, p.capture_count[b], span);
    T* cap = static_cast<T*>(p.capsule) + (size_t)b * p.capacity * p.channels + c;
    for (int t = 0; t < p.capacity; ++t)
      cap[(size_t)t * p.channels] = t < m ? x[(size_t)(span.start + t) * p.channels + c] : from_f32<T>(0.f);
  }
}

// State pass of request b: thread = kConvVec channels. The 16-byte path reads the whole incoming state of its
// channels before writing any of it, so initial_state may alias final_state.
template <typename T>
__device__ __forceinline__ void conv_state(const ConvParams& p, int b) {
  const int c0 = (blockIdx.x * kConvThreads + threadIdx.x) * kConvVec<T>;
  if (c0 >= p.channels) return;
  const RowSpan span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
  if (!conv_vector_path<T>(p)) {
    for (int c = c0; c < min(c0 + kConvVec<T>, p.channels); ++c) conv_state_of<T>(p, b, span, c);
    return;
  }
  ConvChannels<T> chans;
  chans.load_window(conv_row_samples<T>(p, span), b, span.len, c0);  // after the row's last input: the new state
  chans.store_state(p.state_out, p.channels, b, c0);
  if (p.capsule != nullptr) conv_capture<T>(p, b, span, c0);
}

// Output pass: thread = (kConvVec channels, run of consecutive tokens of the packed axis; the run's length
// follows from the grid's height, which the planner picks: cuda/launch_plan.cc). Tokens outside every
// request (malformed offsets only) are left unwritten. Reads the incoming state, writes none of it, so it runs
// before a separate state pass when initial_state and final_state overlap. When they do not, the grid's first
// p.state_rows rows are the state pass (row b of them: request b), which saves the second launch and its wait
// for the whole output grid (about 10 us of a 65 us call at 27B, 1 x 4096; H200;
// docs/design-notes.md#conv-state-pass-in-the-output-grid).
template <typename T>
__device__ __forceinline__ void conv_output(const ConvParams& p) {
  if ((int)blockIdx.y < p.state_rows) {
    conv_state<T>(p, blockIdx.y);
    return;
  }
  const int c0 = (blockIdx.x * kConvThreads + threadIdx.x) * kConvVec<T>;
  if (c0 >= p.channels) return;
  const int run_blocks = gridDim.y - p.state_rows;
  const int tokens_per_block = (p.total_tokens + run_blocks - 1) / run_blocks;
  const int t_begin = (blockIdx.y - p.state_rows) * tokens_per_block;
  const int t_end = min(t_begin + tokens_per_block, p.total_tokens);
  if (t_begin >= t_end) return;
  if (!conv_vector_path<T>(p)) {
    int b = conv_row_of(p, t_begin);
    RowSpan span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
    for (int t = t_begin; t < t_end; ++t) {
      while (b + 1 < p.batch && row_span(p.cu_seqlens, 0, b + 1, p.total_tokens).start <= t) {
        b += 1;
        span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
      }
      const int pos = t - span.start;
      if (pos < 0 || pos >= span.len) continue;
      for (int c = c0; c < min(c0 + kConvVec<T>, p.channels); ++c)
        static_cast<T*>(p.out)[(size_t)t * p.channels + c] = conv_value<T>(p, b, span, pos, c, conv_bias<T>(p, c));
    }
    return;
  }
  ConvChannels<T> chans;
  chans.load_taps(p, c0);
  // A chunk's inputs, clamped to the run (the last chunk's tail re-reads the run's last input).
  const auto request = [&](ConvPack<T>(&chunk)[kConvChunk], int t) {
#pragma unroll
    for (int i = 0; i < kConvChunk; ++i) chunk[i] = conv_load<T>(p.x, (size_t)min(t + i, t_end - 1) * p.channels + c0);
  };
  // The run's first chunk and the three inputs before it have addresses that follow from the block alone. They
  // are requested before the row lookup, so a block's first inputs do not wait for its loads of the offsets
  // (27B fp16, 1 x 8192 / 8 x 2048: 100.2 / 195.6 us before, 96.2 / 185.1 us after; H200;
  // docs/design-notes.md#conv-first-inputs-before-the-row-lookup).
  ConvPack<T> even[kConvChunk], before[kConvTaps - 1];
  request(even, t_begin);
#pragma unroll
  for (int j = 0; j < kConvTaps - 1; ++j)
    before[j] = conv_load<T>(p.x, (size_t)max(t_begin - (kConvTaps - 1) + j, 0) * p.channels + c0);
  int b = conv_row_of(p, t_begin);
  RowSpan span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
  const auto next_row_start = [&]() {  // first token of the next row (total_tokens past the last row)
    return b + 1 < p.batch ? row_span(p.cu_seqlens, 0, b + 1, p.total_tokens).start : p.total_tokens;
  };
  int next_start = next_row_start();
  const int pos0 = t_begin - span.start;
  if (t_end - t_begin >= 2 * kConvChunk && pos0 >= 0 && t_end - span.start <= span.len && next_start >= t_end) {
    // The run lies inside row b, and no later row's start cuts it (malformed offsets may overlap rows). Shorter
    // runs (short calls' single tokens) take the path below, which computes no token past the run.
    const auto use = [&](const ConvPack<T>(&chunk)[kConvChunk], int t) {  // a chunk's outputs, stored inside the run
#pragma unroll
      for (int i = 0; i < kConvChunk; ++i) {
        const ConvPack<T> out = chans.step(p, chunk[i]);
        if (t + i < t_end) conv_store<T>(p.out, (size_t)(t + i) * p.channels + c0, out);
      }
    };
    if (pos0 >= kConvTaps - 1)
      chans.set_window(before);
    else  // the row starts within three tokens of the run: its window holds state samples
      chans.load_window(conv_row_samples<T>(p, span), b, pos0, c0);
    ConvPack<T> odd[kConvChunk];
    if (t_end - t_begin == 2 * kConvChunk) {
      // One pair (mid-sized calls' runs, kConvMediumTokens): every token lies inside the run, so no load
      // is clamped and no store predicated as in the loop below (27B fp16, 1 x 1024 / 1 x 2000: 16.8 / 28.2 us in
      // the loop, 16.2 / 27.5 here; H200; docs/design-notes.md#conv-output-loop-and-run-length).
#pragma unroll
      for (int i = 0; i < kConvChunk; ++i)
        odd[i] = conv_load<T>(p.x, (size_t)(t_begin + kConvChunk + i) * p.channels + c0);
#pragma unroll
      for (int i = 0; i < 2 * kConvChunk; ++i) {
        const ConvPack<T>& in = i < kConvChunk ? even[i] : odd[i - kConvChunk];
        conv_store<T>(p.out, (size_t)(t_begin + i) * p.channels + c0, chans.step(p, in));
      }
      return;
    }
    // Two chunks in turn: one requested while the other is used. A loop, not straight-line code for runs of one
    // length: runs of any length from two chunks take it, and the plan's runs of 16 tokens (5 waves at 27B,
    // 1 x 4096) took 47.7 us where straight-line runs of 32 took 52.0 (H200;
    // docs/design-notes.md#conv-output-loop-and-run-length).
#pragma unroll 1
    for (int t = t_begin; t < t_end; t += 2 * kConvChunk) {
      request(odd, t + kConvChunk);
      use(even, t);
      if (t + 2 * kConvChunk < t_end) request(even, t + 2 * kConvChunk);  // not past the run's last pair
      use(odd, t + kConvChunk);
    }
    return;
  }
  // Runs that rows start or end in, and short calls' single tokens: a chunk's inputs requested at once, then
  // used token by token. The first chunk and the window before it are the ones already requested above
  // (requesting them again cost short and mid-sized calls up to 1.6 us, 1 x 200 fp16: 10.9 against 9.3 us; H200,
  // docs/design-notes.md#conv-first-inputs-before-the-row-lookup).
  bool window = false;  // whether chans.win holds the inputs before the next token
  for (int t = t_begin; t < t_end; t += kConvChunk) {
    if (t != t_begin) request(even, t);
#pragma unroll
    for (int i = 0; i < kConvChunk; ++i) {
      const int ti = t + i;
      if (ti >= t_end) break;
      if (ti >= next_start) {  // a row starts here (several may, when malformed offsets leave rows empty)
        while (b + 1 < p.batch && row_span(p.cu_seqlens, 0, b + 1, p.total_tokens).start <= ti) b += 1;
        span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
        next_start = next_row_start();
        window = false;
      }
      const int pos = ti - span.start;
      if (pos < 0 || pos >= span.len) {  // outside every row (malformed offsets)
        window = false;
        continue;
      }
      if (!window) {
        if (ti == t_begin && pos >= kConvTaps - 1)  // the three inputs before the run, requested above, are the row's
          chans.set_window(before);
        else
          chans.load_window(conv_row_samples<T>(p, span), b, pos, c0);
      }
      window = true;
      conv_store<T>(p.out, (size_t)ti * p.channels + c0, chans.step(p, even[i]));
    }
  }
}

// A decode row in the 16-byte path, computed before its offsets are looked at: its one input is where a decode's
// offsets (0, 1, 2, ...) put it, token b, requested with the taps and the state. The output and the new state are
// stored only if the offsets confirm that; else nothing is written and the caller runs the row from its offsets.
// The offsets are requested first and looked at last, so a thread waits for memory once, not for the offsets and
// then for the rest (27B fp16, B = 32 / 128: 4.21 / 8.65 us before, 3.94 / 8.27 us after; H200;
// docs/design-notes.md#conv-decode-before-its-offsets).
template <typename T>
__device__ __forceinline__ bool conv_decode_guessed(const ConvParams& p, int b, int c0) {
  if (p.total_tokens != p.batch) return false;  // not one token per row: b may lie past the inputs
  const RowOffsets offsets = row_offsets(p.cu_seqlens, b);  // requested first, looked at last
  ConvChannels<T> chans;
  const ConvPack<T> x = conv_load<T>(p.x, (size_t)b * p.channels + c0);
  chans.load_taps(p, c0);
  chans.load_state(ConvSamples{p.state_in, nullptr, p.channels}, b, c0);  // the state alone: no row inputs
  const ConvPack<T> out = chans.step(p, x);
  const RowSpan span = row_span(p.cu_seqlens, offsets, 0, b, p.total_tokens);
  if (span.start != b || span.len != 1) return false;
  conv_store<T>(p.out, (size_t)b * p.channels + c0, out);
  chans.store_state(p.state_out, p.channels, b, c0);
  if (p.capsule != nullptr) conv_capture<T>(p, b, span, c0);
  return true;
}

// Both passes in one launch for short rows (decode, verify): thread = (request, kConvVec channels) computes its
// row's outputs, which read the old state, and only then writes the new state, so one thread owns every access
// to its (request, channels) state and initial_state may alias final_state. One launch instead of two is most
// of the node's host cost at these sizes. The row's first AHEAD inputs are requested with the taps and the
// state, so a thread waits for memory once: 1 for decode, kConvRowsAhead for verify (more registers cost
// blocks in flight: 8 ahead took 9.9 us at decode B = 128, 1 ahead 8.7; H200;
// docs/design-notes.md#conv-short-rows-in-one-launch).
// The verify kernel (HELD) requests the capture count with the offsets and writes each capsule slot from the
// input it holds, as it steps that token: loaded after the state, count and inputs made a thread wait twice more
// at its end (27B fp16, verify 4 with capture, B = 32 / 128: 6.32 / 16.29 us before, 6.03 / 15.45 us after; H200;
// docs/design-notes.md#conv-verify-capsule-from-held-inputs). The decode kernel keeps conv_capture in its rare
// path (decode rows come through conv_decode_guessed): holding inputs and count there took it from 96 to 112
// registers, a block fewer per SM.
template <typename T, int AHEAD>
__device__ __forceinline__ void conv_rows(const ConvParams& p) {
  constexpr bool HELD = AHEAD > 1;
  const int c0 = (blockIdx.x * kConvThreads + threadIdx.x) * kConvVec<T>;
  const int b = blockIdx.y;
  if (c0 >= p.channels) return;
  if constexpr (!HELD)
    if (conv_vector_path<T>(p) && conv_decode_guessed<T>(p, b, c0)) return;
  const int count = HELD ? ld_global_if(p.capture_count + b, p.capsule != nullptr) : 0;
  const RowSpan span = row_span(p.cu_seqlens, 0, b, p.total_tokens);
  if (!conv_vector_path<T>(p)) {
    T* out = static_cast<T*>(p.out);
    for (int c = c0; c < min(c0 + kConvVec<T>, p.channels); ++c) {
      const float bias = conv_bias<T>(p, c);
      for (int pos = 0; pos < span.len; ++pos)
        out[(size_t)(span.start + pos) * p.channels + c] = conv_value<T>(p, b, span, pos, c, bias);
      conv_state_of<T>(p, b, span, c);
    }
    return;
  }
  ConvChannels<T> chans;
  ConvPack<T> xs[AHEAD];
#pragma unroll
  for (int i = 0; i < AHEAD; ++i)
    if (i < span.len) xs[i] = conv_load<T>(p.x, (size_t)(span.start + i) * p.channels + c0);
  chans.load_taps(p, c0);
  chans.load_state(conv_row_samples<T>(p, span), b, c0);
  const bool held = HELD && p.capsule != nullptr;
  const int m = conv_captured_prefix(p, count, span);
#pragma unroll
  for (int i = 0; i < AHEAD; ++i) {
    if (i < span.len) conv_store<T>(p.out, (size_t)(span.start + i) * p.channels + c0, chans.step(p, xs[i]));
    if (held && i < p.capacity) conv_capture_slot<T>(p, b, c0, i, m, xs[i]);  // zeros past the row (m <= len)
  }
  for (int pos = AHEAD; pos < span.len; ++pos) {
    const size_t at = (size_t)(span.start + pos) * p.channels + c0;
    const ConvPack<T> x = conv_load<T>(p.x, at);
    conv_store<T>(p.out, at, chans.step(p, x));
    if (held && pos < p.capacity) conv_capture_slot<T>(p, b, c0, pos, m, x);
  }
  chans.store_state(p.state_out, p.channels, b, c0);
  if (held) {
    for (int t = max(AHEAD, span.len); t < p.capacity; ++t) conv_capture_slot<T>(p, b, c0, t, m, ConvPack<T>{});
  } else if (p.capsule != nullptr) {
    conv_capture<T>(p, b, span, c0);
  }
}

// Conv replay: after n accepted steps the state is the last SL samples of (old state, capsule[0:n)).
// thread = (request, kConvVec channels): in the 16-byte path the window after n inputs of the capsule, as the
// state pass takes it after the row's inputs; else each channel by the element path.
template <typename T>
__device__ __forceinline__ void conv_replay(const ConvReplayParams& p) {
  const int c0 = (blockIdx.x * kConvThreads + threadIdx.x) * kConvVec<T>;
  const int b = blockIdx.y;
  if (c0 >= p.channels) return;
  const int n = max(0, min(p.accepted[b], p.capacity));
  const T* capsule = static_cast<const T*>(p.capsule) + (size_t)b * p.capacity * p.channels;
  if (p.state_len == kConvTaps - 1 && p.channels % kConvVec<T> == 0 && aligned16(p.state_in) &&
      aligned16(p.state_out) && aligned16(capsule)) {
    ConvChannels<T> chans;
    chans.load_window(ConvSamples{p.state_in, capsule, p.channels}, b, n, c0);
    chans.store_state(p.state_out, p.channels, b, c0);
    return;
  }
  for (int c = c0; c < min(c0 + kConvVec<T>, p.channels); ++c) {
    const T* st = static_cast<const T*>(p.state_in) + ((size_t)b * p.channels + c) * p.state_len;
    T* so = static_cast<T*>(p.state_out) + ((size_t)b * p.channels + c) * p.state_len;
    for (int i = 0; i < p.state_len; ++i) {
      const int src = n + i;
      so[i] = src < p.state_len ? st[src] : capsule[(size_t)(src - p.state_len) * p.channels + c];
    }
  }
}

}  // namespace ohk

#define OHK_CONV(TNAME, T, ROWS_BOUNDS)                                             \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads, 4)                \
      conv_output_##TNAME(const ConvParams p) {                                     \
    ohk::wait_for_inputs();                                                         \
    ohk::conv_output<T>(p);                                                         \
  }                                                                                 \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads)                   \
      conv_state_##TNAME(const ConvParams p) {                                      \
    ohk::wait_for_inputs();                                                         \
    ohk::conv_state<T>(p, blockIdx.y);                                              \
  }                                                                                 \
  extern "C" __global__ void __launch_bounds__ ROWS_BOUNDS                         \
      conv_rows_##TNAME(const ConvParams p) {                                       \
    ohk::wait_for_inputs();                                                         \
    ohk::conv_rows<T, ohk::kConvRowsAhead>(p);                                      \
  }                                                                                 \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads)                   \
      conv_decode_##TNAME(const ConvParams p) {                                     \
    ohk::wait_for_inputs();                                                         \
    ohk::conv_rows<T, 1>(p);                                                        \
  }                                                                                 \
  extern "C" __global__ void __launch_bounds__(ohk::kConvThreads)                   \
      conv_replay_##TNAME(const ConvReplayParams p) {                               \
    ohk::wait_for_inputs();                                                         \
    ohk::conv_replay<T>(p);                                                         \
  }

// The output kernel is built for 4 blocks per SM (128 registers), where no type spills
// (tests/cuda/test_cuda_ops_build.py checks it). An earlier bf16 kernel spilled 262 bytes there and ran 20% slower
// (H200; docs/design-notes.md#conv-register-budget).
// The fp32 short-row kernel is held to 4 blocks per SM (128 registers), like the 16-bit ones, which take that many
// on their own: left to choose, ptxas gave it 72 registers and spilled 16 bytes (CUDA 13.0, sm_90a).
OHK_CONV(f32, float, (ohk::kConvThreads, 4))
OHK_CONV(f16, __half, (ohk::kConvThreads))
OHK_CONV(bf16, __nv_bfloat16, (ohk::kConvThreads))
