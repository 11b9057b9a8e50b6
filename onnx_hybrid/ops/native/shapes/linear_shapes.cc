#include "shapes/linear_shapes.h"

namespace onnx_hybrid {
namespace {
namespace ln = contract::linear;
namespace msg = contract::msg;

std::string Listed(const std::vector<int64_t>& values) {  // as contract._fmt writes a list
  std::string text = "[";
  for (size_t i = 0; i < values.size(); ++i) text += (i ? ", " : "") + std::to_string(values[i]);
  return text + "]";
}
}  // namespace

LinearAttributes MakeLinearAttributes(const std::string& activation, const std::vector<int64_t>& output_features,
                                      int outputs) {
  bool allowed = false;
  for (const char* a : ln::kAllowedActivation) allowed = allowed || activation == a;
  if (!allowed) throw ContractError(ln::kName, msg::kLinearActivation, {activation});
  bool sizes_ok = output_features.size() <= size_t(ln::kMaxOutputFeaturesCount);
  for (int64_t f : output_features) sizes_ok = sizes_ok && f >= ln::kMinOutputFeatures;
  if (!sizes_ok) throw ContractError(ln::kName, msg::kLinearOutputFeatures, {Listed(output_features)});
  LinearAttributes a;
  a.swiglu = activation == "swiglu";
  if (a.swiglu && !output_features.empty())
    throw ContractError(ln::kName, msg::kLinearSwigluOutputs, {Listed(output_features)});
  if (outputs != std::max<int>(1, static_cast<int>(output_features.size())))
    throw ContractError(ln::kName, msg::kLinearOutputs, {outputs, Listed(output_features)});
  a.parts = output_features;
  return a;
}

LinearGeometry ResolveLinear(const LinearInputShapes& in, const LinearAttributes& attrs) {
  const Shape& x = in.shape[ln::kInputInput];
  const Shape& w = in.shape[ln::kInputWeight];
  if (x.size() != 2 || w.size() != 2) throw ContractError(ln::kName, msg::kLinearRank, {x, w});
  if (w[1] != x[1]) throw ContractError(ln::kName, msg::kLinearInFeatures, {x[1], w[1]});
  if (x[1] < 1) throw ContractError(ln::kName, msg::kLinearEmptyFeatures, {x[1]});
  if (attrs.swiglu && w[0] % 2 != 0) throw ContractError(ln::kName, msg::kLinearSwigluRows, {w[0]});
  const int64_t columns = attrs.swiglu ? w[0] / 2 : w[0];
  std::vector<int64_t> parts = attrs.parts.empty() ? std::vector<int64_t>{columns} : attrs.parts;
  int64_t sum = 0;
  for (int64_t p : parts) sum += p;
  if (sum != columns) throw ContractError(ln::kName, msg::kLinearOutputSum, {w[0], Listed(attrs.parts), sum});
  return LinearGeometry{x[0], x[1], columns, attrs.swiglu, std::move(parts)};
}

}  // namespace onnx_hybrid
