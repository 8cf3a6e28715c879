// Loads libcuda.so.1 once per process. Nothing here is called unless CUDA is wanted, so a machine
// without a driver pays nothing but one failed dlopen.
#include "cuda/driver.hpp"

#include <cudaTypedefs.h>
#include <dlfcn.h>

#include <mutex>
#include <type_traits>

namespace ferry::cuda {
namespace {

// The versions in FERRY_CUDA_DRIVER_FUNCTIONS name the prototypes cuda.h declares.
#define FERRY_CUDA_DRIVER_CHECK(name, version)                              \
  static_assert(std::is_same_v<decltype(&::name), PFN_##name##_v##version>, \
                #name " is not declared with the signature of version " #version);
FERRY_CUDA_DRIVER_FUNCTIONS(FERRY_CUDA_DRIVER_CHECK)
#undef FERRY_CUDA_DRIVER_CHECK

struct Loaded {
  Driver driver;
  bool ok = false;
  std::string why;
};

using GetProcAddress = CUresult (*)(const char*, void**, int, cuuint64_t,
                                    CUdriverProcAddressQueryResult*);

Loaded load() {
  Loaded loaded;
  void* library = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* error = dlerror();
    loaded.why = std::string("no CUDA driver: dlopen(libcuda.so.1) failed: ") +
                 (error != nullptr ? error : "unknown error");
    return loaded;
  }
  // The library stays open for the life of the process: driver state outlives any Context.
  // A tool that interposes on the driver (compute-sanitizer preloads one) must see our calls:
  // prefer the entry points visible to the whole process, then the library's own.
  auto lookup = [library](const char* name) {
    void* symbol = dlsym(RTLD_DEFAULT, name);
    return symbol != nullptr ? symbol : dlsym(library, name);
  };
  auto get_proc = reinterpret_cast<GetProcAddress>(lookup("cuGetProcAddress_v2"));
  auto get_version =
      reinterpret_cast<decltype(&::cuDriverGetVersion)>(lookup("cuDriverGetVersion"));
  if (get_proc == nullptr || get_version == nullptr) {
    loaded.why = "CUDA driver too old: libcuda.so.1 has no cuGetProcAddress_v2 (needs CUDA 12+)";
    return loaded;
  }
  Driver& d = loaded.driver;
  if (get_version(&d.version) != CUDA_SUCCESS) {
    loaded.why = "cuDriverGetVersion failed";
    return loaded;
  }
  // Ask for each entry point at the version of its prototype in cuda.h: the driver returns the
  // newest variant not newer than that, which is exactly the one declared (a driver older than
  // the variant says so, and its name joins the missing ones).
  std::string missing;
#define FERRY_CUDA_DRIVER_LOAD(name, version)                                                      \
  {                                                                                                \
    void* pointer = nullptr;                                                                       \
    CUdriverProcAddressQueryResult found{};                                                        \
    if (get_proc(#name, &pointer, version, CU_GET_PROC_ADDRESS_DEFAULT, &found) == CUDA_SUCCESS && \
        pointer != nullptr) {                                                                      \
      d.name = reinterpret_cast<decltype(d.name)>(pointer);                                        \
    } else {                                                                                       \
      missing += missing.empty() ? #name : ", " #name;                                             \
    }                                                                                              \
  }
  FERRY_CUDA_DRIVER_FUNCTIONS(FERRY_CUDA_DRIVER_LOAD)
#undef FERRY_CUDA_DRIVER_LOAD
  if (!missing.empty()) {
    loaded.why = "CUDA driver " + std::to_string(d.version) + " lacks " + missing;
    return loaded;
  }
  CUresult result = d.cuInit(0);
  if (result != CUDA_SUCCESS) {
    // Also what a machine with a driver but no usable GPU says (CUDA_ERROR_NO_DEVICE).
    const char* name = nullptr;
    d.cuGetErrorName(result, &name);
    loaded.why = std::string("cuInit failed: ") + (name != nullptr ? name : "unknown error");
    return loaded;
  }
  if (d.cuDeviceGetCount(&d.device_count) != CUDA_SUCCESS || d.device_count == 0) {
    loaded.why = "the CUDA driver sees no device";
    return loaded;
  }
  loaded.ok = true;
  return loaded;
}

}  // namespace

const Driver* driver(std::string* why) {
  static const Loaded loaded = load();
  if (!loaded.ok) {
    if (why != nullptr) *why = loaded.why;
    return nullptr;
  }
  return &loaded.driver;
}

std::string error_string(CUresult result) {
  const Driver* d = driver();
  const char* name = nullptr;
  const char* text = nullptr;
  if (d != nullptr) {
    d->cuGetErrorName(result, &name);
    d->cuGetErrorString(result, &text);
  }
  std::string out = name != nullptr ? name : "CUDA error " + std::to_string(result);
  if (text != nullptr) out += std::string(" (") + text + ")";
  return out;
}

}  // namespace ferry::cuda
