// Stream-ordered operations on a GPU (run by ferryrun -n 2; rank r uses GPU r mod the GPU count).
// Every case writes the send buffer by work on the stream, enqueues the operation on the same
// stream, reads the result by work on the stream, and synchronizes only at the end: a result
// that raced the work before or after it shows as a wrong value in the history the stream kept.
// Graph cases capture the operation and replay the graph, each replay's input the last one's
// output. `stream-death`, `graph-death` and `p2p-graph-death` (runs of their own, --keep-going):
// the last rank dies while the others' streams (or graph replays of an allreduce, of a send/recv
// group, or, `broadcast-graph-death`, of a 4 MiB broadcast) wait for it, and they must be released
// with the error in Context::async_error within seconds. `never-arrives` and `p2p-never-arrives`
// (FERRY_TIMEOUT set): rank 0's allreduce (or receive) has no partner, and its stream is released
// with kTimeout. `leaves` and `p2p-leaves` (no FERRY_TIMEOUT): the last rank ends its Context
// while rank 0's allreduce (or receive from it) waits, and the stream is released with kCanceled
// within a second. `thread-idle`: send/recv through the kernels' bulk ring needs no thread of
// ferry's (thread_idle below).
// Without a GPU it exits 77 (CTest: skipped) and says why.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cuda/driver.hpp"
#include "ferry/ferry.hpp"

namespace ferry {
namespace {

Context* g_ctx = nullptr;
const cuda::Driver* g_cuda = nullptr;
CUstream g_stream = nullptr;

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, cuda::error_string(result).c_str());
    std::abort();
  }
}

// Page-locked host memory the stream copies results into.
struct Pinned {
  explicit Pinned(std::size_t bytes) {
    void* p = nullptr;
    check(g_cuda->cuMemHostAlloc(&p, bytes, 0), "cuMemHostAlloc");
    data = static_cast<std::uint8_t*>(p);
    std::memset(data, 0, bytes);
  }
  ~Pinned() { g_cuda->cuMemFreeHost(data); }
  Pinned(const Pinned&) = delete;
  Pinned& operator=(const Pinned&) = delete;
  std::uint8_t* data = nullptr;
};

struct Device {
  explicit Device(std::size_t bytes) { check(g_cuda->cuMemAlloc(&p, bytes), "cuMemAlloc"); }
  ~Device() { g_cuda->cuMemFree(p); }
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;
  [[nodiscard]] void* get() const { return reinterpret_cast<void*>(p); }
  CUdeviceptr p = 0;
};

// Iterations per size: 10,000 for small ones, fewer where each moves much.
int iterations_for(std::size_t bytes) {
  const std::size_t budget = std::size_t{2} << 30;
  return static_cast<int>(std::min<std::size_t>(10000, std::max<std::size_t>(8, budget / bytes)));
}

std::uint8_t value_of(int iteration, int rank) {
  return static_cast<std::uint8_t>(iteration * 13 + rank * 7 + 1);
}

const std::vector<std::size_t> kSizes = {1,     7,        64,        1000,      4096,
                                         65536, 1u << 20, 16u << 20, 256u << 20};

// On the stream: the first and last byte of `result` into history[2i] and history[2i + 1].
void record_ends(const Device& result, std::size_t bytes, Pinned& history, int i) {
  auto* at = history.data + 2 * static_cast<std::size_t>(i);
  check(g_cuda->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(at), result.p, 1, g_stream),
        "copy first");
  check(g_cuda->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(at + 1), result.p + bytes - 1, 1,
                              g_stream),
        "copy last");
}

// Captures `body` on the stream into a graph and replays it `replays` times without a host
// synchronization between, then waits.
template <class Body>
void replay(int replays, Body body) {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  check(g_cuda->cuStreamBeginCapture(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
  body();
  check(g_cuda->cuStreamEndCapture(g_stream, &graph), "end capture");
  check(g_cuda->cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
  for (int i = 0; i < replays; ++i) check(g_cuda->cuGraphLaunch(exec, g_stream), "launch");
  check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
  check(g_cuda->cuGraphExecDestroy(exec), "destroy exec");
  check(g_cuda->cuGraphDestroy(graph), "destroy graph");
}

// Graphs of 100 send/recv groups of 64 KiB (past the eager size) as the first calls between the
// members, member 0's buffers page-locked host memory, so device data to and from it is staged
// through host rings; 200 replays enqueued at once. (The rings are made where the first calls are
// enqueued, not by ferry's thread at the first staged message, where cuMemHostRegister waited for
// ever for a lock of the driver's that a thread blocked in cuGraphLaunch held: `ferryrun -n 2
// ferry-perf sendrecv --graph 100 -m pinned:cuda` on one H200 stopped so. This test did not,
// with or without that change: it covers the staged path in graphs, not that race.)
TEST(Stream, GraphsOfStagedSendRecvAsTheFirstCalls) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  const int next = (world.rank() + 1) % n;
  const int previous = (world.rank() + n - 1) % n;
  constexpr std::size_t kBytes = 65536;
  constexpr int kCalls = 100;
  constexpr std::size_t kAll = kBytes * kCalls;
  const bool host = world.rank() == 0;
  std::optional<Pinned> host_a, host_b;
  std::optional<Device> device_a, device_b;
  std::byte* a = nullptr;
  std::byte* b = nullptr;
  if (host) {
    a = reinterpret_cast<std::byte*>(host_a.emplace(kAll).data);
    b = reinterpret_cast<std::byte*>(host_b.emplace(kAll).data);
    std::memset(a, value_of(0, world.rank()), kAll);
  } else {
    a = static_cast<std::byte*>(device_a.emplace(kAll).get());
    b = static_cast<std::byte*>(device_b.emplace(kAll).get());
    check(g_cuda->cuMemsetD8(device_a->p, value_of(0, world.rank()), kAll), "fill");
    check(g_cuda->cuMemsetD8(device_b->p, 0, kAll), "clear");
    check(g_cuda->cuStreamSynchronize(nullptr), "fill");  // the legacy stream's memsets
  }
  replay(200, [&] {
    for (std::size_t at = 0; at < kAll; at += kBytes) {
      g_ctx->group_start();
      ASSERT_TRUE(world.send(a + at, kBytes, next, g_stream).is_ok());
      ASSERT_TRUE(world.recv(b + at, kBytes, previous, g_stream).is_ok());
      ASSERT_TRUE(g_ctx->group_end().is_ok());
    }
  });
  ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
  std::vector<std::uint8_t> got(kAll);
  check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()),
                         reinterpret_cast<CUdeviceptr>(b), kAll),
        "read");
  int wrong = 0;
  for (std::uint8_t x : got) wrong += x != value_of(0, previous);
  EXPECT_EQ(wrong, 0);
}

// Host-synchronous collectives on the same communicator between stream ones.
TEST(Stream, MixesWithHostCalls) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  Device buffer(4096);
  Pinned history(64);
  std::vector<std::int64_t> host(4, world.rank() + 1);
  for (int i = 0; i < 32; ++i) {
    check(g_cuda->cuMemsetD8Async(buffer.p, value_of(i, world.rank()), 4096, g_stream), "memset");
    ASSERT_TRUE(
        world
            .allreduce(buffer.get(), buffer.get(), 4096, DataType::kUint8, ReduceOp::kSum, g_stream)
            .is_ok());
    check(g_cuda->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(history.data + 2 * i), buffer.p + 17,
                                1, g_stream),
          "copy");
    std::vector<std::int64_t> sum(4);
    ASSERT_TRUE(
        world.allreduce(host.data(), sum.data(), 4, DataType::kInt64, ReduceOp::kSum).is_ok());
    EXPECT_EQ(sum[3], static_cast<std::int64_t>(n) * (n + 1) / 2);
  }
  check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
  for (int i = 0; i < 32; ++i) {
    std::uint8_t expected = 0;
    for (int r = 0; r < n; ++r) expected = static_cast<std::uint8_t>(expected + value_of(i, r));
    EXPECT_EQ(history.data[2 * i], expected) << "iteration " << i;
  }
}

