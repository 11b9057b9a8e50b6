#include "cuda/driver.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

namespace onnx_hybrid {
namespace cuda {
namespace {

using CUresult = int;
using CUdevice = int;
using CUmodule = struct CUmod_st*;

// Values from cuda.h (stable across CUDA releases).
constexpr int kAttrComputeCapabilityMajor = 75;
constexpr int kAttrComputeCapabilityMinor = 76;
constexpr int kAttrMaxSharedMemoryPerBlockOptin = 97;
constexpr int kFuncAttrSharedSizeBytes = 1;  // static shared memory
constexpr int kFuncAttrMaxDynamicSharedSizeBytes = 8;
constexpr int kDefaultSharedMemoryLimit = 48 * 1024;
constexpr unsigned kMaxGridX = 2147483647, kMaxGridYZ = 65535;  // every architecture since sm_30
constexpr int kLaunchAttributeProgrammaticStreamSerialization = 6;
constexpr int kProgrammaticMinArch = 90;
constexpr int kProgrammaticMinDriver = 12030;  // stream capture of programmatic launches into CUDA graphs

// cuda.h's CUlaunchAttribute and CUlaunchConfig (the stub-driver test reads them through cuda.h itself).
struct LaunchAttribute {
  int id;
  union Value {
    char pad[64];
    int programmatic_stream_serialization_allowed;
    void* pointer_alignment;  // some members are pointers
  } value;
};
static_assert(sizeof(LaunchAttribute) == 72 && offsetof(LaunchAttribute, value) == 8, "CUlaunchAttribute");

struct LaunchConfig {
  unsigned grid_x, grid_y, grid_z;
  unsigned block_x, block_y, block_z;
  unsigned shared_mem_bytes;
  CUstream stream;
  const LaunchAttribute* attrs;
  unsigned num_attrs;
};
static_assert(sizeof(LaunchConfig) == 56 && offsetof(LaunchConfig, stream) == 32 &&
                  offsetof(LaunchConfig, attrs) == 40 && offsetof(LaunchConfig, num_attrs) == 48,
              "CUlaunchConfig");

std::atomic<bool> g_programmatic_launch{true};

// Where the library looks for sm<arch>.cubin by itself (library.py names the same two places).
constexpr char kImagesEnv[] = "ONNX_HYBRID_CUDA_IMAGES";
constexpr char kImageFolder[] = "onnx_hybrid_cuda";
constexpr std::uintmax_t kMaxImageBytes = 512u << 20;  // a sanity bound: our images are ~5 MB

// The entry points the launcher uses, resolved once from libcuda.so.1.
struct Driver {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDriverGetVersion)(int*);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuStreamGetCtx)(CUstream, CUcontext*);
  CUresult (*cuCtxGetCurrent)(CUcontext*);
  CUresult (*cuCtxPushCurrent)(CUcontext);
  CUresult (*cuCtxPopCurrent)(CUcontext*);
  CUresult (*cuCtxGetDevice)(CUdevice*);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             CUstream, void**, void**);
  CUresult (*cuLaunchKernelEx)(const LaunchConfig*, CUfunction, void**, void**);  // null before CUDA 11.8
  bool can_capture_programmatic = false;  // cuLaunchKernelEx, and a driver that captures its launches
  std::string error;  // why the driver is unusable; empty when every entry point resolved
};

template <class Fn>
bool Resolve(void* handle, const char* name, Fn* fn, std::string* error) {
  *fn = reinterpret_cast<Fn>(dlsym(handle, name));
  if (!*fn && error->empty()) *error = std::string("onnx_hybrid: libcuda.so.1 has no ") + name;
  return *fn != nullptr;
}

