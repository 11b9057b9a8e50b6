// cuBLAS without headers or a link dependency: Linear's calls of more rows than LinearRows serves go to the
// cuBLAS that ORT's CUDA execution provider has loaded, on the handle ORT lends the kernel (bound to its compute
// stream), as ORT's own Gemm does.
#pragma once

#include <cstdint>

#include "common.h"

namespace onnx_hybrid {
namespace cublas {

// y [rows, out] = x [rows, in] @ w^T for w [out, in], x and w of `type`, y of `y_type` (`type`, or float for
// sums that a later kernel reads), accumulated in fp32, enqueued on the handle's stream. Throws
// std::runtime_error naming the failure (no cuBLAS in the process, a cuBLAS status).
void LinearGemm(void* handle, ElemType type, const void* x, const void* w, void* y, int64_t rows, int64_t in,
                int64_t out, ElemType y_type);

}  // namespace cublas
}  // namespace onnx_hybrid
