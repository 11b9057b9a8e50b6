// GatedDeltaNet: attributes, shape resolution and per-request rows, shared by every execution provider and by
// onnx_hybrid.ops.contract.resolve_gdn (through ort/c_api.h), so every engine and the Python side reject the
// same inputs with the same messages. Attribute ranges and messages come from the generated contract header.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common.h"

namespace onnx_hybrid {

struct GdnAttributes {
  std::string update_rule;
  bool has_decay = true;
  bool has_delta = true;
  float scale = 0.0f;
  bool qwen_gate = false;
  bool sigmoid_beta = false;
  bool qk_l2_norm = false;
  int64_t chunk_size = 64;
  int capacity = 0;
};

// Validates string and integer attributes (throws ContractError with the contract's text).
GdnAttributes MakeGdnAttributes(const std::string& update_rule, float scale, const std::string& gate_activation,
                                const std::string& beta_activation, int64_t qk_l2_norm, int64_t chunk_size,
                                int64_t capacity);

using GdnInputShapes = InputShapes<contract::gdn::kNumInputs>;

enum class GdnLayout { kRagged, kUniform, kRank4, kPackedRagged, kPackedUniform, kPackedRank3 };

struct GdnGeometry {
  GdnLayout layout;
  int64_t batch, total_tokens;
  int64_t num_heads_q, num_heads_k, num_heads_v, head_size_k, head_size_v;
  bool per_key_decay;
  int capacity;
  Shape output_shape, state_shape;
  int64_t capsule_width;

  bool packed() const {
    return layout == GdnLayout::kPackedRagged || layout == GdnLayout::kPackedUniform ||
           layout == GdnLayout::kPackedRank3;
  }
  bool ragged() const { return layout == GdnLayout::kRagged || layout == GdnLayout::kPackedRagged; }
  int64_t group() const { return num_heads_v / num_heads_q; }
  Shape capsule_shape() const { return {batch, capsule_width}; }  // state_update
};

GdnGeometry ResolveGdn(const GdnInputShapes& shapes, const GdnAttributes& attrs);

// decay and beta (the contract's "gate" ports): float, or both of the activation type `activation`. True for the
// latter with an fp16/bf16 activation (the kernels then widen them on load, as a Cast node would).
bool GdnGatesInActivationType(const GdnInputShapes& shapes, ElemType activation);

struct RequestRow {
  int64_t start, length;
};

// Host-visible offsets, validated like ORT 1.32 CPU (contract.check_offsets calls this); or uniform rows without them.
std::vector<RequestRow> GdnRows(const GdnGeometry& geometry, const int32_t* cu_seqlens);

// Where token t, head h of q, k and v live (element offsets), for separate and packed QKV alike.
struct QkvLayout {
  int64_t q_token_stride, k_token_stride, v_token_stride;
  int64_t q_offset, k_offset, v_offset;  // packed: offsets of the k and v sections inside a row
};
QkvLayout MakeQkvLayout(const GdnGeometry& g);

}  // namespace onnx_hybrid