Driver LoadDriver() {
  Driver d{};
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);  // never closed: kernels may run until exit
  if (!handle) {
    const char* why = dlerror();
    d.error = std::string("onnx_hybrid: the CUDA driver (libcuda.so.1) cannot be loaded: ") + (why ? why : "");
    return d;
  }
  Resolve(handle, "cuInit", &d.cuInit, &d.error);
  Resolve(handle, "cuGetErrorString", &d.cuGetErrorString, &d.error);
  Resolve(handle, "cuStreamGetCtx", &d.cuStreamGetCtx, &d.error);
  Resolve(handle, "cuCtxGetCurrent", &d.cuCtxGetCurrent, &d.error);
  Resolve(handle, "cuCtxPushCurrent_v2", &d.cuCtxPushCurrent, &d.error);
  Resolve(handle, "cuCtxPopCurrent_v2", &d.cuCtxPopCurrent, &d.error);
  Resolve(handle, "cuCtxGetDevice", &d.cuCtxGetDevice, &d.error);
  Resolve(handle, "cuDeviceGetAttribute", &d.cuDeviceGetAttribute, &d.error);
  Resolve(handle, "cuModuleLoadData", &d.cuModuleLoadData, &d.error);
  Resolve(handle, "cuModuleGetFunction", &d.cuModuleGetFunction, &d.error);
  Resolve(handle, "cuFuncGetAttribute", &d.cuFuncGetAttribute, &d.error);
  Resolve(handle, "cuFuncSetAttribute", &d.cuFuncSetAttribute, &d.error);
  Resolve(handle, "cuLaunchKernel", &d.cuLaunchKernel, &d.error);
  Resolve(handle, "cuDriverGetVersion", &d.cuDriverGetVersion, &d.error);
  d.cuLaunchKernelEx = reinterpret_cast<decltype(d.cuLaunchKernelEx)>(dlsym(handle, "cuLaunchKernelEx"));
  int version = 0;
  if (d.error.empty() && d.cuLaunchKernelEx && d.cuDriverGetVersion(&version) == 0)
    d.can_capture_programmatic = version >= kProgrammaticMinDriver;
  return d;
}

const Driver& TheDriver() {
  static const Driver* driver = new Driver(LoadDriver());
  if (!driver->error.empty()) throw std::runtime_error(driver->error);
  return *driver;
}

void Check(CUresult result, const char* what) {
  if (result == 0) return;
  const char* text = nullptr;
  if (TheDriver().cuGetErrorString(result, &text) != 0 || !text) text = "unknown error";
  throw std::runtime_error(std::string("onnx_hybrid: ") + what + " failed: " + text + " (CUresult " +
                           std::to_string(result) + ")");
}

// Images by compute capability (10 * major + minor), copied from Python.
struct Images {
  std::mutex mutex;
  std::map<int, std::vector<unsigned char>> by_arch;
};

Images& TheImages() {
  static Images* images = new Images();
  return *images;
}

// "sm_80, sm_90" for the keys of a map by arch.
template <class Map>
std::string ArchList(const Map& by_arch) {
  std::string list;
  for (const auto& entry : by_arch) list += (list.empty() ? "sm_" : ", sm_") + std::to_string(entry.first);
  return list;
}

// A folder the library searches for images, and what it holds: sm<arch>.cubin files by arch.
struct ImageFolder {
  std::string how;   // how the folder was chosen, for messages
  std::string path;  // empty: the variable is not set
  std::map<int, std::filesystem::path> files;
  std::string problem;  // why nothing could be read there (no such folder, ...)
};

// The folder of this library's own file: an export folder's copy finds the images exported beside it.
std::filesystem::path LibraryFolder() {
  Dl_info info{};
  if (!dladdr(reinterpret_cast<const void*>(&LibraryFolder), &info) || !info.dli_fname) return {};
  std::error_code ec;
  const auto file = std::filesystem::weakly_canonical(info.dli_fname, ec);
  return ec ? std::filesystem::path(info.dli_fname).parent_path() : file.parent_path();
}