// A graph of one allreduce (sum of float64) and a copy of its result back to its input: after k
// replays every element is S * n^(k-1), S the sum of the members' first inputs (rank + 1), exact
// in binary floating point for n = 2 up to 1,000 replays. It comes before the tests of many sizes,
// so that (members sharing a GPU) its staged messages are the first: ferry's thread must not make
// their rings while this thread waits in cuGraphLaunch on a full stream (it waited for ever).
TEST(Stream, GraphReplaysAllreduce) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  struct Case {
    std::size_t count;
    int replays;
  };
  for (Case c : {Case{1, 1000}, Case{1024, 1000}, Case{1u << 20, 100}, Case{8u << 20, 20}}) {
    const int replays = n == 2 ? c.replays : std::min(c.replays, 20);
    const std::size_t bytes = c.count * sizeof(double);
    Device a(bytes), b(bytes);
    std::vector<double> host(c.count, world.rank() + 1.0);
    check(g_cuda->cuMemcpy(a.p, reinterpret_cast<CUdeviceptr>(host.data()), bytes), "fill");
    // From pageable memory the copy may still run after cuMemcpy returns, on the legacy stream,
    // which the test's stream (non-blocking) does not wait for.
    check(g_cuda->cuStreamSynchronize(nullptr), "fill");
    replay(replays, [&] {
      ASSERT_TRUE(
          world.allreduce(a.get(), b.get(), c.count, DataType::kFloat64, ReduceOp::kSum, g_stream)
              .is_ok());
      check(g_cuda->cuMemcpyAsync(a.p, b.p, bytes, g_stream), "copy back");
    });
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()), a.p, bytes), "read");
    const double expected = n * (n + 1) / 2.0 * std::pow(static_cast<double>(n), replays - 1);
    int wrong = 0;
    for (double x : host) wrong += x != expected;
    EXPECT_EQ(wrong, 0) << c.count << " doubles, " << replays << " replays: " << host[0]
                        << " where " << expected;
  }
}

// A graph of a group (send to the next member, receive from the previous) and a copy of what came
// back into the send buffer: after k replays each member holds member (rank - k)'s first data.
TEST(Stream, GraphReplaysSendRecv) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  const int next = (world.rank() + 1) % n;
  const int previous = (world.rank() + n - 1) % n;
  for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20}) {
    const int replays = 1001;
    Device a(bytes), b(bytes);
    check(g_cuda->cuMemsetD8(a.p, value_of(0, world.rank()), bytes), "fill");
    check(g_cuda->cuStreamSynchronize(nullptr), "fill");  // the legacy stream's memset
    replay(replays, [&] {
      g_ctx->group_start();
      ASSERT_TRUE(world.send(a.get(), bytes, next, g_stream).is_ok());
      ASSERT_TRUE(world.recv(b.get(), bytes, previous, g_stream).is_ok());
      ASSERT_TRUE(g_ctx->group_end().is_ok());
      check(g_cuda->cuMemcpyAsync(a.p, b.p, bytes, g_stream), "copy back");
    });
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    std::vector<std::uint8_t> host(bytes);
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()), a.p, bytes), "read");
    const int origin = ((world.rank() - replays) % n + n) % n;
    int wrong = 0;
    for (std::uint8_t x : host) wrong += x != value_of(0, origin);
    EXPECT_EQ(wrong, 0) << bytes << " B";
  }
}

// Each iteration: the stream sets the send buffer to this iteration's value, `enqueue(send,
// recv, bytes)` puts the operation on the stream, and the stream copies the first and last byte
// of the result into the history, which must then hold `expected(i)` for every iteration i.
template <class Enqueue, class Expected>
void ordered_every_size(const Communicator& world, Enqueue enqueue, Expected expected) {
  for (std::size_t bytes : kSizes) {
    const int iterations = iterations_for(bytes);
    Device send(bytes), recv(bytes);
    Pinned history(2 * static_cast<std::size_t>(iterations));
    for (int i = 0; i < iterations; ++i) {
      check(g_cuda->cuMemsetD8Async(send.p, value_of(i, world.rank()), bytes, g_stream), "memset");
      enqueue(send, recv, bytes);
      if (::testing::Test::HasFatalFailure()) return;
      record_ends(recv, bytes, history, i);
    }
    check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    int wrong = 0;
    for (int i = 0; i < iterations; ++i) {
      wrong += (history.data[2 * i] != expected(i)) + (history.data[2 * i + 1] != expected(i));
    }
    EXPECT_EQ(wrong, 0) << bytes << " B, " << iterations << " iterations";
  }
}

TEST(Stream, AllreduceOrderedEverySize) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  ordered_every_size(
      world,
      [&](Device& send, Device& recv, std::size_t bytes) {
        ASSERT_TRUE(world
                        .allreduce(send.get(), recv.get(), bytes, DataType::kUint8, ReduceOp::kSum,
                                   g_stream)
                        .is_ok());
      },
      [&](int i) {
        std::uint8_t sum = 0;
        for (int r = 0; r < n; ++r) sum = static_cast<std::uint8_t>(sum + value_of(i, r));
        return sum;
      });
}

// Every member sends to the next and receives from the previous, in a group (so neither waits
// for the other), the same stream before and after.
TEST(Stream, SendRecvGroupOrderedEverySize) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  const int next = (world.rank() + 1) % n;
  const int previous = (world.rank() + n - 1) % n;
  ordered_every_size(
      world,
      [&](Device& send, Device& recv, std::size_t bytes) {
        g_ctx->group_start();
        ASSERT_TRUE(world.send(send.get(), bytes, next, g_stream).is_ok());
        ASSERT_TRUE(world.recv(recv.get(), bytes, previous, g_stream).is_ok());
        ASSERT_TRUE(g_ctx->group_end().is_ok());
      },
      [&](int i) { return value_of(i, previous); });
}

// Send/recv between GPUs of one node go through a kernel on the stream (coll/stream_p2p.hpp):
// messages from and into host memory (bounced through device or mapped host memory), a receive
// larger than its message (bytes past the message untouched), messages past the inline limit
// (through the bulk ring between device buffers, past the ring's size, at odd addresses; by
// ferry's thread behind the kernel's header where either side is host memory), empty ones, and
// more messages to one member in a group than the kernel has slots for, in order.
TEST(Stream, SendRecvHostBuffersSizesAndWaves) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  const int next = (world.rank() + 1) % n;
  const int previous = (world.rank() + n - 1) % n;
  enum Where { kDevice, kHost };
  struct Case {
    Where from;
    Where into;
    std::size_t bytes;
    std::size_t capacity;
    std::size_t offset = 0;  // of both device buffers from their allocation
  };
  const Case cases[] = {{kHost, kDevice, 1000, 1000},
                        {kDevice, kHost, 1000, 1000},
                        {kDevice, kDevice, 100, 256 << 10},
                        {kHost, kHost, 200 << 10, 200 << 10},
                        {kDevice, kDevice, 0, 8},
                        {kDevice, kHost, 7, 300 << 10},
                        {kDevice, kDevice, 262144, 262144},
                        {kDevice, kDevice, 262145, 262145},
                        {kHost, kDevice, 262145, 1 << 20},
                        {kDevice, kHost, (1 << 20) + 5, (1 << 20) + 5},
                        {kDevice, kDevice, (9 << 20) + 3, (10 << 20) + 1, 1},
                        {kDevice, kDevice, (3 << 20) + 8, 3 << 21, 8}};
  for (const Case& c : cases) {
    Device device_send(std::max<std::size_t>(c.bytes, 1) + c.offset),
        device_recv(c.capacity + c.offset);
    std::vector<std::uint8_t> host_send(std::max<std::size_t>(c.bytes, 1)), host_recv(c.capacity);
    void* send = c.from == kDevice ? static_cast<std::uint8_t*>(device_send.get()) + c.offset
                                   : host_send.data();
    void* recv = c.into == kDevice ? static_cast<std::uint8_t*>(device_recv.get()) + c.offset
                                   : host_recv.data();
    // Every byte its own value, so that a piece out of place shows.
    auto pattern = [](std::uint8_t value, std::size_t k) {
      return static_cast<std::uint8_t>(value + ((k * 2654435761u) >> 11));
    };
    for (int i = 0; i < 20; ++i) {
      const std::uint8_t value = value_of(i, world.rank());
      check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
      for (std::size_t k = 0; k < c.bytes; ++k) host_send[k] = pattern(value, k);
      if (c.from == kDevice && c.bytes > 0) {
        check(g_cuda->cuMemcpy(device_send.p + c.offset,
                               reinterpret_cast<CUdeviceptr>(host_send.data()), c.bytes),
              "fill");
        // From pageable memory: on the legacy stream, maybe still running.
        check(g_cuda->cuStreamSynchronize(nullptr), "fill");
      }
      if (c.into == kDevice) {
        check(g_cuda->cuMemsetD8Async(device_recv.p + c.offset, 0xee, c.capacity, g_stream),
              "memset");
      } else {
        std::memset(host_recv.data(), 0xee, c.capacity);
      }
      g_ctx->group_start();
      ASSERT_TRUE(world.send(send, c.bytes, next, g_stream).is_ok());
      ASSERT_TRUE(world.recv(recv, c.capacity, previous, g_stream).is_ok());
      ASSERT_TRUE(g_ctx->group_end().is_ok());
      check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
      ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
      std::vector<std::uint8_t> got(c.capacity);
      if (c.into == kDevice) {
        check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()), device_recv.p + c.offset,
                               c.capacity),
              "read");
      } else {
        got = host_recv;
      }
      const std::uint8_t expected = value_of(i, previous);
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < c.capacity; ++k) {
        wrong += got[k] != (k < c.bytes ? pattern(expected, k) : 0xee);
      }
      ASSERT_EQ(wrong, 0u) << c.bytes << " B into " << c.capacity << " B, from "
                           << (c.from == kDevice ? "device" : "host") << " into "
                           << (c.into == kDevice ? "device" : "host") << ", iteration " << i;
    }
  }
  // Ten messages each way in one group, more than the kernel's slots: they arrive in order.
  constexpr int kMessages = 10;
  Device sends(kMessages * 8), recvs(kMessages * 8);
  for (int i = 0; i < 50; ++i) {
    for (int m = 0; m < kMessages; ++m) {
      check(g_cuda->cuMemsetD8Async(sends.p + 8 * m, value_of(i + m, world.rank()), 8, g_stream),
            "memset");
    }
    g_ctx->group_start();
    for (int m = 0; m < kMessages; ++m) {
      ASSERT_TRUE(
          world.send(static_cast<std::uint8_t*>(sends.get()) + 8 * m, 8, next, g_stream).is_ok());
      ASSERT_TRUE(world.recv(static_cast<std::uint8_t*>(recvs.get()) + 8 * m, 8, previous, g_stream)
                      .is_ok());
    }
    ASSERT_TRUE(g_ctx->group_end().is_ok());
    std::vector<std::uint8_t> got(kMessages * 8);
    check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()), recvs.p, got.size()), "read");
    for (int m = 0; m < kMessages; ++m) {
      ASSERT_EQ(got[8 * m], value_of(i + m, previous)) << "message " << m << ", round " << i;
      ASSERT_EQ(got[8 * m + 7], value_of(i + m, previous)) << "message " << m << ", round " << i;
    }
  }
}

