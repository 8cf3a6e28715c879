// Helpers shared by the fuzz targets: a cursor that takes fields off the fuzz input (zeros once it
// runs out, so every input is valid), and FUZZ_CHECK for invariants whose failure is a finding.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>

namespace ferry::fuzz {

class Input {
 public:
  Input(const std::uint8_t* data, std::size_t size)
      : bytes_(reinterpret_cast<const std::byte*>(data), size) {}

  [[nodiscard]] bool empty() const { return offset_ == bytes_.size(); }
  [[nodiscard]] std::size_t remaining() const { return bytes_.size() - offset_; }

  template <typename T>
  T take() {
    T value{};
    std::size_t n = remaining() < sizeof(T) ? remaining() : sizeof(T);
    std::memcpy(&value, bytes_.data() + offset_, n);
    offset_ += n;
    return value;
  }
  std::uint8_t u8() { return take<std::uint8_t>(); }
  std::uint16_t u16() { return take<std::uint16_t>(); }

  // Up to `n` bytes (fewer at the end of the input).
  std::span<const std::byte> bytes(std::size_t n) {
    if (n > remaining()) n = remaining();
    auto out = bytes_.subspan(offset_, n);
    offset_ += n;
    return out;
  }
  std::span<const std::byte> rest() { return bytes(remaining()); }

 private:
  std::span<const std::byte> bytes_;
  std::size_t offset_ = 0;
};

}  // namespace ferry::fuzz

// An invariant of the code under test: its failure aborts, which libFuzzer records as a crash.
#define FUZZ_CHECK(cond, ...)                                                                  \
  do {                                                                                         \
    if (!(cond)) {                                                                             \
      std::fprintf(stderr, "fuzz invariant failed at %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      std::fprintf(stderr, __VA_ARGS__);                                                       \
      std::fprintf(stderr, "\n");                                                              \
      std::abort();                                                                            \
    }                                                                                          \
  } while (0)