ImageFolder Scan(std::string how, std::string path) {
  ImageFolder folder{std::move(how), std::move(path), {}, {}};
  if (folder.path.empty()) {
    folder.problem = "not set";
    return folder;
  }
  std::error_code ec;
  std::filesystem::directory_iterator it(folder.path, ec), end;
  if (ec) {
    folder.problem = ec.value() == ENOENT ? "no such folder" : "unreadable: " + ec.message();
    return folder;
  }
  for (; it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    int arch = 0;  // sm<arch>.cubin exactly (sm80.cubin, sm100.cubin): the name written back must match
    if (std::sscanf(name.c_str(), "sm%d", &arch) != 1 || arch < 10 || arch > 999 ||
        name != "sm" + std::to_string(arch) + ".cubin")
      continue;
    folder.files.emplace(arch, it->path());
  }
  if (folder.files.empty()) folder.problem = "no sm<arch>.cubin";
  return folder;
}

// $ONNX_HYBRID_CUDA_IMAGES, then <library folder>/onnx_hybrid_cuda, scanned now.
std::vector<ImageFolder> ScanImageFolders() {
  const char* env = std::getenv(kImagesEnv);
  const std::filesystem::path beside = LibraryFolder();
  return {Scan(std::string("$") + kImagesEnv, env ? env : ""),
          Scan("beside the library", beside.empty() ? "" : (beside / kImageFolder).string())};
}

std::vector<unsigned char> ReadImage(const std::filesystem::path& file) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(file, ec);
  if (ec || size == 0 || size > kMaxImageBytes)
    throw std::runtime_error("onnx_hybrid: " + file.string() + " is not a usable CUDA kernel image (size " +
                             (ec ? ec.message() : std::to_string(size) + " bytes") + ")");
  std::ifstream in(file, std::ios::binary);
  std::vector<unsigned char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (!in.good() && !in.eof()) throw std::runtime_error("onnx_hybrid: cannot read " + file.string());
  if (data.size() < 4 || std::memcmp(data.data(), "\x7f" "ELF", 4) != 0)
    throw std::runtime_error("onnx_hybrid: " + file.string() + " is not a cubin (no ELF header); write it with "
                             "`onnx-hybrid prepare-cuda`");
  return data;
}

// The image that runs on major.minor among `by_arch`: the same major, the highest minor not above the
// device's (a cubin runs on later minors of its major; an sm_90a one only on 9.0). Null when none does.
template <class Map>
const typename Map::value_type* BestFor(const Map& by_arch, int major, int minor) {
  const typename Map::value_type* best = nullptr;
  for (const auto& entry : by_arch)
    if (entry.first / 10 == major && entry.first % 10 <= minor) best = &entry;
  return best;
}

}  // namespace

// The image loaded into one context, and the functions looked up in it. Contexts are the devices'
// primary contexts, which live as long as the process, so entries are never dropped.
struct ContextModule {
  CUmodule module = nullptr;
  DeviceInfo device{};
  bool programmatic = false;  // the device and driver support programmatic dependent launch
  std::mutex mutex;
  struct Function {
    std::string name;
    CUfunction handle;
    int smem_limit;  // dynamic shared memory the function may take now
  };
  // A dozen kernels at most, looked up on every launch: a scan by name allocates nothing.
  std::vector<Function> functions;
};

