#include "cuda/cublas.h"

#include <dlfcn.h>

#include <limits>
#include <stdexcept>
#include <string>

namespace onnx_hybrid {
namespace cublas {
namespace {

// The values of cuBLAS's and CUDA's public enums that the call uses (cublas_api.h, library_types.h).
constexpr int kOpN = 0, kOpT = 1;
constexpr int kR32F = 0, kR16F = 2, kR16BF = 14;
constexpr int kCompute32F = 68;
constexpr int kGemmDefault = -1;

using GemmEx = int (*)(void* handle, int transa, int transb, int m, int n, int k, const void* alpha, const void* a,
                       int a_type, int lda, const void* b, int b_type, int ldb, const void* beta, void* c, int c_type,
                       int ldc, int compute_type, int algo);

struct Library {
  GemmEx gemm_ex = nullptr;
  std::string error;
};

// The cuBLAS ORT loaded (RTLD_NOLOAD: never a second copy beside it); never closed.
Library Load() {
  Library lib;
  for (const char* name : {"libcublas.so.13", "libcublas.so.12", "libcublas.so.11"}) {
    if (void* handle = dlopen(name, RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD)) {
      lib.gemm_ex = reinterpret_cast<GemmEx>(dlsym(handle, "cublasGemmEx"));
      if (!lib.gemm_ex) lib.error = std::string("onnx_hybrid: ") + name + " has no cublasGemmEx";
      return lib;
    }
  }
  lib.error = "onnx_hybrid: Linear needs the cuBLAS of ORT's CUDA execution provider, but none of "
              "libcublas.so.13/.12/.11 is loaded in this process";
  return lib;
}

int CudaType(ElemType type) {
  return type == ElemType::kFloat16 ? kR16F : type == ElemType::kBFloat16 ? kR16BF : kR32F;
}

}  // namespace

void LinearGemm(void* handle, ElemType type, const void* x, const void* w, void* y, int64_t rows, int64_t in,
                int64_t out, ElemType y_type) {
  static const Library lib = Load();
  if (!lib.gemm_ex) throw std::runtime_error(lib.error);
  constexpr int64_t kMax = std::numeric_limits<int>::max();
  if (rows > kMax || in > kMax || out > kMax)
    throw std::runtime_error("onnx_hybrid: Linear dimensions must fit in int32 for cuBLAS; got rows " +
                             std::to_string(rows) + ", in_features " + std::to_string(in) + ", out_features " +
                             std::to_string(out));
  // Column-major view: y^T [out, rows] = (w viewed [in, out])^T @ x^T [in, rows].
  const float alpha = 1.0f, beta = 0.0f;
  const int t = CudaType(type);
  const int status = lib.gemm_ex(handle, kOpT, kOpN, static_cast<int>(out), static_cast<int>(rows),
                                 static_cast<int>(in), &alpha, w, t, static_cast<int>(in), x, t, static_cast<int>(in),
                                 &beta, y, CudaType(y_type), static_cast<int>(out), kCompute32F, kGemmDefault);
  if (status != 0) throw std::runtime_error("onnx_hybrid: cublasGemmEx failed with status " + std::to_string(status));
}

}  // namespace cublas
}  // namespace onnx_hybrid
