// Measures the CUDA driver primitives that ferry's device paths are built from, so that each
// choice in src/cuda and the cuda_ipc transport rests on a number taken on the GPU machine:
// pointer queries, small and large copies by the copy engine, completion polling, IPC handle
// export/open. Build: bench/cuda_probe.sh. Run: cuda_probe [device_a device_b].
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "cuda/driver.hpp"

namespace {

const ferry::cuda::Driver* d = nullptr;
CUfunction copy_kernel = nullptr;
CUfunction mailbox_kernel = nullptr;
unsigned* host_flag = nullptr;  // pinned, device-mapped
CUdeviceptr blocks_done = 0;
unsigned flag_value = 0;

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, ferry::cuda::error_string(r).c_str());
    std::exit(1);
  }
}

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

CUcontext context_for(int ordinal) {
  CUdevice dev;
  check(d->cuDeviceGet(&dev, ordinal), "cuDeviceGet");
  CUcontext ctx;
  check(d->cuDevicePrimaryCtxRetain(&ctx, dev), "retain");
  check(d->cuCtxSetCurrent(ctx), "set current");
  return ctx;
}

void wait_event(CUevent e) {
  while (d->cuEventQuery(e) == CUDA_ERROR_NOT_READY) {
  }
}

// Median-free simple mean over many iterations: these are µs-scale costs, noise is small.
double time_copy(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s, CUevent e, int n) {
  for (int i = 0; i < 10; ++i) {
    check(d->cuMemcpyAsync(dst, src, bytes, s), "copy");
    check(d->cuEventRecord(e, s), "record");
    wait_event(e);
  }
  double t0 = now_us();
  for (int i = 0; i < n; ++i) {
    check(d->cuMemcpyAsync(dst, src, bytes, s), "copy");
    check(d->cuEventRecord(e, s), "record");
    wait_event(e);
  }
  return (now_us() - t0) / n;
}

