#include "proto/address_blob.hpp"

#include "util/wire.hpp"

namespace ferry::proto {

std::vector<std::byte> encode_addresses(const Published& transports) {
  util::Writer writer;
  writer.put<std::uint32_t>(static_cast<std::uint32_t>(transports.size()));
  for (const auto& [name, address] : transports) {
    writer.put_string(name);
    writer.put_bytes(address);
  }
  return writer.bytes();
}

bool decode_addresses(std::span<const std::byte> blob, Published* out) {
  out->clear();
  util::Reader reader(blob);
  std::uint32_t count = 0;
  if (!reader.get(&count) || count > kMaxPublishedTransports) return false;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::string name;
    std::span<const std::byte> address;
    if (!reader.get_string(&name, kMaxTransportName) || !reader.get_bytes(&address)) return false;
    out->emplace_back(std::move(name), address);
  }
  return true;
}

}  // namespace ferry::proto
