// The registration cache: a buffer registered once is found again; entries and bytes are bounded;
// memory that is unmapped, discarded or moved is dropped before a lookup can return it, as the
// kernel reports through the unmap monitor; a revoked registration serves nobody again.
#include "mem/registration_cache.hpp"

#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <set>

namespace ferry::mem {
namespace {

// Stands in for a NIC: hands out numbered handles and remembers which are live.
class FakeNic {
 public:
  RegistrationCache::Register reg() {
    return [this](void* base, std::size_t length, std::uint64_t access, void** handle) {
      if (refuse_) return -22;
      const std::uintptr_t id = ++next_;
      live_[id] = {reinterpret_cast<std::uintptr_t>(base), length, access};
      *handle = reinterpret_cast<void*>(id);
      return 0;
    };
  }
  RegistrationCache::Deregister dereg() {
    return [this](void* handle) {
      ASSERT_EQ(live_.erase(reinterpret_cast<std::uintptr_t>(handle)), 1u)
          << "deregistered twice or never registered";
    };
  }
  struct Registration {
    std::uintptr_t base;
    std::size_t length;
    std::uint64_t access;
  };
  std::map<std::uintptr_t, Registration> live_;
  std::uintptr_t next_ = 0;
  bool refuse_ = false;
};

class RegistrationCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    monitor_ = UnmapMonitor::shared(&why);
    if (monitor_ == nullptr) GTEST_SKIP() << "no userfaultfd here: " << why;
  }
  std::unique_ptr<RegistrationCache> make(std::size_t entries, std::size_t bytes) {
    return std::make_unique<RegistrationCache>(entries, bytes, nic_.reg(), nic_.dereg(), monitor_,
                                               "");
  }
  static std::byte* map(std::size_t bytes, void* at = nullptr) {
    void* p = ::mmap(at, bytes, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS | (at != nullptr ? MAP_FIXED : 0), -1, 0);
    EXPECT_NE(p, MAP_FAILED);
    std::memset(p, 1, bytes);
    return static_cast<std::byte*>(p);
  }
  FakeNic nic_;
  std::shared_ptr<UnmapMonitor> monitor_;
  static constexpr std::size_t kMiB = 1 << 20;
};

TEST_F(RegistrationCacheTest, ABufferRegisteredOnceIsFoundAgainAndInsideIt) {
  auto cache = make(16, 1 << 30);
  std::byte* buffer = map(4 * kMiB);
  int error = 0;
  auto* first = cache->acquire(buffer, 4 * kMiB, 1, &error);
  ASSERT_NE(first, nullptr);
  cache->release(first, false);
  auto* again = cache->acquire(buffer, 4 * kMiB, 1, &error);
  auto* inside = cache->acquire(buffer + kMiB, kMiB, 1, &error);
  EXPECT_EQ(again, first);
  EXPECT_EQ(inside, first);
  EXPECT_EQ(cache->stats().hits, 2u);
  EXPECT_EQ(cache->stats().misses, 1u);
  EXPECT_EQ(nic_.live_.size(), 1u);
  // Wider access than registered, or a range beyond it: a new registration.
  auto* wider = cache->acquire(buffer, 4 * kMiB, 3, &error);
  EXPECT_NE(wider, first);
  cache->release(wider, false);
  cache->release(again, false);
  cache->release(inside, false);
  ::munmap(buffer, 4 * kMiB);
}

TEST_F(RegistrationCacheTest, EntriesAndBytesAreBoundedLeastRecentlyUsedFirst) {
  auto cache = make(2, 1 << 30);
  std::byte* a = map(kMiB);
  std::byte* b = map(kMiB);
  std::byte* c = map(kMiB);
  int error = 0;
  for (std::byte* p : {a, b, a, c}) cache->release(cache->acquire(p, kMiB, 1, &error), false);
  EXPECT_EQ(cache->stats().entries, 2u);
  EXPECT_EQ(cache->stats().evictions, 1u);
  EXPECT_EQ(nic_.live_.size(), 2u);
  // b was the least recently used: a is still there.
  const auto hits = cache->stats().hits;
  cache->release(cache->acquire(a, kMiB, 1, &error), false);
  EXPECT_EQ(cache->stats().hits, hits + 1);

  auto small = make(100, 2 * kMiB);
  for (std::byte* p : {a, b, c}) small->release(small->acquire(p, kMiB, 1, &error), false);
  EXPECT_LE(small->stats().bytes, 2 * kMiB);
  // A held entry is never evicted, even over the bound.
  auto* held = small->acquire(a, kMiB, 4, &error);
  auto* held2 = small->acquire(b, kMiB, 4, &error);
  auto* held3 = small->acquire(c, kMiB, 4, &error);
  EXPECT_EQ(small->stats().entries, 3u);  // all held: over the bound until they are let go
  for (auto* e : {held, held2, held3}) small->release(e, false);
  EXPECT_LE(small->stats().bytes, 2 * kMiB);
  for (std::byte* p : {a, b, c}) ::munmap(p, kMiB);
}