void load_kernel(const char* path) {
  FILE* f = std::fopen(path, "rb");
  if (f == nullptr) {
    std::printf("no fatbin at %s\n", path);
    return;
  }
  std::vector<char> image(1 << 20);
  image.resize(std::fread(image.data(), 1, image.size(), f));
  std::fclose(f);
  CUmodule module;
  check(d->cuModuleLoadData(&module, image.data()), "module load");
  check(d->cuModuleGetFunction(&copy_kernel, module, "ferry_copy"), "get function");
  check(d->cuModuleGetFunction(&mailbox_kernel, module, "ferry_mailbox"), "get function");
  void* flag = nullptr;
  check(d->cuMemHostAlloc(&flag, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
        "flag alloc");
  host_flag = static_cast<unsigned*>(flag);
  *host_flag = 0;
  check(d->cuMemAlloc(&blocks_done, 4), "counter");
  check(d->cuMemsetD8(blocks_done, 0, 4), "counter zero");
}

// Kernel copy, completion seen by polling the host flag the last block writes.
double time_kernel(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s, int n) {
  if (copy_kernel == nullptr) return -1;
  unsigned blocks = static_cast<unsigned>(std::min<size_t>((bytes + 65535) / 65536, 264));
  if (blocks == 0) blocks = 1;
  auto once = [&] {
    unsigned value = ++flag_value;
    CUdeviceptr flag_dev = reinterpret_cast<CUdeviceptr>(host_flag);
    void* args[] = {&src, &dst, &bytes, &blocks_done, &flag_dev, &value};
    check(d->cuLaunchKernel(copy_kernel, blocks, 1, 1, 256, 1, 1, 0, s, args, nullptr), "launch");
    while (__atomic_load_n(host_flag, __ATOMIC_ACQUIRE) != value) {
    }
  };
  for (int i = 0; i < 10; ++i) once();
  double t0 = now_us();
  for (int i = 0; i < n; ++i) once();
  return (now_us() - t0) / n;
}

// Copy engine, completion written by cuStreamWriteValue32 to the host flag.
double time_ce_flag(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s, int n) {
  if (host_flag == nullptr) return -1;
  auto once = [&] {
    unsigned value = ++flag_value;
    check(d->cuMemcpyAsync(dst, src, bytes, s), "copy");
    check(d->cuStreamWriteValue32(s, reinterpret_cast<CUdeviceptr>(host_flag), value, 0),
          "write value");
    while (__atomic_load_n(host_flag, __ATOMIC_ACQUIRE) != value) {
    }
  };
  for (int i = 0; i < 10; ++i) once();
  double t0 = now_us();
  for (int i = 0; i < n; ++i) once();
  return (now_us() - t0) / n;
}

// Resident kernel: post a copy in host memory, wait for its done flag; no launch per copy.
double time_mailbox(CUdeviceptr dst, CUdeviceptr src, size_t bytes, int n) {
  if (mailbox_kernel == nullptr) return -1;
  void* raw = nullptr;
  check(d->cuMemHostAlloc(&raw, 4096, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE),
        "mailbox alloc");
  std::memset(raw, 0, 4096);
  auto* post = static_cast<unsigned*>(raw);
  auto* args = reinterpret_cast<unsigned long long*>(static_cast<char*>(raw) + 64);
  auto* done = reinterpret_cast<unsigned*>(static_cast<char*>(raw) + 128);
  auto* stop = reinterpret_cast<unsigned*>(static_cast<char*>(raw) + 192);
  CUstream s;
  check(d->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "stream");
  void* kargs[] = {&post, &args, &done, &stop};
  check(d->cuLaunchKernel(mailbox_kernel, 1, 1, 1, 256, 1, 1, 0, s, kargs, nullptr), "launch");
  unsigned seq = 0;
  auto once = [&] {
    args[0] = src;
    args[1] = dst;
    args[2] = bytes;
    __atomic_store_n(post, ++seq, __ATOMIC_RELEASE);
    while (__atomic_load_n(done, __ATOMIC_ACQUIRE) != seq) {
    }
  };
  for (int i = 0; i < 100; ++i) once();
  double t0 = now_us();
  for (int i = 0; i < n; ++i) once();
  double us = (now_us() - t0) / n;
  __atomic_store_n(stop, 1u, __ATOMIC_RELEASE);
  check(d->cuStreamSynchronize(s), "mailbox stop");
  d->cuStreamDestroy(s);
  d->cuMemFreeHost(raw);
  return us;
}

double time_sync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, CUstream s, int n, bool stream) {
  for (int i = 0; i < 10; ++i) check(d->cuMemcpy(dst, src, bytes), "sync copy");
  double t0 = now_us();
  for (int i = 0; i < n; ++i) {
    if (stream) {
      check(d->cuMemcpyAsync(dst, src, bytes, s), "copy");
      check(d->cuStreamSynchronize(s), "sync");
    } else {
      check(d->cuMemcpy(dst, src, bytes), "sync copy");
    }
  }
  return (now_us() - t0) / n;
}

void compare_methods(const char* what, CUdeviceptr dst, CUdeviceptr src, CUstream s, CUevent e) {
  for (size_t bytes : {size_t(8), size_t(4096), size_t(65536), size_t(1) << 20, size_t(4) << 20}) {
    int n = bytes <= 65536 ? 5000 : 500;
    double ev = time_copy(dst, src, bytes, s, e, n);
    double ce = time_ce_flag(dst, src, bytes, s, n);
    double k = time_kernel(dst, src, bytes, s, n);
    double sy = time_sync(dst, src, bytes, s, n, false);
    double ss = time_sync(dst, src, bytes, s, n, true);
    double mb = bytes <= 65536 ? time_mailbox(dst, src, bytes, n) : -1;
    std::printf(
        "%s %8zu B: CE+event %.2f, CE+flag %.2f, kernel+flag %.2f, cuMemcpy %.2f, "
        "CE+StreamSync %.2f, resident kernel %.2f us\n",
        what, bytes, ev, ce, k, sy, ss, mb);
  }
}

