// The vector copy loops behind util::copy and util::copy_stream (see copy.hpp).
#include "util/copy.hpp"

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace ferry::util {
namespace {

// One 128-byte block: four 32-byte loads, then four stores (cached or streaming).
template <bool kStream>
__attribute__((target("avx2"), always_inline)) inline void store(char* d, __m256i v) {
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d), v);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d), v);
  }
}

// One 128-byte block: four 32-byte loads, then four stores (cached or streaming).
template <bool kStream>
__attribute__((target("avx2"), always_inline)) inline void block128(char* d, const char* s) {
  const __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s));
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 32));
  const __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 64));
  const __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + 96));
  store<kStream>(d, a);
  store<kStream>(d + 32, b);
  store<kStream>(d + 64, c);
  store<kStream>(d + 96, e);
}

}  // namespace

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

namespace {

template <class Copy>
double best_of_five_us(Copy&& copy) {
  double best = 1e30;
  for (int i = 0; i < 5; ++i) {
    const auto start = std::chrono::steady_clock::now();
    copy();
    best = std::min(
        best, std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
                  .count());
  }
  return best;
}

bool measure_rep_movsb_slow() {
  if (!kHaveAvx2) return false;
  constexpr std::size_t kBytes = 64 << 10;
  std::vector<char> from(kBytes, 1), to(kBytes, 0);
  const double rep = best_of_five_us([&] {
    void* d = to.data();
    const void* s = from.data();
    std::size_t n = kBytes;
    asm volatile("rep movsb" : "+D"(d), "+S"(s), "+c"(n) : : "memory");
  });
  const double vector = best_of_five_us([&] { copy_vector(to.data(), from.data(), kBytes); });
  return rep > 3 * vector;
}

}  // namespace

const bool kRepMovsbSlow = measure_rep_movsb_slow();

const std::size_t kStreamFrom = std::size_t{32} << 20;

void copy_rep(void* dst, const void* src, std::size_t n) noexcept {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

__attribute__((target("avx2"))) void copy_vector(void* dst, const void* src,
                                                 std::size_t n) noexcept {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // n >= 128 (callers use it from 1 KiB): whole blocks, then a last block overlapping the rest.
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) block128<false>(d + i, s + i);
  if (i < n) block128<false>(d + n - 128, s + n - 128);
  _mm256_zeroupper();
}

__attribute__((target("avx2"))) void copy_stream(void* dst, const void* src,
                                                 std::size_t n) noexcept {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Streaming stores need 32-byte aligned destinations: one unaligned store covers the head.
  const std::size_t head = (32 - (reinterpret_cast<std::uintptr_t>(d) & 31)) & 31;
  if (n < head + 256) {
    copy(d, s, n);
    return;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  std::size_t i = head;
  for (; i + 128 <= n; i += 128) block128<true>(d + i, s + i);
  if (i < n) block128<false>(d + n - 128, s + n - 128);
  _mm_sfence();  // streaming stores are weakly ordered: complete them before the FIFO publish
  _mm256_zeroupper();
}

}  // namespace ferry::util
