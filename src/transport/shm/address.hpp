// What a process publishes about its shm segment, and its bounds-checked decoding.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::transport::shm {

struct Address {
  std::string name;  // shm_open name
  std::int32_t pid = 0;
  std::uint32_t fifo_size = 0;
  std::uint32_t bounce_count = 0;
  std::uint32_t bounce_size = 0;
  std::uint64_t cookie_address = 0;  // where cma_cookie lives in the owner's address space
  std::uint64_t cookie = 0;

  [[nodiscard]] std::vector<std::byte> encode() const;
  static Status decode(std::span<const std::byte> bytes, Address* out);
};

}  // namespace ferry::transport::shm
