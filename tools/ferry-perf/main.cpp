// ferry-perf: OSU-style point-to-point benchmarks between ranks 0 and 1: latency (ping-pong, half
// round trip), bandwidth (a window of non-blocking sends, then an ack) and bibw (both directions);
// and collectives over every rank (allreduce, broadcast, allgather, reduce_scatter, reduce): the
// mean time of one call, the slowest rank's, and NCCL's bus bandwidth. Run under ferryrun:
// `ferryrun -n 2 ferry-perf [latency|bandwidth|bibw|allreduce|...] [options]`.
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#ifdef FERRY_HAVE_CUDA
#include "cuda/driver.hpp"
#endif

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<std::string> tests;
  std::vector<std::size_t> sizes;
  long iterations = 0;  // 0: chosen by size
  long warmup = -1;     // -1: a tenth of the iterations
  int window = 64;
  bool check = false;
  bool register_host = false;  // one-sided on host memory: register_memory, not allocate_memory
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

[[noreturn]] void usage(const char* error) {
  if (error != nullptr) std::fprintf(stderr, "ferry-perf: %s\n", error);
  std::fprintf(
      error ? stderr : stdout,
      "usage: ferryrun -n 2 ferry-perf [latency|bandwidth|bibw]... [options]\n"
      "       ferryrun -n 2 ferry-perf [put_lat|get_lat|put_bw|get_bw|atomic_add]... [options]\n"
      "  (one-sided, on memory from allocate_memory, or with -m cuda on registered device\n"
      "  memory: put_lat (host only) is a ping-pong of puts, each\n"
      "  side polling its memory for the\n"
      "  other's last byte; get_lat a blocking get; the _bw tests a window then a flush;\n"
      "  atomic_add a window of 8-byte adds: latency_us is the time per add)\n"
      "       ferryrun -n N ferry-perf [allreduce|broadcast|allgather|reduce_scatter|reduce]...\n"
      "  (collectives: SIZE is the bytes of the result; allreduce, reduce_scatter and reduce\n"
      "  add float32, broadcast comes from rank 0, reduce goes to it; -m cuda puts every rank's\n"
      "  buffers on its GPU)\n"
      "  --sizes LIST       message sizes, e.g. 8,4k,4m (default: 1 B ... 64 MiB)\n"
      "  --iterations N     timed iterations per size (default: by size)\n"
      "  --warmup N         untimed iterations first (default: a tenth)\n"
      "  --window W         sends in flight in bandwidth tests (default 64)\n"
      "  --check            verify every byte received\n"
      "  --register         one-sided on host memory: the exposed buffer is the program's own,\n"
      "                     given to register_memory (reached by CMA on this node)\n"
      "  -m, --mem A[:B]    buffers in host, pinned (host memory page-locked by CUDA) or cuda\n"
      "                     memory on rank 0 (A) and rank 1 (B, default A; in collectives every\n"
      "                     rank after 0 uses B); cuda uses GPU local_rank %% device count\n"
      "  --json | --csv     machine-readable output (default: a table)\n"
      "With no test named it runs latency and bandwidth.\n");
  std::exit(error ? 2 : 0);
}

std::size_t parse_size(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || text[0] == '-')
    usage(("bad size '" + text + "'").c_str());
  std::string suffix(end);
  if (suffix == "k" || suffix == "K")
    v <<= 10;
  else if (suffix == "m" || suffix == "M")
    v <<= 20;
  else if (suffix == "g" || suffix == "G")
    v <<= 30;
  else if (!suffix.empty())
    usage(("bad size '" + text + "'").c_str());
  if (v > (1ULL << 32)) usage(("size '" + text + "' is over 4 GiB").c_str());
  return v;
}

long parse_count(const char* flag, const char* text, long min) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min) {
    usage((std::string("bad value for ") + flag + ": '" + text + "'").c_str());
  }
  return v;
}

bool is_one_sided(const std::string& test) {
  return test == "put_lat" || test == "get_lat" || test == "put_bw" || test == "get_bw" ||
         test == "atomic_add";
}

