// Stream-ordered operations on a machine without a GPU (run by ferryrun -n 2): the tests'
// stand-in CUDA (helpers/fake_cuda.hpp) makes every buffer host memory and every stream a thread,
// so ferry's hand-offs to its thread, graph capture and replay, the proxy's waits, and the
// releases of a stream whose operation cannot end run as they do on a GPU, with the stream's
// order checked by work enqueued before and after each operation. tests/mp/gpu_stream_test.cpp
// runs the same paths, and the kernels, on GPUs.
//
// Runs of their own (ferryrun --keep-going), each printing one line the CTest checks:
// `peer-dies` (rank 1 is killed while rank 0's stream waits in a graph replay of a receive from
// it: the stream is released and the error is in Context::async_error within seconds),
// `never-arrives` (FERRY_TIMEOUT=1: a receive nobody sends to releases its stream with kTimeout)
// and `context-ends` (the Context ends while its stream waits for a receive: the stream goes on).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../helpers/fake_cuda.hpp"
#include "../helpers/ranks_main.hpp"
#include "ferry/ferry.hpp"

namespace ferry::test {
namespace {

using Clock = std::chrono::steady_clock;

FakeCuda& fake() { return *FakeCuda::last(); }

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

// Element i of message `round`.
std::uint32_t pattern(int round, std::size_t i) {
  return static_cast<std::uint32_t>(round) * 2654435761u + static_cast<std::uint32_t>(i);
}

bool holds(const std::vector<std::uint32_t>& data, int round) {
  for (std::size_t i = 0; i < data.size(); ++i) {
    if (data[i] != pattern(round, i)) return false;
  }
  return true;
}

// 200 messages each way of 8 B and of 256 KiB (a rendezvous), from four buffers in turn, with no
// synchronisation between: only the stream's order keeps a buffer from being filled again before
// its message left, or read before its message came. 200 is far more than the hand-offs that may
// wait at once (8), so the enqueueing thread waits for the proxy on the way.
TEST(FakeStream, SendRecvFollowTheStreamsOrder) {
  Communicator world = ctx().world();
  const int peer = 1 - me();
  for (std::size_t elements : {std::size_t{2}, std::size_t{65536}}) {
    FakeStream stream;
    constexpr int kRounds = 200;
    std::vector<std::vector<std::uint32_t>> out(4, std::vector<std::uint32_t>(elements));
    std::vector<std::vector<std::uint32_t>> in(4, std::vector<std::uint32_t>(elements));
    std::atomic<int> wrong{0};
    std::atomic<int> checked{0};
    const int handoffs = fake().handoffs.load();
    for (int round = 0; round < kRounds; ++round) {
      auto& o = out[static_cast<std::size_t>(round % 4)];
      auto& i = in[static_cast<std::size_t>(round % 4)];
      stream.enqueue([&o, round] {
        for (std::size_t k = 0; k < o.size(); ++k) o[k] = pattern(round, k);
      });
      // Rank 0 sends first, rank 1 receives first: the stream's order alone pairs them.
      const std::size_t bytes = elements * sizeof(std::uint32_t);
      Status a = me() == 0 ? world.send(o.data(), bytes, peer, stream.handle())
                           : world.recv(i.data(), bytes, peer, stream.handle());
      Status b = me() == 0 ? world.recv(i.data(), bytes, peer, stream.handle())
                           : world.send(o.data(), bytes, peer, stream.handle());
      ASSERT_TRUE(a.is_ok() && b.is_ok()) << a.to_string() << " / " << b.to_string();
      stream.enqueue([&i, round, &wrong, &checked] {
        if (!holds(i, round)) wrong.fetch_add(1);
        checked.fetch_add(1);
      });
    }
    stream.synchronize();
    EXPECT_EQ(checked.load(), kRounds);
    EXPECT_EQ(wrong.load(), 0) << elements * 4 << " bytes";
    EXPECT_GE(fake().handoffs.load() - handoffs, 2 * kRounds);
    EXPECT_TRUE(ctx().async_error().is_ok()) << ctx().async_error().to_string();
  }
}

// Collectives on the legacy and the per-thread default streams (the stand-in's one default
// stream), each ordered after the fill before it and before the check after it.
TEST(FakeStream, AllreduceOnTheDefaultStreams) {
  Communicator world = ctx().world();
  FakeStream& stream = fake().default_stream();
  std::vector<double> data(1024);
  std::atomic<int> wrong{0};
  for (int round = 0; round < 50; ++round) {
    stream.enqueue([&data, round] {
      for (std::size_t k = 0; k < data.size(); ++k) data[k] = round + me() + static_cast<double>(k);
    });
    const CudaStream which = round % 2 == 0 ? kLegacyStream : kPerThreadStream;
    Status s = world.allreduce(data.data(), data.data(), data.size(), DataType::kFloat64,
                               ReduceOp::kSum, which);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    stream.enqueue([&data, round, &wrong] {
      // Ranks 0 and 1: (round + k) + (round + 1 + k).
      for (std::size_t k = 0; k < data.size(); ++k) {
        if (data[k] != 2.0 * (round + static_cast<double>(k)) + 1) {
          wrong.fetch_add(1);
          return;
        }
      }
    });
  }
  stream.synchronize();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_TRUE(ctx().async_error().is_ok()) << ctx().async_error().to_string();
}

// Both ranks send before they receive, in a group: started together, so neither waits for the
// other's receive; and a host call of the same Context between stream calls.
TEST(FakeStream, GroupsAndHostCallsMix) {
  Communicator world = ctx().world();
  const int peer = 1 - me();
  FakeStream stream;
  std::vector<std::uint32_t> out(1 << 18), in(1 << 18);
  for (int round = 0; round < 20; ++round) {
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = pattern(round + me(), k);
    ctx().group_start();
    Status a = world.send(out.data(), out.size() * 4, peer, stream.handle());
    Status b = world.recv(in.data(), in.size() * 4, peer, stream.handle());
    Status ended = ctx().group_end();
    ASSERT_TRUE(a.is_ok() && b.is_ok() && ended.is_ok()) << a.to_string() << b.to_string();
    stream.synchronize();
    ASSERT_TRUE(holds(in, round + peer)) << "round " << round;
    std::uint64_t sum = 1;
    ASSERT_TRUE(world.allreduce(&sum, &sum, 1, DataType::kUint64, ReduceOp::kSum).is_ok());
    ASSERT_EQ(sum, 2u);
  }
  EXPECT_TRUE(ctx().async_error().is_ok()) << ctx().async_error().to_string();
}

// A graph of fill, send/receive and check, captured once and replayed 30 times: every replay
// communicates again with no call into ferry; then the graph goes and its words serve a plain
// stream call.
TEST(FakeStream, GraphReplaysCommunicateAgain) {
  Communicator world = ctx().world();
  const int peer = 1 - me();
  FakeStream stream;
  std::vector<std::uint32_t> out(4096), in(4096);
  std::atomic<int> replay{0};
  std::atomic<int> wrong{0};
  stream.begin_capture();
  stream.enqueue([&] {
    for (std::size_t k = 0; k < out.size(); ++k) out[k] = pattern(replay.load() * 2 + me(), k);
  });
  ctx().group_start();
  Status a = world.send(out.data(), out.size() * 4, peer, stream.handle());
  Status b = world.recv(in.data(), in.size() * 4, peer, stream.handle());
  Status ended = ctx().group_end();
  stream.enqueue([&] {
    if (!holds(in, replay.load() * 2 + peer)) wrong.fetch_add(1);
    replay.fetch_add(1);
  });
  std::unique_ptr<FakeGraph> graph = stream.end_capture();
  ASSERT_TRUE(a.is_ok() && b.is_ok() && ended.is_ok()) << a.to_string() << b.to_string();
  const int handoffs = fake().handoffs.load();
  for (int r = 0; r < 30; ++r) graph->launch(stream);
  stream.synchronize();
  EXPECT_EQ(replay.load(), 30);
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(fake().handoffs.load(), handoffs);  // no call into ferry per replay
  graph.reset();
  std::uint32_t word = 7 + me();
  std::uint32_t got = 0;
  ctx().group_start();
  ASSERT_TRUE(world.send(&word, 4, peer, stream.handle()).is_ok());
  ASSERT_TRUE(world.recv(&got, 4, peer, stream.handle()).is_ok());
  ASSERT_TRUE(ctx().group_end().is_ok());
  stream.synchronize();
  EXPECT_EQ(got, 7u + peer);
  EXPECT_TRUE(ctx().async_error().is_ok()) << ctx().async_error().to_string();
}

// A collective captured with the work that fills its buffer and the work that checks it, replayed
// 30 times: each replay reduces what that replay filled in, on both members.
TEST(FakeStream, GraphReplaysOfACollectiveReduceEachReplaysData) {
  Communicator world = ctx().world();
  FakeStream stream;
  std::vector<std::uint32_t> data(64);
  std::atomic<int> replay{0};
  std::atomic<int> wrong{0};
  // First a call of the stream's own, whose words the captured call may take next.
  ASSERT_TRUE(world
                  .allreduce(data.data(), data.data(), data.size(), DataType::kUint32,
                             ReduceOp::kSum, stream.handle())
                  .is_ok());
  stream.synchronize();
  stream.begin_capture();
  stream.enqueue([&] {
    for (std::size_t k = 0; k < data.size(); ++k) data[k] = pattern(replay.load() * 2 + me(), k);
  });
  Status s = world.allreduce(data.data(), data.data(), data.size(), DataType::kUint32,
                             ReduceOp::kSum, stream.handle());
  stream.enqueue([&] {
    const int r = replay.load();
    for (std::size_t k = 0; k < data.size(); ++k) {
      if (data[k] != pattern(r * 2, k) + pattern(r * 2 + 1, k)) {
        wrong.fetch_add(1);
        break;
      }
    }
    replay.fetch_add(1);
  });
  std::unique_ptr<FakeGraph> graph = stream.end_capture();
  ASSERT_TRUE(s.is_ok()) << s.to_string();
  for (int r = 0; r < 30; ++r) graph->launch(stream);
  stream.synchronize();
  EXPECT_EQ(replay.load(), 30);
  EXPECT_EQ(wrong.load(), 0);
  graph.reset();
  EXPECT_TRUE(ctx().async_error().is_ok()) << ctx().async_error().to_string();
}

// Where the graph refuses ferry's hold on it, the captured call fails, saying so, and leaves
// nothing behind: no asynchronous error, and the next calls work.
TEST(FakeStream, AGraphThatRefusesItsHoldFailsTheCall) {
  Communicator world = ctx().world();
  FakeStream stream;
  double value = 1;
  fake().refuse_graph_retain = true;
  stream.begin_capture();
  Status s =
      world.allreduce(&value, &value, 1, DataType::kFloat64, ReduceOp::kSum, stream.handle());
  std::unique_ptr<FakeGraph> graph = stream.end_capture();
  fake().refuse_graph_retain = false;
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.message().find("captured in a graph"), std::string::npos) << s.to_string();
  EXPECT_NE(s.message().find("refused"), std::string::npos) << s.to_string();
  graph.reset();
  ASSERT_TRUE(
      world.allreduce(&value, &value, 1, DataType::kFloat64, ReduceOp::kSum, stream.handle())
          .is_ok());
  stream.synchronize();
  EXPECT_EQ(value, 2.0);
  EXPECT_TRUE(ctx().async_error().is_ok()) << ctx().async_error().to_string();
}

// A communicator's memory for stream sends and receives goes once no stream can wait for ferry's
// thread: while a graph of another communicator holds hand-off words it stays; once the graph
// goes, the proxy frees it.
TEST(FakeStream, ADestroyedCommunicatorsMemoryWaitsForTheGraphs) {
  Communicator world = ctx().world();
  const int peer = 1 - me();
  FakeStream stream;
  std::uint32_t word = 1;
  std::uint32_t got = 0;
  // The Context's own hand-off words (a page, for good) first.
  ASSERT_TRUE(
      world.allreduce(&got, &got, 1, DataType::kUint32, ReduceOp::kSum, stream.handle()).is_ok());
  stream.synchronize();
  const int pages = fake().mapped_pages.load();
  {
    Communicator twin = world.split(0, me());
    ctx().group_start();
    ASSERT_TRUE(twin.send(&word, 4, peer, stream.handle()).is_ok());
    ASSERT_TRUE(twin.recv(&got, 4, peer, stream.handle()).is_ok());
    ASSERT_TRUE(ctx().group_end().is_ok());
    stream.synchronize();
    ASSERT_EQ(got, 1u);
    ASSERT_GT(fake().mapped_pages.load(), pages);  // the twin's stop words
  }
  ASSERT_TRUE(world.barrier().is_ok());
  EXPECT_EQ(fake().mapped_pages.load(), pages) << "freed at once: no hand-off holds words";

  Communicator twin = world.split(0, me());
  ctx().group_start();
  ASSERT_TRUE(twin.send(&word, 4, peer, stream.handle()).is_ok());
  ASSERT_TRUE(twin.recv(&got, 4, peer, stream.handle()).is_ok());
  ASSERT_TRUE(ctx().group_end().is_ok());
  stream.synchronize();
  const int with_twin = fake().mapped_pages.load();
  stream.begin_capture();
  ASSERT_TRUE(
      world.allreduce(&word, &word, 1, DataType::kUint32, ReduceOp::kSum, stream.handle()).is_ok());
  std::unique_ptr<FakeGraph> graph = stream.end_capture();
  twin = Communicator();
  ::usleep(50000);
  EXPECT_EQ(fake().mapped_pages.load(), with_twin) << "freed while a graph holds words";
  graph.reset();
  const auto start = Clock::now();
  while (fake().mapped_pages.load() == with_twin && ms_since(start) < 5000) ::usleep(1000);
  EXPECT_LT(fake().mapped_pages.load(), with_twin) << "not freed once the graph went";
  ASSERT_TRUE(world.barrier().is_ok());
}

// --- runs of their own ---

// A send/receive each way on `stream`: the pair's stream set-up, which both make together.
bool warm_up(Context& context, FakeStream& stream) {
  std::uint64_t out = 1;
  std::uint64_t in = 0;
  const int peer = 1 - context.rank();
  context.group_start();
  Status a = context.world().send(&out, 8, peer, stream.handle());
  Status b = context.world().recv(&in, 8, peer, stream.handle());
  Status ended = context.group_end();
  stream.synchronize();
  return a.is_ok() && b.is_ok() && ended.is_ok() && in == 1;
}

// Rank 0 replays a graph of a receive from rank 1 and a check; rank 1 sends 20 times, then is
// killed. Rank 0's stream must be released and the death reported.
int peer_dies(Context& context) {
  Communicator world = context.world();
  FakeStream stream;
  std::uint64_t value = 0;
  if (context.rank() == 1) {
    for (int r = 0; r < 20; ++r) {
      value = static_cast<std::uint64_t>(r);
      if (!world.send(&value, 8, 0, stream.handle()).is_ok()) return 1;
      stream.synchronize();
    }
    ::usleep(200000);
    ::raise(SIGKILL);
  }
  stream.begin_capture();
  Status s = world.recv(&value, 8, 1, stream.handle());
  std::unique_ptr<FakeGraph> graph = stream.end_capture();
  if (!s.is_ok()) {
    std::printf("rank 0: capture failed: %s\n", s.to_string().c_str());
    return 1;
  }
  for (int r = 0; r < 25; ++r) graph->launch(stream);
  const auto start = Clock::now();
  stream.synchronize();
  while (context.async_error().is_ok() && ms_since(start) < 30000) ::usleep(1000);
  const Status error = context.async_error();
  std::printf(
      "rank 0: graph replays of a receive from a killed rank: stream released, async "
      "error %s, %.0f ms after the 20th message\n",
      error.to_string().c_str(), ms_since(start));
  graph.reset();
  if (error.code() != Code::kPeerFailed) return 1;
  // The error is the communicator's: its stream calls are refused, while one shrunk without the
  // dead member takes them.
  const Status mine = world.async_error();
  const Status refused = world.recv(&value, 8, 1, stream.handle());
  static_cast<void>(world.revoke());
  Communicator survivors = world.shrink();
  std::uint64_t in = 42, out = 0;
  const Status alone =
      survivors.allreduce(&in, &out, 1, DataType::kUint64, ReduceOp::kSum, stream.handle());
  stream.synchronize();
  std::printf("rank 0: the communicator's error %s, its next call %s; the shrunk one's %s (%llu)\n",
              to_string(mine.code()), to_string(refused.code()), alone.to_string().c_str(),
              static_cast<unsigned long long>(out));
  return mine.code() == Code::kPeerFailed && !refused.is_ok() && alone.is_ok() &&
                 survivors.async_error().is_ok() && out == 42
             ? 0
             : 1;
}

// FERRY_TIMEOUT=1: rank 0's receive from rank 1, which sends nothing, gives up.
int never_arrives(Context& context) {
  Communicator world = context.world();
  FakeStream stream;
  std::uint64_t value = 0;
  if (!warm_up(context, stream)) return 1;
  const auto start = Clock::now();
  if (context.rank() == 0) {
    Status s = world.recv(&value, 8, 1, stream.handle());
    stream.synchronize();
    const Status error = context.async_error();
    std::printf(
        "rank 0: a receive nobody sends to: enqueued %s; stream released, async error "
        "%s after %.0f ms\n",
        s.to_string().c_str(), error.to_string().c_str(), ms_since(start));
    if (!s.is_ok() || error.code() != Code::kTimeout) return 1;
  } else {
    ::usleep(1500000);
  }
  return world.barrier().is_ok() ? 0 : 1;
}

// Rank 0's stream waits for a receive rank 1 never sends; rank 0's Context ends; the stream must
// go on (its hand-off released for good), not wait for a thread that is gone.
int context_ends(std::unique_ptr<Context> context) {
  FakeStream stream;
  std::uint64_t value = 0;
  std::atomic<bool> after{false};
  if (!warm_up(*context, stream)) return 1;
  if (context->rank() == 0) {
    Status s = context->world().recv(&value, 8, 1, stream.handle());
    stream.enqueue([&after] { after = true; });
    if (!s.is_ok()) return 1;
    ::usleep(100000);
    const bool early = after.load();
    const auto start = Clock::now();
    context.reset();
    stream.synchronize();
    std::printf("rank 0: the Context ended while its stream waited: stream %s after %.0f ms%s\n",
                after.load() ? "went on" : "stuck", ms_since(start),
                early ? " (but it had gone on before the end)" : "");
    return after.load() && !early ? 0 : 1;
  }
  ::usleep(300000);
  return 0;
}

}  // namespace
}  // namespace ferry::test

int main(int argc, char** argv) {
  using ferry::test::FakeCuda;
  ferry::cuda::Cuda::set_factory_for_tests(&FakeCuda::make);
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "peer-dies" || mode == "never-arrives" || mode == "context-ends") {
    try {
      auto context = std::make_unique<ferry::Context>(ferry::Context::init());
      if (mode == "peer-dies") return ferry::test::peer_dies(*context);
      if (mode == "never-arrives") return ferry::test::never_arrives(*context);
      return ferry::test::context_ends(std::move(context));
    } catch (const ferry::Error& e) {
      std::fprintf(stderr, "ferry_stream_fake_tests %s: %s\n", mode.c_str(), e.what());
      return 1;
    }
  }
  return ferry::test::run_on_every_rank(argc, argv, "ferry_stream_fake_tests", 2);
}
