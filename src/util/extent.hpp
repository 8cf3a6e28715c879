// Whether a buffer the caller names (or a peer announces) can exist at all. A process's memory
// ends below 2^56 (x86-64 with five-level paging; 2^47 with four, 2^52 on AArch64), so sizes such
// as SIZE_MAX, 2^63 or (size_t)-100 are refused at the call instead of being trusted, announced
// to a peer or registered for its writes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "ferry/status.hpp"

namespace ferry::util {

inline constexpr std::uint64_t kAddressSpaceEnd = std::uint64_t{1} << 56;

// Whether [address, address + bytes) lies inside the address space a process can have.
[[nodiscard]] inline bool fits_address_space(const void* address, std::size_t bytes) noexcept {
  const auto start = static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(address));
  return bytes <= kAddressSpaceEnd && start <= kAddressSpaceEnd - bytes;
}

// ok, or kInvalidArgument naming the call, the buffer's role, its size and address.
[[nodiscard]] inline Status check_extent(const char* call, const char* what, const void* address,
                                         std::size_t bytes) {
  if (fits_address_space(address, bytes)) return Status::ok();
  char text[256];
  std::snprintf(text, sizeof(text),
                "%s: a %s of %zu bytes at %p cannot exist (it would end past the %llu-byte "
                "address space of a process)",
                call, what, bytes, address, static_cast<unsigned long long>(kAddressSpaceEnd));
  return Status(Code::kInvalidArgument, text);
}

// a * b, or false where it overflows.
[[nodiscard]] inline bool multiply(std::size_t a, std::size_t b, std::size_t* product) noexcept {
  return !__builtin_mul_overflow(a, b, product);
}

}  // namespace ferry::util
