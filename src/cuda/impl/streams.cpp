// The driver's side of the stream-ordered operations (see streams.hpp).
#include "cuda/impl/streams.hpp"

#include <string>

#include "cuda/impl/devices.hpp"

namespace ferry::cuda::streams {

Status info(const Driver* d, CUstream stream, Cuda::StreamInfo* info) {
  // nullptr is the legacy default stream to the driver (CU_STREAM_LEGACY names it too).
  CUcontext context = nullptr;
  if (CUresult result = d->cuStreamGetCtx(stream, &context); result != CUDA_SUCCESS) {
    const bool by_thread =
        stream == nullptr || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD;
    return Status(Code::kInvalidArgument,
                  std::string(by_thread ? "a default stream names the calling thread's current "
                                          "CUDA context, and it has none (cudaSetDevice first): "
                                        : "not a CUDA stream of this process: ") +
                      error_string(result));
  }
  CUdevice device = -1;
  {
    ScopedContext scope(d, context);
    if (CUresult result = d->cuCtxGetDevice(&device); result != CUDA_SUCCESS) {
      return driver_error("cuCtxGetDevice (of the stream's context)", result);
    }
  }
  info->device = static_cast<int>(device);
  info->graph = nullptr;
  CUstreamCaptureStatus capture = CU_STREAM_CAPTURE_STATUS_NONE;
  CUgraph graph = nullptr;
  if (CUresult result =
          d->cuStreamGetCaptureInfo(stream, &capture, nullptr, &graph, nullptr, nullptr, nullptr);
      result != CUDA_SUCCESS) {
    return driver_error("cuStreamGetCaptureInfo", result);
  }
  if (capture == CU_STREAM_CAPTURE_STATUS_INVALIDATED) {
    return Status(Code::kInvalidArgument,
                  "the stream's graph capture was invalidated by an earlier call (end the capture "
                  "and start again)");
  }
  if (capture == CU_STREAM_CAPTURE_STATUS_ACTIVE) info->graph = graph;
  return Status::ok();
}

Status handoff(const Driver* d, CUstream stream, void* start, void* done, std::uint32_t value,
               bool reset) {
  const auto done_word = reinterpret_cast<CUdeviceptr>(done);
  if (reset) {
    // A replay clears what the last one's completion wrote before it asks again.
    if (CUresult r = d->cuStreamWriteValue32(stream, done_word, 0, 0); r != CUDA_SUCCESS) {
      return driver_error("cuStreamWriteValue32 (on the application's stream)", r);
    }
  }
  // Written with a memory barrier (the default): the proxy that reads `start` then sees every
  // write of the work before it, and the buffers are ready.
  if (CUresult r = d->cuStreamWriteValue32(stream, reinterpret_cast<CUdeviceptr>(start), value, 0);
      r != CUDA_SUCCESS) {
    return driver_error("cuStreamWriteValue32 (on the application's stream)", r);
  }
  return wait(d, stream, done, value);
}

Status wait(const Driver* d, CUstream stream, void* done, std::uint32_t value) {
  if (CUresult r = d->cuStreamWaitValue64(stream, reinterpret_cast<CUdeviceptr>(done), value,
                                          CU_STREAM_WAIT_VALUE_GEQ);
      r != CUDA_SUCCESS) {
    return driver_error("cuStreamWaitValue64 (on the application's stream)", r);
  }
  return Status::ok();
}

Status copy(const Driver* d, CUstream stream, void* dst, const void* src, std::size_t bytes) {
  if (CUresult r = d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                    reinterpret_cast<CUdeviceptr>(src), bytes, stream);
      r != CUDA_SUCCESS) {
    return driver_error("cuMemcpyAsync (on the application's stream)", r);
  }
  return Status::ok();
}

Status retain(const Driver* d, CUgraph graph, void (*release)(void*), void* arg) {
  CUuserObject object = nullptr;
  if (CUresult r =
          d->cuUserObjectCreate(&object, arg, release, 1, CU_USER_OBJECT_NO_DESTRUCTOR_SYNC);
      r != CUDA_SUCCESS) {
    release(arg);  // as where the graph refuses it: the caller's hold goes either way
    return driver_error("cuUserObjectCreate", r);
  }
  // The graph takes our reference: release runs when the graph and its instantiations are gone.
  if (CUresult r = d->cuGraphRetainUserObject(graph, object, 1, CU_GRAPH_USER_OBJECT_MOVE);
      r != CUDA_SUCCESS) {
    d->cuUserObjectRelease(object, 1);  // runs release(arg)
    return driver_error("cuGraphRetainUserObject", r);
  }
  return Status::ok();
}

int exchange_capture_mode(const Driver* d, int mode) {
  auto m = static_cast<CUstreamCaptureMode>(mode < 0 ? CU_STREAM_CAPTURE_MODE_RELAXED : mode);
  d->cuThreadExchangeStreamCaptureMode(&m);
  return static_cast<int>(m);
}

}  // namespace ferry::cuda::streams
