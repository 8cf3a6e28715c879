// util::copy and copy_large against byte-by-byte expectations: every size up to 80 bytes (the
// inline path up to 16, overlapping loads and stores) at every alignment of source and
// destination, then sizes around the vector and non-temporal thresholds; nothing outside the
// destination range may change.
#include "util/copy.hpp"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry::util {
namespace {

std::vector<unsigned char> pattern(std::size_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  for (std::size_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>(i * 31 + seed * 7 + 1);
  return v;
}

// Copies `n` bytes from source offset `from` to destination offset `to` with `copier` and checks
// every byte of the destination buffer.
template <typename Copier>
void check(std::size_t n, std::size_t from, std::size_t to, Copier copier) {
  constexpr std::size_t kGuard = 64;
  const std::vector<unsigned char> src = pattern(n + from + kGuard, 1);
  std::vector<unsigned char> dst = pattern(n + to + 2 * kGuard, 2);
  const std::vector<unsigned char> before = dst;
  copier(dst.data() + kGuard + to, src.data() + from, n);
  for (std::size_t i = 0; i < dst.size(); ++i) {
    const bool inside = i >= kGuard + to && i < kGuard + to + n;
    const unsigned char want = inside ? src[from + (i - kGuard - to)] : before[i];
    ASSERT_EQ(dst[i], want) << n << " bytes from offset " << from << " to offset " << to
                            << ": byte " << i << (inside ? " (copied)" : " (outside)");
  }
}

TEST(Copy, EverySmallSizeAtEveryAlignment) {
  for (std::size_t n = 0; n <= 80; ++n) {
    for (std::size_t from = 0; from < 8; ++from) {
      for (std::size_t to = 0; to < 8; ++to) {
        check(n, from, to, [](void* d, const void* s, std::size_t k) { copy(d, s, k); });
      }
    }
  }
}

TEST(Copy, SizesAroundTheThresholds) {
  for (std::size_t n :
       {std::size_t{1023}, std::size_t{1024}, std::size_t{4097}, std::size_t{(1u << 20) - 1},
        std::size_t{1u << 20}, kStreamFrom - 1, kStreamFrom, kStreamFrom + 65}) {
    check(n, 3, 5, [](void* d, const void* s, std::size_t k) { copy(d, s, k); });
    check(n, 0, 0, [](void* d, const void* s, std::size_t k) { copy_large(d, s, k); });
    check(n, 7, 1, [](void* d, const void* s, std::size_t k) { copy_large(d, s, k); });
  }
}

TEST(Copy, RepMovsbAtEveryAlignmentAndAroundItsThreshold) {
  // copy_rep directly (util::copy takes it from kRepFrom only where `rep movsb` is not slow).
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{4097}}) {
    for (std::size_t from = 0; from < 4; ++from) {
      check(n, from, 3 - from, [](void* d, const void* s, std::size_t k) { copy_rep(d, s, k); });
    }
  }
  for (std::size_t n : {kRepFrom - 1, kRepFrom, kRepFrom + 17}) {
    check(n, 0, 0, [](void* d, const void* s, std::size_t k) { copy(d, s, k); });
    check(n, 5, 2, [](void* d, const void* s, std::size_t k) { copy(d, s, k); });
    check(n, 1, 0, [](void* d, const void* s, std::size_t k) { copy_rep(d, s, k); });
  }
}

}  // namespace
}  // namespace ferry::util
