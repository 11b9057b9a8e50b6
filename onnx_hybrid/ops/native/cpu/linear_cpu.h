// Linear on the CPU (docs/op-contract.md#linear): fp32 dot products (with swiglu SiLU(gate) * up of them) rounded
// once to T, each output element the same whatever the rows beside it; parallel over tiles of output features.
#pragma once

#include "common.h"
#include "cpu/qlinear_int8.h"
#include "shapes/linear_shapes.h"

namespace onnx_hybrid {

// `outputs`: one per geo.parts entry, [rows, parts[j]] each.
void RunLinearCpu(const LinearGeometry& geo, ElemType type, const void* input, const void* weight,
                  void* const* outputs, const ParallelFor& parallel);

// QuantizedLinear: the same products over the dequantized weight, each element T((q - zero_point) * scale).
// `zero_points` may be null (8).
void RunQuantizedLinearCpu(const QuantizedLinearGeometry& geo, ElemType type, const void* input,
                           const uint8_t* weight, const void* scales, const uint8_t* zero_points,
                           void* const* outputs, const ParallelFor& parallel);

// QuantizedLinear at accuracy level 4: the input rows quantized to int8 per chunk, products over `weight` (packed
// from the node's weight, scales and zero points) in integers; a row's output is the same whatever rows share the call.
void RunQuantizedLinearInt8Cpu(const QuantizedLinearGeometry& geo, ElemType type, const void* input,
                               const Int8Weight& weight, void* const* outputs, const ParallelFor& parallel);

}  // namespace onnx_hybrid