// A send to the member itself and its receive from itself in one group are a copy on the
// stream (NCCL's alltoall, gather and scatter make them), beside messages with the others. (A
// send to itself alone in its group waits for its receive, as NCCL's does: a receive later on the
// same stream never comes.)
TEST(Stream, SendRecvToItself) {
  Communicator world = g_ctx->world();
  const int me = world.rank();
  const int n = world.size();
  const int next = (me + 1) % n;
  const int previous = (me + n - 1) % n;
  for (std::size_t bytes : {std::size_t{8}, std::size_t{1} << 20}) {
    for (bool host_send : {false, true}) {
      Device send(bytes), recv(bytes + 64), other_send(bytes), other_recv(bytes);
      std::vector<std::uint8_t> host(bytes);
      for (int i = 0; i < 10; ++i) {
        const std::uint8_t value = value_of(i, me);
        check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
        std::memset(host.data(), value, bytes);
        check(g_cuda->cuMemsetD8Async(send.p, value, bytes, g_stream), "memset");
        check(g_cuda->cuMemsetD8Async(other_send.p, value, bytes, g_stream), "memset");
        check(g_cuda->cuMemsetD8Async(recv.p, 0xee, bytes + 64, g_stream), "memset");
        g_ctx->group_start();
        ASSERT_TRUE(
            world
                .send(host_send ? static_cast<void*>(host.data()) : send.get(), bytes, me, g_stream)
                .is_ok());
        ASSERT_TRUE(world.send(other_send.get(), bytes, next, g_stream).is_ok());
        ASSERT_TRUE(world.recv(other_recv.get(), bytes, previous, g_stream).is_ok());
        ASSERT_TRUE(world.recv(recv.get(), bytes + 64, me, g_stream).is_ok());
        ASSERT_TRUE(g_ctx->group_end().is_ok());
        check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
        ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
        std::vector<std::uint8_t> got(bytes + 64);
        check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()), recv.p, got.size()),
              "read");
        std::size_t wrong = 0;
        for (std::size_t k = 0; k < got.size(); ++k) wrong += got[k] != (k < bytes ? value : 0xee);
        ASSERT_EQ(wrong, 0u) << bytes << " B to itself, round " << i;
        check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()), other_recv.p, bytes),
              "read");
        ASSERT_EQ(got[0], value_of(i, previous));
        ASSERT_EQ(got[bytes - 1], value_of(i, previous));
      }
    }
  }
}

// One group of ten receives that may take more than the inline limit, so each hands off to
// ferry's thread and keeps a verdict until the thread reads it, after the group's last launch:
// the middle wave's messages come inline, the others by the thread. (Verdicts were once kept per
// launch: the second launch overwrote the first's, whose receives then took "inline" for their
// answer and ended without their data.)
TEST(Stream, SendRecvGroupVerdictsOutliveTheirLaunch) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  const int next = (world.rank() + 1) % n;
  const int previous = (world.rank() + n - 1) % n;
  constexpr int kMessages = 10;
  constexpr std::size_t kCapacity = 1 << 20;
  auto size_of_message = [](int m) { return m >= 4 && m < 8 ? std::size_t{8} : kCapacity; };
  Device sends(kMessages * kCapacity), recvs(kMessages * kCapacity);
  for (int i = 0; i < 5; ++i) {
    for (int m = 0; m < kMessages; ++m) {
      check(g_cuda->cuMemsetD8Async(sends.p + m * kCapacity, value_of(i + m, world.rank()),
                                    size_of_message(m), g_stream),
            "memset");
    }
    check(g_cuda->cuMemsetD8Async(recvs.p, 0xee, kMessages * kCapacity, g_stream), "memset");
    g_ctx->group_start();
    for (int m = 0; m < kMessages; ++m) {
      auto* out = static_cast<std::uint8_t*>(sends.get()) + m * kCapacity;
      auto* in = static_cast<std::uint8_t*>(recvs.get()) + m * kCapacity;
      ASSERT_TRUE(world.send(out, size_of_message(m), next, g_stream).is_ok());
      ASSERT_TRUE(world.recv(in, kCapacity, previous, g_stream).is_ok());
    }
    ASSERT_TRUE(g_ctx->group_end().is_ok());
    check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    std::vector<std::uint8_t> got(kMessages * kCapacity);
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()), recvs.p, got.size()), "read");
    for (int m = 0; m < kMessages; ++m) {
      const std::uint8_t* in = got.data() + m * kCapacity;
      const std::size_t size = size_of_message(m);
      std::size_t wrong = 0;
      for (std::size_t k = 0; k < kCapacity; ++k) {
        wrong += in[k] != (k < size ? value_of(i + m, previous) : 0xee);
      }
      ASSERT_EQ(wrong, 0u) << "message " << m << " (" << size << " B), round " << i;
    }
  }
}

// Host buffers, page-locked and not, where the allreduce runs as a kernel on the stream: they go
// through device memory of the kernel's by copies on the stream, the results as exact.
TEST(Stream, AllreduceOfHostBuffers) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  for (std::size_t bytes : {std::size_t{8}, std::size_t{65536}}) {
    Pinned pinned_send(bytes), pinned_recv(bytes);
    std::vector<std::uint8_t> send(bytes), recv(bytes);
    for (int i = 0; i < 100; ++i) {
      std::memset(pinned_send.data, value_of(i, world.rank()), bytes);
      std::memset(send.data(), value_of(i + 1, world.rank()), bytes);
      ASSERT_TRUE(world
                      .allreduce(pinned_send.data, pinned_recv.data, bytes, DataType::kUint8,
                                 ReduceOp::kSum, g_stream)
                      .is_ok());
      ASSERT_TRUE(world
                      .allreduce(send.data(), recv.data(), bytes, DataType::kUint8, ReduceOp::kSum,
                                 g_stream)
                      .is_ok());
      check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
      ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
      std::uint8_t expected = 0;
      std::uint8_t expected_next = 0;
      for (int r = 0; r < n; ++r) {
        expected = static_cast<std::uint8_t>(expected + value_of(i, r));
        expected_next = static_cast<std::uint8_t>(expected_next + value_of(i + 1, r));
      }
      int wrong = 0;
      for (std::size_t k = 0; k < bytes; ++k) {
        wrong += (pinned_recv.data[k] != expected) + (recv[k] != expected_next);
      }
      ASSERT_EQ(wrong, 0) << bytes << " B, iteration " << i;
    }
  }
}

