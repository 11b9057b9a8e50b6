#include "shapes/gdn_shapes.h"

#include <cstring>

namespace onnx_hybrid {
namespace {

namespace g = contract::gdn;
namespace msg = contract::msg;
constexpr const char* kOp = g::kName;

template <size_t N>
bool Allowed(const std::string& value, const char* const (&allowed)[N]) {
  for (const char* a : allowed)
    if (value == a) return true;
  return false;
}

bool Int32Ok(int64_t v) { return v > 0 && v <= contract::kInt32Max; }

Shape Slice(const Shape& s, size_t begin, size_t end) { return Shape(s.begin() + begin, s.begin() + end); }

int64_t Product(const Shape& s) {
  int64_t p = 1;
  for (int64_t d : s) p *= d;
  return p;
}

const char* TypeName(int elem) {
  switch (elem) {
    case static_cast<int>(ElemType::kFloat): return "float";
    case static_cast<int>(ElemType::kFloat16): return "float16";
    case static_cast<int>(ElemType::kBFloat16): return "bfloat16";
    default: return "another type";
  }
}

}  // namespace

bool GdnGatesInActivationType(const GdnInputShapes& in, ElemType activation) {
  const int gates[] = {g::kInputDecay, g::kInputBeta};
  const int act = static_cast<int>(activation), fp32 = static_cast<int>(ElemType::kFloat);
  int seen = -2;  // the gates' one type, once a present gate is read
  bool ok = true;
  for (int i : gates) {
    if (!in.present[i]) continue;
    ok = ok && (in.elem[i] == fp32 || in.elem[i] == act) && (seen == -2 || seen == in.elem[i]);
    seen = in.elem[i];
  }
  if (!ok) {
    auto name = [&](int i) { return in.present[i] ? TypeName(in.elem[i]) : "absent"; };
    throw ContractError(kOp, msg::kGateType, {TypeName(act), name(g::kInputDecay), name(g::kInputBeta)});
  }
  return seen == act && activation != ElemType::kFloat;
}

GdnAttributes MakeGdnAttributes(const std::string& update_rule, float scale, const std::string& gate_activation,
                                const std::string& beta_activation, int64_t qk_l2_norm, int64_t chunk_size,
                                int64_t capacity) {
  GdnAttributes a;
  if (!Allowed(update_rule, g::kAllowedUpdateRule)) throw ContractError(kOp, msg::kGdnUpdateRule, {update_rule});
  RequireFinite(g::kAttrScale, scale);
  if (!Allowed(gate_activation, g::kAllowedGateActivation))
    throw ContractError(kOp, msg::kGdnGateActivation, {gate_activation});
  if (!Allowed(beta_activation, g::kAllowedBetaActivation))
    throw ContractError(kOp, msg::kGdnBetaActivation, {beta_activation});
  if (chunk_size < g::kMinChunkSize || chunk_size > g::kMaxChunkSize)
    throw ContractError(kOp, msg::kChunkSize, {chunk_size});
  if (capacity < g::kMinStateUpdateCapacity || capacity > g::kMaxStateUpdateCapacity)
    throw ContractError(kOp, msg::kCapacity, {capacity});
  a.update_rule = update_rule;
  for (const auto& rule : contract::kUpdateRules) {
    if (update_rule == rule.name) {
      a.has_decay = rule.has_decay;
      a.has_delta = rule.has_delta;
    }
  }
  a.scale = scale;
  a.qwen_gate = gate_activation == "qwen";
  a.sigmoid_beta = beta_activation == "sigmoid";
  a.qk_l2_norm = qk_l2_norm != 0;
  a.chunk_size = chunk_size;
  a.capacity = static_cast<int>(capacity);
  return a;
}

GdnGeometry ResolveGdn(const GdnInputShapes& in, const GdnAttributes& attrs) {
  auto has = [&](int i) { return in.present[i]; };
  const Shape& q = in.shape[g::kInputQuery];
  const Shape& k = in.shape[g::kInputKey];
  const Shape& v = in.shape[g::kInputValue];
  const Shape& state = in.shape[g::kInputInitialState];
  const bool has_cu = has(g::kInputCuSeqlens), has_state = has(g::kInputInitialState);
  const char* absent = "absent";
  const char* present = "present";
  auto presence = [&](int i) { return has(i) ? present : absent; };

  GdnGeometry geo{};
  geo.capacity = attrs.capacity;
  if (has(g::kInputKey) != has(g::kInputValue))
    throw ContractError(kOp, msg::kGdnKvPresence, {presence(g::kInputKey), presence(g::kInputValue)});
  const bool packed = !has(g::kInputKey);
  int64_t hq, hk, hv, dk, dv;
  bool rank4;
  Shape tokens_shape;
  if (packed) {
    if (q.size() != 2 && q.size() != 3) throw ContractError(kOp, msg::kGdnPackedRank, {int64_t(q.size())});
    if (has_cu && q.size() == 3) throw ContractError(kOp, msg::kGdnCuRank4, {int64_t(q.size())});
    if (!has_state) throw ContractError(kOp, msg::kGdnPackedNeedsState);
    if (state.size() != 4) throw ContractError(kOp, msg::kGdnStateRank, {int64_t(state.size())});
    hv = state[1];
    dv = state[2];
    dk = state[3];
    const int64_t width = q.back();
    const int64_t rest = width - hv * dv;
    const bool dims_ok = Int32Ok(hv) && Int32Ok(dv) && Int32Ok(dk);
    if (!dims_ok || rest <= 0 || rest % (2 * dk) != 0) {
      if (dims_ok) throw ContractError(kOp, msg::kGdnPackedWidth, {width, rest, dk});
      throw ContractError(kOp, msg::kGdnPackedDims, {"?", dk, hv, dv});
    }
    hq = hk = rest / (2 * dk);
    if (!Int32Ok(hq)) throw ContractError(kOp, msg::kGdnPackedDims, {hq, dk, hv, dv});
    if (hv % hq != 0) throw ContractError(kOp, msg::kGdnHeadsV, {hv, hq});
    rank4 = q.size() == 3;
    tokens_shape = Slice(q, 0, q.size() - 1);
  } else {
    if (q.size() != 3 && q.size() != 4) throw ContractError(kOp, msg::kGdnRank, {int64_t(q.size())});
    if (q.size() != k.size() || k.size() != v.size())
      throw ContractError(kOp, msg::kGdnSameRank, {int64_t(q.size()), int64_t(k.size()), int64_t(v.size())});
    if (has_cu && q.size() == 4) throw ContractError(kOp, msg::kGdnCuRank4, {int64_t(q.size())});
    const size_t r = q.size();
    Shape qt = Slice(q, 0, r - 2), kt = Slice(k, 0, r - 2), vt = Slice(v, 0, r - 2);
    if (qt != kt || kt != vt) throw ContractError(kOp, msg::kGdnTokensAgree, {qt, kt, vt});
    hq = q[r - 2];
    dk = q[r - 1];
    hk = k[r - 2];
    hv = v[r - 2];
    dv = v[r - 1];
    if (k[r - 1] != dk) throw ContractError(kOp, msg::kGdnHeadSize, {dk, k[r - 1]});
    if (hq != hk) throw ContractError(kOp, msg::kGdnHeadsQk, {hq, hk});
    if (hq <= 0 || hv <= 0 || hv % hq != 0) throw ContractError(kOp, msg::kGdnHeadsV, {hv, hq});
    rank4 = r == 4;
    tokens_shape = qt;
  }

  const int64_t total = Product(tokens_shape);
  if (!(total > 0 && total <= contract::kInt32Max)) throw ContractError(kOp, msg::kGdnTotalTokens, {total});

  int64_t batch;
  if (has_cu) {
    const Shape& cu = in.shape[g::kInputCuSeqlens];
    if (cu.size() != 1 || cu[0] < 2) throw ContractError(kOp, msg::kGdnCuShape, {cu});
    batch = cu[0] - 1;
    geo.layout = packed ? GdnLayout::kPackedRagged : GdnLayout::kRagged;
  } else if (rank4) {
    batch = tokens_shape[0];
    geo.layout = packed ? GdnLayout::kPackedRank3 : GdnLayout::kRank4;
  } else {
    if (!has_state) throw ContractError(kOp, msg::kGdnUniformNeedsState);
    if (state.size() != 4) throw ContractError(kOp, msg::kGdnStateRank, {int64_t(state.size())});
    batch = state[0];
    if (!Int32Ok(batch)) throw ContractError(kOp, msg::kGdnBatch, {batch});
    if (total % batch != 0) throw ContractError(kOp, msg::kGdnUniformDivisible, {total, batch});
    geo.layout = packed ? GdnLayout::kPackedUniform : GdnLayout::kUniform;
  }
  if (!Int32Ok(batch)) throw ContractError(kOp, msg::kGdnBatch, {batch});

  const Shape state_shape = {batch, hv, dv, dk};
  if (has_state) {
    if (state.size() != 4) throw ContractError(kOp, msg::kGdnStateRank, {int64_t(state.size())});
    if (state != state_shape) throw ContractError(kOp, msg::kGdnStateShape, {state_shape, state});
  }

  const char* rule = attrs.update_rule.c_str();
  if (has(g::kInputDecay) != attrs.has_decay)
    throw ContractError(kOp, msg::kGdnDecayPresence,
                        {rule, attrs.has_decay ? "requires" : "forbids", presence(g::kInputDecay)});
  if (has(g::kInputBeta) != attrs.has_delta)
    throw ContractError(kOp, msg::kGdnBetaPresence,
                        {rule, attrs.has_delta ? "requires" : "forbids", presence(g::kInputBeta)});
  bool per_key = false;
  Shape scalar_shape = tokens_shape;
  scalar_shape.push_back(hv);
  if (has(g::kInputDecay)) {
    const Shape& decay = in.shape[g::kInputDecay];
    Shape perkey_shape = scalar_shape;
    perkey_shape.push_back(dk);
    if (decay == scalar_shape) {
      per_key = false;
    } else if (decay.size() == perkey_shape.size() && Slice(decay, 0, decay.size() - 1) == scalar_shape) {
      if (decay.back() != dk) throw ContractError(kOp, msg::kGdnDecayPerkey, {dk, decay.back()});
      per_key = true;
    } else {
      throw ContractError(kOp, msg::kGdnDecayShape, {scalar_shape, perkey_shape, decay});
    }
  }
  if (has(g::kInputBeta) && in.shape[g::kInputBeta] != scalar_shape)
    throw ContractError(kOp, msg::kGdnBetaShape, {scalar_shape, in.shape[g::kInputBeta]});

  if (attrs.qwen_gate) {
    if (!has(g::kInputALog) || !has(g::kInputDtBias))
      throw ContractError(kOp, msg::kGdnQwenNeedsGates, {presence(g::kInputALog), presence(g::kInputDtBias)});
    if (in.shape[g::kInputALog] != Shape{hv}) throw ContractError(kOp, msg::kGdnALogShape, {Shape{hv}, in.shape[g::kInputALog]});
    if (in.shape[g::kInputDtBias] != Shape{hv})
      throw ContractError(kOp, msg::kGdnDtBiasShape, {Shape{hv}, in.shape[g::kInputDtBias]});
  } else if (has(g::kInputALog) || has(g::kInputDtBias)) {
    throw ContractError(kOp, msg::kGdnGatesNeedQwen, {attrs.qwen_gate ? "qwen" : "none"});
  }

  const bool has_cc = has(g::kInputCaptureCount);
  if (has_cc != (attrs.capacity > 0))
    throw ContractError(kOp, msg::kCapturePresence, {int64_t(attrs.capacity), presence(g::kInputCaptureCount)});
  if (has_cc && in.shape[g::kInputCaptureCount] != Shape{batch})
    throw ContractError(kOp, msg::kGdnCaptureShape, {Shape{batch}, in.shape[g::kInputCaptureCount]});
  if (attrs.capacity > 0 && per_key) throw ContractError(kOp, msg::kGdnCapturePerkey, {in.shape[g::kInputDecay]});
  if (has(g::kInputStateUpdateActive) && in.shape[g::kInputStateUpdateActive] != Shape{1})
    throw ContractError(kOp, msg::kGdnActiveShape, {in.shape[g::kInputStateUpdateActive]});

  geo.batch = batch;
  geo.total_tokens = total;
  geo.num_heads_q = hq;
  geo.num_heads_k = hk;
  geo.num_heads_v = hv;
  geo.head_size_k = dk;
  geo.head_size_v = dv;
  geo.per_key_decay = per_key;
  geo.output_shape = tokens_shape;
  geo.output_shape.push_back(hv);
  geo.output_shape.push_back(dv);
  geo.state_shape = state_shape;
  geo.capsule_width = int64_t(attrs.capacity) * (hv + hk * dk + hv * dv);
  return geo;
}

std::vector<RequestRow> GdnRows(const GdnGeometry& geo, const int32_t* cu) {
  std::vector<RequestRow> rows(static_cast<size_t>(geo.batch));
  if (!geo.ragged()) {
    const int64_t n = geo.total_tokens / geo.batch;
    for (int64_t b = 0; b < geo.batch; ++b) rows[b] = {b * n, n};
    return rows;
  }
  const int64_t b_count = geo.batch;
  if (cu[0] != 0 || cu[b_count] != geo.total_tokens)
    throw ContractError(kOp, msg::kGdnCuBounds, {b_count, geo.total_tokens, int64_t(cu[0]), int64_t(cu[b_count])});
  for (int64_t b = 0; b < b_count; ++b) {
    if (cu[b + 1] < cu[b])
      throw ContractError(kOp, msg::kGdnCuOrder, {b + 1, int64_t(cu[b + 1]), b, int64_t(cu[b])});
    rows[b] = {cu[b], int64_t(cu[b + 1]) - cu[b]};
  }
  return rows;
}

QkvLayout MakeQkvLayout(const GdnGeometry& geo) {
  const int64_t qk = geo.num_heads_q * geo.head_size_k, vw = geo.num_heads_v * geo.head_size_v;
  if (geo.packed()) {
    const int64_t w = 2 * qk + vw;
    return {w, w, w, 0, qk, 2 * qk};
  }
  return {qk, qk, vw, 0, 0, 0};
}

}  // namespace onnx_hybrid
