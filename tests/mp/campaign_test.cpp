// The kill campaign's worker (tests/scripts/campaign.sh): every rank runs the same random traffic,
// drawn step by step from CAMPAIGN_SEED, until an operation fails; the campaign SIGKILLs one rank
// at a random moment of it. Steps: eager and rendezvous messages around the ring (CMA, pipelined
// or over libfabric as the environment says), host collectives, one-sided puts and gets, and
// receives waited for by the application's own poll() on event_fd(), and with CAMPAIGN_DEVICE=1
// allreduces of device memory (a GPU per rank where there are enough). Every byte received is
// checked. A survivor agrees with the others on who failed (Communicator::agree) and prints
//   campaign: rank R pid P job J ready                    (before its first step; J: FERRY_JOB_ID)
//   campaign: rank R survived: failed [2] step 41 allreduce at 1764...123 ns: <the error>
// where the time is CLOCK_REALTIME of its first error, for the kill-to-error time. Exit status:
// 0 survived, 2 a wrong byte, 3 an error that is not a peer's failure (or none within
// CAMPAIGN_SECONDS, default 30), 4 the survivors' failed sets differ.
#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#if FERRY_HAVE_CUDA
#include "cuda/driver.hpp"
#endif

namespace {

using ferry::Code;
using ferry::Status;

// kDevice with CAMPAIGN_DEVICE=1 only.
enum Kind {
  kSmall,
  kLarge,
  kAllreduce,
  kBarrier,
  kBroadcast,
  kAllgather,
  kOneSided,
  kPolled,
  kDevice
};
constexpr const char* kKindNames[] = {"eager ring", "rendezvous ring", "allreduce",
                                      "barrier",    "broadcast",       "allgather",
                                      "one-sided",  "polled receive",  "device allreduce"};
constexpr int kHostKinds = 8;
constexpr std::size_t kDeviceBytes = 16 << 20;
constexpr std::size_t kWindowBytes = 1 << 20;

std::uint8_t pattern(std::uint64_t step, int source, std::size_t i) {
  return static_cast<std::uint8_t>(step * 131 + static_cast<std::uint64_t>(source) * 31 + i * 7);
}

void fill(std::byte* data, std::size_t bytes, std::uint64_t step, int source) {
  for (std::size_t i = 0; i < bytes; ++i) data[i] = std::byte{pattern(step, source, i)};
}

// The first wrong byte's index, or -1.
long long first_wrong(const std::byte* data, std::size_t bytes, std::uint64_t step, int source) {
  for (std::size_t i = 0; i < bytes; ++i) {
    if (data[i] != std::byte{pattern(step, source, i)}) return static_cast<long long>(i);
  }
  return -1;
}

long long realtime_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_REALTIME, &t);
  return static_cast<long long>(t.tv_sec) * 1000000000LL + t.tv_nsec;
}

struct Worker {
  ferry::Context& ctx;
  ferry::Communicator world;
  int me, n, next, prev;
  std::vector<std::byte> out, in;
  std::vector<std::byte> window;
  ferry::MemoryRegion region;
  std::vector<ferry::RemoteKey> keys;
  std::string wrong;  // the first wrong result, if any
#if FERRY_HAVE_CUDA
  const ferry::cuda::Driver* gpu = nullptr;  // CAMPAIGN_DEVICE=1: this rank's GPU
  CUdeviceptr device_in = 0, device_out = 0;
#endif

  explicit Worker(ferry::Context& c)
      : ctx(c),
        world(c.world()),
        me(c.rank()),
        n(c.size()),
        next((c.rank() + 1) % c.size()),
        prev((c.rank() + c.size() - 1) % c.size()),
        out(4 << 20),
        in(4 << 20),
        window(kWindowBytes) {}

  void check(const std::byte* data, std::size_t bytes, std::uint64_t step, int source,
             const char* what) {
    const long long at = first_wrong(data, bytes, step, source);
    if (at >= 0 && wrong.empty()) {
      wrong = std::string(what) + " of " + std::to_string(bytes) + " bytes from rank " +
              std::to_string(source) + " at step " + std::to_string(step) + ": byte " +
              std::to_string(at) + " is wrong";
    }
  }

