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
                                      int outputs, const char* op) {
  bool allowed = false;
  for (const char* a : ln::kAllowedActivation) allowed = allowed || activation == a;
  if (!allowed) throw ContractError(op, msg::kLinearActivation, {activation});
  bool sizes_ok = output_features.size() <= size_t(ln::kMaxOutputFeaturesCount);
  for (int64_t f : output_features) sizes_ok = sizes_ok && f >= ln::kMinOutputFeatures;
  if (!sizes_ok) throw ContractError(op, msg::kLinearOutputFeatures, {Listed(output_features)});
  LinearAttributes a;
  a.swiglu = activation == "swiglu";
  if (a.swiglu && !output_features.empty())
    throw ContractError(op, msg::kLinearSwigluOutputs, {Listed(output_features)});
  if (outputs != std::max<int>(1, static_cast<int>(output_features.size())))
    throw ContractError(op, msg::kLinearOutputs, {outputs, Listed(output_features)});
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

QuantizedLinearAttributes MakeQuantizedLinearAttributes(const std::string& activation,
                                                        const std::vector<int64_t>& output_features, int outputs,
                                                        int64_t block_size, int64_t bits, int64_t accuracy_level) {
  namespace ql = contract::qlinear;
  if (block_size < ql::kMinBlockSize || (block_size & (block_size - 1)) != 0)
    throw ContractError(ql::kName, msg::kQlinearBlockSize, {block_size});
  if (bits != contract::kQlinearBits) throw ContractError(ql::kName, msg::kQlinearBits, {bits});
  if (accuracy_level < 0 || accuracy_level > contract::kQlinearInt8Level)
    throw ContractError(ql::kName, msg::kQlinearAccuracyLevel, {accuracy_level});
  return QuantizedLinearAttributes{MakeLinearAttributes(activation, output_features, outputs, ql::kName),
                                   block_size, accuracy_level};
}

QuantizedLinearGeometry ResolveQuantizedLinear(const QuantizedLinearInputShapes& in,
                                               const QuantizedLinearAttributes& attrs) {
  namespace ql = contract::qlinear;
  const Shape& x = in.shape[ql::kInputInput];
  const Shape& w = in.shape[ql::kInputWeight];
  if (x.size() != 2 || w.size() != 3) throw ContractError(ql::kName, msg::kQlinearRank, {x, w});
  if (x[1] < 1) throw ContractError(ql::kName, msg::kLinearEmptyFeatures, {x[1]});
  const int64_t bs = attrs.block_size, blocks = (x[1] + bs - 1) / bs;
  if (w[1] != blocks || w[2] != bs / 2)
    throw ContractError(ql::kName, msg::kQlinearWeightBlocks, {blocks, bs / 2, x[1], bs, w});
  const int64_t rows = w[0];
  const Shape& scales = in.shape[ql::kInputScales];
  if (scales != Shape{rows, blocks}) throw ContractError(ql::kName, msg::kQlinearScales, {rows, blocks, scales});
  const bool zero_points = in.present[ql::kInputZeroPoints];
  const int64_t zero_point_bytes = (blocks + 1) / 2;
  if (zero_points && in.shape[ql::kInputZeroPoints] != Shape{rows, zero_point_bytes})
    throw ContractError(ql::kName, msg::kQlinearZeroPoints, {rows, zero_point_bytes, in.shape[ql::kInputZeroPoints]});
  const LinearAttributes& a = attrs.linear;
  if (a.swiglu && rows % 2 != 0) throw ContractError(ql::kName, msg::kLinearSwigluRows, {rows});
  const int64_t columns = a.swiglu ? rows / 2 : rows;
  std::vector<int64_t> parts = a.parts.empty() ? std::vector<int64_t>{columns} : a.parts;
  int64_t sum = 0;
  for (int64_t part : parts) sum += part;
  if (sum != columns) throw ContractError(ql::kName, msg::kLinearOutputSum, {rows, Listed(a.parts), sum});
  QuantizedLinearGeometry geo;
  static_cast<LinearGeometry&>(geo) = LinearGeometry{x[0], x[1], columns, a.swiglu, std::move(parts)};
  geo.block_size = bs;
  geo.blocks = blocks;
  geo.zero_points = zero_points;
  return geo;
}

}  // namespace onnx_hybrid