bool is_collective(const std::string& test) {
  return test == "allreduce" || test == "broadcast" || test == "allgather" ||
         test == "reduce_scatter" || test == "reduce";
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "latency" || a == "bandwidth" || a == "bibw" || is_collective(a) || is_one_sided(a)) {
      args.tests.push_back(a);
    } else if (a == "--sizes") {
      std::string list = value();
      std::size_t start = 0;
      while (start <= list.size()) {
        std::size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        if (comma > start) args.sizes.push_back(parse_size(list.substr(start, comma - start)));
        start = comma + 1;
      }
      if (args.sizes.empty()) usage("--sizes needs at least one size");
    } else if (a == "--iterations") {
      args.iterations = parse_count("--iterations", value(), 1);
    } else if (a == "--warmup") {
      args.warmup = parse_count("--warmup", value(), 0);
    } else if (a == "--window") {
      args.window = static_cast<int>(parse_count("--window", value(), 1));
    } else if (a == "-m" || a == "--mem") {
      std::string spec = value();
      std::size_t colon = spec.find(':');
      args.mem[0] = spec.substr(0, colon);
      args.mem[1] = colon == std::string::npos ? args.mem[0] : spec.substr(colon + 1);
      for (const std::string& m : args.mem) {
        if (m != "host" && m != "cuda" && m != "pinned")
          usage(("bad memory kind '" + m + "' (host, pinned or cuda)").c_str());
      }
    } else if (a == "--check") {
      args.check = true;
    } else if (a == "--register") {
      args.register_host = true;
    } else if (a == "--json") {
      args.format = Args::kJson;
    } else if (a == "--csv") {
      args.format = Args::kCsv;
    } else if (a == "-h" || a == "--help") {
      usage(nullptr);
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (args.tests.empty()) args.tests = {"latency", "bandwidth"};
  if (args.sizes.empty()) {
    for (std::size_t s = 1; s <= (64u << 20); s *= 2) args.sizes.push_back(s);
  }
  return args;
}

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

void fill(std::byte* p, std::size_t size, long seq) {
  for (std::size_t i = 0; i < size; ++i) p[i] = pattern(i, seq, size);
}

void verify(const std::byte* p, std::size_t size, long seq, const char* test) {
  for (std::size_t i = 0; i < size; ++i) {
    if (p[i] != pattern(i, seq, size)) {
      std::fprintf(stderr, "ferry-perf: %s: data check failed at byte %zu of a %zu-byte message\n",
                   test, i, size);
      std::exit(1);
    }
  }
}

void require(const ferry::Status& status, const char* what) {
  if (!status) {
    std::fprintf(stderr, "ferry-perf: %s failed: %s\n", what, status.to_string().c_str());
    std::exit(1);
  }
}

struct Bench {
  ferry::Context& ctx;
  const Args& args;
  int peer;
  Space& space;

  long iterations_for(const std::string& test, std::size_t size) const {
    if (args.iterations > 0) return args.iterations;
    const double bytes = static_cast<double>(std::max<std::size_t>(size, 64));
    if (test == "latency" || test == "put_lat" || test == "get_lat" || is_collective(test)) {
      return std::clamp(static_cast<long>(1e9 / bytes), 20L, 20000L);
    }
    if (test == "atomic_add") return 2000;
    return std::clamp(static_cast<long>(1e9 / (bytes * args.window)), 2L, 2000L);
  }

  double latency(std::size_t size, long iters, long warmup) {
    Buffer out(space, size), in(space, size);
    auto fill_out = [&](long seq) {
      fill(out.shadow(), size, seq);
      out.push(0, size);
    };
    auto verify_in = [&](long seq) {
      in.pull(0, size);
      verify(in.shadow(), size, seq, "latency");
    };
    Clock::time_point start;
    for (long i = -warmup; i < iters; ++i) {
      if (i == 0) start = Clock::now();
      if (ctx.rank() == 0) {
        if (args.check) fill_out(i);
        require(ctx.send(out.data(), size, peer, 1), "send");
        require(ctx.recv(in.data(), size, peer, 2), "recv");
        if (args.check) verify_in(i + 1);
      } else {
        require(ctx.recv(in.data(), size, peer, 1), "recv");
        if (args.check) {
          verify_in(i);
          fill_out(i + 1);
        }
        require(ctx.send(out.data(), size, peer, 2), "send");
      }
    }
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    return us / (2.0 * static_cast<double>(iters));
  }

