// The CUDA driver, opened at run time with dlopen (libcuda.so.1) so that libferry builds and runs
// on machines without a GPU. Every entry point is fetched once through cuGetProcAddress, at the
// version whose signature is the one cuda.h declares for its name.
#pragma once

#include <cuda.h>

#include <string>

namespace ferry::cuda {

// X(name, version): every driver function ferry calls (the graph calls at the end for its tools and
// tests), and the CUDA version that introduced the
// signature cuda.h gives that name. The version matters: asked for at 13000, "cuCtxSynchronize"
// is cuCtxSynchronize_v2(CUcontext), not the cuCtxSynchronize(void) that cuda.h declares, and a
// call through the wrong type passes a garbage context. The pointer types come from cuda.h's
// prototypes, so a call through the table is type-checked like a direct call, and driver.cpp
// checks each pair against cudaTypedefs.h's PFN_<name>_v<version> at compile time.
#define FERRY_CUDA_DRIVER_FUNCTIONS(X)             \
  X(cuInit, 2000)                                  \
  X(cuDriverGetVersion, 2020)                      \
  X(cuGetErrorString, 6000)                        \
  X(cuGetErrorName, 6000)                          \
  X(cuDeviceGetCount, 2000)                        \
  X(cuDeviceGet, 2000)                             \
  X(cuDeviceGetName, 2000)                         \
  X(cuDeviceGetUuid, 11040)                        \
  X(cuDeviceGetAttribute, 2000)                    \
  X(cuDeviceCanAccessPeer, 4000)                   \
  X(cuDevicePrimaryCtxRetain, 7000)                \
  X(cuDevicePrimaryCtxRelease, 11000)              \
  X(cuCtxSetCurrent, 4000)                         \
  X(cuCtxGetCurrent, 4000)                         \
  X(cuCtxGetDevice, 2000)                          \
  X(cuCtxSynchronize, 2000)                        \
  X(cuCtxEnablePeerAccess, 4000)                   \
  X(cuPointerGetAttribute, 4000)                   \
  X(cuPointerGetAttributes, 7000)                  \
  X(cuMemGetAddressRange, 3020)                    \
  X(cuMemGetInfo, 3020)                            \
  X(cuMemAlloc, 3020)                              \
  X(cuMemFree, 3020)                               \
  X(cuMemAllocManaged, 6000)                       \
  X(cuMemHostAlloc, 2020)                          \
  X(cuMemFreeHost, 2000)                           \
  X(cuMemHostRegister, 6050)                       \
  X(cuMemHostUnregister, 4000)                     \
  X(cuMemHostGetDevicePointer, 3020)               \
  X(cuMemcpy, 4000)                                \
  X(cuMemcpyAsync, 4000)                           \
  X(cuMemsetD8, 3020)                              \
  X(cuMemsetD8Async, 3020)                         \
  X(cuStreamCreate, 2000)                          \
  X(cuStreamDestroy, 4000)                         \
  X(cuStreamSynchronize, 2000)                     \
  X(cuStreamWaitEvent, 3020)                       \
  X(cuStreamQuery, 2000)                           \
  X(cuEventCreate, 2000)                           \
  X(cuEventDestroy, 4000)                          \
  X(cuEventRecord, 2000)                           \
  X(cuEventQuery, 2000)                            \
  X(cuEventSynchronize, 2000)                      \
  X(cuEventElapsedTime, 12080)                     \
  X(cuStreamWriteValue32, 11070)                   \
  X(cuStreamWaitValue64, 11070)                    \
  X(cuStreamGetCtx, 9020)                          \
  X(cuStreamGetCaptureInfo, 12030)                 \
  X(cuThreadExchangeStreamCaptureMode, 10010)      \
  X(cuUserObjectCreate, 11030)                     \
  X(cuGraphRetainUserObject, 11030)                \
  X(cuUserObjectRelease, 11030)                    \
  X(cuStreamBeginCapture, 10010)                   \
  X(cuStreamEndCapture, 10000)                     \
  X(cuGraphInstantiateWithFlags, 11040)            \
  X(cuGraphLaunch, 10000)                          \
  X(cuGraphExecDestroy, 10000)                     \
  X(cuGraphDestroy, 10000)                         \
  X(cuModuleLoadData, 2000)                        \
  X(cuModuleUnload, 2000)                          \
  X(cuModuleGetFunction, 2000)                     \
  X(cuLaunchKernel, 4000)                          \
  X(cuFuncGetAttribute, 2020)                      \
  X(cuIpcGetMemHandle, 4010)                       \
  X(cuIpcOpenMemHandle, 11000)                     \
  X(cuIpcCloseMemHandle, 4010)                     \
  X(cuMemGetAllocationGranularity, 10020)          \
  X(cuMemCreate, 10020)                            \
  X(cuMemRelease, 10020)                           \
  X(cuMemAddressReserve, 10020)                    \
  X(cuMemAddressFree, 10020)                       \
  X(cuMemMap, 10020)                               \
  X(cuMemUnmap, 10020)                             \
  X(cuMemSetAccess, 10020)                         \
  X(cuMemRetainAllocationHandle, 11000)            \
  X(cuMemGetAllocationPropertiesFromHandle, 10020) \
  X(cuMemExportToShareableHandle, 10020)           \
  X(cuMemImportFromShareableHandle, 10020)

struct Driver {
#define FERRY_CUDA_DRIVER_MEMBER(name, version) decltype(&::name) name = nullptr;
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