// Every collective on the stream gives the bits of its host-synchronous form on the same inputs
// (float32 sums, whose bits follow the order of the operands): among the members on one node
// the stream forms of allgather, reduce-scatter, broadcast and reduce, and among three or more
// the large allreduces, are kernels on the stream (kernels/mesh.cuh, kernels/twoshot.cuh), and they
// keep the host algorithm's order. Sizes on both sides of each kernel's limits (a 16-byte unit cut,
// past the area: by ferry's thread), every root, and one pass from pageable host memory (staged
// through device memory of the kernel's). Each stream call is followed at once by work on the
// stream that reads its result.
TEST(Stream, EveryCollectiveMatchesItsHostForm) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  const int me = world.rank();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t count : {std::size_t{3}, std::size_t{25000}, std::size_t{262147},
                            std::size_t{1} << 20, std::size_t{1600003}, std::size_t{6} << 20}) {
    const std::size_t bytes = count * sizeof(float);
    std::vector<float> input(un * count);
    for (std::size_t i = 0; i < input.size(); ++i) {
      input[i] = 0.1f * static_cast<float>(me + 1) + 1e-3f * static_cast<float>(i % 977);
    }
    Device in(un * bytes), out(un * bytes), copy(un * bytes);
    std::vector<float> by_stream(un * count), by_host(un * count);
    // `call` on the stream into `out`, then its first `elements` copied to `copy` by the stream
    // (work after it that reads the result); then the host form into `out` again.
    const auto compare = [&](const char* what, std::size_t elements, auto&& stream_call,
                             auto&& host_call, bool from_pageable = false) {
      check(g_cuda->cuMemcpy(in.p, reinterpret_cast<CUdeviceptr>(input.data()), un * bytes),
            "fill");
      check(g_cuda->cuMemsetD8(out.p, 0, un * bytes), "clear");
      // Both on the legacy stream, which the test's stream (non-blocking) does not wait for.
      check(g_cuda->cuStreamSynchronize(nullptr), "fill and clear");
      if (from_pageable) {
        std::vector<float> host_out(un * count, 0.0f);
        ASSERT_TRUE(
            stream_call(static_cast<const void*>(input.data()), static_cast<void*>(host_out.data()))
                .is_ok())
            << what;
        check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
        std::memcpy(by_stream.data(), host_out.data(), elements * sizeof(float));
      } else {
        ASSERT_TRUE(stream_call(static_cast<const void*>(in.get()), out.get()).is_ok()) << what;
        check(g_cuda->cuMemcpyAsync(copy.p, out.p, elements * sizeof(float), g_stream), "copy");
        check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
        check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(by_stream.data()), copy.p,
                               elements * sizeof(float)),
              "read");
      }
      ASSERT_TRUE(g_ctx->async_error().is_ok()) << what << ": " << g_ctx->async_error().to_string();
      check(g_cuda->cuMemcpy(in.p, reinterpret_cast<CUdeviceptr>(input.data()), un * bytes),
            "fill");
      check(g_cuda->cuMemsetD8(out.p, 0, un * bytes), "clear");
      // Both on the legacy stream, which the test's stream (non-blocking) does not wait for.
      check(g_cuda->cuStreamSynchronize(nullptr), "fill and clear");
      ASSERT_TRUE(host_call(static_cast<const void*>(in.get()), out.get()).is_ok()) << what;
      check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(by_host.data()), out.p,
                             elements * sizeof(float)),
            "read");
      std::size_t wrong = 0;
      std::size_t first = elements;
      for (std::size_t i = 0; i < elements; ++i) {
        if (std::memcmp(&by_stream[i], &by_host[i], sizeof(float)) != 0) {
          if (wrong++ == 0) first = i;
        }
      }
      EXPECT_EQ(wrong, 0u) << what << ", " << count << " elements: first at " << first << ": "
                           << (first < elements ? by_stream[first] : 0.0f) << " where "
                           << (first < elements ? by_host[first] : 0.0f);
    };
    const auto sum = ReduceOp::kSum;
    const auto f32 = DataType::kFloat32;
    compare(
        "allreduce", count,
        [&](const void* s, void* r) { return world.allreduce(s, r, count, f32, sum, g_stream); },
        [&](const void* s, void* r) { return world.allreduce(s, r, count, f32, sum); });
    compare(
        "allgather", un * count,
        [&](const void* s, void* r) { return world.allgather(s, r, count, f32, g_stream); },
        [&](const void* s, void* r) { return world.allgather(s, r, count, f32); });
    compare(
        "reduce_scatter", count,
        [&](const void* s, void* r) {
          return world.reduce_scatter(s, r, count, f32, sum, g_stream);
        },
        [&](const void* s, void* r) { return world.reduce_scatter(s, r, count, f32, sum); });
    for (int root = 0; root < n; ++root) {
      // In place: the buffer is `out`, filled from `in` first.
      compare(
          "broadcast", count,
          [&](const void* s, void* r) {
            check(g_cuda->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(r),
                                        reinterpret_cast<CUdeviceptr>(s), bytes, g_stream),
                  "copy in");
            return world.broadcast(r, count, f32, root, g_stream);
          },
          [&](const void* s, void* r) {
            // A copy between device buffers returns before it is done (CUDA's rule for
            // cuMemcpy): the host form's rule is to wait for the stream that wrote the buffer.
            check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(r),
                                   reinterpret_cast<CUdeviceptr>(s), bytes),
                  "copy in");
            check(g_cuda->cuStreamSynchronize(nullptr), "copy in");
            return world.broadcast(r, count, f32, root);
          });
      if (HasFailure()) return;
    }
    for (int root = 0; root < n; ++root) {
      compare(
          "reduce", me == root ? count : 0,
          [&](const void* s, void* r) {
            return world.reduce(s, r, count, f32, sum, root, g_stream);
          },
          [&](const void* s, void* r) { return world.reduce(s, r, count, f32, sum, root); });
    }
    // Sends and receives in a group on the stream (the block to the member itself a copy).
    compare(
        "alltoall", un * count,
        [&](const void* s, void* r) { return world.alltoall(s, r, count, f32, g_stream); },
        [&](const void* s, void* r) { return world.alltoall(s, r, count, f32); });
    for (int root = 0; root < n; ++root) {
      compare(
          "gather", me == root ? un * count : 0,
          [&](const void* s, void* r) { return world.gather(s, r, count, f32, root, g_stream); },
          [&](const void* s, void* r) { return world.gather(s, r, count, f32, root); });
      compare(
          "scatter", count,
          [&](const void* s, void* r) { return world.scatter(s, r, count, f32, root, g_stream); },
          [&](const void* s, void* r) { return world.scatter(s, r, count, f32, root); });
    }
    if (count == (std::size_t{1} << 20)) {
      compare(
          "allgather from pageable host memory", un * count,
          [&](const void* s, void* r) { return world.allgather(s, r, count, f32, g_stream); },
          [&](const void* s, void* r) { return world.allgather(s, r, count, f32); }, true);
    }
    if (HasFailure()) return;
  }
}

