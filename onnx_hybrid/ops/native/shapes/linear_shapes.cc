#include "shapes/linear_shapes.h"

namespace onnx_hybrid {

LinearGeometry ResolveLinear(const LinearInputShapes& in) {
  namespace ln = contract::linear;
  namespace msg = contract::msg;
  const Shape& x = in.shape[ln::kInputInput];
  const Shape& w = in.shape[ln::kInputWeight];
  if (x.size() != 2 || w.size() != 2) throw ContractError(ln::kName, msg::kLinearRank, {x, w});
  if (w[1] != x[1]) throw ContractError(ln::kName, msg::kLinearInFeatures, {x[1], w[1]});
  if (x[1] < 1) throw ContractError(ln::kName, msg::kLinearEmptyFeatures, {x[1]});
  return LinearGeometry{x[0], x[1], w[0]};
}

}  // namespace onnx_hybrid
