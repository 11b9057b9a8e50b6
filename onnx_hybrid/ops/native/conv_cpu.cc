#include "conv_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

namespace onnx_hybrid {
namespace {

constexpr int64_t kChannelTile = 64;

std::unique_ptr<float[]> Scratch(size_t floats) { return std::unique_ptr<float[]>(new float[floats]); }

}  // namespace

void RunConvCpu(const ConvGeometry& geo, const ConvAttributes& attrs, const std::vector<RequestRow>& rows,
                const ConvTensors& t, const ParallelFor& parallel) {
  const int64_t ch = geo.channels, kernel = geo.kernel_size, sl = geo.state_length, dil = attrs.dilation;
  const size_t es = ElemSize(t.type);
  const int64_t tiles = (ch + kChannelTile - 1) / kChannelTile;
  if (t.state_update) std::memset(t.state_update, 0, es * geo.batch * geo.capacity * ch);

  parallel.Run(static_cast<size_t>(geo.batch * tiles), [&](size_t index) {
    const int64_t b = static_cast<int64_t>(index) / tiles;
    const int64_t c0 = (static_cast<int64_t>(index) % tiles) * kChannelTile;
    const int64_t width = std::min(kChannelTile, ch - c0);
    const int64_t start = rows[b].start, n = rows[b].length;
    const char* in_bytes = static_cast<const char*>(t.input);
    const char* old_state = static_cast<const char*>(t.initial_state) + es * (b * ch + c0) * sl;
    char* new_state = static_cast<char*>(t.final_state) + es * (b * ch + c0) * sl;

    if (n > 0) {
      // weights [K, width] and the old state [SL, width] in fp32, then one output row per token.
      const int64_t row = std::max({width, kernel, sl});  // x holds a weight row, a state row or a token
      auto scratch = Scratch(size_t(kernel * width + sl * width + 2 * width + row));
      float* w = scratch.get();
      float* history = w + kernel * width;
      float* bias = history + sl * width;
      float* acc = bias + width;
      float* x = acc + width;
      for (int64_t ci = 0; ci < width; ++ci) {
        LoadAsFloat(t.type, t.weight, (c0 + ci) * kernel, kernel, x);
        for (int64_t j = 0; j < kernel; ++j) w[j * width + ci] = x[j];
        if (sl > 0) {
          LoadAsFloat(t.type, t.initial_state, (b * ch + c0 + ci) * sl, sl, x);
          for (int64_t i = 0; i < sl; ++i) history[i * width + ci] = x[i];
        }
      }
      if (t.bias)
        LoadAsFloat(t.type, t.bias, c0, width, bias);
      else
        std::fill(bias, bias + width, 0.0f);
      for (int64_t tok = 0; tok < n; ++tok) {
        std::copy(bias, bias + width, acc);
        for (int64_t j = 0; j < kernel; ++j) {
          const int64_t p = tok - (kernel - 1 - j) * dil;
          const float* xs;
          if (p >= 0) {
            LoadAsFloat(t.type, t.input, (start + p) * ch + c0, width, x);
            xs = x;
          } else {
            xs = history + (sl + p) * width;
          }
          const float* wj = w + j * width;
          for (int64_t ci = 0; ci < width; ++ci) acc[ci] += wj[ci] * xs[ci];
        }
        if (attrs.silu)
          for (int64_t ci = 0; ci < width; ++ci) acc[ci] = acc[ci] * (1.0f / (1.0f + std::exp(-acc[ci])));
        StoreFromFloat(t.type, acc, width, t.output, (start + tok) * ch + c0);
      }
    }
    // final_state[i] = X[n - SL + i], raw samples copied bit for bit. In place (aliased state) this
    // reads index n + i >= i before index i is written.
    for (int64_t ci = 0; ci < width; ++ci) {
      const char* old_row = old_state + es * ci * sl;
      char* new_row = new_state + es * ci * sl;
      for (int64_t i = 0; i < sl; ++i) {
        const int64_t p = n - sl + i;
        const char* src = p >= 0 ? in_bytes + es * ((start + p) * ch + c0 + ci) : old_row + es * (sl + p);
        if (src != new_row + es * i) std::memcpy(new_row + es * i, src, es);
      }
    }
    if (t.state_update && geo.capacity > 0) {
      const int64_t m = std::max<int64_t>(0, std::min<int64_t>({t.capture_count[b], geo.capacity, n}));
      char* capsule = static_cast<char*>(t.state_update) + es * b * geo.capacity * ch;
      for (int64_t slot = 0; slot < m; ++slot)
        std::memcpy(capsule + es * (slot * ch + c0), in_bytes + es * ((start + slot) * ch + c0), es * width);
    }
  });
}

}  // namespace onnx_hybrid