// Past what one kernel takes (between two members an allreduce past FERRY_STREAM_KERNEL and a
// reduce past twice that; among any number a broadcast or an allgather past the members' slots,
// twice that for two, and a reduce-scatter whose block is past a slot) a stream call goes in
// rounds of kernels, not to ferry's thread: the bits are still the host form's, the order of
// operands included (the minimum of +0 and -0 is the second operand, so each element shows whose
// value came first).
TEST(Stream, CallsInRoundsMatchTheirHostForm) {
  Communicator world = g_ctx->world();
  const int me = world.rank();
  const std::size_t count = (std::size_t{12} << 20) + 3;  // 48 MiB of float32, an odd count
  const std::size_t bytes = count * sizeof(float);
  const auto input_of = [&](int rank) {
    std::vector<float> v(count);
    for (std::size_t i = 0; i < count; ++i) {
      v[i] = i % 2 == 0 ? (rank % 2 == 0 ? 0.0f : -0.0f)
                        : 1e-3f * static_cast<float>(i % 977) - 0.25f * static_cast<float>(rank);
    }
    return v;
  };
  const std::vector<float> input = input_of(me);
  Device in(bytes), out(bytes);
  std::vector<float> by_stream(count), by_host(count);
  const auto fill = [&] {
    check(g_cuda->cuMemcpy(in.p, reinterpret_cast<CUdeviceptr>(input.data()), bytes), "fill");
    check(g_cuda->cuMemsetD8(out.p, 0, bytes), "clear");
    check(g_cuda->cuStreamSynchronize(nullptr), "fill and clear");
  };
  const auto differ = [&] {
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) {
      wrong += std::memcmp(&by_stream[i], &by_host[i], sizeof(float)) != 0;
    }
    return wrong;
  };
  for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kSum}) {
    fill();
    ASSERT_TRUE(
        world.allreduce(in.get(), out.get(), count, DataType::kFloat32, op, g_stream).is_ok());
    check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(by_stream.data()), out.p, bytes), "read");
    fill();
    ASSERT_TRUE(world.allreduce(in.get(), out.get(), count, DataType::kFloat32, op).is_ok());
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(by_host.data()), out.p, bytes), "read");
    EXPECT_EQ(differ(), 0u) << "allreduce, op " << static_cast<int>(op);
  }
  for (int root = 0; root < world.size(); ++root) {
    fill();
    check(g_cuda->cuMemcpyAsync(out.p, in.p, bytes, g_stream), "copy in");
    ASSERT_TRUE(world.broadcast(out.get(), count, DataType::kFloat32, root, g_stream).is_ok());
    check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(by_stream.data()), out.p, bytes), "read");
    fill();
    check(g_cuda->cuMemcpy(out.p, in.p, bytes), "copy in");
    check(g_cuda->cuStreamSynchronize(nullptr), "copy in");  // device to device: asynchronous
    ASSERT_TRUE(world.broadcast(out.get(), count, DataType::kFloat32, root).is_ok());
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(by_host.data()), out.p, bytes), "read");
    EXPECT_EQ(differ(), 0u) << "broadcast from " << root;
    EXPECT_EQ(std::memcmp(by_host.data(), input_of(root).data(), bytes), 0)
        << "broadcast from " << root << " by the host form";
  }
  // An allgather past the members' slots and a reduce-scatter whose block is past a slot, in
  // rounds of a part of every member's block; a reduce between two past the generation's two
  // slots. Block 0 of a member's input is its input (its -0s kept), block j its input plus j.
  const auto un = static_cast<std::size_t>(world.size());
  std::vector<float> wide_input(un * count);
  for (std::size_t j = 0; j < un; ++j) {
    for (std::size_t i = 0; i < count; ++i) {
      wide_input[j * count + i] = j == 0 ? input[i] : input[i] + static_cast<float>(j);
    }
  }
  Device wide_in(un * bytes), wide_out(un * bytes);
  std::vector<float> wide_stream(un * count), wide_host(un * count);
  const auto both = [&](const std::string& what, std::size_t elements, auto&& call) {
    const auto fill_wide = [&] {
      check(
          g_cuda->cuMemcpy(wide_in.p, reinterpret_cast<CUdeviceptr>(wide_input.data()), un * bytes),
          "fill");
      check(g_cuda->cuMemsetD8(wide_out.p, 0, un * bytes), "clear");
      check(g_cuda->cuStreamSynchronize(nullptr), "fill and clear");
    };
    fill_wide();
    ASSERT_TRUE(call(true).is_ok()) << what;
    check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << what << ": " << g_ctx->async_error().to_string();
    check(
        g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(wide_stream.data()), wide_out.p, un * bytes),
        "read");
    fill_wide();
    ASSERT_TRUE(call(false).is_ok()) << what;
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(wide_host.data()), wide_out.p, un * bytes),
          "read");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < elements; ++i) {
      wrong += std::memcmp(&wide_stream[i], &wide_host[i], sizeof(float)) != 0;
    }
    EXPECT_EQ(wrong, 0u) << what;
  };
  const auto f32 = DataType::kFloat32;
  both("allgather", un * count, [&](bool on_stream) {
    return on_stream ? world.allgather(wide_in.get(), wide_out.get(), count, f32, g_stream)
                     : world.allgather(wide_in.get(), wide_out.get(), count, f32);
  });
  for (std::size_t j = 0; j < un; ++j) {
    EXPECT_EQ(
        std::memcmp(wide_host.data() + j * count, input_of(static_cast<int>(j)).data(), bytes), 0)
        << "allgather by the host form, member " << j << "'s block";
  }
  for (const ReduceOp op : {ReduceOp::kMin, ReduceOp::kSum}) {
    both("reduce_scatter, op " + std::to_string(static_cast<int>(op)), count, [&](bool on_stream) {
      return on_stream
                 ? world.reduce_scatter(wide_in.get(), wide_out.get(), count, f32, op, g_stream)
                 : world.reduce_scatter(wide_in.get(), wide_out.get(), count, f32, op);
    });
    for (int root = 0; root < world.size(); ++root) {
      both("reduce to " + std::to_string(root) + ", op " + std::to_string(static_cast<int>(op)),
           me == root ? count : 0, [&](bool on_stream) {
             return on_stream ? world.reduce(wide_in.get(), wide_out.get(), count, f32, op, root,
                                             g_stream)
                              : world.reduce(wide_in.get(), wide_out.get(), count, f32, op, root);
           });
    }
  }
}

// A graph of an allgather, a reduce-scatter of its result, a broadcast and a reduce, replayed: on
// the stream among the members of one node these are kernels the GPU numbers itself, so each
// replay is a call of its own; checked against the arithmetic.
TEST(Stream, GraphReplaysEveryCollective) {
  Communicator world = g_ctx->world();
  const int n = world.size();
  const int me = world.rank();
  const auto un = static_cast<std::size_t>(n);
  // int32 per member: 4,000 B (by LL lines), 4 MiB (the mesh kernels).
  for (const std::size_t count : {std::size_t{1000}, std::size_t{1} << 20}) {
    const std::size_t bytes = count * sizeof(std::int32_t);
    Device mine(bytes), all(un * bytes), reduced(bytes), rooted(bytes);
    std::vector<std::int32_t> host(count);
    for (std::size_t i = 0; i < count; ++i) host[i] = static_cast<std::int32_t>(i % 1000) + me;
    check(g_cuda->cuMemcpy(mine.p, reinterpret_cast<CUdeviceptr>(host.data()), bytes), "fill");
    check(g_cuda->cuStreamSynchronize(nullptr), "fill");
    const int replays = 20;
    const int root = n - 1;
    replay(replays, [&] {
      const auto i32 = DataType::kInt32;
      ASSERT_TRUE(world.allgather(mine.get(), all.get(), count, i32, g_stream).is_ok());
      ASSERT_TRUE(
          world.reduce_scatter(all.get(), reduced.get(), count, i32, ReduceOp::kSum, g_stream)
              .is_ok());
      ASSERT_TRUE(world.broadcast(reduced.get(), count, i32, root, g_stream).is_ok());
      ASSERT_TRUE(world.reduce(reduced.get(), rooted.get(), count, i32, ReduceOp::kMax, 0, g_stream)
                      .is_ok());
      // The next replay's input: this one's broadcast result.
      check(g_cuda->cuMemcpyAsync(mine.p, reduced.p, bytes, g_stream), "copy back");
    });
    ASSERT_TRUE(g_ctx->async_error().is_ok()) << g_ctx->async_error().to_string();
    // Each replay: the gathered buffer is the same on every member, block r member r's input, so
    // the reduce-scatter leaves member r with n times its own input, and the broadcast leaves every
    // member with n times the root's (int32 arithmetic wraps alike on both sides).
    std::vector<std::int64_t> result(count);
    for (std::size_t i = 0; i < count; ++i) result[i] = static_cast<std::int64_t>(i % 1000) + root;
    for (int k = 0; k < replays; ++k) {
      for (std::int64_t& x : result) {
        x = static_cast<std::int32_t>(static_cast<std::int64_t>(un) * x);
      }
    }
    std::vector<std::int32_t> got(count);
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()), mine.p, bytes), "read");
    std::size_t wrong = 0;
    for (std::size_t i = 0; i < count; ++i) wrong += got[i] != static_cast<std::int32_t>(result[i]);
    EXPECT_EQ(wrong, 0u) << "after " << replays << " replays: " << got[0] << " where "
                         << static_cast<std::int32_t>(result[0]);
    if (me == 0) {
      check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(got.data()), rooted.p, bytes), "read");
      wrong = 0;
      for (std::size_t i = 0; i < count; ++i) {
        wrong += got[i] != static_cast<std::int32_t>(result[i]);
      }
      EXPECT_EQ(wrong, 0u) << "the reduce (max) to member 0 after " << replays << " replays";
    }
  }
}