  // One-sided tests between ranks 0 and 1: each exposes a buffer and sends the other its key. On
  // host memory the exposed buffer comes from allocate_memory (a peer on this node maps it); on
  // device memory (all but put_lat, which polls the buffer with the CPU) it is a cuMemAlloc
  // buffer given to register_memory, and the local buffers are device memory too. Returns the
  // time per operation in us (put_lat: half a round trip) and fills *gbps for the bandwidth tests.
  double one_sided(const std::string& test, std::size_t size, long iters, long warmup,
                   double* gbps) {
    if (space.device() && test == "put_lat") usage("put_lat takes host memory only");
    const int window = test == "put_lat" || test == "get_lat" ? 1 : args.window;
    const std::size_t bytes = std::max<std::size_t>(size, 8);
    const std::size_t total = bytes * static_cast<std::size_t>(window);  // (atomics: words)
    Buffer local_buffer(space, total);
    Buffer registered(space, space.device() || args.register_host ? total : 0);
    std::byte* local = local_buffer.data();
    ferry::MemoryRegion region;
    if (space.device() || args.register_host) {
      require(ctx.register_memory(registered.data(), total, &region), "register_memory");
    } else {
      require(ctx.allocate_memory(total, &region), "allocate_memory");
    }
    auto* exposed = static_cast<std::byte*>(region.address());
    std::vector<std::byte> mine = region.remote_key(), theirs(mine.size());
    require(ctx.send(mine.data(), mine.size(), peer, 5), "key send");
    require(ctx.recv(theirs.data(), theirs.size(), peer, 5), "key recv");
    ferry::RemoteKey key;
    require(ferry::RemoteKey::unpack(theirs, &key), "unpack");
    {
      std::vector<std::byte> pattern(total);
      fill(pattern.data(), total, 1);
      space.put(local, pattern.data(), total);
    }
    std::vector<ferry::Request> requests;
    requests.reserve(static_cast<std::size_t>(window));
    std::vector<std::uint64_t> results(static_cast<std::size_t>(window));
    // put_lat: the last byte of each message says which iteration it is (1..127, never 0).
    auto mark = [](long i) { return static_cast<std::uint8_t>((i & 0x7f) + 1); };
    std::atomic_ref<std::uint8_t> last(*reinterpret_cast<std::uint8_t*>(&exposed[size - 1]));
    auto await_mark = [&](long i) {
      while (last.load(std::memory_order_acquire) != mark(i)) ctx.progress();
    };
    Clock::time_point start;
    // Decided once: string comparisons in the loop would be timed with the operations.
    const bool put_lat = test == "put_lat", atomic = test == "atomic_add";
    const bool get = test == "get_lat" || test == "get_bw", put_bw = test == "put_bw";
    const bool first = ctx.rank() == 0, active = first || put_lat;
    for (long i = -warmup; active && i < iters; ++i) {
      if (i == 0) start = Clock::now();
      if (put_lat) {
        if (!first) await_mark(i);
        local[size - 1] = static_cast<std::byte>(mark(i));
        ctx.iput(local, size, key, 0);  // completes on its own; the peer's reply says so
        if (first) await_mark(i);
        continue;
      }
      requests.clear();
      for (int w = 0; w < window; ++w) {
        // Bandwidth: every operation of the window on the same bytes (as ucx_perftest does),
        // so memory bandwidth is not what is measured; atomics on words of their own.
        const std::size_t offset = atomic ? static_cast<std::size_t>(w) * bytes : 0;
        if (get) {
          requests.push_back(ctx.iget(local + offset, size, key, offset));
        } else if (put_bw) {
          requests.push_back(ctx.iput(local + offset, size, key, offset));
        } else {
          requests.push_back(ctx.iatomic(ferry::AtomicOp::kAdd, 8, key, offset, 1));
        }
      }
      require(ferry::Request::wait_all(requests), test.c_str());
    }
    double us = 0;
    if (active) {
      require(ctx.flush(peer), "flush");
      us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    }
    // The passive side progresses in this receive until the active side is done.
    std::uint32_t done = 0;
    if (ctx.rank() == 0) {
      require(ctx.send(&done, sizeof(done), peer, 6), "done send");
    } else {
      require(ctx.recv(&done, sizeof(done), peer, 6), "done recv");
    }
    const double ops = static_cast<double>(iters) * window;
    *gbps = test == "put_bw" || test == "get_bw" ? static_cast<double>(size) * ops / us / 1e3 : -1;
    return test == "put_lat" ? us / (2.0 * static_cast<double>(iters)) : us / ops;
  }

