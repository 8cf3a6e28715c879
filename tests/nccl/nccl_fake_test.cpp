// NCCL's API on ferry with the tests' stand-in CUDA (helpers/fake_cuda.hpp: host memory, streams
// that are threads), so that what NCCL's operations do on streams runs without a GPU: ncclAvg and
// pre-multiplied sums (the scaling ferry adds around its sum: before, and for an integer average
// after, inside groups too), their ops' life (made per communicator, destroyed, used with the
// wrong type), a device-resident scalar read when the operation runs (changed between two graph
// replays), the 8-bit float types moved as bytes; and every operation on a stream, alone, in a
// group, captured and replayed, and two ranks driven by one thread. Built from the library's
// sources (its objects), since the shared library exports NCCL's names only; each test forks its
// ranks.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <nccl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../helpers/fake_cuda.hpp"
#include "forked_ranks.hpp"

namespace {

using ferry::test::FakeCuda;
using ferry::test::FakeStream;

using ferry::test::Checks;
using ferry::test::fork_ranks;
using ferry::test::last_error_says;

// Runs `body` in `n` forked ranks of one job (their communicator made, and destroyed after);
// true when every one exits 0 within 60 s (rank `killed`: is killed by SIGKILL).
bool run_ranks(int n, const std::function<void(Checks&, ncclComm_t, int n)>& body,
               int killed = -1) {
  ncclUniqueId id;
  if (ncclGetUniqueId(&id) != ncclSuccess) return false;
  return fork_ranks(
      n,
      [&](Checks& c) {
        ncclComm_t comm = nullptr;
        c.expect(ncclCommInitRank(&comm, n, id, c.rank) == ncclSuccess, "init");
        if (comm == nullptr) return;
        body(c, comm, n);
        c.expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
      },
      killed);
}

cudaStream_t handle(FakeStream& stream) { return reinterpret_cast<cudaStream_t>(stream.handle()); }

// Element i of rank r's input.
float input(int r, std::size_t i) { return static_cast<float>(r * 100 + static_cast<int>(i % 7)); }

// ncclAvg of floats: each input times 1/n, then summed; of integers: the sum divided by n,
// truncated toward zero (here -5 + 1 + 1 = -3: -1; 1 + 1 + 1 = 3: 1, where dividing each input
// first would give 0).
TEST(NcclFake, AverageOfFloatsAndIntegers) {
  ASSERT_TRUE(run_ranks(3, [](Checks& c, ncclComm_t comm, int n) {
    FakeStream stream;
    constexpr std::size_t kCount = 1000;
    std::vector<float> send(kCount), recv(kCount, -1.0f);
    for (std::size_t i = 0; i < kCount; ++i) send[i] = input(c.rank, i);
    c.expect(ncclAllReduce(send.data(), recv.data(), kCount, ncclFloat, ncclAvg, comm,
                           handle(stream)) == ncclSuccess,
             "float allreduce ncclAvg");
    std::vector<std::int32_t> ints(4, c.rank == 0 ? -5 : 1);
    c.expect(ncclAllReduce(ints.data(), ints.data(), ints.size(), ncclInt32, ncclAvg, comm,
                           handle(stream)) == ncclSuccess,
             "int32 allreduce ncclAvg, in place");
    stream.synchronize();
    bool close = true;
    for (std::size_t i = 0; i < kCount; ++i) {
      double mean = 0;
      for (int r = 0; r < n; ++r) mean += input(r, i);
      mean /= n;
      close = close && std::fabs(recv[i] - mean) <= 1e-5 * std::fabs(mean) + 1e-6;
    }
    c.expect(close, "the float average is the mean of the inputs");
    c.expect(ints == std::vector<std::int32_t>(4, -1), "the int32 average truncates: -3 / 3");
    std::vector<std::uint8_t> ones(8, 1), out(8, 9);
    c.expect(ncclAllReduce(ones.data(), out.data(), ones.size(), ncclUint8, ncclAvg, comm,
                           handle(stream)) == ncclSuccess,
             "uint8 ncclAvg");
    stream.synchronize();
    c.expect(out == std::vector<std::uint8_t>(8, 1), "the sum divided after: 3 / 3, not 3 * 0");

    // Reduce: only the root's result is divided; reduce-scatter: each member's block.
    std::vector<std::int64_t> value(2, 10 * (c.rank + 1)), at_root(2, 0);
    c.expect(ncclReduce(value.data(), at_root.data(), 2, ncclInt64, ncclAvg, 1, comm,
                        handle(stream)) == ncclSuccess,
             "int64 reduce ncclAvg");
    std::vector<double> blocks(static_cast<std::size_t>(n) * 3), mine(3, 0);
    for (std::size_t i = 0; i < blocks.size(); ++i) blocks[i] = (c.rank + 1) * 3.0 + double(i);
    c.expect(ncclReduceScatter(blocks.data(), mine.data(), 3, ncclDouble, ncclAvg, comm,
                               handle(stream)) == ncclSuccess,
             "double reduce-scatter ncclAvg");
    stream.synchronize();
    if (c.rank == 1) c.expect(at_root == std::vector<std::int64_t>(2, 20), "(10+20+30)/3 at root");
    bool block_ok = true;
    for (std::size_t k = 0; k < 3; ++k) {
      const double expected = 6.0 + double(static_cast<std::size_t>(c.rank) * 3 + k);
      block_ok = block_ok && std::fabs(mine[k] - expected) < 1e-12;
    }
    c.expect(block_ok, "each block the mean of the members' blocks");

    // Half precision: the inputs times 1/3 rounded to binary16 (as NCCL), summed: 3 * 0.3333 of 3.
    std::vector<std::uint16_t> halves(4, 0x4200);  // 3.0
    c.expect(ncclAllReduce(halves.data(), halves.data(), halves.size(), ncclFloat16, ncclAvg, comm,
                           handle(stream)) == ncclSuccess,
             "float16 ncclAvg");
    stream.synchronize();
    c.expect(halves[0] == 0x4200 || halves[0] == 0x41ff || halves[0] == 0x4201,
             "the float16 average of 3s is 3 (to the last place)");
  }));
}

// An integer average inside a group: the division goes after the group's end enqueued the sum.
TEST(NcclFake, IntegerAverageInAGroupDividesAfterTheSum) {
  ASSERT_TRUE(run_ranks(2, [](Checks& c, ncclComm_t comm, int) {
    FakeStream stream;
    std::vector<std::int32_t> a(16, 3), b(16, 0);
    std::vector<float> f(16, 1.0f), g(16, 0.0f);
    c.expect(ncclGroupStart() == ncclSuccess, "group start");
    c.expect(ncclAllReduce(a.data(), b.data(), a.size(), ncclInt32, ncclAvg, comm,
                           handle(stream)) == ncclSuccess,
             "int32 ncclAvg in a group");
    c.expect(ncclAllReduce(f.data(), g.data(), f.size(), ncclFloat, ncclSum, comm,
                           handle(stream)) == ncclSuccess,
             "a float sum beside it");
    c.expect(ncclGroupEnd() == ncclSuccess, "group end");
    stream.synchronize();
    c.expect(b == std::vector<std::int32_t>(16, 3), "(3 + 3) / 2, divided once, after the sum");
    c.expect(g == std::vector<float>(16, 2.0f), "the sum beside it");
  }));
}

// ncclRedOpCreatePreMulSum: a host scalar taken at creation, a device scalar read when the
// operation runs (a graph replayed after the scalar changed uses the new value), the op's type
// checked, the op per communicator, destroyed once.
TEST(NcclFake, PreMultipliedSums) {
  ASSERT_TRUE(run_ranks(2, [](Checks& c, ncclComm_t comm, int) {
    FakeStream stream;
    float host_scalar = static_cast<float>(c.rank + 2);  // 2 and 3
    ncclRedOp_t by_host{};
    c.expect(ncclRedOpCreatePreMulSum(&by_host, &host_scalar, ncclFloat, ncclScalarHostImmediate,
                                      comm) == ncclSuccess,
             "create with a host scalar");
    c.expect(by_host >= ncclNumOps, "a value past the built-in ops");
    host_scalar = 100;  // taken at creation: no effect
    std::vector<float> x(64, static_cast<float>(c.rank + 1)), y(64, 0);
    c.expect(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat, by_host, comm,
                           handle(stream)) == ncclSuccess,
             "allreduce with it");
    std::vector<float> blocks(2 * 5, 1.0f), part(5, 0);
    c.expect(ncclReduceScatter(blocks.data(), part.data(), 5, ncclFloat, by_host, comm,
                               handle(stream)) == ncclSuccess,
             "reduce-scatter with it");
    stream.synchronize();
    c.expect(y == std::vector<float>(64, 2 * 1 + 3 * 2.0f), "2 * 1 + 3 * 2");
    c.expect(part == std::vector<float>(5, 5.0f), "2 + 3 per element");
    c.expect(blocks == std::vector<float>(10, 1.0f), "the input is left as it was");

    // The wrong type; an op of another communicator; destroyed, then used.
    std::vector<double> d(4, 1.0);
    c.expect(ncclAllReduce(d.data(), d.data(), d.size(), ncclDouble, by_host, comm,
                           handle(stream)) == ncclInvalidArgument &&
                 last_error_says("was made for datatype"),
             "an op made for floats refuses doubles");
    ncclComm_t other = nullptr;
    c.expect(ncclCommSplit(comm, 0, c.rank, &other, nullptr) == ncclSuccess, "split");
    if (other != nullptr) {
      c.expect(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat, by_host, other,
                             handle(stream)) == ncclInvalidArgument &&
                   last_error_says("no ncclRedOp_t of this communicator"),
               "an op is its communicator's");
      c.expect(ncclRedOpDestroy(by_host, other) == ncclInvalidArgument, "nor destroyed there");
      ncclCommDestroy(other);
    }
    c.expect(ncclRedOpDestroy(by_host, comm) == ncclSuccess, "destroy");
    c.expect(ncclRedOpDestroy(by_host, comm) == ncclInvalidArgument, "destroy twice");
    c.expect(ncclRedOpDestroy(ncclSum, comm) == ncclInvalidArgument && last_error_says("built in"),
             "a built-in op is not destroyed");
    c.expect(ncclAllReduce(x.data(), y.data(), x.size(), ncclFloat, by_host, comm,
                           handle(stream)) == ncclInvalidArgument,
             "a destroyed op is refused");

    // A scalar in (stand-in) device memory, read when the work runs: captured once, replayed with
    // the scalar changed between the replays.
    std::int32_t device_scalar = 1;
    ncclRedOp_t by_device{};
    c.expect(ncclRedOpCreatePreMulSum(&by_device, &device_scalar, ncclInt32, ncclScalarDevice,
                                      comm) == ncclSuccess,
             "create with a device scalar");
    std::vector<std::int32_t> in(32, c.rank + 1), out(32, 0);
    stream.begin_capture();
    c.expect(ncclAllReduce(in.data(), out.data(), in.size(), ncclInt32, by_device, comm,
                           handle(stream)) == ncclSuccess,
             "captured");
    std::unique_ptr<ferry::test::FakeGraph> graph = stream.end_capture();
    c.expect(out == std::vector<std::int32_t>(32, 0), "nothing ran while capturing");
    for (std::int32_t scalar : {1, 5, -2}) {
      device_scalar = scalar;
      graph->launch(stream);
      stream.synchronize();
      c.expect(out == std::vector<std::int32_t>(32, scalar * (1 + 2)),
               "replay with scalar " + std::to_string(scalar) + ": " + std::to_string(out[0]) +
                   " " + std::to_string(out[31]));
    }
    graph.reset();
    c.expect(ncclRedOpDestroy(by_device, comm) == ncclSuccess, "destroy the device op");
    c.expect(ncclRedOpCreatePreMulSum(nullptr, &device_scalar, ncclInt32, ncclScalarDevice, comm) ==
                 ncclInvalidArgument,
             "no op pointer");
    c.expect(ncclRedOpCreatePreMulSum(&by_device, &device_scalar, ncclInt32,
                                      static_cast<ncclScalarResidence_t>(7),
                                      comm) == ncclInvalidArgument,
             "no such residence");
  }));
}

