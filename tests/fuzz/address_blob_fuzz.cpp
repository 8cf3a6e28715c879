// Fuzzes the decoding of what a rank publishes at connect time (proto/address_blob.hpp): any
// input either decodes into at most 16 named addresses that all lie inside the input, or is
// refused; a decoded blob re-encodes to the bytes it was decoded from.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "proto/address_blob.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  auto blob = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size);
  ferry::proto::Published published;
  if (!ferry::proto::decode_addresses(blob, &published)) return 0;
  if (published.size() > ferry::proto::kMaxPublishedTransports) std::abort();
  const std::byte* begin = blob.data();
  const std::byte* end = blob.data() + blob.size();
  for (const auto& [name, address] : published) {
    if (name.size() > ferry::proto::kMaxTransportName) std::abort();
    if (!address.empty() && (address.data() < begin || address.data() + address.size() > end)) {
      std::abort();  // an address that points outside the blob
    }
  }
  // Round trip: the decoded form encodes to a prefix of the input (trailing bytes are ignored).
  std::vector<std::byte> again = ferry::proto::encode_addresses(published);
  if (again.size() > size || std::memcmp(again.data(), data, again.size()) != 0) std::abort();
  return 0;
}