  // Returns GB/s. `both`: bibw (each side sends and receives a window).
  double bandwidth(std::size_t size, long iters, long warmup, bool both) {
    int window = args.window;
    // With --check each message of a window needs its own buffer; keep that under 1 GiB.
    std::size_t slots = args.check ? static_cast<std::size_t>(window) : 1;
    while (slots > 1 && slots * size > (1u << 30)) slots /= 2;
    if (args.check) window = static_cast<int>(slots);
    Buffer out(space, std::max<std::size_t>(size, 1) * slots);
    Buffer in(space, std::max<std::size_t>(size, 1) * slots);
    std::vector<ferry::Request> requests;
    requests.reserve(static_cast<std::size_t>(2 * window));
    const bool sender = both || ctx.rank() == 0;
    const bool receiver = both || ctx.rank() == 1;
    std::uint32_t ack = 0;
    Clock::time_point start;
    for (long i = -warmup; i < iters; ++i) {
      if (i == 0) start = Clock::now();
      requests.clear();
      for (int w = 0; receiver && w < window; ++w) {
        std::byte* p = in.data() + (args.check ? static_cast<std::size_t>(w) * size : 0);
        requests.push_back(ctx.irecv(p, size, peer, 3));
      }
      for (int w = 0; sender && w < window; ++w) {
        const std::size_t offset = args.check ? static_cast<std::size_t>(w) * size : 0;
        if (args.check) {
          fill(out.shadow() + offset, size, i * window + w);
          out.push(offset, size);
        }
        requests.push_back(ctx.isend(out.data() + offset, size, peer, 3));
      }
      require(ferry::Request::wait_all(requests), "wait_all");
      if (args.check && receiver) {
        in.pull(0, size * static_cast<std::size_t>(window));
        for (int w = 0; w < window; ++w) {
          verify(in.shadow() + static_cast<std::size_t>(w) * size, size, i * window + w,
                 "bandwidth");
        }
      }
      if (!both) {
        if (ctx.rank() == 0) {
          require(ctx.recv(&ack, sizeof(ack), peer, 4), "ack recv");
        } else {
          require(ctx.send(&ack, sizeof(ack), peer, 4), "ack send");
        }
      }
    }
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    double bytes = static_cast<double>(size) * window * static_cast<double>(iters) * (both ? 2 : 1);
    return bytes / s / 1e9;
  }
};

