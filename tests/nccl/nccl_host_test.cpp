// NCCL's API on ferry (libnccl.so.2), what a machine without a GPU can check: the unique-id
// bootstrap with one process per rank, argument errors and what ncclGetLastError says, groups,
// split, shrink after a death, registration handles, abort, and a new job after the last
// communicator went. Built against NCCL's own header; each multi-rank test forks its ranks from
// a parent that made the unique id (as an application passes it out of band).
#include <gtest/gtest.h>
#include <nccl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "forked_ranks.hpp"

// nccl_device.h's host call (its header needs nvcc); pointers stand for its types.
extern "C" ncclResult_t ncclDevCommCreate(ncclComm_t, const void*, void*);

namespace {

using Clock = std::chrono::steady_clock;

using ferry::test::Checks;
using ferry::test::last_error_says;

// Runs `body` in `n` forked ranks (rank, the ids); true when every one exits 0 within 60 s.
bool run_ranks(int n, const std::vector<ncclUniqueId>& ids,
               const std::function<void(Checks&, int n, const std::vector<ncclUniqueId>&)>& body) {
  return ferry::test::fork_ranks(n, [&](Checks& c) { body(c, n, ids); });
}

std::vector<ncclUniqueId> make_ids(int count) {
  std::vector<ncclUniqueId> ids(static_cast<std::size_t>(count));
  for (auto& id : ids) EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess) << ncclGetLastError(nullptr);
  return ids;
}

// NCCL_DEBUG is read again at the next line (deprecated in NCCL's header, and still exported).
void reread_nccl_debug() {
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  ncclResetDebugInit();
#pragma GCC diagnostic pop
}

TEST(NcclApi, VersionAndErrorStrings) {
  int version = 0;
  ASSERT_EQ(ncclGetVersion(&version), ncclSuccess);
  EXPECT_EQ(version, NCCL_VERSION_CODE);
  EXPECT_EQ(ncclGetVersion(nullptr), ncclInvalidArgument);
  for (int r = ncclSuccess; r < ncclNumResults; ++r) {
    EXPECT_GT(std::strlen(ncclGetErrorString(static_cast<ncclResult_t>(r))), 5u) << r;
  }
  // The pnccl twins are the same functions.
  EXPECT_EQ(pncclGetVersion(&version), ncclSuccess);
}