// Arguments the stream forms refuse where the call is made.
TEST(Stream, RefusesBadArgumentsAtTheCall) {
  Communicator world = g_ctx->world();
  Device buffer(64);
  EXPECT_EQ(world.broadcast(buffer.get(), 8, DataType::kUint8, world.size(), g_stream).code(),
            Code::kInvalidArgument);
  EXPECT_EQ(world.send(buffer.get(), 8, -1, g_stream).code(), Code::kInvalidArgument);
  EXPECT_EQ(
      world
          .allreduce(buffer.get(), buffer.get(), 8, DataType::kFloat32, ReduceOp::kBitAnd, g_stream)
          .code(),
      Code::kInvalidArgument);
  g_ctx->group_start();
  CUstream other = nullptr;
  check(g_cuda->cuStreamCreate(&other, CU_STREAM_NON_BLOCKING), "stream");
  ASSERT_TRUE(world.send(buffer.get(), 8, 0, g_stream).is_ok());
  ASSERT_TRUE(world.recv(buffer.get(), 8, 0, other).is_ok());
  EXPECT_EQ(g_ctx->group_end().code(), Code::kInvalidArgument);
  EXPECT_EQ(g_ctx->group_end().code(), Code::kInvalidArgument);
  g_cuda->cuStreamDestroy(other);
  EXPECT_TRUE(g_ctx->async_error().is_ok());
}

// The last rank dies 300 ms in while every rank enqueues allreduces; the survivors' streams must
// be released (cuStreamSynchronize returns) and the failure be in async_error.
int stream_death(Context& ctx) {
  Communicator world = ctx.world();
  const int victim = ctx.size() - 1;
  Device buffer(4096);
  check(g_cuda->cuMemsetD8(buffer.p, 1, 4096), "memset");
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  long calls = 0;
  Status enqueued;
  while (enqueued.is_ok() && Clock::now() - start < std::chrono::seconds(20)) {
    if (ctx.rank() == victim && Clock::now() - start > std::chrono::milliseconds(300)) {
      ::kill(::getpid(), SIGKILL);
    }
    enqueued = world.allreduce(buffer.get(), buffer.get(), 1024, DataType::kFloat32, ReduceOp::kMax,
                               g_stream);
    ++calls;
    if (calls % 64 == 0) check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
  }
  const auto failed_at = Clock::now();
  const CUresult synchronized = g_cuda->cuStreamSynchronize(g_stream);
  const double release_ms =
      std::chrono::duration<double, std::milli>(Clock::now() - failed_at).count();
  const Status error = ctx.async_error();
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf(
      "rank %d: stream allreduces without rank %d: %ld enqueued, the last enqueue said %s; "
      "stream released %.1f ms after it (%s); async_error %s; %.0f ms in all\n",
      ctx.rank(), victim, calls, enqueued.to_string().c_str(), release_ms,
      synchronized == CUDA_SUCCESS ? "ok" : "failed", error.to_string().c_str(), total_ms);
  const bool ok = synchronized == CUDA_SUCCESS && error.code() == Code::kPeerFailed &&
                  !enqueued.is_ok() && total_ms < 15000;
  return ok ? 0 : 1;
}

// A graph of one 8-byte allreduce replayed over and over while the last rank dies 300 ms in: the
// survivors' replays must end (cuStreamSynchronize returns) with the failure in async_error,
// where the allreduce waits for its peers inside a kernel of the graph.
// `p2p`: the graph is a group of a send to the next member and a receive from the previous.
enum class Replayed { kAllreduce, kSendRecv, kBroadcast };