  // Registers the window and swaps keys (before the first step: no one is killed yet).
  Status open_window() {
    if (Status s = ctx.register_memory(window.data(), window.size(), &region); !s) return s;
    const std::vector<std::byte> mine = region.remote_key();
    std::uint64_t longest = mine.size(), most = 0;
    if (Status s =
            world.allreduce(&longest, &most, 1, ferry::DataType::kUint64, ferry::ReduceOp::kMax);
        !s) {
      return s;
    }
    std::vector<std::byte> padded(most + 8), all((most + 8) * static_cast<std::size_t>(n));
    const std::uint64_t length = mine.size();
    std::memcpy(padded.data(), &length, 8);
    std::memcpy(padded.data() + 8, mine.data(), mine.size());
    if (Status s =
            world.allgather(padded.data(), all.data(), padded.size(), ferry::DataType::kUint8);
        !s) {
      return s;
    }
    keys.resize(static_cast<std::size_t>(n));
    for (int r = 0; r < n; ++r) {
      const std::byte* at = all.data() + static_cast<std::size_t>(r) * (most + 8);
      std::uint64_t bytes = 0;
      std::memcpy(&bytes, at, 8);
      if (Status s = ferry::RemoteKey::unpack({at + 8, bytes}, &keys[static_cast<std::size_t>(r)]);
          !s) {
        return s;
      }
    }
    return Status::ok();
  }

