// PagedAttention on the CPU (docs/op-contract.md#pagedattention): write the new keys/values into their pool slots, then
// causal GQA attention of every token over its request's positions, softmax and accumulation in fp32.
#pragma once

#include <vector>

#include "common.h"
#include "shapes/paged_attention_shapes.h"

namespace onnx_hybrid {

// Host pointers of one call. The *_out pools may alias the input pools (the Engine binds one buffer).
struct PagedAttentionTensors {
  ElemType type;
  const void *query, *key, *value, *key_cache, *value_cache;
  const int32_t* block_table;
  void *output, *key_cache_out, *value_cache_out;
};

void RunPagedAttentionCpu(const PagedAttentionGeometry& geo, const std::vector<PagedRow>& rows,
                          const PagedAttentionTensors& t, const ParallelFor& parallel);

}  // namespace onnx_hybrid