// One collective over every rank, timed like OSU and NCCL's tests: a barrier, then `iters` calls
// back to back; the time of one call is the slowest rank's mean. Bus bandwidth is NCCL's: the
// bytes each rank must move per unit time, comparable across rank counts.
Record collective(ferry::Communicator& world, const Args& args, Space& space,
                  const std::string& test, std::size_t size, long iters, long warmup) {
  const auto n = static_cast<std::size_t>(world.size());
  const std::size_t floats = size / 4;
  // The buffers are in the space of --mem (host or this rank's GPU); data goes in and out
  // through their host shadows.
  Buffer in(space, size);
  Buffer out(space, size);
  if (test == "allreduce" || test == "reduce_scatter" || test == "reduce") {
    std::fill_n(reinterpret_cast<float*>(in.shadow()), floats,
                static_cast<float>(world.rank() + 1));
  } else if (test == "allgather") {
    std::fill_n(out.shadow(), size, std::byte{0});
    for (std::size_t i = 0; i < size / n; ++i) {
      out.shadow()[static_cast<std::size_t>(world.rank()) * (size / n) + i] =
          pattern(i, world.rank(), 1);
    }
    out.push(0, size);
  } else {
    std::fill_n(out.shadow(), size, std::byte{0});
    if (world.rank() == 0) fill(out.shadow(), size, 1);
    out.push(0, size);
  }
  in.push(0, size);
  // The test is picked once: the timed loop holds the call alone.
  const int kind = test == "allreduce"        ? 0
                   : test == "reduce_scatter" ? 1
                   : test == "allgather"      ? 2
                   : test == "reduce"         ? 4
                                              : 3;
  std::byte* my_block = out.data() + static_cast<std::size_t>(world.rank()) * (size / n);
  auto once = [&] {
    switch (kind) {
      case 0:
        return world.allreduce(in.data(), out.data(), floats, ferry::DataType::kFloat32,
                               ferry::ReduceOp::kSum);
      case 1:
        return world.reduce_scatter(in.data(), out.data(), floats / n, ferry::DataType::kFloat32,
                                    ferry::ReduceOp::kSum);
      case 2:
        return world.allgather(my_block, out.data(), size / n, ferry::DataType::kUint8);
      case 4:
        return world.reduce(in.data(), out.data(), floats, ferry::DataType::kFloat32,
                            ferry::ReduceOp::kSum, 0);
      default:
        return world.broadcast(out.data(), size, ferry::DataType::kUint8, 0);
    }
  };
  for (long i = 0; i < warmup; ++i) require(once(), test.c_str());
  require(world.barrier(), "barrier");
  const Clock::time_point start = Clock::now();
  for (long i = 0; i < iters; ++i) require(once(), test.c_str());
  const double mine =
      std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(iters);
  double slowest = 0;
  require(world.allreduce(&mine, &slowest, 1, ferry::DataType::kFloat64, ferry::ReduceOp::kMax),
          "allreduce of the times");
  if (args.check) {
    out.pull(0, size);
    const std::byte* got = out.shadow();
    const float sum = static_cast<float>(n * (n + 1) / 2);
    bool ok = true;
    if (test == "allreduce" || test == "reduce_scatter" || test == "reduce") {
      // reduce: only the root's result is defined.
      const std::size_t results = test == "reduce_scatter"                ? floats / n
                                  : test == "reduce" && world.rank() != 0 ? 0
                                                                          : floats;
      for (std::size_t i = 0; i < results && ok; ++i) {
        float v;
        std::memcpy(&v, got + i * 4, 4);
        ok = v == sum;
      }
    } else if (test == "allgather") {
      for (std::size_t r = 0; r < n && ok; ++r) {
        for (std::size_t i = 0; i < size / n; ++i) {
          ok = ok && got[r * (size / n) + i] == pattern(i, static_cast<long>(r), 1);
        }
      }
    } else {
      verify(got, size, 1, "broadcast");
    }
    if (!ok) {
      std::fprintf(stderr, "ferry-perf: %s: data check failed on rank %d\n", test.c_str(),
                   world.rank());
      std::exit(1);
    }
  }
  const double nd = static_cast<double>(n);
  const double factor = test == "allreduce"                       ? 2 * (nd - 1) / nd
                        : test == "broadcast" || test == "reduce" ? 1
                                                                  : (nd - 1) / nd;
  return {test, size, iters, slowest * 1e6, static_cast<double>(size) / slowest / 1e9 * factor};
}