int graph_death(Context& ctx, Replayed what) {
  const bool p2p = what == Replayed::kSendRecv;
  Communicator world = ctx.world();
  const int victim = ctx.size() - 1;
  const int n = ctx.size();
  // A broadcast of 4 MiB: the mesh kernel, whose blocks wait on flags.
  const std::size_t broadcast_bytes = std::size_t{4} << 20;
  Device buffer(what == Replayed::kBroadcast ? broadcast_bytes : 8), other(8);
  check(g_cuda->cuMemsetD8(buffer.p, 1, 8), "memset");
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  check(g_cuda->cuStreamBeginCapture(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
  Status captured;
  if (p2p) {
    ctx.group_start();
    captured = world.send(buffer.get(), 8, (ctx.rank() + 1) % n, g_stream);
    if (captured.is_ok()) captured = world.recv(other.get(), 8, (ctx.rank() + n - 1) % n, g_stream);
    const Status ended = ctx.group_end();
    if (captured.is_ok()) captured = ended;
  } else if (what == Replayed::kBroadcast) {
    captured = world.broadcast(buffer.get(), broadcast_bytes, DataType::kUint8, 0, g_stream);
  } else {
    captured =
        world.allreduce(buffer.get(), buffer.get(), 1, DataType::kInt64, ReduceOp::kMax, g_stream);
  }
  check(g_cuda->cuStreamEndCapture(g_stream, &graph), "end capture");
  check(g_cuda->cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  long replays = 0;
  while (ctx.async_error().is_ok() && Clock::now() - start < std::chrono::seconds(20)) {
    if (ctx.rank() == victim && Clock::now() - start > std::chrono::milliseconds(300)) {
      ::kill(::getpid(), SIGKILL);
    }
    check(g_cuda->cuGraphLaunch(exec, g_stream), "launch");
    if (++replays % 64 == 0) check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
  }
  const CUresult synchronized = g_cuda->cuStreamSynchronize(g_stream);
  const Status error = ctx.async_error();
  const double total_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf(
      "rank %d: graph replays of %s without rank %d: captured %s, %ld replays; "
      "stream %s; async_error %s; %.0f ms in all (the kill at 300)\n",
      ctx.rank(),
      p2p                            ? "a send/recv group"
      : what == Replayed::kBroadcast ? "a 4 MiB broadcast"
                                     : "an allreduce",
      victim, captured.to_string().c_str(), replays,
      synchronized == CUDA_SUCCESS ? "released" : "failed", error.to_string().c_str(), total_ms);
  g_cuda->cuGraphExecDestroy(exec);
  g_cuda->cuGraphDestroy(graph);
  const bool ok = captured.is_ok() && synchronized == CUDA_SUCCESS &&
                  error.code() == Code::kPeerFailed && total_ms < 15000;
  return ok ? 0 : 1;
}

// The Context's async error once it is set (ferry's thread sets it within a millisecond or so of
// a kernel's stop), or ok after `limit` from `start`.
Status async_error_within(Context& ctx, std::chrono::steady_clock::time_point start,
                          std::chrono::seconds limit) {
  while (ctx.async_error().is_ok() && std::chrono::steady_clock::now() - start < limit) {
    ::usleep(1000);
  }
  return ctx.async_error();
}

// After one allreduce together, rank 0 enqueues one that no other rank makes (they wait, then
// meet it in a barrier): with FERRY_TIMEOUT set (1 s), its stream must be released within about
// that time, the error kTimeout.
// `p2p`: the same with a pair of send/recv groups first and then a receive from rank 1 that rank 1
// never sends.
int never_arrives(Context& ctx, bool p2p) {
  Communicator world = ctx.world();
  const int n = ctx.size();
  Device buffer(64), other(64);
  check(g_cuda->cuMemsetD8(buffer.p, 1, 64), "memset");
  auto first = [&] {
    if (!p2p) {
      return world.allreduce(buffer.get(), buffer.get(), 8, DataType::kFloat64, ReduceOp::kSum,
                             g_stream);
    }
    ctx.group_start();
    Status s = world.send(buffer.get(), 8, (ctx.rank() + 1) % n, g_stream);
    if (s.is_ok()) s = world.recv(other.get(), 8, (ctx.rank() + n - 1) % n, g_stream);
    const Status ended = ctx.group_end();
    return s.is_ok() ? ended : s;
  };
  Status enqueued = first();
  check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
  if (!enqueued.is_ok() || !ctx.async_error().is_ok()) {
    std::printf("rank %d: the first allreduce failed: %s / %s\n", ctx.rank(),
                enqueued.to_string().c_str(), ctx.async_error().to_string().c_str());
    return 1;
  }
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  if (ctx.rank() != 0) ::usleep(800000);
  if (ctx.rank() == 0) {
    enqueued = p2p ? world.recv(other.get(), 8, 1, g_stream)
                   : world.allreduce(buffer.get(), buffer.get(), 8, DataType::kFloat64,
                                     ReduceOp::kSum, g_stream);
    check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
    (void)async_error_within(ctx, start, std::chrono::seconds(30));
  }
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  const Status error = ctx.async_error();
  std::printf(
      "rank %d: %s nobody else made: enqueued %s; stream released and async "
      "error %s after %.0f ms\n",
      ctx.rank(), p2p ? "a receive whose send" : "an allreduce", enqueued.to_string().c_str(),
      error.to_string().c_str(), ms);
  const Status met = world.barrier();
  return met.is_ok() && (ctx.rank() != 0 || (enqueued.is_ok() && error.code() == Code::kTimeout))
             ? 0
             : 1;
}

// `leaves` (FERRY_TIMEOUT unset): the last rank ends its Context, alive, without joining the
// others' last stream call, which waits for it inside a kernel (an allreduce; `p2p`: a receive
// from it). Nothing dies and no deadline runs, so only its finalize notice and the kernel's word
// naming whom it waits for (coll/departed_wait.hpp) can release the stream: it must be released
// with kCanceled naming that rank, within a second of the end.
int leaves(Context& ctx, bool p2p) {
  Communicator world = ctx.world();
  const int n = ctx.size();
  const int victim = n - 1;
  Device buffer(64), other(64);
  check(g_cuda->cuMemsetD8(buffer.p, 1, 64), "memset");
  // The first calls set up the kernels' areas and pairs on every member.
  Status first =
      world.allreduce(buffer.get(), buffer.get(), 8, DataType::kFloat64, ReduceOp::kSum, g_stream);
  if (first.is_ok()) {
    ctx.group_start();
    first = world.send(buffer.get(), 8, (ctx.rank() + 1) % n, g_stream);
    if (first.is_ok()) first = world.recv(other.get(), 8, (ctx.rank() + n - 1) % n, g_stream);
    const Status ended = ctx.group_end();
    if (first.is_ok()) first = ended;
  }
  check(g_cuda->cuStreamSynchronize(g_stream), "synchronize");
  if (!first.is_ok() || !ctx.async_error().is_ok()) {
    std::printf("rank %d: the first calls failed: %s / %s\n", ctx.rank(), first.to_string().c_str(),
                ctx.async_error().to_string().c_str());
    return 1;
  }
  using Clock = std::chrono::steady_clock;
  if (ctx.rank() == victim) {
    if (!world.barrier().is_ok()) return 1;
    const auto start = Clock::now();
    { Context gone = std::move(ctx); }
    std::printf("rank %d: ended its Context in %.0f ms; staying alive for 5 s\n", victim,
                std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    ::usleep(5000000);
    return 0;
  }
  // Enqueued before the barrier that lets the victim go: the kernel already waits for it.
  const Status enqueued = p2p ? world.recv(other.get(), 8, victim, g_stream)
                              : world.allreduce(buffer.get(), buffer.get(), 8, DataType::kFloat64,
                                                ReduceOp::kSum, g_stream);
  const Status met = world.barrier();
  const auto start = Clock::now();
  const CUresult synchronized = g_cuda->cuStreamSynchronize(g_stream);
  const Status error = async_error_within(ctx, start, std::chrono::seconds(30));
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  std::printf(
      "rank %d: %s rank %d, which ended its Context: enqueued %s, barrier %s; stream %s and "
      "async error %s %.0f ms after the barrier\n",
      ctx.rank(), p2p ? "a receive from" : "an allreduce without", victim,
      enqueued.to_string().c_str(), met.to_string().c_str(),
      synchronized == CUDA_SUCCESS ? "released" : "failed", error.to_string().c_str(), ms);
  return enqueued.is_ok() && met.is_ok() && synchronized == CUDA_SUCCESS &&
                 error.code() == Code::kCanceled && ms < 1000
             ? 0
             : 1;
}

// `thread-idle` (FERRY_TEST_STREAM_THREAD_IDLE=1: ferry's stream thread starts no hand-off; the
// members' send/recv must take the kernels: GPUs of their own, or FERRY_COLL_DEVICE_SHARED_GPU=1).
// Send/recv groups of device buffers past the inline limit go through the bulk ring, and their
// launch releases the stream itself (proto::Release): back-to-back groups and graph replays of 1
// and 4 MiB end, their data right, without the thread. Then, to show that the thread is idle
// indeed, a 1 MiB receive into page-locked host memory (the thread copies it) keeps its stream
// waiting; the communicator's end must not wait for it (its memory goes once no stream waits for
// the thread), and the Context's end releases it.
int thread_idle(Context& ctx) {
  Communicator world = ctx.world();
  const int n = world.size();
  const int next = (world.rank() + 1) % n;
  const int previous = (world.rank() + n - 1) % n;
  using Clock = std::chrono::steady_clock;
  auto ended_within = [](std::chrono::seconds limit) {
    const auto until = Clock::now() + limit;
    for (;;) {
      const CUresult r = g_cuda->cuStreamQuery(g_stream);
      if (r == CUDA_SUCCESS) return true;
      if (r != CUDA_ERROR_NOT_READY) check(r, "cuStreamQuery");
      if (Clock::now() > until) return false;
      ::usleep(1000);
    }
  };
  auto since_ms = [](Clock::time_point start) {
    return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  };
  int failures = 0;
  for (std::size_t bytes : {std::size_t{1} << 20, std::size_t{4} << 20}) {
    Device a(bytes), b(bytes);
    check(g_cuda->cuMemsetD8(a.p, value_of(0, world.rank()), bytes), "fill");
    check(g_cuda->cuStreamSynchronize(nullptr), "fill");
    auto group = [&] {
      ctx.group_start();
      Status s = world.send(a.get(), bytes, next, g_stream);
      if (s.is_ok()) s = world.recv(b.get(), bytes, previous, g_stream);
      const Status ended = ctx.group_end();
      check(g_cuda->cuMemcpyAsync(a.p, b.p, bytes, g_stream), "copy back");
      return s.is_ok() ? ended : s;
    };
    constexpr int kBackToBack = 10;
    constexpr int kReplays = 50;
    Status enqueued;
    const auto start = Clock::now();
    for (int i = 0; i < kBackToBack && enqueued.is_ok(); ++i) enqueued = group();
    // Where it stops, the back-to-back groups or the replays (a stream that never ends keeps the
    // graph's capture from starting: it is not tried then).
    const bool straight = ended_within(std::chrono::seconds(30));
    std::printf("rank %d: %zu B, %d groups back to back: enqueued %s, stream %s after %.0f ms\n",
                world.rank(), bytes, kBackToBack, enqueued.to_string().c_str(),
                straight ? "ended" : "still waits", since_ms(start));
    if (!straight) return 1;  // the buffers stay: the stream still uses them
    CUgraph graph = nullptr;
    CUgraphExec exec = nullptr;
    check(g_cuda->cuStreamBeginCapture(g_stream, CU_STREAM_CAPTURE_MODE_GLOBAL), "begin capture");
    if (enqueued.is_ok()) enqueued = group();
    check(g_cuda->cuStreamEndCapture(g_stream, &graph), "end capture");
    check(g_cuda->cuGraphInstantiateWithFlags(&exec, graph, 0), "instantiate");
    for (int i = 0; i < kReplays; ++i) check(g_cuda->cuGraphLaunch(exec, g_stream), "launch");
    const auto replayed = Clock::now();
    const bool ended = ended_within(std::chrono::seconds(30));
    int wrong = -1;
    if (ended) {
      check(g_cuda->cuGraphExecDestroy(exec), "destroy exec");
      check(g_cuda->cuGraphDestroy(graph), "destroy graph");
      std::vector<std::uint8_t> host(bytes);
      check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()), a.p, bytes), "read");
      const int origin = ((world.rank() - kBackToBack - kReplays) % n + n) % n;
      wrong = 0;
      for (std::uint8_t x : host) wrong += x != value_of(0, origin);
    }
    const bool ok = enqueued.is_ok() && ended && wrong == 0 && ctx.async_error().is_ok();
    std::printf(
        "rank %d: %zu B send/recv groups, %d back to back and %d graph replays with ferry's "
        "thread idle: enqueued %s, stream %s after %.0f ms of replays, %d bytes wrong, async "
        "error %s: %s\n",
        world.rank(), bytes, kBackToBack, kReplays, enqueued.to_string().c_str(),
        ended ? "ended" : "still waits", since_ms(replayed), wrong,
        ctx.async_error().to_string().c_str(), ok ? "ok" : "FAILED");
    failures += ok ? 0 : 1;
    if (!ended) return 1;  // the buffers stay: the stream still uses them
  }
  // Collectives past what one kernel takes (40 MiB a member, past the default FERRY_STREAM_KERNEL
  // of 16 MiB) go in rounds of kernels: they end with the thread idle, their bytes right.
  {
    const auto un = static_cast<std::size_t>(n);
    constexpr std::size_t kCount = std::size_t{40} << 20;
    const auto mine = static_cast<unsigned char>(world.rank() + 1);
    const auto sum = static_cast<unsigned char>(n * (n + 1) / 2);
    Device in(un * kCount), out(un * kCount);
    std::vector<unsigned char> host(un * kCount);
    struct Case {
      const char* what;
      std::function<Status()> call;
      std::function<unsigned char(std::size_t)> expected;  // of byte i of the result
      std::size_t bytes;  // of the result to check (0: not run here)
      bool in_place;      // the result in `in` (a broadcast's one buffer), else in `out`
    };
    const auto u8 = DataType::kUint8;
    const int root = n - 1;
    const Case cases[] = {
        {"allgather", [&] { return world.allgather(in.get(), out.get(), kCount, u8, g_stream); },
         [&](std::size_t i) { return static_cast<unsigned char>(i / kCount + 1); }, un * kCount,
         false},
        {"reduce_scatter",
         [&] {
           return world.reduce_scatter(in.get(), out.get(), kCount, u8, ReduceOp::kSum, g_stream);
         },
         [&](std::size_t) { return sum; }, kCount, false},
        {"allreduce",
         [&] { return world.allreduce(in.get(), out.get(), kCount, u8, ReduceOp::kSum, g_stream); },
         // Among more than two, past one kernel, an allreduce or a reduce still takes the thread.
         [&](std::size_t) { return sum; }, n == 2 ? kCount : 0, false},
        {"reduce",
         [&] {
           return world.reduce(in.get(), out.get(), kCount, u8, ReduceOp::kSum, root, g_stream);
         },
         // A non-root's receive buffer stays as it was (cleared).
         [&](std::size_t) { return world.rank() == root ? sum : static_cast<unsigned char>(0); },
         n == 2 ? kCount : 0, false},
        {"broadcast", [&] { return world.broadcast(in.get(), kCount, u8, root, g_stream); },
         [&](std::size_t) { return static_cast<unsigned char>(n); }, kCount, true},
    };
    for (const Case& c : cases) {
      if (c.bytes == 0) continue;
      check(g_cuda->cuMemsetD8(in.p, mine, un * kCount), "fill");
      check(g_cuda->cuMemsetD8(out.p, 0, un * kCount), "clear");
      check(g_cuda->cuStreamSynchronize(nullptr), "fill");
      const auto start = Clock::now();
      const Status enqueued = c.call();
      const bool ended = ended_within(std::chrono::seconds(30));
      std::size_t wrong = 0;
      if (ended) {
        check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()),
                               c.in_place ? in.p : out.p, c.bytes),
              "read");
        for (std::size_t i = 0; i < c.bytes; ++i) wrong += host[i] != c.expected(i);
      }
      const bool ok = enqueued.is_ok() && ended && wrong == 0 && ctx.async_error().is_ok();
      std::printf(
          "rank %d: a 40 MiB %s on the stream with ferry's thread idle: enqueued %s, stream %s "
          "after %.0f ms, %zu bytes wrong: %s\n",
          world.rank(), c.what, enqueued.to_string().c_str(), ended ? "ended" : "still waits",
          since_ms(start), wrong, ok ? "ok" : "FAILED");
      failures += ok ? 0 : 1;
      if (!ended) return 1;  // the buffers stay: the stream still uses them
    }
  }
  if (!world.barrier().is_ok()) return 1;
  // The control: a receive into host memory needs the thread, so its stream waits.
  constexpr std::size_t kBytes = 1 << 20;
  // The stream may use them until the process ends: they stay.
  auto* send_buffer = new Device(kBytes);
  auto* receive_buffer = new Pinned(kBytes);
  ctx.group_start();
  Status s = world.send(send_buffer->get(), kBytes, next, g_stream);
  if (s.is_ok()) s = world.recv(receive_buffer->data, kBytes, previous, g_stream);
  const Status grouped = ctx.group_end();
  const bool waits = !ended_within(std::chrono::seconds(2));
  std::printf(
      "rank %d: a 1 MiB receive into host memory with ferry's thread idle: enqueued %s, "
      "stream %s: %s\n",
      world.rank(), (s.is_ok() ? grouped : s).to_string().c_str(),
      waits ? "waits (as it must)" : "ended", waits ? "ok" : "FAILED");
  failures += waits && s.is_ok() && grouped.is_ok() ? 0 : 1;
  return failures == 0 ? 0 : 1;
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // lines reach the log even where the job is killed
  std::string why;
  ferry::g_cuda = ferry::cuda::driver(&why);
  if (ferry::g_cuda == nullptr) {
    std::printf("SKIP: GPU tests need a CUDA driver and device: %s\n", why.c_str());
    return 77;
  }
  try {
    ferry::Context ctx = ferry::Context::init();
    ferry::g_ctx = &ctx;
    CUdevice device;
    ferry::check(ferry::g_cuda->cuDeviceGet(&device, ctx.rank() % ferry::g_cuda->device_count),
                 "cuDeviceGet");
    CUcontext context;
    ferry::check(ferry::g_cuda->cuDevicePrimaryCtxRetain(&context, device), "retain");
    ferry::check(ferry::g_cuda->cuCtxSetCurrent(context), "set current");
    ferry::check(ferry::g_cuda->cuStreamCreate(&ferry::g_stream, CU_STREAM_NON_BLOCKING),
                 "cuStreamCreate");
    int result = 0;
    if (argc > 1 && std::string(argv[1]) == "stream-death") {
      result = ferry::stream_death(ctx);
    } else if (argc > 1 && std::string(argv[1]) == "graph-death") {
      result = ferry::graph_death(ctx, ferry::Replayed::kAllreduce);
    } else if (argc > 1 && std::string(argv[1]) == "p2p-graph-death") {
      result = ferry::graph_death(ctx, ferry::Replayed::kSendRecv);
    } else if (argc > 1 && std::string(argv[1]) == "broadcast-graph-death") {
      result = ferry::graph_death(ctx, ferry::Replayed::kBroadcast);
    } else if (argc > 1 && std::string(argv[1]) == "never-arrives") {
      result = ferry::never_arrives(ctx, false);
    } else if (argc > 1 && std::string(argv[1]) == "p2p-never-arrives") {
      result = ferry::never_arrives(ctx, true);
    } else if (argc > 1 && std::string(argv[1]) == "leaves") {
      result = ferry::leaves(ctx, false);
    } else if (argc > 1 && std::string(argv[1]) == "p2p-leaves") {
      result = ferry::leaves(ctx, true);
    } else if (argc > 1 && std::string(argv[1]) == "thread-idle") {
      result = ferry::thread_idle(ctx);
    } else {
      result = RUN_ALL_TESTS();
    }
    ferry::g_ctx = nullptr;
    return result;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "gpu_stream_test: %s\n", e.what());
    return 1;
  }
}
