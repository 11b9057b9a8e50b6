#include "cpu/paged_attention_cpu.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>

#include "cpu/cpu_kernels.h"

namespace onnx_hybrid {
namespace {

// Query rows (tokens x query heads of one KV head) per work item, which share every key and value block
// read from the pool; a verify step of 4 tokens at G = 4 is one tile.
constexpr int64_t kRowsPerTile = 16;

// `rows` pool rows starting at element `first` and `row_stride` elements apart, as fp32 rows `*stride`
// floats apart: the pool itself for fp32, else widened into `scratch`.
const float* PoolRows(ElemType type, const void* pool, int64_t first, int64_t rows, int64_t row_stride, int64_t d,
                      float* scratch, int64_t* stride) {
  if (type == ElemType::kFloat) {
    *stride = row_stride;
    return static_cast<const float*>(pool) + first;
  }
  for (int64_t r = 0; r < rows; ++r) LoadAsFloat(type, pool, first + r * row_stride, d, scratch + r * d);
  *stride = d;
  return scratch;
}

struct Tile {
  size_t request;
  int64_t first, count;  // tokens [first, first + count) of the packed axis, all of one request
};

}  // namespace

void RunPagedAttentionCpu(const PagedAttentionGeometry& geo, const std::vector<PagedRow>& rows,
                          const PagedAttentionTensors& t, const ParallelFor& parallel) {
  const int64_t hq = geo.num_heads, hkv = geo.kv_num_heads, d = geo.head_size, bs = geo.block_size;
  const int64_t g_size = geo.group(), kv_width = hkv * d;
  const size_t elem = ElemSize(t.type);
  const size_t pool_bytes = static_cast<size_t>(geo.num_blocks * bs * kv_width) * elem;
  if (t.key_cache_out != t.key_cache) std::memcpy(t.key_cache_out, t.key_cache, pool_bytes);
  if (t.value_cache_out != t.value_cache) std::memcpy(t.value_cache_out, t.value_cache, pool_bytes);

  // Pool row of position pos of request b; PagedRows has checked every table entry this reaches.
  auto slot = [&](size_t b, int64_t pos) {
    return int64_t(t.block_table[b * geo.max_num_blocks + pos / bs]) * bs + pos % bs;
  };

  // Every write precedes every read: a token attends to the keys of earlier tokens of the same call.
  const size_t row_bytes = static_cast<size_t>(kv_width) * elem;
  for (size_t b = 0; b < rows.size(); ++b) {
    for (int64_t j = 0; j < rows[b].length; ++j) {
      const int64_t tok = rows[b].start + j, at = slot(b, rows[b].past + j) * kv_width;
      std::memcpy(static_cast<char*>(t.key_cache_out) + at * elem, static_cast<const char*>(t.key) + tok * row_bytes,
                  row_bytes);
      std::memcpy(static_cast<char*>(t.value_cache_out) + at * elem,
                  static_cast<const char*>(t.value) + tok * row_bytes, row_bytes);
    }
  }

  // Work items: (tile of consecutive tokens of one request, KV head). The tile's tokens x G query heads are
  // the M rows that read each key and value block once.
  const int64_t tile_tokens = std::max<int64_t>(1, kRowsPerTile / g_size);
  std::vector<Tile> tiles;
  for (size_t b = 0; b < rows.size(); ++b)
    for (int64_t j = 0; j < rows[b].length; j += tile_tokens)
      tiles.push_back({b, rows[b].start + j, std::min(tile_tokens, rows[b].length - j)});

  const CpuKernels& kern = Kernels();
  parallel.Run(tiles.size() * static_cast<size_t>(hkv), [&](size_t item) {
    const Tile& tile = tiles[item / static_cast<size_t>(hkv)];
    const int64_t g = static_cast<int64_t>(item % static_cast<size_t>(hkv));
    const size_t b = tile.request;
    const int64_t m = tile.count * g_size;
    const int64_t first_position = rows[b].past + tile.first - rows[b].start;
    const int64_t span = first_position + tile.count;  // positions 0..span-1: all the tile's tokens see
    std::unique_ptr<float[]> work(new float[2 * m * d + m * span + bs * d]);
    float* q = work.get();                // [M, D], row = token * G + head
    float* acc = q + m * d;               // [M, D]
    float* probs = acc + m * d;           // [M, span]: scores, then probabilities
    float* pool_rows = probs + m * span;  // [bs, D]: pool rows widened from fp16/bf16

    // The G query heads of KV head g are contiguous in a query row.
    for (int64_t i = 0; i < tile.count; ++i)
      LoadAsFloat(t.type, t.query, (tile.first + i) * hq * d + g * g_size * d, g_size * d, q + i * g_size * d);

    // scores = q K^T, one key block at a time (the pool's rows as they lie). Every score is one dot product
    // and every output element of the PV product below one FMA chain in a fixed order, whatever M is, so a
    // token gets the same bits in a verify step as in a one-token step: speculative decoding then
    // reproduces plain decoding exactly (tests/contract/test_replay_agreement.py).
    int64_t stride = 0;
    for (int64_t first = 0; first < span; first += bs) {
      const int64_t n = std::min(bs, span - first);
      const float* keys = PoolRows(t.type, t.key_cache_out, slot(b, first) * kv_width + g * d, n, kv_width, d,
                                   pool_rows, &stride);
      kern.dots(m, n, d, q, d, keys, stride, probs + first, span);
    }
    // Softmax of row r over its causal span in fp32; positions it must not see get probability 0.
    for (int64_t r = 0; r < m; ++r) {
      const int64_t visible = first_position + r / g_size + 1;
      float* p = probs + r * span;
      float top = -std::numeric_limits<float>::infinity();
      for (int64_t i = 0; i < visible; ++i) top = std::max(top, p[i] *= geo.scale);
      float sum = 0.0f;
      for (int64_t i = 0; i < visible; ++i) sum += (p[i] = std::exp(p[i] - top));
      kern.scale(p, 1.0f / sum, p, visible);
      std::fill(p + visible, p + span, 0.0f);
    }
    for (int64_t first = 0; first < span; first += bs) {
      const int64_t n = std::min(bs, span - first);
      const float* values = PoolRows(t.type, t.value_cache_out, slot(b, first) * kv_width + g * d, n, kv_width, d,
                                     pool_rows, &stride);
      kern.gemm(m, d, n, probs + first, span, values, stride, acc, d, /*accumulate=*/first > 0);
    }
    for (int64_t i = 0; i < tile.count; ++i)
      StoreFromFloat(t.type, acc + i * g_size * d, g_size * d, t.output, (tile.first + i) * hq * d + g * g_size * d);
  });
}

}  // namespace onnx_hybrid
