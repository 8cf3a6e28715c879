// Memory copy for the data path. glibc's memcpy switches to `rep movsb` between 2 KiB and its
// non-temporal threshold; on some virtual machines (seen on this project's AMD EPYC VMs) that
// instruction runs 13-20x slower than a vector loop (4 KiB: 1.6 us vs 0.12 us), so there copies
// in that range use an AVX2 loop; elsewhere (Intel VMs with fast short `rep movsb`) memcpy is as
// fast or faster. Which of the two holds is timed once, when the library loads (kRepMovsbSlow).
// docs/PERFORMANCE.md has the measurements.
#pragma once

#include <cstddef>
#include <cstring>

namespace ferry::util {

void copy_vector(void* dst, const void* src, std::size_t n) noexcept;
// Non-temporal stores: the destination lines go to memory, not into this core's cache.
void copy_stream(void* dst, const void* src, std::size_t n) noexcept;
extern const bool kHaveAvx2;
// Whether `rep movsb` runs far (3x or more) slower than the AVX2 loop here: best of five copies of
// 64 KiB in cache each way. The kernel's copies (process_vm_readv, so CMA) use it too.
extern const bool kRepMovsbSlow;
// `rep movsb`, for copies of kRepFrom or more where it is not slow. glibc's memcpy stops using it
// above the L2 size on AMD processors and runs a vector loop there; on this project's AMD EPYC
// VM whose `rep movsb` is fast (bench/copy_probe.cpp, interleaved pairs) that loop moved 1 MiB at
// 57-60 GB/s against 63-68, 16 MiB at 30-36 against 34-46, and 4 MiB 2-4% slower except with the
// destination 16 bytes off the source's alignment (2-4% faster there; docs/PERFORMANCE.md,
// "One-sided"). Where glibc keeps `rep movsb` (Intel) this is the copy it makes anyway.
void copy_rep(void* dst, const void* src, std::size_t n) noexcept;
constexpr std::size_t kRepFrom = std::size_t{1} << 20;

// Up to 16 bytes in at most two loads and two stores (overlapping), with no call: a one-sided
// access of a word is then a few instructions.
[[gnu::always_inline]] inline void copy_small(void* dst, const void* src, std::size_t n) noexcept {
  auto* d = static_cast<unsigned char*>(dst);
  const auto* s = static_cast<const unsigned char*>(src);
  if (n >= 8) {
    unsigned long long head, tail;
    std::memcpy(&head, s, 8);
    std::memcpy(&tail, s + n - 8, 8);
    std::memcpy(d, &head, 8);
    std::memcpy(d + n - 8, &tail, 8);
  } else if (n >= 4) {
    unsigned head, tail;
    std::memcpy(&head, s, 4);
    std::memcpy(&tail, s + n - 4, 4);
    std::memcpy(d, &head, 4);
    std::memcpy(d + n - 4, &tail, 4);
  } else {
    for (std::size_t i = 0; i < n; ++i) d[i] = s[i];
  }
}

[[gnu::always_inline]] inline void copy(void* dst, const void* src, std::size_t n) noexcept {
  if (n <= 16) {
    copy_small(dst, src, n);
    return;
  }
  constexpr std::size_t kVectorFrom = 1024;
  constexpr std::size_t kVectorUpTo = 1u << 20;  // above, glibc goes non-temporal: fast again
  if (n >= kVectorFrom && n < kVectorUpTo && kRepMovsbSlow) {
    copy_vector(dst, src, n);
  } else if (n >= kRepFrom && !kRepMovsbSlow) {
    copy_rep(dst, src, n);
  } else {
    std::memcpy(dst, src, n);
  }
}

// Copies of 32 MiB or more into memory this process does not read next go around the cache.
// Direct one-sided puts, interleaved A/B on the VMs (docs/PERFORMANCE.md, "Shared memory"): below
// that, cached stores were ahead (4 MiB: 14.0-14.7 GB/s against 12.3-13.4 in 16 of 18 rounds on
// two VMs; 16 MiB likewise); at 64 MiB streaming stores were (12.2-13.0 against 5.8-9.1), the
// copy no longer staying in the cache the VM gives a core. sysconf's cache sizes do not say where
// that lies on a VM (it reports a 480 MiB L3), so the size is fixed. Gets, whose destination the
// caller reads next, keep cached stores.
extern const std::size_t kStreamFrom;

inline void copy_large(void* dst, const void* src, std::size_t n) noexcept {
  if (n >= kStreamFrom && kHaveAvx2) {
    copy_stream(dst, src, n);
  } else {
    copy(dst, src, n);
  }
}

}  // namespace ferry::util