// The 8-bit float types move as bytes (allgather, broadcast, send/recv); reducing them is refused,
// saying so.
TEST(NcclFake, EightBitFloatsMoveAsBytes) {
  ASSERT_TRUE(run_ranks(2, [](Checks& c, ncclComm_t comm, int n) {
    FakeStream stream;
    std::vector<std::uint8_t> mine(6, static_cast<std::uint8_t>(0xa0 + c.rank));
    std::vector<std::uint8_t> all(6 * static_cast<std::size_t>(n), 0);
    c.expect(ncclAllGather(mine.data(), all.data(), mine.size(), ncclFloat8e4m3, comm,
                           handle(stream)) == ncclSuccess,
             "fp8 allgather");
    std::vector<std::uint8_t> peer(6, 0);
    c.expect(ncclGroupStart() == ncclSuccess, "group start");
    c.expect(ncclSend(mine.data(), mine.size(), ncclFloat8e5m2, 1 - c.rank, comm, handle(stream)) ==
                 ncclSuccess,
             "fp8 send");
    c.expect(ncclRecv(peer.data(), peer.size(), ncclFloat8e5m2, 1 - c.rank, comm, handle(stream)) ==
                 ncclSuccess,
             "fp8 recv");
    c.expect(ncclGroupEnd() == ncclSuccess, "group end");
    stream.synchronize();
    bool gathered = true;
    for (std::size_t i = 0; i < all.size(); ++i) gathered = gathered && all[i] == 0xa0 + i / 6;
    c.expect(gathered, "every member's bytes in order");
    c.expect(peer == std::vector<std::uint8_t>(6, static_cast<std::uint8_t>(0xa0 + 1 - c.rank)),
             "the peer's bytes");
    c.expect(ncclAllReduce(mine.data(), mine.data(), mine.size(), ncclFloat8e4m3, ncclSum, comm,
                           handle(stream)) == ncclInvalidUsage &&
                 last_error_says("reductions of the 8-bit float types"),
             "an fp8 reduction is refused, saying why");
  }));
}

