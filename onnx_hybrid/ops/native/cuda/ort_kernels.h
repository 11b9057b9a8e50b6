// The CUDA variants of GatedDeltaNet and VarlenCausalConvWithState: the same validation as the CPU
// kernels (shapes and attributes through shapes/gdn_shapes and shapes/conv_shapes, same messages), then the kernels of
// onnx_hybrid.cuda_ops enqueued on ORT's compute stream. Offsets and capture counts stay on the device
// (docs/op-contract.md#engine-selection, rule 4): nothing here reads device memory or synchronises with the host.
#pragma once

#include "shapes/conv_shapes.h"
#include "shapes/gdn_shapes.h"
#include "shapes/linear_shapes.h"
#include "ort/ort_api.h"

namespace onnx_hybrid {

constexpr char kCudaProvider[] = "CUDAExecutionProvider";

class GdnCudaKernel {
 public:
  GdnCudaKernel(const OrtKernelInfo* info, ElemType type);
  ~GdnCudaKernel();
  GdnCudaKernel(const GdnCudaKernel&) = delete;
  GdnCudaKernel& operator=(const GdnCudaKernel&) = delete;
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  ElemType type_;
  GdnAttributes attrs_;
  OrtAllocator* allocator_ = nullptr;  // the EP's device allocator: the chunked engine's workspace
};

class ConvCudaKernel {
 public:
  ConvCudaKernel(const OrtKernelInfo* info, ElemType type);
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  ElemType type_;
  ConvAttributes attrs_;
};

// Linear: LinearRows for a one-row call (a batch-1 decode step), cuBLAS (ORT's handle) for the rest (with swiglu
// into fp32 scratch, then linear_swiglu_*).
class LinearCudaKernel {
 public:
  LinearCudaKernel(const OrtKernelInfo* info, ElemType type);
  ~LinearCudaKernel();
  LinearCudaKernel(const LinearCudaKernel&) = delete;
  LinearCudaKernel& operator=(const LinearCudaKernel&) = delete;
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  ElemType type_;
  LinearAttributes attrs_;
  OrtAllocator* allocator_ = nullptr;  // the cuBLAS path's fp32 sums with swiglu
};

// QuantizedLinear: the tensor-core kernel (weights read once) up to kQlinearMaxRowTiles * 8 rows, else the weight
// dequantized into scratch and Linear's cuBLAS path.
class QuantizedLinearCudaKernel {
 public:
  QuantizedLinearCudaKernel(const OrtKernelInfo* info, ElemType type);
  ~QuantizedLinearCudaKernel();
  QuantizedLinearCudaKernel(const QuantizedLinearCudaKernel&) = delete;
  QuantizedLinearCudaKernel& operator=(const QuantizedLinearCudaKernel&) = delete;
  OrtStatusPtr ComputeV2(OrtKernelContext* context);

 private:
  ElemType type_;
  QuantizedLinearAttributes attrs_;
  OrtAllocator* allocator_ = nullptr;  // the dequantized weight and fp32 sums of the cuBLAS path
};

}  // namespace onnx_hybrid
