// The library's C entry points outside ORT, called through ctypes (their structs mirrored field for field in
// onnx_hybrid/ops/c_api.py):
// * the shape checks of each op on input shapes alone and the checks of host-resident offsets, which
//   onnx_hybrid.ops.contract's resolve_* and check_* use, so the rules and messages exist once
//   (onnx_hybrid_resolve_gdn, _conv, _paged_attention; onnx_hybrid_check_offsets, _check_paged_rows in ort/);
// * the CUDA ops on arrays the caller owns (onnx_hybrid.cuda_ops): the same shape checks, parameters, plan and
//   launches as ORT's CUDA kernels, on the caller's stream.
#pragma once

#include <cstdint>

extern "C" {

// One array by contract port: data null means the input is absent. Device memory, except GatedDeltaNet's
// state_update_active, which is a host int32; the shape checks read only the shapes (any non-null data).
// Ranks above OH_MAX_RANK are refused (no operator takes more than 4). elem_type (0 float32, 1 float16,
// 2 bfloat16) is read only for the ports that allow more than one type (GatedDeltaNet's decay and beta).
#define OH_MAX_RANK 8
struct OhArray {
  const void* data;
  int64_t dims[OH_MAX_RANK];
  int32_t rank;
  int32_t elem_type;
};

// Element types: 0 float32, 1 float16, 2 bfloat16 (the library's ElemType). Engines: 0 auto, 1 chunked,
// 2 recurrent. The knobs (engine, rec_rows, rec_groups, scan_width, prep_heads; 0: the plan's choice) are
// PlanGdn's; only_kernels (null: all) launches only the plan's kernels whose names start with one of its
// comma-separated prefixes (per-kernel timing in the benchmarks; "" plans and launches none).
struct OhGdnCall {
  OhArray inputs[11];
  int32_t type;
  int32_t engine, rec_rows, rec_groups, scan_width, prep_heads;
  const char* only_kernels;
  const char* update_rule;
  const char* gate_activation;
  const char* beta_activation;
  float scale;
  int64_t qk_l2_norm, chunk_size, state_update_capacity;
  void* outputs[3];  // output, final_state (may be initial_state's memory), state_update
  void* stream;
  void* workspace;
  int64_t workspace_bytes;
  // The outputs' shapes: with all three outputs given, the caller writes theirs and the call checks them; the call
  // writes the resolved ones (and the workspace the plan needs).
  int64_t output_dims[3][4];
  int32_t output_ranks[3];
  int64_t workspace_needed;
};

struct OhConvCall {
  OhArray inputs[6];
  int32_t type;
  const char* only_kernels;
  const char* activation;
  int64_t dilation, state_update_capacity;
  void* outputs[3];
  void* stream;
  int64_t output_dims[3][4];  // as OhGdnCall's
  int32_t output_ranks[3];
};

struct OhPagedAttentionCall {  // shapes only: PagedAttention runs in ORT sessions
  OhArray inputs[8];
  int64_t num_heads, kv_num_heads;
  float scale;
};

// Resolved geometries (onnx_hybrid.ops.contract's GdnGeometry, ConvGeometry, PagedAttentionGeometry).
// GatedDeltaNet layouts: 0 ragged, 1 uniform, 2 rank4, 3 packed_ragged, 4 packed_uniform, 5 packed_rank3.
struct OhGdnGeometry {
  int32_t layout, per_key_decay, capacity, output_rank;
  int64_t batch, total_tokens, num_heads_q, num_heads_k, num_heads_v, head_size_k, head_size_v, capsule_width;
  int64_t output_dims[4];
};

struct OhConvGeometry {
  int64_t batch, total_tokens, channels, kernel_size, state_length, capacity;
};

struct OhPagedAttentionGeometry {
  int64_t batch, num_tokens, num_heads, kv_num_heads, head_size, num_blocks, block_size, max_num_blocks;
  float scale;
};

}  // extern "C"
