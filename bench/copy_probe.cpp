// glibc's memcpy against `rep movsb` for large copies in one process, between two MAP_SHARED
// buffers (as a direct one-sided put or get copies between its buffer and a peer's mapping),
// interleaved: for each size and each relative offset of source and destination, memcpy then
// `rep movsb`, ROUNDS times. The measurement behind util::copy_rep (docs/PERFORMANCE.md,
// "One-sided"). Run: build/bench/copy_probe [ROUNDS] [MIB...] (default 6 rounds of 4 MiB).
#include <sys/mman.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

void rep_movsb(void* dst, const void* src, std::size_t n) {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

template <typename Copy>
double gbps(char* dst, const char* src, std::size_t n, Copy copy) {
  const int times = static_cast<int>(std::max<std::size_t>(20, (std::size_t{800} << 20) / n));
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < times; ++i) {
    copy(dst, src, n);
    asm volatile("" : : "r"(dst) : "memory");
  }
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(n) * times / s / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  const int rounds = argc > 1 ? std::atoi(argv[1]) : 6;
  std::vector<std::size_t> sizes;
  for (int a = 2; a < argc; ++a) sizes.push_back(std::strtoul(argv[a], nullptr, 10) << 20);
  if (sizes.empty()) sizes.push_back(std::size_t{4} << 20);
  // Source and destination offsets from a page: both aligned, 16 bytes apart either way, both 16.
  const std::size_t offsets[][2] = {{0, 0}, {16, 0}, {0, 16}, {16, 16}};
  for (std::size_t n : sizes) {
    const std::size_t length = n + 4096;
    auto* src = static_cast<char*>(
        mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    auto* dst = static_cast<char*>(
        mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (src == MAP_FAILED || dst == MAP_FAILED) {
      std::perror("mmap");
      return 1;
    }
    std::memset(src, 1, length);
    std::memset(dst, 2, length);
    for (int r = 1; r <= rounds; ++r) {
      for (const auto& o : offsets) {
        const double m = gbps(dst + o[1], src + o[0], n,
                              [](void* d, const void* s, std::size_t k) { std::memcpy(d, s, k); });
        const double rep = gbps(dst + o[1], src + o[0], n, rep_movsb);
        std::printf("%zu MiB round %d src+%zu dst+%zu: memcpy %.1f GB/s, rep movsb %.1f GB/s\n",
                    n >> 20, r, o[0], o[1], m, rep);
      }
    }
    munmap(src, length);
    munmap(dst, length);
  }
  return 0;
}