void print(const Args& args, const std::vector<Record>& records, const ferry::Context& ctx) {
  if (args.format == Args::kJson) {
    std::printf("[");
    for (std::size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      std::printf("%s\n  {\"test\": \"%s\", \"size\": %zu, \"iterations\": %ld", i ? "," : "",
                  r.test.c_str(), r.size, r.iterations);
      if (r.latency_us >= 0) std::printf(", \"latency_us\": %.4f", r.latency_us);
      if (r.bandwidth_GBps >= 0) std::printf(", \"bandwidth_GBps\": %.4f", r.bandwidth_GBps);
      std::printf("}");
    }
    std::printf("\n]\n");
    return;
  }
  if (args.format == Args::kCsv) {
    std::printf("test,size,iterations,latency_us,bandwidth_GBps\n");
    for (const Record& r : records) {
      std::printf("%s,%zu,%ld,", r.test.c_str(), r.size, r.iterations);
      if (r.latency_us >= 0) std::printf("%.4f", r.latency_us);
      std::printf(",");
      if (r.bandwidth_GBps >= 0) std::printf("%.4f", r.bandwidth_GBps);
      std::printf("\n");
    }
    return;
  }
  std::printf(
      "# ferry-perf %s: ranks 0 and 1 of %d (collectives: all); memory %s:%s; rank 1 via "
      "%s%s\n",
      FERRY_VERSION_STRING, ctx.size(), args.mem[0].c_str(), args.mem[1].c_str(),
      ctx.size() > 1 ? ctx.describe_peer(1).c_str() : "-", args.check ? "; data checked" : "");
  std::printf("%-10s %12s %11s %12s %15s\n", "test", "size", "iterations", "latency_us",
              "bandwidth_GBps");
  for (const Record& r : records) {
    std::printf("%-10s %12zu %11ld ", r.test.c_str(), r.size, r.iterations);
    if (r.latency_us >= 0) {
      std::printf("%12.3f ", r.latency_us);
    } else {
      std::printf("%12s ", "-");
    }
    if (r.bandwidth_GBps >= 0) {
      std::printf("%15.3f\n", r.bandwidth_GBps);
    } else {
      std::printf("%15s\n", "-");
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    ferry::Context ctx = ferry::Context::init();
    const bool point_to_point = !std::all_of(args.tests.begin(), args.tests.end(), is_collective);
    if (ctx.size() < 2 && point_to_point) {
      std::fprintf(stderr, "ferry-perf: needs 2 ranks (run it as `ferryrun -n 2 ferry-perf`)\n");
      return 2;
    }
    std::vector<Record> records;
    ferry::Communicator world = ctx.world();
    Space space(args.mem[std::min(ctx.rank(), 1)], ctx.local_rank());
    Bench bench{ctx, args, 1 - ctx.rank(), space};
    for (const std::string& test : args.tests) {
      for (std::size_t size : args.sizes) {
        long iters = bench.iterations_for(test, size);
        long warmup = args.warmup >= 0 ? args.warmup : std::max(1L, iters / 10);
        if (is_collective(test)) {
          records.push_back(collective(world, args, space, test, size, iters, warmup));
          continue;
        }
        if (ctx.rank() > 1) continue;  // point to point: ranks 0 and 1 only
        if (is_one_sided(test) && size == 0) continue;
        if (test == "atomic_add" && size != args.sizes.front()) continue;  // 8 bytes, once
        if (test == "atomic_add") size = 8;
        Record r{test, size, iters, -1, -1};
        if (is_one_sided(test)) {
          r.latency_us = bench.one_sided(test, size, iters, warmup, &r.bandwidth_GBps);
          if (test == "put_bw" || test == "get_bw") r.latency_us = -1;
        } else if (test == "latency") {
          r.latency_us = bench.latency(size, iters, warmup);
        } else {
          r.bandwidth_GBps = bench.bandwidth(size, iters, warmup, test == "bibw");
        }
        records.push_back(r);
      }
    }
    if (ctx.rank() == 0) print(args, records, ctx);
    std::fflush(stdout);
    require(ctx.barrier(), "barrier");
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry-perf: %s\n", e.what());
    return 1;
  }
  return 0;
}
