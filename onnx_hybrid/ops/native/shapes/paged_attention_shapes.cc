#include "shapes/paged_attention_shapes.h"

#include <cmath>

namespace onnx_hybrid {
namespace {
namespace pa = contract::paged;
namespace msg = contract::msg;
constexpr const char* kOp = pa::kName;
}  // namespace

PagedAttentionAttributes MakePagedAttentionAttributes(int64_t num_heads, int64_t kv_num_heads, float scale) {
  if (num_heads < pa::kMinNumHeads || num_heads > pa::kMaxNumHeads)
    throw ContractError(kOp, msg::kPaNumHeads, {num_heads});
  if (kv_num_heads < pa::kMinKvNumHeads || kv_num_heads > pa::kMaxKvNumHeads)
    throw ContractError(kOp, msg::kPaKvNumHeads, {kv_num_heads});
  if (num_heads % kv_num_heads) throw ContractError(kOp, msg::kPaHeads, {num_heads, kv_num_heads});
  RequireFinite(pa::kAttrScale, scale);
  return PagedAttentionAttributes{num_heads, kv_num_heads, scale};
}

PagedAttentionGeometry ResolvePagedAttention(const PagedAttentionInputShapes& in,
                                             const PagedAttentionAttributes& attrs) {
  const int64_t hq = attrs.num_heads, hkv = attrs.kv_num_heads;
  const Shape& cache = in.shape[pa::kInputKeyCache];
  if (cache.size() != 4) throw ContractError(kOp, msg::kPaCacheRank, {"key_cache", cache});
  const int64_t num_blocks = cache[0], block_size = cache[1], d = cache[3];
  if (block_size <= 0 || d <= 0 || cache[2] != hkv) throw ContractError(kOp, msg::kPaCacheDims, {hkv, cache});
  if (in.shape[pa::kInputValueCache] != cache)
    throw ContractError(kOp, msg::kPaCacheSame, {cache, in.shape[pa::kInputValueCache]});
  const Shape& q = in.shape[pa::kInputQuery];
  const int64_t tokens = q.empty() ? -1 : q[0];
  const struct {
    int index;
    const char* name;
    int64_t width;
    const char* what;
  } rows[] = {{pa::kInputQuery, "query", hq * d, "num_heads * head_size"},
              {pa::kInputKey, "key", hkv * d, "kv_num_heads * head_size"},
              {pa::kInputValue, "value", hkv * d, "kv_num_heads * head_size"}};
  for (const auto& r : rows) {
    if (tokens < 0 || in.shape[r.index] != Shape{tokens, r.width}) {
      const MessageArg n = tokens < 0 ? MessageArg("num_tokens") : MessageArg(tokens);
      throw ContractError(kOp, msg::kPaTensorShape, {r.name, r.what, n, r.width, in.shape[r.index]});
    }
  }
  const Shape& cu = in.shape[pa::kInputCumulativeSequenceLengths];
  if (cu.size() != 1 || cu[0] < 2) throw ContractError(kOp, msg::kPaCuShape, {cu});
  const int64_t batch = cu[0] - 1;
  if (in.shape[pa::kInputPastSequenceLengths] != Shape{batch})
    throw ContractError(kOp, msg::kPaPastShape, {Shape{batch}, in.shape[pa::kInputPastSequenceLengths]});
  const Shape& table = in.shape[pa::kInputBlockTable];
  if (table.size() != 2 || table[0] != batch) throw ContractError(kOp, msg::kPaBlockTableShape, {batch, table});
  const float scale = attrs.scale != 0.0f ? attrs.scale : 1.0f / std::sqrt(static_cast<float>(d));
  return PagedAttentionGeometry{batch, tokens, hq, hkv, d, num_blocks, block_size, table[1], scale};
}

std::vector<PagedRow> PagedRows(const PagedAttentionGeometry& geo, const int32_t* cu, const int32_t* past,
                                const int32_t* block_table) {
  const int64_t b_count = geo.batch;
  if (cu[0] != 0 || cu[b_count] != geo.num_tokens)
    throw ContractError(kOp, msg::kPaCuBounds, {b_count, geo.num_tokens, int64_t(cu[0]), int64_t(cu[b_count])});
  std::vector<PagedRow> rows(static_cast<size_t>(b_count));
  for (int64_t b = 0; b < b_count; ++b) {
    if (cu[b + 1] < cu[b]) throw ContractError(kOp, msg::kPaCuOrder, {b + 1, int64_t(cu[b + 1]), b, int64_t(cu[b])});
    const int64_t length = int64_t(cu[b + 1]) - cu[b], p = past[b];
    if (p < 0 || p > contract::kInt32Max - length)
      throw ContractError(kOp, msg::kPaPastRange, {b, contract::kInt32Max - length, p});
    const int64_t columns = (p + length + geo.block_size - 1) / geo.block_size;
    if (columns > geo.max_num_blocks)
      throw ContractError(kOp, msg::kPaBlockColumns, {b, p + length - 1, columns, geo.max_num_blocks});
    for (int64_t c = 0; c < columns; ++c) {
      const int64_t block = block_table[b * geo.max_num_blocks + c];
      if (block < 0 || block >= geo.num_blocks)
        throw ContractError(kOp, msg::kPaBlockIndex, {b, c, block, geo.num_blocks});
    }
    rows[b] = {cu[b], length, p};
  }
  return rows;
}

}  // namespace onnx_hybrid
