#include "shapes/linear_shapes.h"

namespace onnx_hybrid {
namespace {
namespace ln = contract::linear;
namespace msg = contract::msg;
}  // namespace

LinearAttributes MakeLinearAttributes(const std::string& activation) {
  bool allowed = false;
  for (const char* a : ln::kAllowedActivation) allowed = allowed || activation == a;
  if (!allowed) throw ContractError(ln::kName, msg::kLinearActivation, {activation});
  LinearAttributes a;
  a.swiglu = activation == "swiglu";
  return a;
}

LinearGeometry ResolveLinear(const LinearInputShapes& in, const LinearAttributes& attrs) {
  const Shape& x = in.shape[ln::kInputInput];
  const Shape& w = in.shape[ln::kInputWeight];
  if (x.size() != 2 || w.size() != 2) throw ContractError(ln::kName, msg::kLinearRank, {x, w});
  if (w[1] != x[1]) throw ContractError(ln::kName, msg::kLinearInFeatures, {x[1], w[1]});
  if (x[1] < 1) throw ContractError(ln::kName, msg::kLinearEmptyFeatures, {x[1]});
  if (attrs.swiglu && w[0] % 2 != 0) throw ContractError(ln::kName, msg::kLinearSwigluRows, {w[0]});
  return LinearGeometry{x[0], x[1], attrs.swiglu ? w[0] / 2 : w[0], attrs.swiglu};
}

}  // namespace onnx_hybrid
