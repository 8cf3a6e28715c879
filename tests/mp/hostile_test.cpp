// What one rank's carelessness (or malice) may cost another: nothing. Run under ferryrun with two
// or more ranks over shm (with and without CMA) and over ofi: a peer's put, get or atomic on memory
// its owner registered read-only, or unmapped without deregistering, fails at the peer and the
// owner goes on; regions deregistered while a peer maps them are freed.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "../helpers/ranks_main.hpp"
#include "ferry/ferry.hpp"

namespace ferry {
namespace {

using test::ctx;
using test::me;
using test::nranks;

std::size_t page() { return static_cast<std::size_t>(::sysconf(_SC_PAGESIZE)); }

// Rank 0's packed key for `region`, on every rank.
std::vector<std::byte> packed_key_of_rank0(const MemoryRegion* region) {
  std::vector<std::byte> packed(64);
  std::uint64_t length = 0;
  if (me() == 0) {
    const std::vector<std::byte> mine = region->remote_key();
    length = mine.size();
    std::memcpy(packed.data(), mine.data(), mine.size());
  }
  EXPECT_TRUE(ctx().world().broadcast(&length, 1, DataType::kUint64, 0).is_ok());
  EXPECT_TRUE(ctx().world().broadcast(packed.data(), packed.size(), DataType::kUint8, 0).is_ok());
  packed.resize(length);
  return packed;
}

RemoteKey unpacked(std::span<const std::byte> packed) {
  RemoteKey key;
  EXPECT_TRUE(RemoteKey::unpack(packed, &key).is_ok());
  return key;
}

RemoteKey key_of_rank0(const MemoryRegion* region) { return unpacked(packed_key_of_rank0(region)); }

void* map_pages(std::size_t pages, char fill) {
  void* mapped =
      ::mmap(nullptr, pages * page(), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(mapped, MAP_FAILED);
  std::memset(mapped, fill, pages * page());
  return mapped;
}

TEST(OwnerSurvives, PutsAndAtomicsOnReadOnlyMemoryFailAtThePeer) {
  void* mapped = nullptr;
  MemoryRegion region;
  if (me() == 0) {
    mapped = map_pages(2, 'r');
    ASSERT_EQ(::mprotect(mapped, 2 * page(), PROT_READ), 0);
    ASSERT_TRUE(ctx().register_memory(mapped, 2 * page(), &region).is_ok());
    EXPECT_TRUE(region.read_only());
  }
  std::vector<std::byte> packed = packed_key_of_rank0(&region);
  RemoteKey key = unpacked(packed);
  if (me() != 0) {
    EXPECT_TRUE(key.read_only());
    std::vector<char> got(page() + 8);
    ASSERT_TRUE(ctx().iget(got.data(), got.size(), key, 16).wait().is_ok());
    EXPECT_EQ(got.front(), 'r');
    EXPECT_EQ(got.back(), 'r');
    const std::vector<char> data(page(), 'w');
    Status s = ctx().iput(data.data(), data.size(), key, 0).wait();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.message().find("only gets"), std::string::npos) << s.to_string();
    std::uint64_t old = 0;
    s = ctx().iatomic(AtomicOp::kAdd, 8, key, 64, 1, &old).wait();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
    // The same through a key whose read-only mark was cleared by hand (PackedKey::flags, in
    // api/rma.cpp): the owner refuses, by whichever path the put takes.
    packed[48] &= ~std::byte{2};
    RemoteKey forged = unpacked(packed);
    ASSERT_FALSE(forged.read_only());
    for (int round = 0; round < 2; ++round) {
      s = ctx().iput(data.data(), data.size(), forged, 0).wait();
      EXPECT_NE(s.code(), Code::kOk) << "a put into read-only memory succeeded";
      s = ctx().iatomic(AtomicOp::kAdd, 8, forged, 64, 1, &old).wait();
      EXPECT_NE(s.code(), Code::kOk) << "an atomic on read-only memory succeeded";
    }
    (void)ctx().flush(0);
  }
  ASSERT_TRUE(ctx().barrier().is_ok()) << "the owner is alive and answers";
  if (me() == 0) {
    EXPECT_EQ(static_cast<char*>(mapped)[0], 'r');
    EXPECT_TRUE(region.deregister().is_ok());
    ::munmap(mapped, 2 * page());
  }
}

TEST(OwnerSurvives, AccessesToMemoryUnmappedWithoutDeregisteringFailAtThePeer) {
  void* mapped = nullptr;
  MemoryRegion region;
  if (me() == 0) {
    mapped = map_pages(4, 'u');
    ASSERT_TRUE(ctx().register_memory(mapped, 4 * page(), &region).is_ok());
  }
  RemoteKey key = key_of_rank0(&region);
  if (me() == 0) {
    ASSERT_EQ(::munmap(mapped, 4 * page()), 0);  // careless: still registered
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() != 0) {
    const std::vector<char> data(2 * page() + 3, 'p');
    for (int round = 0; round < 2; ++round) {  // the second after any grant was asked for
      Status s = ctx().iput(data.data(), data.size(), key, 8).wait();
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
      EXPECT_NE(s.message().find("no longer mapped"), std::string::npos) << s.to_string();
      std::vector<char> got(100);
      s = ctx().iget(got.data(), got.size(), key, page()).wait();
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
      std::uint64_t old = 0;
      s = ctx().iatomic(AtomicOp::kSwap, 8, key, 8, 5, &old).wait();
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
    }
    (void)ctx().flush(0);
  }
  ASSERT_TRUE(ctx().barrier().is_ok()) << "the owner is alive and answers";
  // It still serves one-sided operations on its other memory.
  std::vector<char> own(page(), 'o');
  MemoryRegion fine;
  if (me() == 0) {
    ASSERT_TRUE(ctx().register_memory(own.data(), own.size(), &fine).is_ok());
  }
  RemoteKey fine_key = key_of_rank0(&fine);
  if (me() != 0) {
    const char mark = static_cast<char>('a' + me());
    EXPECT_TRUE(ctx().iput(&mark, 1, fine_key, static_cast<std::uint64_t>(me())).wait().is_ok());
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 0) {
    for (int r = 1; r < nranks(); ++r) EXPECT_EQ(own[static_cast<std::size_t>(r)], 'a' + r);
    EXPECT_TRUE(fine.deregister().is_ok());
    EXPECT_TRUE(region.deregister().is_ok());
  }
}

// Mappings of ferry's shared one-sided memory in this process (/proc/self/maps).
int mapped_regions() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);) {
    if (line.find("memfd:ferry-rma ") != std::string::npos ||
        line.ends_with("memfd:ferry-rma (deleted)")) {
      ++count;
    }
  }
  return count;
}