TEST_F(RegistrationCacheTest, UnmappedMemoryIsDroppedBeforeALookupCanFindIt) {
  auto cache = make(16, 1 << 30);
  std::byte* buffer = map(4 * kMiB);
  int error = 0;
  auto* first = cache->acquire(buffer, 4 * kMiB, 1, &error);
  cache->release(first, false);
  const std::uintptr_t old_handle = reinterpret_cast<std::uintptr_t>(first->handle);
  ASSERT_EQ(::munmap(buffer, 4 * kMiB), 0);
  // New memory at the same address: the old registration must not serve it.
  std::byte* again = map(4 * kMiB, buffer);
  ASSERT_EQ(again, buffer);
  auto* second = cache->acquire(again, 4 * kMiB, 1, &error);
  EXPECT_NE(reinterpret_cast<std::uintptr_t>(second->handle), old_handle);
  EXPECT_EQ(nic_.live_.count(old_handle), 0u) << "the stale registration is still live";
  EXPECT_EQ(cache->stats().invalidations, 1u);
  EXPECT_EQ(cache->stats().hits, 0u);
  cache->release(second, false);
  ::munmap(again, 4 * kMiB);
}

TEST_F(RegistrationCacheTest, DiscardedAndMovedMemoryIsDroppedToo) {
  auto cache = make(16, 1 << 30);
  std::byte* buffer = map(4 * kMiB);
  int error = 0;
  cache->release(cache->acquire(buffer, kMiB, 1, &error), false);
  // madvise(MADV_DONTNEED) gives the pages back: new ones come on the next touch.
  ASSERT_EQ(::madvise(buffer, kMiB, MADV_DONTNEED), 0);
  cache->release(cache->acquire(buffer, kMiB, 1, &error), false);
  EXPECT_EQ(cache->stats().invalidations, 1u);
  EXPECT_EQ(cache->stats().hits, 0u);
  // mremap moves the pages away from this address (the watched range is a mapping of its own
  // while it is cached, so exactly it can move).
  cache->release(cache->acquire(buffer + 2 * kMiB, kMiB, 1, &error), false);
  void* moved = ::mremap(buffer + 2 * kMiB, kMiB, 8 * kMiB, MREMAP_MAYMOVE);
  ASSERT_NE(moved, MAP_FAILED) << std::strerror(errno);
  EXPECT_EQ(cache->stats().invalidations, 1u);
  std::byte* refill = map(kMiB, buffer + 2 * kMiB);
  cache->release(cache->acquire(refill, kMiB, 1, &error), false);
  EXPECT_EQ(cache->stats().invalidations, 2u);
  EXPECT_EQ(cache->stats().hits, 0u);
  ::munmap(buffer, 4 * kMiB);
  ::munmap(moved, 8 * kMiB);
}

TEST_F(RegistrationCacheTest, AnEvictedEntryNoLongerSplitsItsMapping) {
  auto cache = make(1, 1 << 30);
  std::byte* buffer = map(4 * kMiB);
  std::byte* other = map(kMiB);
  int error = 0;
  // While cached, the mapping is split at the entry's bounds (a resize across them fails).
  cache->release(cache->acquire(buffer + kMiB, kMiB, 1, &error), false);
  cache->release(cache->acquire(other, kMiB, 1, &error), false);  // evicts it
  EXPECT_EQ(cache->stats().evictions, 1u);
  void* moved = ::mremap(buffer, 4 * kMiB, 8 * kMiB, MREMAP_MAYMOVE);
  ASSERT_NE(moved, MAP_FAILED) << std::strerror(errno);
  ::munmap(moved, 8 * kMiB);
  ::munmap(other, kMiB);
}

