// Careless use of the public API in a job of one process: impossible sizes, null out-pointers,
// waits of any length, memory that cannot be written or is gone. Each call must fail with a
// status that says what is wrong (or work), never crash or return at once by accident.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cfloat>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry {
namespace {

Context& ctx() {
  static Context context = Context::init();
  return context;
}

std::size_t page() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

// Sizes no buffer can have: each must be refused, not announced to a peer or registered.
const std::vector<std::size_t> kImpossible = {std::numeric_limits<std::size_t>::max(),
                                              std::size_t{1} << 63, static_cast<std::size_t>(-100),
                                              std::size_t{1} << 62};

TEST(Misuse, ImpossibleSizesAreRefusedByEveryCallThatTakesOne) {
  char buffer[64] = {};
  for (std::size_t bytes : kImpossible) {
    Status s = ctx().isend(buffer, bytes, 0, 1).wait();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    EXPECT_NE(s.message().find("cannot exist"), std::string::npos) << s.to_string();
    s = ctx().irecv(buffer, bytes, 0, 1).wait();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    MemoryRegion region;
    s = ctx().register_memory(buffer, bytes, &region);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    EXPECT_FALSE(region.valid());
    s = ctx().allocate_memory(bytes, &region);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    // Collectives: counts whose bytes overflow, or reach past the address space.
    Communicator world = ctx().world();
    s = world.allreduce(buffer, buffer, bytes, DataType::kFloat64, ReduceOp::kSum);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    s = world.allgather(buffer, buffer, bytes, DataType::kInt32);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    s = world.reduce_scatter(buffer, buffer, bytes, DataType::kInt8, ReduceOp::kSum);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    const std::size_t counts[] = {bytes};
    const std::size_t displacements[] = {0};
    s = world.allgatherv(buffer, buffer, counts, displacements, DataType::kUint8);
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << bytes << ": " << s.to_string();
    const std::size_t small[] = {1};
    const std::size_t far[] = {bytes};
    s = world.allgatherv(buffer, buffer, small, far, DataType::kUint8);
    EXPECT_EQ(s.code(), Code::kInvalidArgument)
        << "displacement " << bytes << ": " << s.to_string();
    s = world.alltoallv(buffer, small, far, buffer, small, far, DataType::kUint8);
    EXPECT_EQ(s.code(), Code::kInvalidArgument)
        << "displacement " << bytes << ": " << s.to_string();
  }
  // Nothing was left behind: a message of the right size still goes through.
  int out = 5, in = 0;
  ASSERT_TRUE(ctx().send(&out, sizeof(out), 0, 2).is_ok());
  ASSERT_TRUE(ctx().recv(&in, sizeof(in), 0, 2).is_ok());
  EXPECT_EQ(in, 5);
}

TEST(Misuse, NullOutPointersAreRefused) {
  MemoryRegion region;
  char data[16] = {};
  ASSERT_TRUE(ctx().register_memory(data, sizeof(data), &region).is_ok());
  const std::vector<std::byte> packed = region.remote_key();
  EXPECT_EQ(RemoteKey::unpack(packed, nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(ctx().register_memory(data, sizeof(data), nullptr).code(), Code::kInvalidArgument);
  EXPECT_EQ(ctx().allocate_memory(64, nullptr).code(), Code::kInvalidArgument);
}

TEST(Misuse, WaitForTakesAnyLengthOfTime) {
  // A limit too long for the clock (INFINITY, DBL_MAX, 1e10 s) waits without one: it must not
  // end at once with kTimeout because the deadline overflowed.
  for (double seconds : {1e10, 9.3e9, 1e300, DBL_MAX, static_cast<double>(INFINITY)}) {
    int in = 0;
    const int out = 11;
    Request r = ctx().irecv(&in, sizeof(in), 0, 40);
    std::thread sender([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      (void)ctx().send(&out, sizeof(out), 0, 40);
    });
    const auto start = std::chrono::steady_clock::now();
    const Status s = r.wait_for(seconds);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sender.join();
    EXPECT_TRUE(s.is_ok()) << seconds << ": " << s.to_string();
    EXPECT_GE(waited, 0.04) << seconds;
    EXPECT_EQ(in, out);
  }
  int in = 0;
  Request r = ctx().irecv(&in, sizeof(in), 0, 41);
  EXPECT_EQ(r.wait_for(std::nan("")).code(), Code::kInvalidArgument);
  EXPECT_EQ(r.wait_for(-1).code(), Code::kTimeout) << "a negative limit is a test";
  EXPECT_TRUE(r.cancel());
}

TEST(Misuse, ShortLimitsEndOnTimeInEveryWaitMode) {
  // wait_for and FERRY_TIMEOUT read the clock at every step: under FERRY_WAIT_MODE=block a step
  // may sleep 32 ms, and reading it every 256th step ended wait_for(0.01) after 8 s.
  for (const char* mode : {"spin", "adaptive", "block"}) {
    Context c = Context::init({{{"FERRY_WAIT_MODE", mode}, {"FERRY_TIMEOUT", "0.02"}}});
    int in = 0;
    Request r = c.irecv(&in, sizeof(in), 0, 42);
    double longest = 0;
    for (int i = 0; i < 20; ++i) {
      const auto start = std::chrono::steady_clock::now();
      EXPECT_EQ(r.wait_for(0.01).code(), Code::kTimeout) << mode;
      longest = std::max(
          longest, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    EXPECT_LT(longest, 0.5) << mode << ": wait_for(0.01) took " << longest << " s";
    EXPECT_TRUE(r.cancel());
    const auto start = std::chrono::steady_clock::now();
    EXPECT_EQ(c.probe(0, 43).source, -1) << mode << ": nothing matched within FERRY_TIMEOUT";
    const double probed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    EXPECT_LT(probed, 0.5) << mode << ": probe under FERRY_TIMEOUT=0.02 took " << probed << " s";
  }
}

TEST(Misuse, WaitAnyHonoursTheTimeout) {
  // Every blocking call honours FERRY_TIMEOUT: wait_any over receives nobody sends to returns
  // requests.size() once it runs out, the receives still posted.
  Context bounded = Context::init({{{"FERRY_TIMEOUT", "0.2"}}});
  int a = 0, b = 0;
  std::vector<Request> pending;
  pending.push_back(bounded.irecv(&a, sizeof(a), 0, 50));
  pending.push_back(bounded.irecv(&b, sizeof(b), 0, 51));
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(Request::wait_any(pending), pending.size());
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.15);
  const int value = 3;
  ASSERT_TRUE(bounded.send(&value, sizeof(value), 0, 51).is_ok());
  EXPECT_EQ(Request::wait_any(pending), 1u) << "still posted after the timeout";
  EXPECT_TRUE(pending[0].cancel());
}

TEST(Misuse, ReadOnlyMemoryIsRegisteredForGetsOnly) {
  const std::size_t bytes = page();
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  static_cast<char*>(mapped)[3] = 'x';
  ASSERT_EQ(::mprotect(mapped, bytes, PROT_READ), 0);
  MemoryRegion region;
  ASSERT_TRUE(ctx().register_memory(mapped, bytes, &region).is_ok());
  EXPECT_TRUE(region.read_only());
  RemoteKey key;
  ASSERT_TRUE(RemoteKey::unpack(region.remote_key(), &key).is_ok());
  EXPECT_TRUE(key.read_only());
  char got[4] = {};
  EXPECT_TRUE(ctx().iget(got, sizeof(got), key, 0).wait().is_ok());
  EXPECT_EQ(got[3], 'x');
  const char data[4] = {'a', 'b', 'c', 'd'};
  Status s = ctx().iput(data, sizeof(data), key, 0).wait();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("only gets"), std::string::npos) << s.to_string();
  std::uint64_t old = 0;
  s = ctx().iatomic(AtomicOp::kAdd, 8, key, 8, 1, &old).wait();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  // A key whose read-only mark was cleared by hand is refused by the owner all the same.
  std::vector<std::byte> packed = region.remote_key();
  packed[48] &= ~std::byte{2};  // PackedKey::flags (api/rma.cpp)
  RemoteKey forged;
  ASSERT_TRUE(RemoteKey::unpack(packed, &forged).is_ok());
  ASSERT_FALSE(forged.read_only());
  s = ctx().iput(data, sizeof(data), forged, 0).wait();
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(region.deregister().is_ok());
  ::munmap(mapped, bytes);
}

TEST(Misuse, MemoryThatIsNotMappedCannotBeRegistered) {
  const std::size_t bytes = 3 * page();
  void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mapped, MAP_FAILED);
  // A hole in the middle, and a page nobody may read at the end.
  ASSERT_EQ(::munmap(static_cast<char*>(mapped) + page(), page()), 0);
  ASSERT_EQ(::mprotect(static_cast<char*>(mapped) + 2 * page(), page(), PROT_NONE), 0);
  MemoryRegion region;
  Status s = ctx().register_memory(mapped, bytes, &region);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("not all mapped"), std::string::npos) << s.to_string();
  s = ctx().register_memory(static_cast<char*>(mapped) + 2 * page(), page(), &region);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_TRUE(ctx().register_memory(mapped, page(), &region).is_ok()) << "the first page is fine";
  EXPECT_FALSE(region.read_only());
  EXPECT_TRUE(region.deregister().is_ok());
  // Only the pages still ours: the hole may hold someone else's mapping by now (a sanitizer's
  // thread-local storage was found there once).
  ::munmap(mapped, page());
  ::munmap(static_cast<char*>(mapped) + 2 * page(), page());
}

}  // namespace
}  // namespace ferry
