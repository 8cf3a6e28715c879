// The CUDA driver, opened at run time with dlopen (libcuda.so.1) so that libferry builds and runs
// on machines without a GPU. Every entry point is fetched once through cuGetProcAddress at the
// ABI of the cuda.h this file was compiled against (or the driver's, when that is older).
#pragma once

#include <cuda.h>

#include <string>

namespace ferry::cuda {

// X(name): every driver function ferry calls. The pointer types come from cuda.h's prototypes,
// so a call through the table is type-checked like a direct call.
#define FERRY_CUDA_DRIVER_FUNCTIONS(X)      \
  X(cuInit)                                 \
  X(cuDriverGetVersion)                     \
  X(cuGetErrorString)                       \
  X(cuGetErrorName)                         \
  X(cuDeviceGetCount)                       \
  X(cuDeviceGet)                            \
  X(cuDeviceGetName)                        \
  X(cuDeviceGetUuid)                        \
  X(cuDeviceGetAttribute)                   \
  X(cuDeviceCanAccessPeer)                  \
  X(cuDevicePrimaryCtxRetain)               \
  X(cuDevicePrimaryCtxRelease)              \
  X(cuCtxSetCurrent)                        \
  X(cuCtxGetCurrent)                        \
  X(cuCtxGetDevice)                         \
  X(cuCtxSynchronize)                       \
  X(cuPointerGetAttribute)                  \
  X(cuPointerGetAttributes)                 \
  X(cuMemGetAddressRange)                   \
  X(cuMemGetInfo)                           \
  X(cuMemAlloc)                             \
  X(cuMemFree)                              \
  X(cuMemAllocManaged)                      \
  X(cuMemHostAlloc)                         \
  X(cuMemFreeHost)                          \
  X(cuMemHostRegister)                      \
  X(cuMemHostUnregister)                    \
  X(cuMemHostGetDevicePointer)              \
  X(cuMemcpy)                               \
  X(cuMemcpyAsync)                          \
  X(cuMemsetD8)                             \
  X(cuStreamCreate)                         \
  X(cuStreamDestroy)                        \
  X(cuStreamSynchronize)                    \
  X(cuStreamQuery)                          \
  X(cuEventCreate)                          \
  X(cuEventDestroy)                         \
  X(cuEventRecord)                          \
  X(cuEventQuery)                           \
  X(cuEventSynchronize)                     \
  X(cuEventElapsedTime)                     \
  X(cuStreamWriteValue32)                   \
  X(cuModuleLoadData)                       \
  X(cuModuleUnload)                         \
  X(cuModuleGetFunction)                    \
  X(cuLaunchKernel)                         \
  X(cuFuncGetAttribute)                     \
  X(cuIpcGetMemHandle)                      \
  X(cuIpcOpenMemHandle)                     \
  X(cuIpcCloseMemHandle)                    \
  X(cuMemGetAllocationGranularity)          \
  X(cuMemCreate)                            \
  X(cuMemRelease)                           \
  X(cuMemAddressReserve)                    \
  X(cuMemAddressFree)                       \
  X(cuMemMap)                               \
  X(cuMemUnmap)                             \
  X(cuMemSetAccess)                         \
  X(cuMemRetainAllocationHandle)            \
  X(cuMemGetAllocationPropertiesFromHandle) \
  X(cuMemExportToShareableHandle)           \
  X(cuMemImportFromShareableHandle)

struct Driver {
#define FERRY_CUDA_DRIVER_MEMBER(name) decltype(&::name) name = nullptr;
  FERRY_CUDA_DRIVER_FUNCTIONS(FERRY_CUDA_DRIVER_MEMBER)
#undef FERRY_CUDA_DRIVER_MEMBER
  int version = 0;       // cuDriverGetVersion, e.g. 13000
  int device_count = 0;  // after cuInit
};

// The driver, loaded and initialised on first call; null when there is none (no libcuda.so.1, no
// device, cuInit failed, FERRY_CUDA=0 …), and then *why says which. Thread-safe.
const Driver* driver(std::string* why = nullptr);

// "CUDA_ERROR_INVALID_VALUE (invalid argument)"
std::string error_string(CUresult result);

}  // namespace ferry::cuda