// Element i of rank r's data for operation `salt`.
std::int32_t value(int salt, int r, std::size_t i) {
  return salt * 1000003 + r * 10007 + static_cast<std::int32_t>(i);
}

std::vector<std::int32_t> filled(int salt, int r, std::size_t count) {
  std::vector<std::int32_t> v(count);
  for (std::size_t i = 0; i < count; ++i) v[i] = value(salt, r, i);
  return v;
}

// Every operation of NCCL's API on one stream, each alone and then all of them inside one group,
// the results checked against what every rank's inputs make.
TEST(NcclFake, EveryOperationOnAStream) {
  ASSERT_TRUE(run_ranks(3, [](Checks& c, ncclComm_t comm, int n) {
    FakeStream stream;
    const cudaStream_t s = handle(stream);
    const std::size_t kCount = 300;
    const auto nn = static_cast<std::size_t>(n);
    for (bool grouped : {false, true}) {
      const int base = grouped ? 100 : 0;
      std::vector<std::int32_t> bcast_in = filled(base + 1, c.rank, kCount), bcast_out(kCount, -1);
      std::vector<std::int32_t> inplace = filled(base + 2, c.rank, kCount);
      std::vector<std::int32_t> red_in = filled(base + 3, c.rank, kCount), red_out(kCount, -1);
      std::vector<std::int32_t> ag_in = filled(base + 4, c.rank, kCount), ag_out(nn * kCount, -1);
      std::vector<std::int32_t> rs_in = filled(base + 5, c.rank, nn * kCount), rs_out(kCount, -1);
      std::vector<std::int32_t> a2a_in = filled(base + 6, c.rank, nn * kCount),
                                a2a_out(nn * kCount, -1);
      std::vector<std::int32_t> ga_in = filled(base + 7, c.rank, kCount), ga_out(nn * kCount, -1);
      std::vector<std::int32_t> sc_in = filled(base + 8, c.rank, nn * kCount), sc_out(kCount, -1);
      std::vector<std::int32_t> ring_in = filled(base + 9, c.rank, kCount), ring_out(kCount, -1);
      const int next = (c.rank + 1) % n;
      const int prev = (c.rank + n - 1) % n;
      if (grouped) c.expect(ncclGroupStart() == ncclSuccess, "group start");
      c.expect(ncclBroadcast(bcast_in.data(), bcast_out.data(), kCount, ncclInt32, 1, comm, s) ==
                   ncclSuccess,
               "broadcast");
      c.expect(ncclBcast(inplace.data(), kCount, ncclInt32, 2, comm, s) == ncclSuccess, "bcast");
      c.expect(ncclReduce(red_in.data(), red_out.data(), kCount, ncclInt32, ncclSum, 0, comm, s) ==
                   ncclSuccess,
               "reduce");
      c.expect(
          ncclAllGather(ag_in.data(), ag_out.data(), kCount, ncclInt32, comm, s) == ncclSuccess,
          "allgather");
      c.expect(ncclReduceScatter(rs_in.data(), rs_out.data(), kCount, ncclInt32, ncclMax, comm,
                                 s) == ncclSuccess,
               "reduce-scatter");
      c.expect(
          ncclAlltoAll(a2a_in.data(), a2a_out.data(), kCount, ncclInt32, comm, s) == ncclSuccess,
          "alltoall");
      c.expect(
          ncclGather(ga_in.data(), ga_out.data(), kCount, ncclInt32, 1, comm, s) == ncclSuccess,
          "gather");
      c.expect(
          ncclScatter(sc_in.data(), sc_out.data(), kCount, ncclInt32, 2, comm, s) == ncclSuccess,
          "scatter");
      if (!grouped) c.expect(ncclGroupStart() == ncclSuccess, "the ring's group");
      c.expect(ncclSend(ring_in.data(), kCount, ncclInt32, next, comm, s) == ncclSuccess, "send");
      c.expect(ncclRecv(ring_out.data(), kCount, ncclInt32, prev, comm, s) == ncclSuccess, "recv");
      c.expect(ncclGroupEnd() == ncclSuccess, "group end");
      stream.synchronize();
      const std::string how = grouped ? " (in a group)" : "";
      c.expect(bcast_out == filled(base + 1, 1, kCount), "broadcast's data" + how);
      c.expect(inplace == filled(base + 2, 2, kCount), "bcast's data" + how);
      if (c.rank == 0) {
        bool sum = true;
        for (std::size_t i = 0; i < kCount; ++i) {
          std::int32_t want = 0;
          for (int r = 0; r < n; ++r) want += value(base + 3, r, i);
          sum = sum && red_out[i] == want;
        }
        c.expect(sum, "reduce's sum at the root" + how);
      }
      bool gathered = true, scattered_max = true, exchanged = true;
      for (std::size_t b = 0; b < nn; ++b) {
        for (std::size_t i = 0; i < kCount; ++i) {
          gathered = gathered && ag_out[b * kCount + i] == value(base + 4, int(b), i);
          exchanged =
              exchanged && a2a_out[b * kCount + i] == value(base + 6, int(b), c.rank * kCount + i);
        }
      }
      for (std::size_t i = 0; i < kCount; ++i) {
        scattered_max = scattered_max && rs_out[i] == value(base + 5, n - 1, c.rank * kCount + i);
      }
      c.expect(gathered, "allgather's blocks" + how);
      c.expect(scattered_max, "reduce-scatter's max" + how);
      c.expect(exchanged, "alltoall's blocks" + how);
      if (c.rank == 1) {
        bool all = true;
        for (std::size_t b = 0; b < nn; ++b) {
          for (std::size_t i = 0; i < kCount; ++i) {
            all = all && ga_out[b * kCount + i] == value(base + 7, int(b), i);
          }
        }
        c.expect(all, "gather's blocks at the root" + how);
      }
      bool part = true;
      for (std::size_t i = 0; i < kCount; ++i) {
        part = part && sc_out[i] == value(base + 8, 2, c.rank * kCount + i);
      }
      c.expect(part, "scatter's block" + how);
      c.expect(ring_out == filled(base + 9, prev, kCount), "the ring's message" + how);
    }
    ncclResult_t async = ncclInternalError;
    c.expect(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess,
             "no async error");
  }));
}

