// How the CPU kernels treat fp32 values below the normal range (|x| < FLT_MIN, "subnormals").
//
// Intel cores take a microcode assist of ~100+ cycles for every SSE/AVX multiply or FMA that reads or
// produces a subnormal; decay products of fast-decaying heads underflow all the time, which made the GDN
// engines up to 5-17x slower there than on AMD cores. Each work item of a CPU kernel therefore runs with
// flush-to-zero and denormals-are-zero set on its thread, and puts the thread's previous MXCSR back when
// it ends, so ORT's other kernels (and onnxruntime-genai's host code) on that thread never see the mode.
//
// Flushing is free wherever the contract leaves rounding free (matrix and dot products, gates, norms, the
// chunked engine, conv, attention). The recurrent state update is not free: replays (onnx_hybrid.ops.replay
// and onnxruntime-genai's host replay) compute it in IEEE fp32 with gradual underflow, so the sequential
// engine keeps the state exactly as IEEE arithmetic would (see RecurrentRowArgs and ExactStateStep).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#endif

namespace onnx_hybrid {

class FlushSubnormalsScope {
 public:
#if defined(__x86_64__) || defined(__i386__)
  FlushSubnormalsScope() : saved_(_mm_getcsr()) {
    _mm_setcsr(saved_ | kFlushToZero | kDenormalsAreZero);
    // No load of the work item's inputs may be scheduled before the mode change.
    asm volatile("" ::: "memory");
  }
  ~FlushSubnormalsScope() {
    asm volatile("" ::: "memory");  // every result is stored before the mode goes back
    _mm_setcsr(saved_);
  }

 private:
  static constexpr unsigned kFlushToZero = 1u << 15, kDenormalsAreZero = 1u << 6;
  unsigned saved_;
#else
  // Other architectures: IEEE arithmetic throughout (the kernels' results do not depend on the mode).
  FlushSubnormalsScope() = default;
#endif
  FlushSubnormalsScope(const FlushSubnormalsScope&) = delete;
  FlushSubnormalsScope& operator=(const FlushSubnormalsScope&) = delete;
};

}  // namespace onnx_hybrid
