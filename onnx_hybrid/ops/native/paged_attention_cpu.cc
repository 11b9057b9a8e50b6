#include "paged_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>

#include "cpu_kernels.h"

namespace onnx_hybrid {
namespace {

// Pool rows of one block, as fp32 rows `stride` floats apart: the pool itself for fp32, else widened
// into `scratch` (one conversion per block and KV head, shared by the G query heads of that KV head).
const float* BlockRows(ElemType type, const void* pool, int64_t first_row, int64_t rows, int64_t row_stride,
                       int64_t d, float* scratch, int64_t* stride) {
  if (type == ElemType::kFloat) {
    *stride = row_stride;
    return static_cast<const float*>(pool) + first_row;
  }
  for (int64_t r = 0; r < rows; ++r) LoadAsFloat(type, pool, first_row + r * row_stride, d, scratch + r * d);
  *stride = d;
  return scratch;
}

}  // namespace

void RunPagedAttentionCpu(const PagedAttentionGeometry& geo, const std::vector<PagedRow>& rows,
                          const PagedAttentionTensors& t, const ParallelFor& parallel) {
  const int64_t hq = geo.num_heads, hkv = geo.kv_num_heads, d = geo.head_size, bs = geo.block_size;
  const int64_t g_size = geo.group(), kv_width = hkv * d;
  const size_t elem = ElemSize(t.type);
  const size_t pool_bytes = static_cast<size_t>(geo.num_blocks * bs * kv_width) * elem;
  if (t.key_cache_out != t.key_cache) std::memcpy(t.key_cache_out, t.key_cache, pool_bytes);
  if (t.value_cache_out != t.value_cache) std::memcpy(t.value_cache_out, t.value_cache, pool_bytes);

  // Slot of position pos of request b; PagedRows has checked every table entry this reaches.
  auto slot = [&](size_t b, int64_t pos) { return int64_t(t.block_table[b * geo.max_num_blocks + pos / bs]) * bs + pos % bs; };

  // Every write precedes every read: a token attends to the keys of earlier tokens of the same call.
  std::vector<int64_t> token_row(static_cast<size_t>(geo.num_tokens));
  const size_t row_bytes = static_cast<size_t>(kv_width) * elem;
  for (size_t b = 0; b < rows.size(); ++b) {
    for (int64_t j = 0; j < rows[b].length; ++j) {
      const int64_t tok = rows[b].start + j, at = slot(b, rows[b].past + j) * kv_width;
      std::memcpy(static_cast<char*>(t.key_cache_out) + at * elem, static_cast<const char*>(t.key) + tok * row_bytes, row_bytes);
      std::memcpy(static_cast<char*>(t.value_cache_out) + at * elem, static_cast<const char*>(t.value) + tok * row_bytes,
                  row_bytes);
      token_row[tok] = static_cast<int64_t>(b);
    }
  }

  const CpuKernels& kern = Kernels();
  // One work item per (token, KV head): the G query heads that share a KV head read each block once.
  parallel.Run(static_cast<size_t>(geo.num_tokens * hkv), [&](size_t item) {
    const int64_t tok = static_cast<int64_t>(item) / hkv, g = static_cast<int64_t>(item) % hkv;
    const size_t b = static_cast<size_t>(token_row[tok]);
    const int64_t visible = rows[b].past + tok - rows[b].start + 1;
    const int64_t head0 = tok * hq * d + g * g_size * d;  // the G query heads are contiguous
    std::unique_ptr<float[]> work(new float[g_size * d * 2 + g_size * visible + bs * d]);
    float* q = work.get();
    float* acc = q + g_size * d;
    float* probs = acc + g_size * d;  // [G, visible]
    float* block_rows = probs + g_size * visible;
    LoadAsFloat(t.type, t.query, head0, g_size * d, q);

    for (int64_t first = 0; first < visible; first += bs) {
      const int64_t n = std::min(bs, visible - first);
      int64_t stride = 0;
      const float* keys = BlockRows(t.type, t.key_cache_out, slot(b, first) * kv_width + g * d, n, kv_width, d,
                                    block_rows, &stride);
      for (int64_t h = 0; h < g_size; ++h)
        for (int64_t r = 0; r < n; ++r) probs[h * visible + first + r] = kern.dot(q + h * d, keys + r * stride, d) * geo.scale;
    }
    for (int64_t h = 0; h < g_size; ++h) {
      float* p = probs + h * visible;
      const float top = *std::max_element(p, p + visible);
      float sum = 0.0f;
      for (int64_t i = 0; i < visible; ++i) sum += (p[i] = std::exp(p[i] - top));
      kern.scale(p, 1.0f / sum, p, visible);
    }
    for (int64_t first = 0; first < visible; first += bs) {
      const int64_t n = std::min(bs, visible - first);
      int64_t stride = 0;
      const float* values = BlockRows(t.type, t.value_cache_out, slot(b, first) * kv_width + g * d, n, kv_width, d,
                                      block_rows, &stride);
      kern.gemm(g_size, d, n, probs + first, visible, values, stride, acc, d, /*accumulate=*/first > 0);
    }
    StoreFromFloat(t.type, acc, g_size * d, t.output, head0);
  });
}

}  // namespace onnx_hybrid