// Operations captured in a graph with the work that fills their inputs, replayed: every replay
// moves that replay's data (an allreduce, an allgather, a broadcast from another root).
TEST(NcclFake, CapturedOperationsReplay) {
  ASSERT_TRUE(run_ranks(2, [](Checks& c, ncclComm_t comm, int n) {
    FakeStream stream;
    const cudaStream_t s = handle(stream);
    const std::size_t kCount = 64;
    std::vector<std::int32_t> in(kCount), sum(kCount), all(2 * kCount), root(kCount);
    int round = 0;
    // A call of the stream's own first (the graph's words may be ones it used).
    c.expect(
        ncclAllReduce(in.data(), sum.data(), kCount, ncclInt32, ncclSum, comm, s) == ncclSuccess,
        "a call before the capture");
    stream.synchronize();
    stream.begin_capture();
    stream.enqueue([&] {
      for (std::size_t i = 0; i < kCount; ++i) in[i] = value(round, c.rank, i);
      for (std::size_t i = 0; i < kCount; ++i) root[i] = value(round + 50, c.rank, i);
    });
    c.expect(
        ncclAllReduce(in.data(), sum.data(), kCount, ncclInt32, ncclSum, comm, s) == ncclSuccess,
        "allreduce captured");
    c.expect(ncclAllGather(in.data(), all.data(), kCount, ncclInt32, comm, s) == ncclSuccess,
             "allgather captured");
    c.expect(ncclBcast(root.data(), kCount, ncclInt32, 1, comm, s) == ncclSuccess,
             "bcast captured");
    std::unique_ptr<ferry::test::FakeGraph> graph = stream.end_capture();
    int wrong = 0;
    for (round = 1; round <= 10; ++round) {
      graph->launch(stream);
      stream.synchronize();
      for (std::size_t i = 0; i < kCount; ++i) {
        if (sum[i] != value(round, 0, i) + value(round, 1, i) || all[i] != value(round, 0, i) ||
            all[kCount + i] != value(round, 1, i) || root[i] != value(round + 50, 1, i)) {
          ++wrong;
          break;
        }
      }
    }
    c.expect(wrong == 0, std::to_string(wrong) + " of 10 replays wrong");
    graph.reset();
    (void)n;
  }));
}

