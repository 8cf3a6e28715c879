// Cross Memory Attach's failures say what they mean for the next copy (util/cma.hpp): only a
// refusal (kUnsupported) may turn zero-copy off for a peer; a range that is not mapped fails
// that copy alone, and a process that is gone is a dead peer. Copies with this process itself,
// which every machine allows.
#include "util/cma.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <numeric>
#include <vector>

namespace ferry::util {
namespace {

TEST(Cma, CopiesWithAProcessBothWays) {
  std::vector<std::uint8_t> there(1 << 20), here(there.size(), 0);
  std::iota(there.begin(), there.end(), 1);
  const Status read = cma_read(::getpid(), here.data(),
                               reinterpret_cast<std::uint64_t>(there.data()), there.size());
  if (read.code() == Code::kUnsupported) GTEST_SKIP() << "CMA refused here: " << read.to_string();
  ASSERT_TRUE(read) << read.to_string();
  EXPECT_EQ(here, there);
  std::vector<std::uint8_t> back(there.size(), 0);
  ASSERT_TRUE(cma_write(::getpid(), reinterpret_cast<std::uint64_t>(back.data()), there.data(),
                        there.size()));
  EXPECT_EQ(back, there);
}

TEST(Cma, ARangeNotMappedFailsThatCopyOnlyNotAsARefusal) {
  std::vector<std::uint8_t> here(4096);
  // A page mapped, then unmapped: its address is certainly not mapped now.
  void* page = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(page, MAP_FAILED);
  ASSERT_EQ(::munmap(page, 4096), 0);
  const Status status =
      cma_read(::getpid(), here.data(), reinterpret_cast<std::uint64_t>(page), here.size());
  if (status.code() == Code::kUnsupported) GTEST_SKIP() << "CMA refused here";
  EXPECT_EQ(status.code(), Code::kInvalidArgument) << status.to_string();
  // And the next copy works.
  std::vector<std::uint8_t> there(4096, 7);
  EXPECT_TRUE(cma_read(::getpid(), here.data(), reinterpret_cast<std::uint64_t>(there.data()),
                       here.size()));
  EXPECT_EQ(here, there);
}

TEST(Cma, AProcessThatIsGoneIsAFailedPeer) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);  // reaped: the pid names no process now
  std::vector<std::uint8_t> here(64);
  const Status copy =
      cma_read(child, here.data(), reinterpret_cast<std::uint64_t>(here.data()), here.size());
  EXPECT_EQ(copy.code(), Code::kPeerFailed) << copy.to_string();
}

}  // namespace
}  // namespace ferry::util