namespace {

// The image for a device: one handed over through onnx_hybrid_set_cuda_image, else one found in the image
// folders (read now, kept from then on), else an error that says where it looked and how to make one.
const std::vector<unsigned char>& ImageFor(int major, int minor) {
  Images& images = TheImages();
  std::lock_guard<std::mutex> lock(images.mutex);
  if (const auto* best = BestFor(images.by_arch, major, minor)) return best->second;  // never erased
  const std::vector<ImageFolder> folders = ScanImageFolders();
  for (const ImageFolder& folder : folders)
    if (const auto* file = BestFor(folder.files, major, minor))
      return images.by_arch.emplace(file->first, ReadImage(file->second)).first->second;
  const std::string sm = std::to_string(10 * major + minor);
  std::string looked;
  for (const ImageFolder& folder : folders)
    looked += (looked.empty() ? "" : "; ") + folder.how + (folder.path.empty() ? "" : " (" + folder.path + ")") +
              ": " + (folder.files.empty() ? folder.problem : "holds " + ArchList(folder.files));
  const std::string handed = images.by_arch.empty() ? "none" : ArchList(images.by_arch);
  const std::string target = folders.back().path.empty() ? "<folder>" : folders.back().path;
  throw std::runtime_error(
      "onnx_hybrid: no CUDA kernel image for this GPU's architecture sm_" + sm + ". Looked in " + looked +
      "; handed over by onnx_hybrid.ops.library.prepare_cuda(): " + handed + ". Prepare one with `onnx-hybrid "
      "prepare-cuda --arch " + sm + " -o " + target + "` (needs CuPy and NVRTC, no GPU), or export with "
      "`export-hybrid ... -e cuda --cuda-arch " + sm + "`");
}

ContextModule* ModuleFor(const Driver& d, CUcontext context) {
  static std::mutex* mutex = new std::mutex();
  static auto* modules = new std::map<CUcontext, ContextModule*>();
  std::lock_guard<std::mutex> lock(*mutex);
  auto found = modules->find(context);
  if (found != modules->end()) return found->second;
  CUdevice device = 0;
  Check(d.cuCtxGetDevice(&device), "cuCtxGetDevice");
  int major = 0, minor = 0, smem = 0;
  Check(d.cuDeviceGetAttribute(&major, kAttrComputeCapabilityMajor, device), "cuDeviceGetAttribute");
  Check(d.cuDeviceGetAttribute(&minor, kAttrComputeCapabilityMinor, device), "cuDeviceGetAttribute");
  Check(d.cuDeviceGetAttribute(&smem, kAttrMaxSharedMemoryPerBlockOptin, device), "cuDeviceGetAttribute");
  auto entry = std::make_unique<ContextModule>();
  Check(d.cuModuleLoadData(&entry->module, ImageFor(major, minor).data()), "cuModuleLoadData");
  entry->device = DeviceInfo{10 * major + minor, smem};
  entry->programmatic = entry->device.arch >= kProgrammaticMinArch && d.can_capture_programmatic;
  ContextModule* module = entry.release();
  (*modules)[context] = module;
  return module;
}

CUfunction FunctionFor(const Driver& d, ContextModule& m, const char* name, int smem) {
  std::lock_guard<std::mutex> lock(m.mutex);
  auto found = std::find_if(m.functions.begin(), m.functions.end(),
                            [&](const ContextModule::Function& f) { return f.name == name; });
  if (found == m.functions.end()) {
    CUfunction f = nullptr;
    const CUresult r = d.cuModuleGetFunction(&f, m.module, name);
    if (r != 0) Check(r, (std::string("cuModuleGetFunction(") + name + ")").c_str());
    // Without the opt-in, static and dynamic shared memory together stay within 48 KB.
    int static_smem = 0;
    Check(d.cuFuncGetAttribute(&static_smem, kFuncAttrSharedSizeBytes, f), "cuFuncGetAttribute(SHARED_SIZE_BYTES)");
    found = m.functions.insert(m.functions.end(),
                               ContextModule::Function{name, f, kDefaultSharedMemoryLimit - static_smem});
  }
  if (smem > found->smem_limit) {
    Check(d.cuFuncSetAttribute(found->handle, kFuncAttrMaxDynamicSharedSizeBytes, smem),
          "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)");
    found->smem_limit = smem;
  }
  return found->handle;
}

}  // namespace

bool SetImage(int cc_major, int cc_minor, const void* data, size_t size, std::string* error) {
  if (cc_major <= 0 || cc_major > 99 || cc_minor < 0 || cc_minor > 9 || !data || size == 0) {
    *error = "onnx_hybrid_set_cuda_image: needs a compute capability (major 1-99, minor 0-9) and a non-empty image";
    return false;
  }
  const auto* bytes = static_cast<const unsigned char*>(data);
  const int arch = 10 * cc_major + cc_minor;
  Images& images = TheImages();
  std::lock_guard<std::mutex> lock(images.mutex);
  auto found = images.by_arch.find(arch);
  if (found == images.by_arch.end()) {
    images.by_arch.emplace(arch, std::vector<unsigned char>(bytes, bytes + size));
    return true;
  }
  if (found->second.size() == size && std::memcmp(found->second.data(), bytes, size) == 0) return true;
  *error = "onnx_hybrid_set_cuda_image: a different image is already set for sm_" + std::to_string(arch) +
           " (images are never replaced; restart the process to use new kernels)";
  return false;
}