// One thread drives two ranks of a job (nccl-tests' -g 2): ncclCommInitAll, then each rank's
// operation inside one group, on a stream of its own.
TEST(NcclFake, OneThreadDrivesTwoRanks) {
  std::vector<ncclComm_t> comms(2, nullptr);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 2, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  FakeStream streams[2];
  std::vector<std::vector<float>> in{std::vector<float>(1000, 1.5f),
                                     std::vector<float>(1000, 2.0f)};
  std::vector<std::vector<float>> out(2, std::vector<float>(1000, 0));
  for (int round = 0; round < 3; ++round) {
    ASSERT_EQ(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(ncclAllReduce(in[r].data(), out[r].data(), 1000, ncclFloat, ncclAvg, comms[r],
                              handle(streams[r])),
                ncclSuccess)
          << ncclGetLastError(nullptr);
    }
    ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
    for (auto& st : streams) st.synchronize();
    for (int r = 0; r < 2; ++r) EXPECT_EQ(out[r], std::vector<float>(1000, 1.75f)) << "rank " << r;
  }
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
}

// A rank killed while the others' operations wait for it on their streams: the survivors'
// ncclCommGetAsyncError says ncclRemoteError within seconds, their streams go on, they shrink
// the communicator without it and reduce again, and aborting the old one returns at once.
TEST(NcclFake, ARankKilledWhileOperationsWait) {
  ASSERT_TRUE(run_ranks(
      3,
      [](Checks& c, ncclComm_t comm, int) {
        using Clock = std::chrono::steady_clock;
        FakeStream stream;
        const cudaStream_t s = handle(stream);
        std::vector<float> x(256, 1.0f);
        c.expect(
            ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat, ncclSum, comm, s) == ncclSuccess,
            "a first allreduce");
        stream.synchronize();
        c.expect(x == std::vector<float>(256, 3.0f), "its sum");
        if (c.rank == 2) ::raise(SIGKILL);
        const auto start = Clock::now();
        c.expect(
            ncclAllReduce(x.data(), x.data(), x.size(), ncclFloat, ncclSum, comm, s) == ncclSuccess,
            "an allreduce rank 2 never joins is enqueued");
        ncclResult_t async = ncclSuccess;
        while (async == ncclSuccess && Clock::now() - start < std::chrono::seconds(20)) {
          c.expect(ncclCommGetAsyncError(comm, &async) == ncclSuccess, "async error query");
          ::usleep(1000);
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
        c.expect(async == ncclRemoteError,
                 "the async error is ncclRemoteError (" + std::to_string(async) + ")");
        c.expect(seconds < 3, "within seconds (" + std::to_string(seconds) + " s)");
        std::fprintf(stderr, "rank %d: async error %d after %.3f s: %s\n", c.rank, async, seconds,
                     ncclGetLastError(comm));
        stream.synchronize();  // released (else the rank's alarm ends it)
        int dead = 2;
        ncclComm_t shrunk = nullptr;
        c.expect(ncclCommShrink(comm, &dead, 1, &shrunk, nullptr, NCCL_SHRINK_ABORT) == ncclSuccess,
                 "shrink without rank 2");
        if (shrunk != nullptr) {
          FakeStream again;
          std::vector<float> y(256, 2.0f);
          c.expect(ncclAllReduce(y.data(), y.data(), y.size(), ncclFloat, ncclSum, shrunk,
                                 handle(again)) == ncclSuccess,
                   "an allreduce of the two");
          again.synchronize();
          c.expect(y == std::vector<float>(256, 4.0f), "its sum");
          c.expect(ncclCommDestroy(shrunk) == ncclSuccess, "destroy the shrunk one");
        }
        const auto abort_start = Clock::now();
        c.expect(ncclCommAbort(comm) == ncclSuccess, "abort the old one");
        c.expect(Clock::now() - abort_start < std::chrono::seconds(1),
                 "abort returns within a second");
        std::fflush(nullptr);
        ::_exit(c.failures == 0 ? 0 : 1);  // the communicator is gone: not destroyed again
      },
      /*killed=*/2));
}