TEST_F(RegistrationCacheTest, AnEntryInUseIsDeregisteredOnlyWhenItsHolderLetsGo) {
  auto cache = make(16, 1 << 30);
  std::byte* buffer = map(kMiB);
  int error = 0;
  auto* held = cache->acquire(buffer, kMiB, 1, &error);
  const auto handle = reinterpret_cast<std::uintptr_t>(held->handle);
  ASSERT_EQ(::munmap(buffer, kMiB), 0);
  std::byte* again = map(kMiB, buffer);
  auto* fresh = cache->acquire(again, kMiB, 1, &error);
  EXPECT_NE(fresh, held);
  EXPECT_EQ(nic_.live_.count(handle), 1u) << "deregistered while a transfer held it";
  cache->release(held, false);
  EXPECT_EQ(nic_.live_.count(handle), 0u);
  cache->release(fresh, false);
  ::munmap(again, kMiB);
}

TEST_F(RegistrationCacheTest, ARevokedRegistrationServesNobodyAgain) {
  auto cache = make(16, 1 << 30);
  std::byte* buffer = map(kMiB);
  int error = 0;
  auto* entry = cache->acquire(buffer, kMiB, 1, &error);
  const auto handle = reinterpret_cast<std::uintptr_t>(entry->handle);
  cache->release(entry, true);
  EXPECT_EQ(nic_.live_.count(handle), 0u);
  cache->release(cache->acquire(buffer, kMiB, 1, &error), false);
  EXPECT_EQ(cache->stats().hits, 0u);
  ::munmap(buffer, kMiB);
}

TEST_F(RegistrationCacheTest, ARefusedRegistrationIsAnErrorAndNothingIsKept) {
  auto cache = make(16, 1 << 30);
  std::byte* buffer = map(kMiB);
  nic_.refuse_ = true;
  int error = 0;
  EXPECT_EQ(cache->acquire(buffer, kMiB, 1, &error), nullptr);
  EXPECT_EQ(error, -22);
  EXPECT_EQ(cache->stats().entries, 0u);
  ::munmap(buffer, kMiB);
}

TEST(RegistrationCacheOff, WithoutAMonitorEveryRegistrationIsForOneUse) {
  FakeNic nic;
  RegistrationCache cache(16, 1 << 30, nic.reg(), nic.dereg(), nullptr, "userfaultfd: refused");
  std::vector<std::byte> buffer(1 << 20);
  int error = 0;
  auto* entry = cache.acquire(buffer.data(), buffer.size(), 1, &error);
  ASSERT_NE(entry, nullptr);
  EXPECT_EQ(nic.live_.size(), 1u);
  cache.release(entry, false);
  EXPECT_TRUE(nic.live_.empty());
  cache.release(cache.acquire(buffer.data(), buffer.size(), 1, &error), false);
  EXPECT_EQ(cache.stats().hits, 0u);
  EXPECT_NE(cache.describe().find("off (userfaultfd: refused)"), std::string::npos)
      << cache.describe();
}

TEST(UnmapMonitor, AHeapBufferFreedByMallocIsSeen) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "a sanitizer's allocator keeps freed memory mapped (quarantine)";
#endif
  std::string why;
  auto monitor = UnmapMonitor::shared(&why);
  if (monitor == nullptr) GTEST_SKIP() << why;
  const int me = monitor->subscribe();
  ASSERT_GE(me, 0);
  // Large enough that malloc serves it by mmap and free() unmaps it inside the C library,
  // where no symbol interposition could see it.
  auto* buffer = static_cast<std::byte*>(std::malloc(64 << 20));
  ASSERT_NE(buffer, nullptr);
  std::memset(buffer, 0, 64 << 20);
  ASSERT_TRUE(monitor->watch(reinterpret_cast<std::uintptr_t>(buffer),
                             reinterpret_cast<std::uintptr_t>(buffer) + (64 << 20), &why))
      << why;
  std::free(buffer);
  std::vector<AddressRange> gone;
  bool everything = false;
  monitor->drain(me, &gone, &everything);
  bool seen = everything;
  for (const AddressRange& range : gone) {
    seen = seen || range.overlaps(reinterpret_cast<std::uintptr_t>(buffer),
                                  reinterpret_cast<std::uintptr_t>(buffer) + 1);
  }
  EXPECT_TRUE(seen);
  monitor->unsubscribe(me);
}

}  // namespace
}  // namespace ferry::mem
