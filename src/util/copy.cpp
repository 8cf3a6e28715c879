// The vector copy loop behind util::copy (see copy.hpp).
#include "util/copy.hpp"

#include <immintrin.h>

#include <cstdint>

namespace ferry::util {

const bool kHaveAvx2 = __builtin_cpu_supports("avx2");

__attribute__((target("avx2"))) void copy_vector(void* dst, const void* src,
                                                 std::size_t n) noexcept {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // n >= 128 here (callers use it from 1 KiB): 128-byte blocks, then an overlapping last block.
  std::size_t i = 0;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  if (i < n) {
    // The last 128 bytes, overlapping what was already copied (n >= 128).
    const std::size_t t = n - 128;
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + t));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + t + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + t + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + t + 96));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + t), a);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + t + 32), b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + t + 64), c);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + t + 96), e);
  }
  _mm256_zeroupper();
}

}  // namespace ferry::util

namespace ferry::util {

__attribute__((target("avx2"))) void copy_stream(void* dst, const void* src,
                                                 std::size_t n) noexcept {
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Align the destination to 32 bytes with one unaligned store, then stream whole blocks.
  std::size_t head = (32 - (reinterpret_cast<std::uintptr_t>(d) & 31)) & 31;
  if (n < head + 128) {
    std::memcpy(d, s, n);
    return;
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(d),
                      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s)));
  std::size_t i = head;
  for (; i + 128 <= n; i += 128) {
    __m256i a = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i));
    __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 32));
    __m256i c = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 64));
    __m256i e = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(s + i + 96));
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i), a);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 32), b);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 64), c);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(d + i + 96), e);
  }
  if (i < n) copy_vector(d + n - 128, s + n - 128, 128);
  _mm_sfence();  // streamed stores are weakly ordered: finish them before the FIFO publish
  _mm256_zeroupper();
}

}  // namespace ferry::util
