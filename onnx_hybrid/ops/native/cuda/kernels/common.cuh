// Shared device helpers of every kernel in this image; the parameter structs are in params.cuh.
#pragma once
#include <cuda_fp16.h>
#include <cuda_bf16.h>

#include "launch_config.h"
#include "params.cuh"

namespace ohk {

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// Two fp32 values as one 32-bit word of T (round to nearest even), a in the low half: one conversion per pair.
template <typename T>
__device__ __forceinline__ unsigned pack2(float a, float b);
template <>
__device__ __forceinline__ unsigned pack2<__half>(float a, float b) {
  const __half2 x = __floats2half2_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&x);
}
template <>
__device__ __forceinline__ unsigned pack2<__nv_bfloat16>(float a, float b) {
  const __nv_bfloat162 x = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const unsigned*>(&x);
}

__device__ __forceinline__ unsigned smem_addr(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

// Global -> shared copies (cp.async, sm_80+) of 16, 8 or 4 bytes, zero-filled when !valid (src is then not
// read). Commit and wait clobber memory, so shared-memory reads stay after the wait even where no barrier
// follows (the recurrent kernel's per-warp stage).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 8 : 0));
}
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N>  // at most N of this thread's committed groups still pending
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory"); }

// 16-byte shared-memory load and global store, spelled out: with uint4 assignments through cast pointers
// ptxas split some of the stores into four 4-byte ones.
__device__ __forceinline__ uint4 ld_shared_v4(unsigned smem_address) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem_address)
               : "memory");
  return v;
}
// Stores only if `valid` (a predicated store: no branch around it).
__device__ __forceinline__ void st_global_v4(void* p, uint4 v, bool valid) {
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %5, 0;\n@p st.global.v4.b32 [%0], {%1,%2,%3,%4};\n}\n" ::"l"(p),
               "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w), "r"((int)valid)
               : "memory");
}
// A global load of a 2- or 4-byte element issued only if `valid` (zero otherwise), as one predicated load in
// straight-line code: a conditional load in C++ becomes a branch around it where the address costs a few
// instructions, and ptxas waited for loads in flight at such branches (the recurrent kernel's start,
// docs/design-notes.md#block-start-loads-issued-together). `volatile` keeps it after griddepcontrol.wait
// (wait_for_inputs), which is too; only for data the kernel does not write.
template <typename T>
__device__ __forceinline__ T ld_global_if(const T* p, bool valid) {
  static_assert(sizeof(T) == 2 || sizeof(T) == 4, "2- or 4-byte elements");
  if constexpr (sizeof(T) == 2) {
    unsigned short raw;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nmov.b16 %0, 0;\n@p ld.global.u16 %0, [%1];\n}\n"
                 : "=h"(raw)
                 : "l"(p), "r"((int)valid));
    return *reinterpret_cast<const T*>(&raw);
  } else {
    unsigned raw;
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\nmov.b32 %0, 0;\n@p ld.global.u32 %0, [%1];\n}\n"
                 : "=r"(raw)
                 : "l"(p), "r"((int)valid));
    return *reinterpret_cast<const T*>(&raw);
  }
}

// Named CTA barriers (ids 1-15; 0 is __syncthreads'), counting `threads` arrivals (a multiple of 32, whole
// warps). arrive does not wait and publishes this thread's earlier memory operations (release); sync waits
// for the count and sees what the arriving threads published (acquire): a producer/consumer hand-off.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_barrier_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Programmatic dependent launch (sm_90+; the launchers set the attribute). Under it a kernel's blocks may
// start while the kernel before it in the stream still runs, so every kernel calls wait_for_inputs() first,
// in every thread, before any early return: a grid whose threads all returned without waiting could complete
// before its predecessor, and the kernel after it would then wait on nothing. Only index arithmetic may
// precede it. No kernel triggers its dependents early (griddepcontrol.launch_dependents); each block's exit
// does. On the H200 decode B=1 took 5.2 us so, and 5.8 us with a trigger right after the wait
// (docs/design-notes.md#programmatic-dependent-launch).
// Under a plain launch, and below sm_90, the wait does nothing.
__device__ __forceinline__ void wait_for_inputs() {
#if __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

struct RowSpan {
  int start;
  int len;
};

// Row b's raw offsets (cu_seqlens[b] and [b + 1]), loaded apart from row_span's arithmetic: a kernel can then
// issue their load with its other inputs and wait for all of them at once (row_offsets: predicated loads, zeros
// without offsets).
struct RowOffsets {
  int begin, end;
};
__device__ __forceinline__ RowOffsets row_offsets(const int* cu, int b) {
  return {ld_global_if(cu + b, cu != nullptr), ld_global_if(cu + b + 1, cu != nullptr)};
}
// Offsets stay on the device. Malformed ones are contained, never trusted
// (docs/op-contract.md#zero-length-requests-and-malformed-offsets):
// start = clamp(cu[b], 0, T), end = max(start, clamp(cu[b+1], 0, T)).
__device__ __forceinline__ RowSpan row_span(const int* cu, RowOffsets o, int uniform_len, int b, int total) {
  if (cu == nullptr) return {b * uniform_len, uniform_len};
  const int s = min(max(o.begin, 0), total);
  const int e = max(s, min(max(o.end, 0), total));
  return {s, e - s};
}
__device__ __forceinline__ RowSpan row_span(const int* cu, int uniform_len, int b, int total) {
  if (cu == nullptr) return {b * uniform_len, uniform_len};
  return row_span(cu, RowOffsets{cu[b], cu[b + 1]}, uniform_len, b, total);
}

}  // namespace ohk