TEST(NcclApi, BadArgumentsAreRefusedSayingWhich) {
  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_EQ(ncclGetUniqueId(nullptr), ncclInvalidArgument);
  ncclComm_t comm = nullptr;
  EXPECT_EQ(ncclCommInitRank(nullptr, 2, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 0, id, 0), ncclInvalidArgument);
  EXPECT_EQ(ncclCommInitRank(&comm, 2, id, 2), ncclInvalidArgument);
  EXPECT_TRUE(last_error_says("rank 2 of 2 ranks")) << ncclGetLastError(nullptr);
  ncclUniqueId garbage;
  std::memset(&garbage, 0x5a, sizeof(garbage));
  EXPECT_EQ(ncclCommInitRank(&comm, 2, garbage, 0), ncclInvalidArgument);
  EXPECT_TRUE(last_error_says("unique id")) << ncclGetLastError(nullptr);
  EXPECT_EQ(comm, nullptr);
  ncclConfig_t config{};  // not NCCL_CONFIG_INITIALIZER
  EXPECT_EQ(ncclCommInitRankConfig(&comm, 2, id, 0, &config), ncclInvalidArgument);
  EXPECT_TRUE(last_error_says("NCCL_CONFIG_INITIALIZER")) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclCommInitAll(&comm, 0, nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommDestroy(nullptr), ncclInvalidArgument);
  EXPECT_EQ(ncclCommAbort(nullptr), ncclSuccess);
  int count = 0;
  EXPECT_EQ(ncclCommCount(nullptr, &count), ncclInvalidArgument);
  EXPECT_EQ(ncclAllReduce(nullptr, nullptr, 1, ncclFloat, ncclSum, nullptr, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(last_error_says("ncclAllReduce: comm is NULL")) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclGroupEnd(), ncclInvalidUsage);
  ncclSimInfo_t sim{};
  EXPECT_EQ(ncclGroupSimulateEnd(&sim), ncclInvalidArgument);
  ncclRedOp_t op;
  float scalar = 2;
  EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, nullptr, ncclFloat, ncclScalarHostImmediate, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(last_error_says("op or scalar is NULL")) << ncclGetLastError(nullptr);
  EXPECT_EQ(ncclRedOpCreatePreMulSum(&op, &scalar, ncclFloat, ncclScalarHostImmediate, nullptr),
            ncclInvalidArgument);
  EXPECT_TRUE(last_error_says("comm is NULL")) << ncclGetLastError(nullptr);
}

TEST(NcclApi, NcclCommIdIsReadAsNcclReadsIt) {
  ASSERT_EQ(::setenv("NCCL_COMM_ID", "not-an-address", 1), 0);
  ncclUniqueId id;
  EXPECT_EQ(ncclGetUniqueId(&id), ncclInvalidArgument);
  EXPECT_TRUE(last_error_says("NCCL_COMM_ID='not-an-address'")) << ncclGetLastError(nullptr);
  ASSERT_EQ(::setenv("NCCL_COMM_ID", "127.0.0.1:1", 1), 0);
  EXPECT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  EXPECT_NE(std::string(id.internal, sizeof(id.internal)).find("127.0.0.1:1"), std::string::npos);
  ncclUniqueId again;
  EXPECT_EQ(ncclGetUniqueId(&again), ncclSuccess);
  EXPECT_EQ(std::memcmp(&id, &again, sizeof(id)), 0) << "one address, one id (as NCCL's)";
  ::unsetenv("NCCL_COMM_ID");
}

// config.blocking = 0: the init returns ncclInProgress at once, though the other rank comes
// 300 ms later, and ncclCommGetAsyncError says ncclInProgress until the communicator is made;
// calls on it meanwhile say ncclInProgress too.
TEST(NcclApi, NonBlockingInitReturnsAtOnceAndIsPolled) {
  const auto ids = make_ids(1);
  ASSERT_TRUE(run_ranks(2, ids, [](Checks& c, int n, const std::vector<ncclUniqueId>& id) {
    ncclComm_t comm = nullptr;
    if (c.rank == 1) {
      ::usleep(300 * 1000);
      c.expect(ncclCommInitRank(&comm, n, id[0], c.rank) == ncclSuccess, "the blocking init");
    } else {
      ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
      config.blocking = 0;
      const auto start = Clock::now();
      const ncclResult_t r = ncclCommInitRankConfig(&comm, n, id[0], c.rank, &config);
      c.expect(r == ncclInProgress && comm != nullptr, "the non-blocking init: ncclInProgress");
      c.expect(Clock::now() - start < std::chrono::milliseconds(200), "returned at once");
      int count = 0;
      c.expect(ncclCommCount(comm, &count) == ncclInProgress, "a call meanwhile: ncclInProgress");
      ncclResult_t first = ncclInternalError;
      c.expect(ncclCommGetAsyncError(comm, &first) == ncclSuccess && first == ncclInProgress,
               "in progress while the other rank is away");
      ncclResult_t state = first;
      while (state == ncclInProgress && Clock::now() - start < std::chrono::seconds(20)) {
        ::usleep(1000);
        c.expect(ncclCommGetAsyncError(comm, &state) == ncclSuccess, "the poll");
      }
      c.expect(state == ncclSuccess, "made");
    }
    if (comm == nullptr) return;
    int count = 0;
    c.expect(ncclCommCount(comm, &count) == ncclSuccess && count == n, "count");
    c.expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  }));
}

// A revoked communicator's ncclCommGetAsyncError: ncclRemoteError at every poll, and with
// NCCL_DEBUG=INFO one line about it, not one per poll (PyTorch's watchdog polls every few ms).
TEST(NcclApi, APolledAsyncErrorIsLoggedOnce) {
  const auto ids = make_ids(1);
  ASSERT_TRUE(run_ranks(2, ids, [](Checks& c, int n, const std::vector<ncclUniqueId>& id) {
    ncclComm_t comm = nullptr;
    c.expect(ncclCommInitRank(&comm, n, id[0], c.rank) == ncclSuccess, "init");
    if (comm == nullptr) return;
    if (c.rank == 0) {
      char path[] = "/tmp/ferry-nccl-log-XXXXXX";
      const int log = ::mkstemp(path);
      const int saved = ::dup(2);
      ::dup2(log, 2);
      ::setenv("NCCL_DEBUG", "INFO", 1);
      reread_nccl_debug();
      c.expect(ncclCommRevoke(comm, NCCL_REVOKE_DEFAULT) == ncclSuccess, "revoke");
      for (int i = 0; i < 50; ++i) {
        ncclResult_t state = ncclSuccess;
        c.expect(ncclCommGetAsyncError(comm, &state) == ncclSuccess && state == ncclRemoteError,
                 "ncclRemoteError at poll " + std::to_string(i));
      }
      c.expect(last_error_says("revoked"), "the last error says why");
      std::fflush(stderr);
      ::dup2(saved, 2);
      ::unsetenv("NCCL_DEBUG");
      reread_nccl_debug();
      std::FILE* f = std::fopen(path, "r");
      int lines = 0;
      char line[2048];
      while (f != nullptr && std::fgets(line, sizeof(line), f) != nullptr) {
        lines += std::strstr(line, "ferry-nccl INFO") != nullptr &&
                 std::strstr(line, "stream operation") != nullptr;
      }
      if (f != nullptr) std::fclose(f);
      ::unlink(path);
      ::close(log);
      c.expect(lines == 1, "one line about the error, got " + std::to_string(lines));
    }
    c.expect(ncclCommDestroy(comm) == ncclSuccess, "destroy");
  }));
}

TEST(NcclApi, RanksJoinByUniqueIdAndSplit) {
  const auto ids = make_ids(2);
  ASSERT_TRUE(run_ranks(3, ids, [](Checks& c, int n, const std::vector<ncclUniqueId>& id) {
    ncclComm_t world = nullptr;
    c.expect(ncclCommInitRank(&world, n, id[0], c.rank) == ncclSuccess, "init");
    if (world == nullptr) return;
    int count = 0, rank = -1, device = -2;
    c.expect(ncclCommCount(world, &count) == ncclSuccess && count == n, "count");
    c.expect(ncclCommUserRank(world, &rank) == ncclSuccess && rank == c.rank, "rank");
    c.expect(ncclCommCuDevice(world, &device) == ncclSuccess && device >= -1, "device");
    ncclResult_t async = ncclInternalError;
    c.expect(ncclCommGetAsyncError(world, &async) == ncclSuccess && async == ncclSuccess,
             "no async error");

    // A second job beside this one, and a rank of this job twice in one process: refused.
    ncclComm_t other = nullptr;
    c.expect(ncclCommInitRank(&other, n, id[1], c.rank) == ncclSuccess && other != nullptr,
             "a second job in the process");
    c.expect(ncclCommCount(other, &count) == ncclSuccess && count == n, "the second job's count");
    ncclComm_t twice = nullptr;
    c.expect(ncclCommInitRank(&twice, n, id[0], c.rank) == ncclInvalidUsage && twice == nullptr,
             "a rank of a job twice in one process is refused");
    c.expect(last_error_says("in this process already"), "and says why");
    c.expect(ncclCommDestroy(other) == ncclSuccess, "destroy the second job");

    // What ferry has not: said, not wrong.
    float x = 1;
    c.expect(ncclAllReduce(&x, &x, 1, ncclFloat8e4m3, ncclSum, world, nullptr) == ncclInvalidUsage,
             "an fp8 reduction is refused");
    c.expect(last_error_says("8-bit float"), "fp8's reason");
    c.expect(ncclAllReduce(&x, &x, 1, static_cast<ncclDataType_t>(99), ncclSum, world, nullptr) ==
                 ncclInvalidArgument,
             "a type that is none");
    c.expect(ncclAllReduce(&x, &x, 1, ncclFloat, static_cast<ncclRedOp_t>(77), world, nullptr) ==
                 ncclInvalidArgument,
             "a reduction that is none");
    c.expect(ncclDevCommCreate(world, nullptr, nullptr) == ncclInvalidUsage, "device API");

    // Without a CUDA driver (device -1) a stream operation has no stream to go on: said.
    if (device == -1) {
      float y = 0;
      const ncclResult_t r = ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, world, nullptr);
      c.expect(r != ncclSuccess && last_error_says("CUDA"), "no CUDA: the operation says so");
      // Inside a group the operation is made at the group's end, which reports its failure.
      c.expect(ncclGroupStart() == ncclSuccess, "group start");
      c.expect(ncclAllReduce(&x, &y, 1, ncclFloat, ncclSum, world, nullptr) == ncclSuccess,
               "an operation inside a group is taken");
      c.expect(ncclGroupEnd() == ncclInvalidUsage && last_error_says("allreduce"),
               "and its failure comes at the group's end, named");
    }

    // Registration handles.
    void* handle = nullptr;
    c.expect(ncclCommRegister(world, &x, sizeof(x), &handle) == ncclSuccess && handle != nullptr,
             "register");
    c.expect(ncclCommDeregister(world, &x) == ncclInvalidArgument, "an unknown handle");
    c.expect(ncclCommDeregister(world, handle) == ncclSuccess, "deregister");
    ncclWindow_t window = nullptr;
    c.expect(ncclCommWindowRegister(world, &x, sizeof(x), &window, NCCL_WIN_COLL_SYMMETRIC) ==
                     ncclSuccess &&
                 ncclCommWindowDeregister(world, window) == ncclSuccess,
             "a window");

    // Groups nest; the outermost end is the one that enqueues.
    c.expect(ncclGroupStart() == ncclSuccess && ncclGroupStart() == ncclSuccess, "group start");
    c.expect(ncclGroupEnd() == ncclSuccess && ncclGroupEnd() == ncclSuccess, "group end");
    c.expect(ncclGroupEnd() == ncclInvalidUsage, "an end too many");

    // Split: evens and odds, ordered by key (reversed here); NOCOLOR gets no communicator.
    ncclComm_t part = nullptr;
    c.expect(ncclCommSplit(world, c.rank % 2, -c.rank, &part, nullptr) == ncclSuccess, "split");
    if (part != nullptr) {
      c.expect(ncclCommCount(part, &count) == ncclSuccess && count == (c.rank % 2 == 0 ? 2 : 1),
               "split's count");
      c.expect(ncclCommUserRank(part, &rank) == ncclSuccess && rank == (c.rank == 0 ? 1 : 0),
               "split's order by key");
      c.expect(ncclCommDestroy(part) == ncclSuccess, "destroy the part");
    }
    ncclComm_t none = world;
    c.expect(ncclCommSplit(world, c.rank == 1 ? NCCL_SPLIT_NOCOLOR : 0, 0, &none, nullptr) ==
                 ncclSuccess,
             "split with NOCOLOR");
    c.expect((none == nullptr) == (c.rank == 1), "NOCOLOR gets NULL, the others a communicator");
    if (none != nullptr) ncclCommDestroy(none);
    c.expect(ncclCommSplit(world, -5, 0, &part, nullptr) == ncclInvalidArgument, "color -5");

    // The last communicator takes the job with it: a new id makes a new one.
    c.expect(ncclCommDestroy(world) == ncclSuccess, "destroy");
    c.expect(ncclCommInitRank(&world, n, id[1], c.rank) == ncclSuccess, "a second job after it");
    if (world != nullptr) {
      c.expect(ncclCommCount(world, &count) == ncclSuccess && count == n, "its count");
      c.expect(ncclCommDestroy(world) == ncclSuccess, "destroy it");
    }
  }));
}

