// ferry-perf's parts: its arguments, where its buffers live, the point-to-point benchmarks
// (point_to_point.cpp), the collectives (collectives.cpp) and the output (args.cpp).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#ifdef FERRY_HAVE_CUDA
#include "cuda/driver.hpp"
#endif

namespace ferry::perf {

using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<std::string> tests;
  std::vector<std::size_t> sizes;
  long iterations = 0;  // 0: chosen by size
  long warmup = -1;     // -1: a tenth of the iterations
  int window = 64;
  bool check = false;
  bool register_host = false;  // one-sided on host memory: register_memory, not allocate_memory
  bool stream = false;         // collectives by their stream-ordered forms, on one CUDA stream
  long in_flight = 1;          // collectives: non-blocking calls posted before waiting for them
  long graph = 0;              // > 0: captured in CUDA graphs of this many calls, replayed
  long group = 1;              // send: messages of one call, in one group (a window)
  enum { kTable, kJson, kCsv } format = kTable;
  std::string mem[2] = {"host", "host"};  // where rank 0's and rank 1's buffers live
};

struct Record {
  std::string test;
  std::size_t size;
  long iterations;
  double latency_us;      // < 0 when it does not apply
  double bandwidth_GBps;  // < 0 when it does not apply
};

// Prints the usage (with `error`, to stderr) and exits (2 with an error, else 0).
[[noreturn]] void usage(const char* error);
// Parses the command line; prints the usage and exits on a bad one.
Args parse(int argc, char** argv);
bool is_one_sided(const std::string& test);
bool is_collective(const std::string& test);
// The records as a table, JSON or CSV (rank 0).
void print(const Args& args, const std::vector<Record>& records, const ferry::Context& ctx);

// Where one rank's buffers live: host memory, or a CUDA device (allocated through the driver).
constexpr std::align_val_t kHostAlignment{4096};

class Space {
 public:
  Space(const std::string& kind, int local_rank) {
    if (kind == "host") return;
#ifdef FERRY_HAVE_CUDA
    std::string why;
    d_ = ferry::cuda::driver(&why);
    if (d_ == nullptr) fail("--mem " + kind + ": " + why);
    CUdevice dev;
    const int ordinal = local_rank % d_->device_count;
    check(d_->cuDeviceGet(&dev, ordinal), "cuDeviceGet");
    CUcontext context;
    check(d_->cuDevicePrimaryCtxRetain(&context, dev), "cuDevicePrimaryCtxRetain");
    check(d_->cuCtxSetCurrent(context), "cuCtxSetCurrent");
    if (kind == "cuda") {
      device_ = ordinal;
    } else {
      pinned_ = true;  // host memory from cuMemHostAlloc, page-locked for the GPU's DMA
    }
#else
    (void)local_rank;
    fail("--mem cuda: this ferry-perf was built without CUDA support");
#endif
  }
  [[nodiscard]] bool device() const { return device_ >= 0; }
  [[nodiscard]] std::string name() const {
    return device() ? "cuda:" + std::to_string(device_) : pinned_ ? "pinned host" : "host";
  }

