// The copy engine's own rates on one GPU, the reference the host-staged path is measured against
// (bench/gpu_run.sh guard): device -> pinned host, pinned host -> device, and pinned host ->
// pinned host by the copy engine and by one CPU thread's memcpy; for host memory from
// cuMemHostAlloc and for shared memory registered with cuMemHostRegister, as the staging rings
// are; and both directions at once. Run: build/bench/pinned_rate [DEVICE] [MiB]. Prints one line
// per copy: GB/s (10^9 B/s), the best of 5 passes of 8 copies.
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "cuda/driver.hpp"

namespace {

const ferry::cuda::Driver* d = nullptr;

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "pinned_rate: %s failed (%d)\n", what, static_cast<int>(result));
    std::exit(1);
  }
}

double seconds_now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

template <typename Copy>
double best_rate(std::size_t bytes, Copy copy) {
  double best = 0;
  for (int pass = 0; pass < 5; ++pass) {
    const double start = seconds_now();
    for (int i = 0; i < 8; ++i) copy();
    const double rate = 8.0 * static_cast<double>(bytes) / (seconds_now() - start) / 1e9;
    best = std::max(best, rate);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const int ordinal = argc > 1 ? std::atoi(argv[1]) : 0;
  const std::size_t bytes = (argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 64) << 20;
  std::string why;
  d = ferry::cuda::driver(&why);
  if (d == nullptr) {
    std::printf("pinned_rate: no CUDA: %s\n", why.c_str());
    return 77;
  }
  CUdevice device;
  CUcontext context;
  check(d->cuDeviceGet(&device, ordinal), "cuDeviceGet");
  check(d->cuDevicePrimaryCtxRetain(&context, device), "cuDevicePrimaryCtxRetain");
  check(d->cuCtxSetCurrent(context), "cuCtxSetCurrent");
  CUstream stream;
  check(d->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
  CUdeviceptr gpu = 0;
  check(d->cuMemAlloc(&gpu, bytes), "cuMemAlloc");
  check(d->cuMemsetD8(gpu, 1, bytes), "cuMemsetD8");
  void* alloc[2] = {nullptr, nullptr};
  for (void*& p : alloc) check(d->cuMemHostAlloc(&p, bytes, 0), "cuMemHostAlloc");
  void* shared[2] = {nullptr, nullptr};
  for (void*& p : shared) {
    p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 1;
    std::memset(p, 2, bytes);
    check(d->cuMemHostRegister(p, bytes, 0), "cuMemHostRegister");
  }
  auto engine = [&](void* to, const void* from) {
    return [&, to, from] {
      check(d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(to), reinterpret_cast<CUdeviceptr>(from),
                             bytes, stream),
            "cuMemcpyAsync");
      check(d->cuStreamSynchronize(stream), "cuStreamSynchronize");
    };
  };
  void* device_pointer = reinterpret_cast<void*>(gpu);
  const char* kinds[] = {"cuMemHostAlloc", "registered shared memory"};
  void** hosts[] = {alloc, shared};
  for (int k = 0; k < 2; ++k) {
    void** h = hosts[k];
    std::printf(
        "%-25s %5zu MiB: d2h %.1f GB/s, h2d %.1f GB/s, h2h by the copy engine %.1f GB/s, "
        "h2h by memcpy %.1f GB/s\n",
        kinds[k], bytes >> 20, best_rate(bytes, engine(h[0], device_pointer)),
        best_rate(bytes, engine(device_pointer, h[0])), best_rate(bytes, engine(h[1], h[0])),
        best_rate(bytes, [&] { std::memcpy(h[1], h[0], bytes); }));
  }
  // Both directions at once (host to device on one stream, device to host on another), as the
  // staged path's copy of page-locked memory through its process's GPU runs them: each
  // direction's rate while the other is busy.
  {
    CUstream back;
    check(d->cuStreamCreate(&back, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    CUdeviceptr second = 0;
    check(d->cuMemAlloc(&second, bytes), "cuMemAlloc");
    const double rate = best_rate(bytes, [&] {
      check(d->cuMemcpyAsync(gpu, reinterpret_cast<CUdeviceptr>(alloc[0]), bytes, stream),
            "cuMemcpyAsync");
      check(d->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(alloc[1]), second, bytes, back),
            "cuMemcpyAsync");
      check(d->cuStreamSynchronize(stream), "cuStreamSynchronize");
      check(d->cuStreamSynchronize(back), "cuStreamSynchronize");
    });
    std::printf("%-25s %5zu MiB: h2d and d2h at once %.1f GB/s each way\n", "cuMemHostAlloc",
                bytes >> 20, rate);
  }
  // The peer copy over the GPUs' link, where there is another GPU (the one-sided and IPC paths'
  // reference).
  if (d->device_count > 1) {
    const int other = (ordinal + 1) % d->device_count;
    CUdevice peer_device;
    CUcontext peer_context;
    check(d->cuDeviceGet(&peer_device, other), "cuDeviceGet");
    check(d->cuDevicePrimaryCtxRetain(&peer_context, peer_device), "cuDevicePrimaryCtxRetain");
    check(d->cuCtxSetCurrent(peer_context), "cuCtxSetCurrent");
    CUdeviceptr far = 0;
    check(d->cuMemAlloc(&far, bytes), "cuMemAlloc (peer)");
    check(d->cuCtxSetCurrent(context), "cuCtxSetCurrent");
    // Direct over the link (without peer access the driver stages the copy through the host).
    const CUresult enabled = d->cuCtxEnablePeerAccess(peer_context, 0);
    if (enabled != CUDA_SUCCESS && enabled != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
      check(enabled, "cuCtxEnablePeerAccess");
    }
    std::printf("%-25s %5zu MiB: cuda:%d -> cuda:%d %.1f GB/s\n", "peer copy", bytes >> 20, ordinal,
                other, best_rate(bytes, engine(reinterpret_cast<void*>(far), device_pointer)));
  }
  return 0;
}