// Several ranks of a job in one process, as nccl-tests' -g runs them: ncclCommInitAll, and
// ncclCommInitRank of each rank inside one group. One thread destroys them one after the other:
// the job's ranks here finalize together, without waiting for each other's destroy.
TEST(NcclApi, SeveralRanksInOneProcess) {
  std::vector<ncclComm_t> comms(3, nullptr);
  ASSERT_EQ(ncclCommInitAll(comms.data(), 3, nullptr), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 3; ++r) {
    int count = 0, rank = -1;
    EXPECT_EQ(ncclCommCount(comms[r], &count), ncclSuccess);
    EXPECT_EQ(count, 3);
    EXPECT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    EXPECT_EQ(rank, r);
  }
  auto start = Clock::now();
  for (ncclComm_t comm : comms) EXPECT_EQ(ncclCommDestroy(comm), ncclSuccess);
  EXPECT_LT(Clock::now() - start, std::chrono::seconds(5)) << "destroys waited for each other";

  ncclUniqueId id;
  ASSERT_EQ(ncclGetUniqueId(&id), ncclSuccess);
  ASSERT_EQ(ncclGroupStart(), ncclSuccess);
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(ncclCommInitRank(&comms[r], 2, id, r), ncclSuccess);
    ncclResult_t state = ncclSuccess;
    EXPECT_EQ(ncclCommGetAsyncError(comms[r], &state), ncclSuccess);
    EXPECT_EQ(state, ncclInProgress) << "made at the group's end";
    int count = 0;
    EXPECT_EQ(ncclCommCount(comms[r], &count), ncclInvalidUsage) << "not made yet";
  }
  ASSERT_EQ(ncclGroupEnd(), ncclSuccess) << ncclGetLastError(nullptr);
  for (int r = 0; r < 2; ++r) {
    ncclResult_t state = ncclInternalError;
    EXPECT_EQ(ncclCommGetAsyncError(comms[r], &state), ncclSuccess);
    EXPECT_EQ(state, ncclSuccess);
    int rank = -1;
    EXPECT_EQ(ncclCommUserRank(comms[r], &rank), ncclSuccess);
    EXPECT_EQ(rank, r);
  }
  for (int r = 0; r < 2; ++r) EXPECT_EQ(ncclCommDestroy(comms[r]), ncclSuccess);
}

