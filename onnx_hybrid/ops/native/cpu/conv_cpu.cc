#include "cpu/conv_cpu.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "cpu/cpu_kernels.h"

namespace onnx_hybrid {
namespace {

constexpr int64_t kChannelTile = 64;

std::unique_ptr<float[]> Scratch(size_t floats) { return std::unique_ptr<float[]>(new float[floats]); }

// final_state[c, i] = X[n - SL + i, c] for the tile's channels: the request's input rows (row stride `ch`
// elements) where n - SL + i >= 0, else old_state[c, SL + n - SL + i]; raw samples copied bit for bit. In place
// (aliased state) ascending i reads index n + i >= i before index i is written.
template <class Sample>
void ShiftStateOf(const char* input, int64_t ch, const char* old_state, char* new_state, int64_t width, int64_t sl,
                  int64_t n) {
  for (int64_t ci = 0; ci < width; ++ci) {
    for (int64_t i = 0; i < sl; ++i) {
      const int64_t p = n - sl + i;
      const char* src =
          p >= 0 ? input + sizeof(Sample) * (p * ch + ci) : old_state + sizeof(Sample) * (ci * sl + sl + p);
      char* dst = new_state + sizeof(Sample) * (ci * sl + i);
      Sample sample;
      std::memcpy(&sample, src, sizeof(Sample));
      std::memcpy(dst, &sample, sizeof(Sample));
    }
  }
}

void ShiftState(size_t es, const char* input, int64_t ch, const char* old_state, char* new_state, int64_t width,
                int64_t sl, int64_t n) {
  if (es == 4)
    ShiftStateOf<uint32_t>(input, ch, old_state, new_state, width, sl, n);
  else
    ShiftStateOf<uint16_t>(input, ch, old_state, new_state, width, sl, n);
}

}  // namespace

void RunConvCpu(const ConvGeometry& geo, const ConvAttributes& attrs, const std::vector<RequestRow>& rows,
                const ConvTensors& t, const ParallelFor& parallel) {
  const int64_t ch = geo.channels, kernel = geo.kernel_size, sl = geo.state_length, dil = attrs.dilation;
  const size_t es = ElemSize(t.type);
  const int64_t tiles = (ch + kChannelTile - 1) / kChannelTile;
  const CpuKernels& kernels = Kernels();
  if (t.state_update) std::memset(t.state_update, 0, es * geo.batch * geo.capacity * ch);

  // One work item per channel tile, every request inside it: the tile's weights are converted once.
  parallel.Run(static_cast<size_t>(tiles), [&](size_t index) {
    const int64_t c0 = static_cast<int64_t>(index) * kChannelTile;
    const int64_t width = std::min(kChannelTile, ch - c0);
    const char* in_bytes = static_cast<const char*>(t.input);
    // Weights [K, width] and a request's old state [SL, width] in fp32 (each one block load, then transposed),
    // and a ring of the last R = (K - 1) * dilation + 1 input rows: every input row is converted once, not per tap.
    const int64_t ring = (kernel - 1) * dil + 1;
    auto scratch = Scratch(size_t((kernel + sl + ring + 2) * width + std::max(kernel, sl) * width));
    float* w = scratch.get();
    float* history = w + kernel * width;
    float* rows_ring = history + sl * width;
    float* bias = rows_ring + ring * width;
    float* acc = bias + width;
    float* block = acc + width;  // [width, K] or [width, SL] as stored, before the transpose
    LoadAsFloat(t.type, t.weight, c0 * kernel, width * kernel, block);
    for (int64_t ci = 0; ci < width; ++ci)
      for (int64_t j = 0; j < kernel; ++j) w[j * width + ci] = block[ci * kernel + j];
    if (t.bias)
      LoadAsFloat(t.type, t.bias, c0, width, bias);
    else
      std::fill(bias, bias + width, 0.0f);

    for (int64_t b = 0; b < geo.batch; ++b) {
      const int64_t start = rows[b].start, n = rows[b].length;
      const char* old_state = static_cast<const char*>(t.initial_state) + es * (b * ch + c0) * sl;
      char* new_state = static_cast<char*>(t.final_state) + es * (b * ch + c0) * sl;
      if (n > 0) {
        if (sl > 0) {
          LoadAsFloat(t.type, t.initial_state, (b * ch + c0) * sl, width * sl, block);
          for (int64_t ci = 0; ci < width; ++ci)
            for (int64_t i = 0; i < sl; ++i) history[i * width + ci] = block[ci * sl + i];
        }
        for (int64_t tok = 0; tok < n; ++tok) {
          LoadAsFloat(t.type, t.input, (start + tok) * ch + c0, width, rows_ring + (tok % ring) * width);
          std::copy(bias, bias + width, acc);
          for (int64_t j = 0; j < kernel; ++j) {
            const int64_t p = tok - (kernel - 1 - j) * dil;
            const float* xs = p >= 0 ? rows_ring + (p % ring) * width : history + (sl + p) * width;
            kernels.mul_add(w + j * width, xs, acc, width);
          }
          if (attrs.silu) kernels.silu(acc, width);
          StoreFromFloat(t.type, acc, width, t.output, (start + tok) * ch + c0);
        }
      }
      ShiftState(es, in_bytes + es * (start * ch + c0), ch, old_state, new_state, width, sl, n);
      if (t.state_update && geo.capacity > 0) {
        const int64_t m = std::max<int64_t>(0, std::min<int64_t>({t.capture_count[b], geo.capacity, n}));
        char* capsule = static_cast<char*>(t.state_update) + es * b * geo.capacity * ch;
        for (int64_t slot = 0; slot < m; ++slot)
          std::memcpy(capsule + es * (slot * ch + c0), in_bytes + es * ((start + slot) * ch + c0), es * width);
      }
    }
  });
}

}  // namespace onnx_hybrid