void SetProgrammaticLaunch(bool enabled) { g_programmatic_launch.store(enabled); }

std::string ImageList() {
  Images& images = TheImages();
  std::lock_guard<std::mutex> lock(images.mutex);
  return ArchList(images.by_arch);
}

bool HasImageFor(int cc_major, int cc_minor) {
  Images& images = TheImages();
  std::lock_guard<std::mutex> lock(images.mutex);
  if (BestFor(images.by_arch, cc_major, cc_minor)) return true;
  for (const ImageFolder& folder : ScanImageFolders())
    if (BestFor(folder.files, cc_major, cc_minor)) return true;
  return false;
}

Launcher::Launcher(void* ort_stream) : stream_(static_cast<CUstream>(ort_stream)) {
  const Driver& d = TheDriver();
  static const CUresult init = d.cuInit(0);  // ORT initialised the driver already; this is a formality
  Check(init, "cuInit");
  CUcontext context = nullptr;
  Check(d.cuStreamGetCtx(stream_, &context), "cuStreamGetCtx");
  CUcontext current = nullptr;
  Check(d.cuCtxGetCurrent(&current), "cuCtxGetCurrent");
  if (current != context) {  // ORT's CUDA EP thread normally has it current already: two driver calls saved
    Check(d.cuCtxPushCurrent(context), "cuCtxPushCurrent");
    pushed_ = true;
  }
  try {
    module_ = ModuleFor(d, context);
  } catch (...) {
    CUcontext popped = nullptr;
    if (pushed_) d.cuCtxPopCurrent(&popped);
    throw;
  }
  device_ = &module_->device;
}

Launcher::~Launcher() {
  if (!pushed_) return;
  CUcontext popped = nullptr;
  TheDriver().cuCtxPopCurrent(&popped);
}

void Launcher::Launch(const char* kernel, Dim3 grid, Dim3 block, int smem, const void* params) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0) return;  // nothing to do (e.g. no tokens)
  if (grid.x > kMaxGridX || grid.y > kMaxGridYZ || grid.z > kMaxGridYZ)  // the driver would only say "invalid"
    throw std::runtime_error(std::string("onnx_hybrid: ") + kernel + " needs a grid of " + std::to_string(grid.x) +
                             " x " + std::to_string(grid.y) + " x " + std::to_string(grid.z) +
                             " blocks, beyond CUDA's limit of " + std::to_string(kMaxGridX) + " x " +
                             std::to_string(kMaxGridYZ) + " x " + std::to_string(kMaxGridYZ) +
                             "; split the call into smaller batches");
  const Driver& d = TheDriver();
  CUfunction f = FunctionFor(d, *module_, kernel, smem);
  void* args[] = {const_cast<void*>(params)};
  if (module_->programmatic && g_programmatic_launch.load(std::memory_order_relaxed)) {
    LaunchAttribute attr{};
    attr.id = kLaunchAttributeProgrammaticStreamSerialization;
    attr.value.programmatic_stream_serialization_allowed = 1;
    const LaunchConfig config{grid.x, grid.y, grid.z, block.x, block.y, block.z, static_cast<unsigned>(smem),
                              stream_, &attr, 1};
    const CUresult r = d.cuLaunchKernelEx(&config, f, args, nullptr);
    if (r != 0) Check(r, (std::string("cuLaunchKernelEx(") + kernel + ")").c_str());
    return;
  }
  const CUresult r = d.cuLaunchKernel(f, grid.x, grid.y, grid.z, block.x, block.y, block.z,
                                      static_cast<unsigned>(smem), stream_, args, nullptr);
  if (r != 0) Check(r, (std::string("cuLaunchKernel(") + kernel + ")").c_str());
}

}  // namespace cuda
}  // namespace onnx_hybrid