  // Around the ring: from the previous rank, to the next. A rank that saw a failure revokes the
  // world and stops sending, so a wait on a live rank ends when the revocation arrives.
  Status ring(std::uint64_t step, std::size_t bytes, bool polled) {
    fill(out.data(), bytes, step, me);
    ferry::Request both[2] = {ctx.irecv(in.data(), bytes, prev, step),
                              ctx.isend(out.data(), bytes, next, step)};
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!(both[0].test() && both[1].test())) {
      // One half failed (its peer died): the other may wait on a live rank for ever.
      for (int i = 0; i < 2; ++i) {
        if (both[i].test() && !both[i].status().is_ok()) {
          both[1 - i].cancel();
          return both[i].status();
        }
      }
      if (std::chrono::steady_clock::now() > give_up) {
        return Status(Code::kTimeout, "a ring step did not end in 20 s");
      }
      if (world.revoked()) {
        for (auto& r : both) r.cancel();
        return Status(Code::kRevoked, "the world was revoked during a ring step");
      }
      if (!polled) {
        static_cast<void>(both[both[0].test() ? 1 : 0].wait_for(0.01));
      } else if (ctx.arm()) {
        // The application's own loop: sleep in poll() until ferry's descriptor rings (ofi's
        // messages do not ring it: a short timeout).
        pollfd fds[] = {{ctx.event_fd(), POLLIN, 0}};
        ::poll(fds, 1, 10);
      } else {
        ctx.progress();
      }
    }
    for (auto& r : both) {
      if (Status s = r.status(); !s) return s;
    }
    check(in.data(), bytes, step, prev, polled ? "a polled receive" : "a ring receive");
    return Status::ok();
  }

  Status allreduce(std::uint64_t step, std::size_t count) {
    std::vector<std::int64_t> mine(count), sum(count, -1);
    for (std::size_t i = 0; i < count; ++i) {
      mine[i] = static_cast<std::int64_t>(pattern(step, me, i)) * (me + 1);
    }
    if (Status s = world.allreduce(mine.data(), sum.data(), count, ferry::DataType::kInt64,
                                   ferry::ReduceOp::kSum);
        !s) {
      return s;
    }
    for (std::size_t i = 0; i < count && wrong.empty(); ++i) {
      std::int64_t want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<std::int64_t>(pattern(step, r, i)) * (r + 1);
      if (sum[i] != want) {
        wrong = "allreduce at step " + std::to_string(step) + ": element " + std::to_string(i) +
                " is " + std::to_string(sum[i]) + ", not " + std::to_string(want);
      }
    }
    return Status::ok();
  }

  Status broadcast(std::uint64_t step, std::size_t bytes) {
    const int root = static_cast<int>(step % static_cast<std::uint64_t>(n));
    std::byte* data = in.data();
    if (me == root) fill(data, bytes, step, root);
    if (Status s = world.broadcast(data, bytes, ferry::DataType::kUint8, root); !s) return s;
    check(data, bytes, step, root, "a broadcast");
    return Status::ok();
  }

  Status allgather(std::uint64_t step, std::size_t bytes) {
    fill(out.data(), bytes, step, me);
    if (Status s = world.allgather(out.data(), in.data(), bytes, ferry::DataType::kUint8); !s) {
      return s;
    }
    for (int r = 0; r < n; ++r) {
      check(in.data() + static_cast<std::size_t>(r) * bytes, bytes, step, r, "an allgather block");
    }
    return Status::ok();
  }

  // A put into the next rank's window, flushed; after a barrier each checks what its previous
  // rank put there and gets it back from the next rank's window; a barrier before anyone puts
  // again.
  Status one_sided(std::uint64_t step, std::size_t bytes) {
    fill(out.data(), bytes, step, me);
    ferry::Request put = ctx.iput(out.data(), bytes, keys[static_cast<std::size_t>(next)], 0);
    if (Status s = put.wait(); !s) return s;
    if (Status s = ctx.flush(next); !s) return s;
    if (Status s = world.barrier(); !s) return s;
    check(window.data(), bytes, step, prev, "a put");
    ferry::Request get = ctx.iget(in.data(), bytes, keys[static_cast<std::size_t>(next)], 0);
    if (Status s = get.wait(); !s) return s;
    check(in.data(), bytes, step, me, "a get");
    return world.barrier();
  }

  // CAMPAIGN_DEVICE=1: this rank's GPU (rank modulo their number) and two buffers on it.
  Status open_device() {
#if FERRY_HAVE_CUDA
    std::string why;
    gpu = ferry::cuda::driver(&why);
    CUdevice device;
    CUcontext context;
    if (gpu == nullptr || gpu->cuDeviceGet(&device, me % gpu->device_count) != CUDA_SUCCESS ||
        gpu->cuDevicePrimaryCtxRetain(&context, device) != CUDA_SUCCESS ||
        gpu->cuCtxSetCurrent(context) != CUDA_SUCCESS ||
        gpu->cuMemAlloc(&device_in, kDeviceBytes) != CUDA_SUCCESS ||
        gpu->cuMemAlloc(&device_out, kDeviceBytes) != CUDA_SUCCESS) {
      gpu = nullptr;
      return Status(Code::kUnsupported, "CAMPAIGN_DEVICE=1 but no GPU to use: " + why);
    }
    return Status::ok();
#else
    return Status(Code::kUnsupported, "CAMPAIGN_DEVICE=1 but ferry was built without CUDA");
#endif
  }

  // The allreduce on device buffers (one-shot, two-shot or ring kernels by size), checked on
  // the host.
  Status device_allreduce(std::uint64_t step, std::size_t count) {
#if FERRY_HAVE_CUDA
    std::vector<std::int64_t> mine(count), sum(count, -1);
    for (std::size_t i = 0; i < count; ++i) {
      mine[i] = static_cast<std::int64_t>(pattern(step, me, i)) * (me + 1);
    }
    const std::size_t bytes = count * sizeof(std::int64_t);
    if (gpu->cuMemcpy(device_in, reinterpret_cast<CUdeviceptr>(mine.data()), bytes) !=
            CUDA_SUCCESS ||
        gpu->cuCtxSynchronize() != CUDA_SUCCESS) {
      return Status(Code::kIoError, "copying the input to the GPU failed");
    }
    if (Status s =
            world.allreduce(reinterpret_cast<void*>(device_in), reinterpret_cast<void*>(device_out),
                            count, ferry::DataType::kInt64, ferry::ReduceOp::kSum);
        !s) {
      return s;
    }
    if (gpu->cuMemcpy(reinterpret_cast<CUdeviceptr>(sum.data()), device_out, bytes) !=
        CUDA_SUCCESS) {
      return Status(Code::kIoError, "copying the result from the GPU failed");
    }
    for (std::size_t i = 0; i < count && wrong.empty(); ++i) {
      std::int64_t want = 0;
      for (int r = 0; r < n; ++r) want += static_cast<std::int64_t>(pattern(step, r, i)) * (r + 1);
      if (sum[i] != want) {
        wrong = "device allreduce of " + std::to_string(count) + " int64 at step " +
                std::to_string(step) + ": element " + std::to_string(i) + " is " +
                std::to_string(sum[i]) + ", not " + std::to_string(want);
      }
    }
    return Status::ok();
#else
    static_cast<void>(step);
    static_cast<void>(count);
    return Status(Code::kUnsupported, "built without CUDA");
#endif
  }

  Status run(std::uint64_t step, Kind kind, std::mt19937_64& draw) {
    auto size = [&](std::size_t low, std::size_t high) {
      // Log-uniform between low and high.
      const double x = std::uniform_real_distribution<double>(
          std::log2(static_cast<double>(low)), std::log2(static_cast<double>(high)))(draw);
      return static_cast<std::size_t>(std::exp2(x));
    };
    switch (kind) {
      case kSmall:
        return ring(step, size(1, 4096), false);
      case kLarge:
        return ring(step, size(64 << 10, 4 << 20), false);
      case kAllreduce:
        return allreduce(step, size(1, 1 << 16));
      case kBarrier:
        return world.barrier();
      case kBroadcast:
        return broadcast(step, size(1, 1 << 20));
      case kAllgather:
        return allgather(step, size(1, (4 << 20) / static_cast<std::size_t>(n)));
      case kOneSided:
        return one_sided(step, size(1, kWindowBytes));
      case kPolled:
        return ring(step, size(1, 1 << 20), true);
      case kDevice:
        return device_allreduce(step, size(1, kDeviceBytes / sizeof(std::int64_t)));
    }
    return Status::ok();
  }
};

}  // namespace