// Each rank makes its own id from the same NCCL_COMM_ID, as a launcher without a channel for the
// id has them do (NCCL's ids are then alike): they make one job, whose allreduce sums.
TEST(NcclFake, RanksThatMakeTheirOwnIdsFromNcclCommIdJoin) {
  const int probe = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  ASSERT_EQ(::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length), 0);
  ::close(probe);
  const std::string where = "127.0.0.1:" + std::to_string(ntohs(address.sin_port));
  EXPECT_TRUE(fork_ranks(3, [&where](Checks& c) {
    ::setenv("NCCL_COMM_ID", where.c_str(), 1);
    ncclUniqueId id;
    c.expect(ncclGetUniqueId(&id) == ncclSuccess, "each rank's own id");
    ncclComm_t comm = nullptr;
    c.expect(ncclCommInitRank(&comm, 3, id, c.rank) == ncclSuccess, "init");
    if (comm == nullptr) return;
    FakeStream stream;
    std::vector<std::int32_t> x(4096, c.rank + 1);
    c.expect(ncclAllReduce(x.data(), x.data(), x.size(), ncclInt32, ncclSum, comm,
                           handle(stream)) == ncclSuccess,
             "allreduce");
    stream.synchronize();
    c.expect(x == std::vector<std::int32_t>(4096, 6), "one job: 1 + 2 + 3");
    c.expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  }));
}

