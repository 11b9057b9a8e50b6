#include "cuda/calls.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace onnx_hybrid {

GdnParams MakeGdnParams(const GdnGeometry& geo, const GdnAttributes& attrs, ElemType type, bool gates_act,
                        const void* const* inputs, void* out, float* final_state, float* capsule) {
  namespace g = contract::gdn;
  const auto* active = static_cast<const int32_t*>(inputs[g::kInputStateUpdateActive]);  // host memory
  const QkvLayout qkv = MakeQkvLayout(geo);
  const size_t es = ElemSize(type);
  const auto* query = static_cast<const char*>(inputs[g::kInputQuery]);
  GdnParams p{};
  p.q = query + qkv.q_offset * es;
  p.k = geo.packed() ? query + qkv.k_offset * es : inputs[g::kInputKey];
  p.v = geo.packed() ? query + qkv.v_offset * es : inputs[g::kInputValue];
  p.cu_seqlens = static_cast<const int*>(inputs[g::kInputCuSeqlens]);
  p.decay = static_cast<const float*>(inputs[g::kInputDecay]);
  p.beta = static_cast<const float*>(inputs[g::kInputBeta]);
  p.state_in = static_cast<const float*>(inputs[g::kInputInitialState]);
  p.a_log = static_cast<const float*>(inputs[g::kInputALog]);
  p.dt_bias = static_cast<const float*>(inputs[g::kInputDtBias]);
  p.capture_count = static_cast<const int*>(inputs[g::kInputCaptureCount]);
  p.out = out;
  p.state_out = final_state;
  p.capsule = geo.capacity > 0 ? capsule : nullptr;
  p.q_stride = qkv.q_token_stride;
  p.k_stride = qkv.k_token_stride;
  p.v_stride = qkv.v_token_stride;
  p.batch = static_cast<int>(geo.batch);
  p.total_tokens = static_cast<int>(geo.total_tokens);
  p.uniform_len = geo.ragged() || geo.batch == 0 ? 0 : static_cast<int>(geo.total_tokens / geo.batch);
  p.hk = static_cast<int>(geo.num_heads_k);
  p.hv = static_cast<int>(geo.num_heads_v);
  p.dk = static_cast<int>(geo.head_size_k);
  p.dv = static_cast<int>(geo.head_size_v);
  p.has_decay = attrs.has_decay;
  p.has_delta = attrs.has_delta;
  p.gate_qwen = attrs.qwen_gate;
  p.beta_sigmoid = attrs.sigmoid_beta;
  p.l2norm = attrs.qk_l2_norm;
  p.decay_per_key = geo.per_key_decay;
  p.capacity = geo.capacity;
  p.capture_active = geo.capacity > 0 && (active == nullptr || active[0] != 0);
  p.tail_only = 0;
  p.row_groups = 1;
  p.gates_act = gates_act;
  // The default scale rounded once from double, as the reference and the CPU kernel take it.
  p.scale = attrs.scale != 0.0f ? attrs.scale : static_cast<float>(1.0 / std::sqrt(double(geo.head_size_k)));
  return p;
}

ConvParams MakeConvParams(const ConvGeometry& geo, const ConvAttributes& attrs, const void* const* inputs,
                          void* out, void* final_state, void* capsule) {
  namespace cv = contract::conv;
  ConvParams p{};
  p.x = inputs[cv::kInputInput];
  p.weight = inputs[cv::kInputWeight];
  p.bias = inputs[cv::kInputBias];
  p.state_in = inputs[cv::kInputInitialState];
  p.cu_seqlens = static_cast<const int*>(inputs[cv::kInputCumulativeSequenceLength]);
  p.capture_count = static_cast<const int*>(inputs[cv::kInputCaptureCount]);
  p.out = out;
  p.state_out = final_state;
  p.capsule = geo.capacity > 0 ? capsule : nullptr;
  p.batch = static_cast<int>(geo.batch);
  p.total_tokens = static_cast<int>(geo.total_tokens);
  p.channels = static_cast<int>(geo.channels);
  p.kernel_size = static_cast<int>(geo.kernel_size);
  p.dilation = static_cast<int>(attrs.dilation);
  p.state_len = static_cast<int>(geo.state_length);
  p.capacity = geo.capacity;
  p.silu = attrs.silu;
  return p;
}

int64_t GdnWorkspaceBytes(const GdnGeometry& geo, ElemType type, const GdnParams& params,
                          const cuda::DeviceInfo& device, GdnCudaEngine engine) {
  const int64_t bytes = ChunkWorkspaceBytes(geo);
  return bytes > 0 && GdnUsesChunked(geo, type, params, device.arch, device.smem_optin, engine) ? bytes : 0;
}

static_assert(sizeof(LinearParams::part_start) / sizeof(int) == contract::linear::kMaxOutputFeaturesCount - 1 &&
                  sizeof(LinearParams::y_rest) / sizeof(void*) == contract::linear::kMaxOutputFeaturesCount - 1,
              "LinearParams holds every output after the first");

LinearParams MakeLinearParams(const LinearGeometry& geo, const void* const* inputs, void* const* outputs) {
  namespace ln = contract::linear;
  LinearParams p{};
  p.x = inputs[ln::kInputInput];
  p.w = inputs[ln::kInputWeight];
  p.y = outputs[0];
  p.parts = static_cast<int>(geo.parts.size());
  int64_t start = 0;
  for (int j = 1; j < p.parts; ++j) {
    start += geo.parts[j - 1];
    p.y_rest[j - 1] = outputs[j];
    p.part_start[j - 1] = static_cast<int>(std::min<int64_t>(start, INT32_MAX));
  }
  // Sizes beyond int32 are clamped: LinearUsesRows then declines and cuBLAS's own check refuses them.
  p.rows = static_cast<int>(std::min<int64_t>(geo.rows, INT32_MAX));
  p.n = static_cast<int>(std::min<int64_t>(geo.out_features, INT32_MAX));
  p.k = static_cast<int>(std::min<int64_t>(geo.in_features, INT32_MAX));
  p.splits = 1;
  p.swiglu = geo.swiglu ? 1 : 0;
  return p;
}

LinearParams MakeQuantizedLinearParams(const QuantizedLinearGeometry& geo, const void* const* inputs,
                                       void* const* outputs) {
  namespace ql = contract::qlinear;
  const void* linear_inputs[contract::linear::kNumInputs] = {inputs[ql::kInputInput], inputs[ql::kInputWeight]};
  LinearParams p = MakeLinearParams(geo, linear_inputs, outputs);
  p.scales = inputs[ql::kInputScales];
  p.zero_points = static_cast<const unsigned char*>(inputs[ql::kInputZeroPoints]);
  p.block_size = static_cast<int>(geo.block_size);
  p.k_blocks = static_cast<int>(std::min<int64_t>(geo.blocks, INT32_MAX));
  return p;
}

}  // namespace onnx_hybrid