  std::byte* allocate(std::size_t bytes) {
    bytes = std::max<std::size_t>(bytes, 1);
#ifdef FERRY_HAVE_CUDA
    if (device()) {
      CUdeviceptr p = 0;
      check(d_->cuMemAlloc(&p, bytes), "cuMemAlloc");
      return reinterpret_cast<std::byte*>(p);
    }
    if (pinned_) {
      void* p = nullptr;
      check(d_->cuMemHostAlloc(&p, bytes, CU_MEMHOSTALLOC_PORTABLE), "cuMemHostAlloc");
      return static_cast<std::byte*>(p);
    }
#endif
    // Page-aligned, as ucx_perftest's buffers (UCX maps them) and the OSU benchmarks' are: the
    // alignment of a copy's source against its destination moves a 4 MiB copy by several percent.
    return static_cast<std::byte*>(::operator new[](bytes, kHostAlignment));
  }
  void release(std::byte* p) {
#ifdef FERRY_HAVE_CUDA
    if (device()) {
      d_->cuMemFree(reinterpret_cast<CUdeviceptr>(p));
      return;
    }
    if (pinned_) {
      d_->cuMemFreeHost(p);
      return;
    }
#endif
    ::operator delete[](p, kHostAlignment);
  }
  // Enqueues `calls` calls of once(stream) on a stream of this process's GPU, back to back, or
  // where `graph` > 0 captures `graph` of them in a CUDA graph and replays it; waits for the
  // stream and returns the calls made (`calls` rounded up to whole graphs).
  template <class Once>
  long on_stream(long calls, long graph, Once once) {
#ifdef FERRY_HAVE_CUDA
    if (d_ == nullptr) fail("--stream needs CUDA (-m cuda or pinned)");
    if (stream_ == nullptr) check(d_->cuStreamCreate(&stream_, CU_STREAM_NON_BLOCKING), "stream");
    auto* stream = reinterpret_cast<ferry::CudaStream>(stream_);
    if (graph <= 0) {
      for (long i = 0; i < calls; ++i) once(stream);
    } else {
      if (graphs_.count(graph) == 0) {
        CUgraph g = nullptr;
        CUgraphExec exec = nullptr;
        check(d_->cuStreamBeginCapture(stream_, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), "capture");
        for (long i = 0; i < graph; ++i) once(stream);
        check(d_->cuStreamEndCapture(stream_, &g), "end capture");
        check(d_->cuGraphInstantiateWithFlags(&exec, g, 0), "instantiate");
        d_->cuGraphDestroy(g);
        graphs_[graph] = exec;
      }
      const long launches = std::max(1L, (calls + graph - 1) / graph);
      for (long i = 0; i < launches; ++i)
        check(d_->cuGraphLaunch(graphs_[graph], stream_), "launch");
      calls = launches * graph;
    }
    check(d_->cuStreamSynchronize(stream_), "cuStreamSynchronize");
    return calls;
#else
    (void)calls, (void)graph, (void)once;
    fail("--stream: this ferry-perf was built without CUDA support");
#endif
  }
  // A new size or test captures again.
  void forget_graphs() {
#ifdef FERRY_HAVE_CUDA
    for (auto& [calls, exec] : graphs_) d_->cuGraphExecDestroy(exec);
    graphs_.clear();
#endif
  }

  // Copies between a buffer of this space and host memory (data checks).
  void put(std::byte* dst, const std::byte* host, std::size_t bytes) {
#ifdef FERRY_HAVE_CUDA
    if (device()) {
      check(d_->cuMemcpy(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(host),
                         bytes),
            "cuMemcpy");
      // Pageable-to-device copies may return before the DMA is done.
      check(d_->cuCtxSynchronize(), "cuCtxSynchronize");
      return;
    }
#endif
    std::memcpy(dst, host, bytes);
  }
  void get(std::byte* host, const std::byte* src, std::size_t bytes) {
#ifdef FERRY_HAVE_CUDA
    if (device()) {
      check(d_->cuMemcpy(reinterpret_cast<CUdeviceptr>(host), reinterpret_cast<CUdeviceptr>(src),
                         bytes),
            "cuMemcpy");
      return;
    }
#endif
    std::memcpy(host, src, bytes);
  }

 private:
  [[noreturn]] static void fail(const std::string& what) {
    std::fprintf(stderr, "ferry-perf: %s\n", what.c_str());
    std::exit(2);
  }
#ifdef FERRY_HAVE_CUDA
  void check(CUresult r, const char* what) {
    if (r != CUDA_SUCCESS) fail(std::string(what) + ": " + ferry::cuda::error_string(r));
  }
  const ferry::cuda::Driver* d_ = nullptr;
  CUstream stream_ = nullptr;
  std::map<long, CUgraphExec> graphs_;  // by calls per graph
#endif
  int device_ = -1;
  bool pinned_ = false;
};

