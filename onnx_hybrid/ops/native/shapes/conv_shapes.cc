#include "shapes/conv_shapes.h"

namespace onnx_hybrid {
namespace {
namespace cv = contract::conv;
namespace msg = contract::msg;
constexpr const char* kOp = cv::kName;
}  // namespace

ConvAttributes MakeConvAttributes(const std::string& activation, int64_t dilation, int64_t capacity) {
  bool allowed = false;
  for (const char* a : cv::kAllowedActivation) allowed = allowed || activation == a;
  if (!allowed) throw ContractError(kOp, msg::kConvActivation, {activation});
  if (dilation < cv::kMinDilation || dilation > cv::kMaxDilation) throw ContractError(kOp, msg::kConvDilation, {dilation});
  if (capacity < cv::kMinStateUpdateCapacity || capacity > cv::kMaxStateUpdateCapacity)
    throw ContractError(kOp, msg::kCapacity, {capacity});
  ConvAttributes a;
  a.silu = activation != "none";  // silu and swish are both z * sigmoid(z)
  a.dilation = dilation;
  a.capacity = static_cast<int>(capacity);
  return a;
}

ConvGeometry ResolveConv(const ConvInputShapes& in, const ConvAttributes& attrs) {
  auto has = [&](int i) { return in.present[i]; };
  if (!has(cv::kInputCumulativeSequenceLength)) throw ContractError(kOp, msg::kConvCuRequired);
  if (!has(cv::kInputInitialState)) throw ContractError(kOp, msg::kConvStateRequired);
  const Shape& x = in.shape[cv::kInputInput];
  const Shape& w = in.shape[cv::kInputWeight];
  const Shape& cu = in.shape[cv::kInputCumulativeSequenceLength];
  const Shape& state = in.shape[cv::kInputInitialState];
  if (x.size() != 2) throw ContractError(kOp, msg::kConvInputRank, {int64_t(x.size())});
  if (cu.size() != 1) throw ContractError(kOp, msg::kConvCuRank, {int64_t(cu.size())});
  if (w.size() != 3) throw ContractError(kOp, msg::kConvWeightRank, {int64_t(w.size())});
  if (cu[0] < 2) throw ContractError(kOp, msg::kConvCuSize, {cu[0]});
  const int64_t total = x[0], ch = x[1];
  if (ch <= 0) throw ContractError(kOp, msg::kConvChannels, {ch});
  const int64_t kernel = w[2];
  if (kernel <= 0) throw ContractError(kOp, msg::kConvKernelSize, {kernel});
  if (w[0] != ch) throw ContractError(kOp, msg::kConvWeightChannels, {ch, w[0]});
  if (w[1] != 1) throw ContractError(kOp, msg::kConvWeightMiddle, {w[1]});
  if (has(cv::kInputBias) && in.shape[cv::kInputBias] != Shape{ch})
    throw ContractError(kOp, msg::kConvBiasShape, {Shape{ch}, in.shape[cv::kInputBias]});
  const int64_t batch = cu[0] - 1;
  const int64_t sl = (kernel - 1) * attrs.dilation;
  if (state != Shape{batch, ch, sl}) throw ContractError(kOp, msg::kConvStateShape, {Shape{batch, ch, sl}, state});
  if (total < batch) throw ContractError(kOp, msg::kConvTokensVsBatch, {total, batch});
  const bool has_cc = has(cv::kInputCaptureCount);
  if (has_cc != (attrs.capacity > 0))
    throw ContractError(kOp, msg::kCapturePresence, {int64_t(attrs.capacity), has_cc ? "present" : "absent"});
  if (has_cc && in.shape[cv::kInputCaptureCount] != Shape{batch})
    throw ContractError(kOp, msg::kConvCaptureShape, {Shape{batch}, in.shape[cv::kInputCaptureCount]});
  return ConvGeometry{batch, total, ch, kernel, sl, attrs.capacity};
}

std::vector<RequestRow> ConvRows(const ConvGeometry& geo, const int32_t* cu) {
  const int64_t b_count = geo.batch;
  if (cu[0] != 0 || cu[b_count] != geo.total_tokens)
    throw ContractError(kOp, msg::kConvCuBounds, {b_count, geo.total_tokens, int64_t(cu[0]), int64_t(cu[b_count])});
  std::vector<RequestRow> rows(static_cast<size_t>(b_count));
  for (int64_t b = 0; b < b_count; ++b) {
    if (cu[b + 1] < cu[b])
      throw ContractError(kOp, msg::kConvCuOrder, {b + 1, int64_t(cu[b + 1]), b, int64_t(cu[b])});
    rows[b] = {cu[b], int64_t(cu[b + 1]) - cu[b]};
  }
  return rows;
}

}  // namespace onnx_hybrid