// A member aborts while another's receive from it waits (the pair's set-up in the call, which
// waited for ever): the waiting member's communicator fails (revoked) within a second, its
// stream goes on, and a communicator split off before goes on.
TEST(NcclFake, AbortReleasesTheOthersWaits) {
  ASSERT_TRUE(run_ranks(2, [](Checks& c, ncclComm_t comm, int) {
    using Clock = std::chrono::steady_clock;
    FakeStream stream;
    ncclComm_t other = nullptr;
    c.expect(ncclCommSplit(comm, 0, c.rank, &other, nullptr) == ncclSuccess, "split");
    std::vector<float> got(16, 0);
    if (c.rank == 0) {
      ::usleep(200000);  // rank 1's receive waits
      const auto start = Clock::now();
      c.expect(ncclCommAbort(comm) == ncclSuccess, "abort");
      c.expect(Clock::now() - start < std::chrono::seconds(1), "abort returns within a second");
    } else {
      const auto start = Clock::now();
      // The first receive between the pair waits for rank 0's side of their set-up (it sets up
      // the pair) inside the call: the revoke ends it there, or, where it got that far, on the
      // stream.
      const ncclResult_t r = ncclRecv(got.data(), got.size(), ncclFloat, 0, comm, handle(stream));
      c.expect(r == ncclSuccess || (r == ncclRemoteError && last_error_says("revoked by rank 0")),
               "a receive rank 0 never sends: enqueued, or refused naming the revoke");
      ncclResult_t async = ncclSuccess;
      while (async == ncclSuccess && Clock::now() - start < std::chrono::seconds(10)) {
        c.expect(ncclCommGetAsyncError(comm, &async) == ncclSuccess, "async error query");
        ::usleep(1000);
      }
      const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
      c.expect(async == ncclRemoteError, "the receive fails (" + std::to_string(async) + ")");
      c.expect(seconds < 1.5, "within a second of the abort (" + std::to_string(seconds) + " s)");
      std::fprintf(stderr, "rank 1: async error %d after %.3f s: %s\n", async, seconds,
                   ncclGetLastError(comm));
      stream.synchronize();
      c.expect(ncclCommAbort(comm) == ncclSuccess, "abort here too");
    }
    // The communicator split off before is not revoked: both go on with it.
    if (other != nullptr) {
      FakeStream again;
      std::vector<std::int32_t> x(8, c.rank + 1);
      c.expect(ncclAllReduce(x.data(), x.data(), x.size(), ncclInt32, ncclSum, other,
                             handle(again)) == ncclSuccess,
               "the split communicator's allreduce");
      again.synchronize();
      c.expect(x == std::vector<std::int32_t>(8, 3), "its sum");
      ncclResult_t async = ncclInternalError;
      c.expect(ncclCommGetAsyncError(other, &async) == ncclSuccess && async == ncclSuccess,
               "no async error there");
      c.expect(ncclCommDestroy(other) == ncclSuccess, "destroy it");
    }
    std::fflush(nullptr);
    ::_exit(c.failures == 0 ? 0 : 1);  // the aborted communicator is gone
  }));
}