// A buffer in a Space, with a host shadow for data checks.
class Buffer {
 public:
  Buffer(Space& space, std::size_t bytes)
      : space_(space), data_(space.allocate(bytes)), size_(bytes) {}
  ~Buffer() { space_.release(data_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  [[nodiscard]] std::byte* data() const { return data_; }
  // Host memory holding what data() holds after pull(), or what push() copies there.
  std::byte* shadow() {
    if (!space_.device()) return data_;
    shadow_.resize(std::max<std::size_t>(size_, 1));
    return shadow_.data();
  }
  void push(std::size_t offset, std::size_t bytes) {
    if (space_.device()) space_.put(data_ + offset, shadow() + offset, bytes);
  }
  void pull(std::size_t offset, std::size_t bytes) {
    if (space_.device()) space_.get(shadow() + offset, data_ + offset, bytes);
  }

 private:
  Space& space_;
  std::byte* data_;
  std::size_t size_;
  std::vector<std::byte> shadow_;
};

// The byte at `i` of message number `seq` of size `size`: differs per byte, message and size.
inline std::byte pattern(std::size_t i, long seq, std::size_t size) {
  return static_cast<std::byte>((i * 131 + static_cast<std::size_t>(seq) * 7 + size) & 0xff);
}

inline void fill(std::byte* p, std::size_t size, long seq) {
  for (std::size_t i = 0; i < size; ++i) p[i] = pattern(i, seq, size);
}

inline void verify(const std::byte* p, std::size_t size, long seq, const char* test) {
  for (std::size_t i = 0; i < size; ++i) {
    if (p[i] != pattern(i, seq, size)) {
      std::fprintf(stderr, "ferry-perf: %s: data check failed at byte %zu of a %zu-byte message\n",
                   test, i, size);
      std::exit(1);
    }
  }
}

inline void require(const ferry::Status& status, const char* what) {
  if (!status) {
    std::fprintf(stderr, "ferry-perf: %s failed: %s\n", what, status.to_string().c_str());
    std::exit(1);
  }
}

// The point-to-point and one-sided benchmarks between ranks 0 and 1 (point_to_point.cpp).
struct Bench {
  ferry::Context& ctx;
  const Args& args;
  int peer;
  Space& space;

  long iterations_for(const std::string& test, std::size_t size) const;
  // Half a round trip of a ping-pong, in us.
  double latency(std::size_t size, long iters, long warmup);

  // One-sided tests between ranks 0 and 1: each exposes a buffer and sends the other its key. On
  // host memory the exposed buffer comes from allocate_memory (a peer on this node maps it); on
  // device memory (all but put_lat, which polls the buffer with the CPU) it is a cuMemAlloc
  // buffer given to register_memory, and the local buffers are device memory too. Returns the
  // time per operation in us (put_lat: half a round trip) and fills *gbps for the bandwidth tests.
  double one_sided(const std::string& test, std::size_t size, long iters, long warmup,
                   double* gbps);

  // Returns GB/s. `both`: bibw (each side sends and receives a window).
  double bandwidth(std::size_t size, long iters, long warmup, bool both);
};

// One collective over every rank, timed like OSU and NCCL's tests: a barrier, then `iters` calls
// back to back; the time of one call is the slowest rank's mean. Bus bandwidth is NCCL's: the
// bytes each rank must move per unit time, comparable across rank counts.
// With --stream (and --graph) the calls are the stream-ordered forms, timed from the first
// enqueue to the stream's end; sendrecv (stream forms only) is NCCL's test of the name: every
// member sends to the next and receives from the previous, in a group.
Record collective(ferry::Context& ctx, ferry::Communicator& world, const Args& args, Space& space,
                  const std::string& test, std::size_t size, long iters, long warmup);

}  // namespace ferry::perf
