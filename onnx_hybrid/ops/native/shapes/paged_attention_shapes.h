// PagedAttention: attributes, shape resolution and per-request rows, shared by the CPU kernel and by
// onnx_hybrid.ops.contract.resolve_paged_attention (through ort/c_api.h).
#pragma once

#include <cstdint>
#include <vector>

#include "common.h"

namespace onnx_hybrid {

struct PagedAttentionAttributes {
  int64_t num_heads = 0, kv_num_heads = 0;
  float scale = 0.0f;  // 0 means 1/sqrt(head_size)
};

// Validates the head counts (throws ContractError with the contract's text).
PagedAttentionAttributes MakePagedAttentionAttributes(int64_t num_heads, int64_t kv_num_heads, float scale);

using PagedAttentionInputShapes = InputShapes<contract::paged::kNumInputs>;

struct PagedAttentionGeometry {
  int64_t batch, num_tokens, num_heads, kv_num_heads, head_size, num_blocks, block_size, max_num_blocks;
  float scale;  // resolved
  int64_t group() const { return num_heads / kv_num_heads; }
  Shape cache_shape() const { return {num_blocks, block_size, kv_num_heads, head_size}; }
};

PagedAttentionGeometry ResolvePagedAttention(const PagedAttentionInputShapes& shapes,
                                             const PagedAttentionAttributes& attrs);

struct PagedRow {
  int64_t start, length, past;  // tokens [start, start + length) at positions past, past + 1, ...
};

// Host-visible offsets, past lengths and every block_table entry a request reaches, validated before any
// pool access, so a malformed table fails cleanly instead of writing outside the pool.
std::vector<PagedRow> PagedRows(const PagedAttentionGeometry& geometry, const int32_t* cumulative_sequence_lengths,
                                const int32_t* past_sequence_lengths, const int32_t* block_table);

}  // namespace onnx_hybrid