// A non-blocking communicator (config.blocking = 0): init returns ncclInProgress, operations made
// before it is ready wait for it, and they run.
TEST(NcclFake, NonBlockingCommunicatorsOperations) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_TRUE(fork_ranks(2, [&id](Checks& c) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    const ncclResult_t made = ncclCommInitRankConfig(&comm, 2, id, c.rank, &config);
    c.expect(made == ncclInProgress || made == ncclSuccess, "non-blocking init");
    FakeStream stream;
    std::vector<double> x(32, 0.5 * (c.rank + 1));
    c.expect(ncclAllReduce(x.data(), x.data(), x.size(), ncclDouble, ncclAvg, comm,
                           handle(stream)) == ncclSuccess,
             "an allreduce that waits for the init");
    stream.synchronize();
    c.expect(x == std::vector<double>(32, 0.75), "its average");
    ncclResult_t async = ncclInProgress;
    c.expect(ncclCommGetAsyncError(comm, &async) == ncclSuccess && async == ncclSuccess,
             "ready, no error");
    c.expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  }));
}

// A group of operations on two communicators of a rank (the world and one split off it) and a
// send/receive to itself, on one stream.
TEST(NcclFake, AGroupAcrossCommunicatorsAndToItself) {
  ASSERT_TRUE(run_ranks(3, [](Checks& c, ncclComm_t comm, int) {
    FakeStream stream;
    const cudaStream_t s = handle(stream);
    ncclComm_t pair = nullptr;  // ranks 0 and 1; rank 2 alone
    c.expect(ncclCommSplit(comm, c.rank < 2 ? 0 : 1, c.rank, &pair, nullptr) == ncclSuccess,
             "split");
    std::vector<std::int32_t> a(100, c.rank + 1), b(100, 10 * (c.rank + 1)), mine(50, 7 + c.rank),
        back(50, 0);
    c.expect(ncclGroupStart() == ncclSuccess, "group start");
    c.expect(
        ncclAllReduce(a.data(), a.data(), a.size(), ncclInt32, ncclSum, comm, s) == ncclSuccess,
        "the world's allreduce");
    if (pair != nullptr) {
      c.expect(
          ncclAllReduce(b.data(), b.data(), b.size(), ncclInt32, ncclSum, pair, s) == ncclSuccess,
          "the split one's allreduce");
    }
    c.expect(ncclSend(mine.data(), mine.size(), ncclInt32, c.rank, comm, s) == ncclSuccess,
             "a send to itself");
    c.expect(ncclRecv(back.data(), back.size(), ncclInt32, c.rank, comm, s) == ncclSuccess,
             "its receive");
    const ncclResult_t ended = ncclGroupEnd();
    c.expect(ended == ncclSuccess, "group end");
    stream.synchronize();
    c.expect(a == std::vector<std::int32_t>(100, 6), "the world's sum");
    if (pair != nullptr) {
      c.expect(b == std::vector<std::int32_t>(100, 30), "the split one's sum (10 + 20; 30 alone)");
      ncclCommDestroy(pair);
    }
    c.expect(back == mine, "the message to itself");
  }));
}

}  // namespace

int main(int argc, char** argv) {
  ferry::cuda::Cuda::set_factory_for_tests(&FakeCuda::make);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