void pointer_queries(CUdeviceptr dev, void* host, void* pinned) {
  CUpointer_attribute attrs[] = {
      CU_POINTER_ATTRIBUTE_MEMORY_TYPE,    CU_POINTER_ATTRIBUTE_BUFFER_ID,
      CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
      CU_POINTER_ATTRIBUTE_RANGE_SIZE,     CU_POINTER_ATTRIBUTE_IS_MANAGED};
  unsigned type = 0;
  unsigned long long id = 0;
  int ordinal = -1;
  void* start = nullptr;
  size_t size = 0;
  int managed = 0;
  void* values[] = {&type, &id, &ordinal, &start, &size, &managed};
  struct Case {
    const char* name;
    CUdeviceptr p;
  } cases[] = {{"device", dev},
               {"host malloc", reinterpret_cast<CUdeviceptr>(host)},
               {"host pinned", reinterpret_cast<CUdeviceptr>(pinned)}};
  for (const Case& c : cases) {
    const int n = 200000;
    double t0 = now_us();
    for (int i = 0; i < n; ++i) d->cuPointerGetAttributes(6, attrs, values, c.p);
    double six = (now_us() - t0) / n * 1000;
    t0 = now_us();
    for (int i = 0; i < n; ++i) d->cuPointerGetAttribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, c.p);
    double one = (now_us() - t0) / n * 1000;
    d->cuPointerGetAttributes(6, attrs, values, c.p);
    std::printf(
        "pointer query %-12s: 6 attributes %.0f ns, buffer id alone %.0f ns (type %u ordinal %d "
        "managed %d range %zu)\n",
        c.name, six, one, type, ordinal, managed, size);
  }
}

const char* fatbin_path = "kernels.fatbin";

void ipc_child(int ordinal, int in, int out) {
  std::string why;
  d = ferry::cuda::driver(&why);
  if (d == nullptr) {
    std::fprintf(stderr, "child: %s\n", why.c_str());
    std::exit(1);
  }
  context_for(ordinal);
  load_kernel(fatbin_path);
  CUipcMemHandle handle;
  if (read(in, &handle, sizeof handle) != sizeof handle) std::exit(2);
  double t0 = now_us();
  CUdeviceptr mapped;
  check(d->cuIpcOpenMemHandle(&mapped, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), "open");
  double open_us = now_us() - t0;
  CUdeviceptr mapped2;
  CUresult again = d->cuIpcOpenMemHandle(&mapped2, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  std::printf(
      "ipc open (device %d): %.1f us; second open of the same handle: %s%s\n", ordinal, open_us,
      ferry::cuda::error_string(again).c_str(),
      again == CUDA_SUCCESS ? (mapped2 == mapped ? " same pointer" : " other pointer") : "");
  if (again == CUDA_SUCCESS) d->cuIpcCloseMemHandle(mapped2);
  CUdeviceptr local;
  const size_t big = size_t(1) << 30;
  check(d->cuMemAlloc(&local, big), "alloc");
  CUstream s;
  check(d->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "stream");
  CUevent e;
  check(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "event");
  compare_methods("ipc peer->local", local, mapped, s, e);
  for (size_t bytes : {size_t(65536), size_t(4) << 20, size_t(64) << 20, big}) {
    int n = bytes >= (size_t(64) << 20) ? 20 : 200;
    double us = time_copy(local, mapped, bytes, s, e, n);
    std::printf("ipc copy %10zu B: %.1f us  %.1f GB/s\n", bytes, us, bytes / us / 1000);
  }
  check(d->cuIpcCloseMemHandle(mapped), "close");
  char done = 1;
  if (write(out, &done, 1) != 1) std::exit(3);
  std::exit(0);
}

}  // namespace