TEST(NcclApi, ShrinkLeavesOutTheDeadAndAbortDoesNotWait) {
  const auto ids = make_ids(1);
  ASSERT_TRUE(run_ranks(3, ids, [](Checks& c, int n, const std::vector<ncclUniqueId>& id) {
    ncclComm_t world = nullptr;
    c.expect(ncclCommInitRank(&world, n, id[0], c.rank) == ncclSuccess, "init");
    if (world == nullptr) return;
    if (c.rank == 2) ::_exit(0);  // dies without a word
    // Ranks 0 and 1: leaving out a rank that is alive is refused (after at most a second), not
    // a hang.
    int* alive = new int(1 - c.rank);
    ncclComm_t shrunk = nullptr;
    auto start = Clock::now();
    c.expect(ncclCommShrink(world, alive, 1, &shrunk, nullptr, NCCL_SHRINK_DEFAULT) ==
                     ncclInvalidUsage &&
                 shrunk == nullptr,
             "a live rank cannot be left out");
    c.expect(last_error_says("excluded but alive"), "and says why");
    c.expect(Clock::now() - start < std::chrono::seconds(3), "refused within a second or so");
    delete alive;
    int dead = 2;
    c.expect(ncclCommShrink(world, &dead, 1, &shrunk, nullptr, NCCL_SHRINK_ABORT) == ncclSuccess,
             "shrink without rank 2");
    int count = 0, rank = -1;
    if (shrunk != nullptr) {
      c.expect(ncclCommCount(shrunk, &count) == ncclSuccess && count == 2, "two go on");
      c.expect(ncclCommUserRank(shrunk, &rank) == ncclSuccess && rank == c.rank, "in order");
    }
    start = Clock::now();
    c.expect(ncclCommAbort(world) == ncclSuccess, "abort the old one");
    c.expect(Clock::now() - start < std::chrono::seconds(1), "abort returns within a second");
    if (shrunk != nullptr) c.expect(ncclCommDestroy(shrunk) == ncclSuccess, "destroy");
  }));
}

}  // namespace
