// The library's C entry points for arrays the caller owns (onnx_hybrid.cuda_ops calls them through ctypes): the
// same shape checks, parameters, plan and launches as ORT's CUDA kernels, on the caller's stream. Plain C
// structs, mirrored field for field by ctypes in onnx_hybrid/cuda_ops/api.py.
#pragma once

#include <cstdint>

extern "C" {

// One array by contract port: data null means the input is absent. Device memory, except GatedDeltaNet's
// state_update_active, which is a host int32.
struct OhArray {
  const void* data;
  int64_t dims[4];
  int32_t rank;
  int32_t reserved;
};

// Element types: 0 float32, 1 float16, 2 bfloat16 (the library's ElemType). Engines: 0 auto, 1 chunked,
// 2 recurrent. The knobs (engine, rec_rows, rec_groups, scan_width, prep_heads; 0: the plan's choice) are
// PlanGdn's; only_kernels (null: all) launches only the plan's kernels whose names start with one of its
// comma-separated prefixes (per-kernel timing in the benchmarks).
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
  // Written by the call: the outputs' shapes, and the workspace the plan needs.
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
  int64_t output_dims[3][4];
  int32_t output_ranks[3];
};

}  // extern "C"