int main(int argc, char** argv) {
  int a = argc > 1 ? std::atoi(argv[1]) : 0;
  int b = argc > 2 ? std::atoi(argv[2]) : 0;
  if (argc > 3) fatbin_path = argv[3];
  int to_child[2], to_parent[2];
  if (pipe(to_child) != 0 || pipe(to_parent) != 0) return 1;
  pid_t child = fork();  // before any CUDA call: a forked child cannot use the parent's driver
  if (child == 0) ipc_child(b, to_child[0], to_parent[1]);

  std::string why;
  double t0 = now_us();
  d = ferry::cuda::driver(&why);
  if (d == nullptr) {
    std::printf("no CUDA: %s\n", why.c_str());
    return 1;
  }
  std::printf("driver %d, %d devices, load+cuInit %.0f ms\n", d->version, d->device_count,
              (now_us() - t0) / 1000);
  for (int i = 0; i < d->device_count; ++i) {
    CUdevice dev;
    d->cuDeviceGet(&dev, i);
    char name[128];
    d->cuDeviceGetName(name, sizeof name, dev);
    CUuuid uuid;
    d->cuDeviceGetUuid(&uuid, dev);
    std::printf("device %d: %s uuid %02x%02x%02x%02x…", i, name, uuid.bytes[0] & 0xff,
                uuid.bytes[1] & 0xff, uuid.bytes[2] & 0xff, uuid.bytes[3] & 0xff);
    for (int j = 0; j < d->device_count; ++j) {
      int can = 0;
      CUdevice other;
      d->cuDeviceGet(&other, j);
      if (j != i) d->cuDeviceCanAccessPeer(&can, dev, other);
      if (j != i) std::printf(" peer %d:%d", j, can);
    }
    std::printf("\n");
  }
  context_for(a);
  const size_t big = size_t(1) << 30;
  CUdeviceptr dev, dev2;
  check(d->cuMemAlloc(&dev, big), "alloc");
  check(d->cuMemAlloc(&dev2, big), "alloc");
  check(d->cuMemsetD8(dev, 7, big), "memset");
  std::vector<char> host(size_t(64) << 20);
  void* pinned = nullptr;
  check(d->cuMemHostAlloc(&pinned, size_t(64) << 20, 0), "host alloc");
  pointer_queries(dev, host.data(), pinned);
  load_kernel(fatbin_path);

  CUstream s;
  check(d->cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), "stream");
  CUevent e;
  check(d->cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), "event");
  auto P = [](void* p) { return reinterpret_cast<CUdeviceptr>(p); };
  compare_methods("d2d same device", dev2, dev, s, e);
  {
    CUstream s2;
    check(d->cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), "stream");
    const int n = 20000;
    double t = now_us();
    for (int i = 0; i < n; ++i) d->cuEventQuery(e);
    std::printf("cuEventQuery (complete event): %.3f us\n", (now_us() - t) / n);
    t = now_us();
    for (int i = 0; i < n; ++i) d->cuStreamQuery(s2);
    std::printf("cuStreamQuery (idle stream): %.3f us\n", (now_us() - t) / n);
    t = now_us();
    for (int i = 0; i < n; ++i) d->cuEventRecord(e, s2);
    std::printf("cuEventRecord: %.3f us\n", (now_us() - t) / n);
  }
  std::printf("d2h 8 B pinned: %.2f us\n", time_copy(P(pinned), dev, 8, s, e, 20000));
  std::printf("h2d 8 B pinned: %.2f us\n", time_copy(dev, P(pinned), 8, s, e, 20000));
  std::printf("d2h 8 B pageable: %.2f us\n", time_copy(P(host.data()), dev, 8, s, e, 20000));
  std::printf("h2d 8 B pageable: %.2f us\n", time_copy(dev, P(host.data()), 8, s, e, 20000));
  {
    double t = now_us();
    for (int i = 0; i < 20000; ++i) check(d->cuMemcpy(dev2, dev, 8), "sync copy");
    std::printf("cuMemcpy (sync) d2d 8 B: %.2f us\n", (now_us() - t) / 20000);
    t = now_us();
    for (int i = 0; i < 20000; ++i) check(d->cuMemcpy(P(pinned), dev, 8), "sync copy");
    std::printf("cuMemcpy (sync) d2h 8 B pinned: %.2f us\n", (now_us() - t) / 20000);
  }
  for (size_t bytes : {size_t(1) << 20, size_t(4) << 20, size_t(64) << 20}) {
    double d2h = time_copy(P(pinned), dev, bytes, s, e, 50);
    double h2d = time_copy(dev, P(pinned), bytes, s, e, 50);
    std::printf("pinned %8zu B: d2h %.1f GB/s h2d %.1f GB/s\n", bytes, bytes / d2h / 1000,
                bytes / h2d / 1000);
  }
  double d2d = time_copy(dev2, dev, big, s, e, 10);
  std::printf("d2d 1 GiB same device: %.1f GB/s (bytes moved once)\n", big / d2d / 1000);
  {
    const int n = 10000;
    CUipcMemHandle h;
    double t = now_us();
    for (int i = 0; i < n; ++i) check(d->cuIpcGetMemHandle(&h, dev), "get handle");
    std::printf("cuIpcGetMemHandle: %.2f us\n", (now_us() - t) / n);
    if (write(to_child[1], &h, sizeof h) != sizeof h) return 1;
  }
  char done = 0;
  if (read(to_parent[0], &done, 1) != 1) std::printf("ipc child failed\n");
  int status = 0;
  waitpid(child, &status, 0);
  std::printf("child exit %d\n", WIFEXITED(status) ? WEXITSTATUS(status) : -1);
  return 0;
}