// Rows the chunked engine leaves to the sequential one, decided on the device (rules 1 and 2 of
// docs/op-contract.md#engine-selection).
#ifndef OHK_SEQUENTIAL_MIN_TOKENS  // the contract's SEQUENTIAL_MIN_TOKENS, passed by cuda_ops/compiler.py
#error "compile with -DOHK_SEQUENTIAL_MIN_TOKENS=<onnx_hybrid.ops.contract.SEQUENTIAL_MIN_TOKENS>"
#endif
__device__ __forceinline__ bool gdn_row_is_sequential(const GdnParams& p, int b, int len) {
  const bool captured = p.capacity > 0 && p.capture_active && p.capture_count[b] > 0;
  return captured || len < OHK_SEQUENTIAL_MIN_TOKENS;
}

// Row b's raw capture count where capture is on (else 0; a predicated load), apart from the arithmetic of
// gdn_captured_prefix (see row_offsets).
__device__ __forceinline__ int gdn_capture_count(const GdnParams& p, int b) {
  return ohk::ld_global_if(p.capture_count + b, p.capacity > 0 && p.capture_active);
}
// The captured prefix of a row of `len` tokens whose capture count is `count`.
__device__ __forceinline__ int gdn_captured_prefix(const GdnParams& p, int count, int len) {
  if (p.capacity <= 0 || !p.capture_active) return 0;
  return max(0, min(count, min(p.capacity, len)));
}

// Element i of decay or beta (`base`): fp32, or with gates_act the activation type T widened, as a Cast node
// before the op would (docs/op-contract.md#gateddeltanet-inputs-and-outputs).
template <typename T>
__device__ __forceinline__ float gdn_gate(const GdnParams& p, const float* base, size_t i) {
  return p.gates_act ? ohk::to_f32(reinterpret_cast<const T*>(base)[i]) : base[i];
}
// The same as a predicated load in straight-line code (ld_global_if), kept as raw bits (0 where `valid` is false)
// in one register whatever the gate type: the fp32 word, or the 16-bit T zero-extended; gdn_gate_from_bits widens
// it where it is used. Two loads of two types held two registers and spilled in the verify kernels (ptxas, sm_90).
template <typename T>
__device__ __forceinline__ unsigned gdn_gate_bits_if(const GdnParams& p, const float* base, size_t i, bool valid) {
  if constexpr (sizeof(T) == 4) {
    return __float_as_uint(ohk::ld_global_if(base + i, valid));
  } else {
    const bool act = p.gates_act;
    const char* at = reinterpret_cast<const char*>(base) + (i << (act ? 1 : 2));
    unsigned raw;
    asm volatile(
        "{\n.reg .pred w, n;\nsetp.ne.b32 w, %2, 0;\nsetp.ne.b32 n, %3, 0;\nmov.b32 %0, 0;\n"
        "@w ld.global.u32 %0, [%1];\n@n ld.global.u16 %0, [%1];\n}\n"
        : "=r"(raw)
        : "l"(at), "r"((int)(valid && !act)), "r"((int)(valid && act)));
    return raw;
  }
}
template <typename T>
__device__ __forceinline__ float gdn_gate_from_bits(const GdnParams& p, unsigned raw) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(raw);
  } else {
    const unsigned short narrow = static_cast<unsigned short>(raw);
    return p.gates_act ? ohk::to_f32(*reinterpret_cast<const T*>(&narrow)) : __uint_as_float(raw);
  }
}

// Log-space gate g of (token, value head, key column r) in fp32 (docs/op-contract.md#sequential-definition).
template <typename T>
__device__ __forceinline__ float gdn_log_gate(const GdnParams& p, int tok, int h, int r) {
  const float x = gdn_gate<T>(p, p.decay, p.decay_per_key ? ((size_t)tok * p.hv + h) * p.dk + r
                                                          : (size_t)tok * p.hv + h);
  if (!p.gate_qwen) return x;
  const float z = x + p.dt_bias[h];
  const float softplus = z > 20.0f ? z : log1pf(expf(z));
  return -expf(p.a_log[h]) * softplus;
}

// Capsule block offsets inside one row (docs/op-contract.md#capsule-layout).
__device__ __forceinline__ size_t gdn_capsule_row(const GdnParams& p) {
  return (size_t)p.capacity * (p.hv + (size_t)p.hk * p.dk + (size_t)p.hv * p.dv);
}
__device__ __forceinline__ size_t gdn_capsule_key(const GdnParams& p) { return (size_t)p.capacity * p.hv; }
__device__ __forceinline__ size_t gdn_capsule_delta(const GdnParams& p) {
  return (size_t)p.capacity * (p.hv + (size_t)p.hk * p.dk);
}

