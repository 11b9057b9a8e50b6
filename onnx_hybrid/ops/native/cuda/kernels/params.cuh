// Parameter structs of every kernel in the image, passed by value. Plain C++ with no CUDA header, so the
// same file is compiled by NVRTC (through common.cuh) and by the custom-op library's launcher (g++), which fills
// them for ORT's kernels and for onnx_hybrid.cuda_ops alike (cuda/calls.cc).
#pragma once

// GatedDeltaNet: one struct for the recurrent, chunked and tail-pass kernels.
struct GdnParams {
  const void* q;              // first element of head 0 of token 0 (packed QKV: row base + section offset)
  const void* k;
  const void* v;
  const int* cu_seqlens;      // [B+1] or null (uniform packing: uniform_len tokens per row)
  const float* decay;         // [T, Hv] or [T, Hv, Dk]; null without decay; fp32, or T where gates_act
  const float* beta;          // [T, Hv]; null without delta retrieval; as decay
  const float* state_in;      // [B, Hv, Dv, Dk] or null (zeros)
  const float* a_log;         // [Hv] (qwen gate)
  const float* dt_bias;       // [Hv] (qwen gate)
  const int* capture_count;   // [B] (capacity > 0)
  void* out;                  // [T, Hv, Dv] in the activation type
  float* state_out;           // [B, Hv, Dv, Dk] or null; may alias state_in
  float* capsule;             // [B, capacity * (Hv + Hk*Dk + Hv*Dv)] or null
  void* workspace;            // chunked engine scratch (ChunkWorkspaceBytes in cuda/launch_plan.cc) or null
  long long q_stride;         // elements between consecutive tokens
  long long k_stride;
  long long v_stride;
  int batch;
  int total_tokens;
  int uniform_len;
  int hk;
  int hv;
  int dk;
  int dv;
  int has_decay;
  int has_delta;
  int gate_qwen;
  int beta_sigmoid;
  int l2norm;
  int decay_per_key;
  int capacity;
  int capture_active;         // state_update_active (host value) and capacity > 0
  int tail_only;              // recurrent kernel: serve only rows the chunked kernel skips
  int row_groups;             // recurrent kernel: row groups per warp (>= 1)
  int gates_act;              // decay and beta are in the activation type (widened on load), not fp32
  float scale;
};

struct ConvParams {
  const void* x;              // [T, Ch]
  const void* weight;         // [Ch, 1, K]
  const void* bias;           // [Ch] or null
  const void* state_in;       // [B, Ch, SL]
  const int* cu_seqlens;      // [B+1]
  const int* capture_count;   // [B] or null
  void* out;                  // [T, Ch]
  void* state_out;            // [B, Ch, SL]; may alias state_in
  void* capsule;              // [B, capacity, Ch] or null
  int batch;
  int total_tokens;
  int channels;
  int kernel_size;
  int dilation;
  int state_len;
  int capacity;
  int silu;
  int state_rows;             // output pass: grid rows that run the state pass first (cuda/launch_plan.cc PlanConv), else 0
};

struct GdnReplayParams {
  const float* state_in;      // [B, Hv, Dv, Dk] committed state
  float* state_out;           // may alias state_in
  const float* capsule;       // [B, W]
  const int* accepted;        // [B] transitions to replay, clamped to [0, capacity]
  int batch;
  int hk;
  int hv;
  int dk;
  int dv;
  int capacity;
};

struct ConvReplayParams {
  const void* state_in;       // [B, Ch, SL]
  void* state_out;            // may alias state_in
  const void* capsule;        // [B, capacity, Ch]
  const int* accepted;        // [B], clamped to [0, capacity]
  int batch;
  int channels;
  int state_len;
  int capacity;
};

// Linear's kernels (linear.cu): LinearRows, y = x @ w^T for one row of x; linear_swiglu_* after cuBLAS.
struct LinearParams {
  const void* x;              // [rows, k], contiguous, 16-byte aligned
  const void* w;              // [n, k], contiguous, 16-byte aligned; swiglu: [2n, k], gate rows then up rows
  void* y;                    // [rows, n]; with output_features the first part's output
  void* y_rest[3];            // the outputs of the columns from part_start[0], [1], [2] on (output_features)
  int part_start[3];          // ascending; a part's output is [rows, its columns]
  int parts;                  // outputs: 1-4
  const float* sums;          // linear_swiglu_*: the [rows, 2n] fp32 products cuBLAS wrote
  int rows;                   // 1 for linear_rows_* (LinearUsesRows)
  int n;                      // output features
  int k;                      // a multiple of 8 for linear_rows_*
  int splits;                 // warps per output feature: 1, 2, 4 or 8
  int swiglu;                 // y = SiLU(gate) * up of the two products (docs/op-contract.md#linear)
  // QuantizedLinear (quantized_linear.cu): w is MatMulNBits' 4-bit [weight rows, k_blocks, block_size / 2] bytes.
  const void* scales;                // [weight rows, k_blocks], the activation type
  const unsigned char* zero_points;  // [weight rows, ceil(k_blocks / 2)], two blocks a byte; null: 8
  void* dequantized;                 // qlinear_dequantize_*: [weight rows, k] out, for cuBLAS
  int block_size;                    // a multiple of 32 for qlinear_mma_*
  int k_blocks;                      // ceil(k / block_size)
};