TEST(Regions, DeregisteredAllocationsAreFreedWhileTheirPeersLive) {
  // Each round rank 0 allocates 1 MiB, every other rank writes into it directly (mapping it),
  // and rank 0 deregisters it. Without the peers letting go, 300 rounds kept 300 MiB per rank.
  constexpr int kRounds = 300;
  const int before = mapped_regions();
  for (int round = 0; round < kRounds; ++round) {
    MemoryRegion region;
    if (me() == 0) {
      ASSERT_TRUE(ctx().allocate_memory(1 << 20, &region).is_ok());
    }
    RemoteKey key = key_of_rank0(&region);
    if (me() != 0) {
      const std::uint64_t value = static_cast<std::uint64_t>(round);
      ASSERT_TRUE(ctx()
                      .iput(&value, sizeof(value), key, 8 * static_cast<std::uint64_t>(me()))
                      .wait()
                      .is_ok());
    }
    ASSERT_TRUE(ctx().barrier().is_ok());
    if (me() == 0) {
      ASSERT_TRUE(region.deregister().is_ok());
    }
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  EXPECT_LE(mapped_regions(), before + 2) << "mappings of deregistered regions kept";
  // And the last ones go with further progress, without another mapping.
  for (int i = 0; i < 100000 && mapped_regions() > before; ++i) ctx().progress();
  EXPECT_EQ(mapped_regions(), before);
  ASSERT_TRUE(ctx().barrier().is_ok());
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  return ferry::test::run_on_every_rank(argc, argv, "hostile_test", 2);
}
