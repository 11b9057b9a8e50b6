// The CUDA driver API without CUDA headers or a link dependency (docs/native-library.md#driver-api-without-headers):
// opaque handle types, the images (cubins) Python hands over or the library finds on disk, and a launcher
// that loads them into the context of ORT's stream and enqueues kernels there. libcuda.so.1 is dlopen'ed on
// the first launch.
#pragma once

#include <cstddef>
#include <string>

namespace onnx_hybrid {
namespace cuda {

using CUstream = struct CUstream_st*;
using CUcontext = struct CUctx_st*;
using CUfunction = struct CUfunc_st*;

struct Dim3 {
  unsigned x, y, z;
};

// Stores a copy of `data` as the image for compute capability major.minor. Returns false (and says why
// in *error) for an empty image or when a different image is already set for that capability: a module
// loaded from the first one may be live in some context, and two sources of truth would be a bug.
bool SetImage(int cc_major, int cc_minor, const void* data, size_t size, std::string* error);

// Programmatic dependent launch (on by default): launches carry CUDA's programmatic stream serialization
// attribute where the device is sm_90+ and the driver captures such launches into graphs (CUDA >= 12.3), so a
// kernel's blocks may start while the kernel before it finishes (each kernel waits for its inputs first).
// False launches every kernel plainly. Applies from the next launch on, in every context.
void SetProgrammaticLaunch(bool enabled);

// The compute capabilities that have an image, as "sm_80, sm_90" (empty when none).
std::string ImageList();

// Whether a device of compute capability major.minor would get an image: one handed over, or one in the folders
// the library searches ($ONNX_HYBRID_CUDA_IMAGES, then onnx_hybrid_cuda/ beside the library file), by the rule
// the launcher itself applies.
bool HasImageFor(int cc_major, int cc_minor);

// The device behind the stream's context, as the plans need it.
struct DeviceInfo {
  int arch;        // 10 * major + minor
  int smem_optin;  // opt-in shared memory per block, bytes
};

// One Compute call's view of the driver: makes the stream's context current for the call (pushed on
// construction and popped on destruction, every path, errors included, unless it is current already).
// Every failure throws std::runtime_error with the driver's own text; nothing here synchronises with the host.
class Launcher {
 public:
  explicit Launcher(void* ort_stream);
  ~Launcher();
  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  const DeviceInfo& device() const { return *device_; }
  // Launches `kernel` (an extern "C" name of the image) with one by-value parameter struct.
  void Launch(const char* kernel, Dim3 grid, Dim3 block, int smem, const void* params);

 private:
  CUstream stream_;
  struct ContextModule* module_ = nullptr;
  const DeviceInfo* device_ = nullptr;
  bool pushed_ = false;
};

}  // namespace cuda
}  // namespace onnx_hybrid