int main() {
  const char* seed_text = std::getenv("CAMPAIGN_SEED");
  const char* seconds_text = std::getenv("CAMPAIGN_SECONDS");
  const std::uint64_t seed = seed_text != nullptr ? std::strtoull(seed_text, nullptr, 10) : 1;
  const double seconds = seconds_text != nullptr ? std::atof(seconds_text) : 30;
  const char* device_text = std::getenv("CAMPAIGN_DEVICE");
  const bool device = device_text != nullptr && std::string(device_text) == "1";
  ferry::Context ctx = ferry::Context::init();
  Worker w(ctx);
  if (Status s = device ? w.open_device() : Status::ok(); !s) {
    std::printf("campaign: rank %d UNEXPECTED before the first step: %s\n", w.me,
                s.to_string().c_str());
    return 3;
  }
  if (Status s = w.open_window(); !s) {
    std::printf("campaign: rank %d UNEXPECTED before the first step: %s\n", w.me,
                s.to_string().c_str());
    return 3;
  }
  const char* job = std::getenv("FERRY_JOB_ID");
  std::printf("campaign: rank %d pid %d job %s ready\n", w.me, static_cast<int>(::getpid()),
              job != nullptr && *job != '\0' ? job : "-");
  std::fflush(stdout);
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  Status error;
  long long error_ns = 0;
  std::uint64_t step = 0;
  Kind kind = kSmall;
  for (; std::chrono::steady_clock::now() < give_up; ++step) {
    std::mt19937_64 draw(seed * 1000003 + step);
    kind = static_cast<Kind>(draw() % (device ? kHostKinds + 1 : kHostKinds));
    error = w.run(step, kind, draw);
    if (!w.wrong.empty()) {
      std::printf("campaign: rank %d WRONG: %s\n", w.me, w.wrong.c_str());
      return 2;
    }
    if (!error.is_ok()) {
      error_ns = realtime_ns();
      break;
    }
  }
  if (error.is_ok()) {
    std::printf("campaign: rank %d UNEXPECTED: no failure in %.0f s (%llu steps)\n", w.me, seconds,
                static_cast<unsigned long long>(step));
    return 3;
  }
  if (error.code() != Code::kPeerFailed && error.code() != Code::kRevoked) {
    std::printf("campaign: rank %d UNEXPECTED at step %llu (%s): %s\n", w.me,
                static_cast<unsigned long long>(step), kKindNames[kind], error.to_string().c_str());
    return 3;
  }
  // The others may wait on this rank (a ring step, a collective): the revocation ends those waits.
  static_cast<void>(w.world.revoke());
  // Who failed, agreed by every survivor; then whether all of them hold the same set.
  std::uint64_t flag = 1;
  std::vector<int> failed;
  if (Status s = w.world.agree(&flag, &failed); !s) {
    std::printf("campaign: rank %d UNEXPECTED in agree: %s\n", w.me, s.to_string().c_str());
    return 3;
  }
  std::uint64_t mask = 0;
  for (int m : failed) mask |= std::uint64_t{1} << m;
  ferry::Communicator survivors = w.world.shrink();
  std::uint64_t low = 0, high = 0;
  Status a = survivors.allreduce(&mask, &low, 1, ferry::DataType::kUint64, ferry::ReduceOp::kMin);
  Status b = survivors.allreduce(&mask, &high, 1, ferry::DataType::kUint64, ferry::ReduceOp::kMax);
  std::string names;
  for (int m : failed) names += (names.empty() ? "" : ",") + std::to_string(m);
  std::printf("campaign: rank %d survived: failed [%s] step %llu %s at %lld ns: %s\n", w.me,
              names.c_str(), static_cast<unsigned long long>(step), kKindNames[kind], error_ns,
              error.message().c_str());
  if (!a || !b || low != high) {
    std::printf("campaign: rank %d DIFFER: the survivors' failed sets differ (%s, %s)\n", w.me,
                a.to_string().c_str(), b.to_string().c_str());
    return 4;
  }
  return 0;
}
