// What each rank publishes through the bootstrap at connect time: one (transport name, address)
// pair per transport it runs. Decoding never trusts the blob: counts, lengths and names are
// bounded and every address stays inside the blob (fuzzed: tests/fuzz/address_blob_fuzz.cpp).
#pragma once

#include <cstddef>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace ferry::proto {

inline constexpr std::uint32_t kMaxPublishedTransports = 16;
inline constexpr std::size_t kMaxTransportName = 64;

using Published = std::vector<std::pair<std::string, std::span<const std::byte>>>;

std::vector<std::byte> encode_addresses(const Published& transports);
// False when the blob is malformed; `out` then holds what was decoded before the fault.
[[nodiscard]] bool decode_addresses(std::span<const std::byte> blob, Published* out);

}  // namespace ferry::proto
