#include "transport/ofi/wire.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>

namespace ferry::transport::ofi {

bool parse_message(std::span<const std::byte> message, int ranks, int self, Wire* wire) {
  if (message.size() < sizeof(Wire)) return false;
  std::memcpy(wire, message.data(), sizeof(Wire));
  return wire->magic == kWireMagic && wire->length == message.size() - sizeof(Wire) &&
         wire->source >= 0 && wire->source < ranks && wire->source != self;
}

std::vector<std::byte> encode_address(const AddressHeader& header,
                                      std::span<const std::byte> name) {
  std::vector<std::byte> out(sizeof header + name.size());
  std::memcpy(out.data(), &header, sizeof header);
  if (!name.empty()) std::memcpy(out.data() + sizeof header, name.data(), name.size());
  return out;
}

bool parse_address(std::span<const std::byte> address, AddressHeader* header,
                   std::span<const std::byte>* name) {
  if (address.size() <= sizeof(AddressHeader) || address.size() > kMaxAddress) return false;
  std::memcpy(header, address.data(), sizeof(AddressHeader));
  if (header->magic != kAddressMagic || header->node.back() != '\0') return false;
  *name = address.subspan(sizeof(AddressHeader));
  return true;
}

std::array<char, 64> node_identity() {
  std::array<char, 64> node{};
  std::string boot;
  std::ifstream("/proc/sys/kernel/random/boot_id") >> boot;
  struct stat ns {};
  const auto pid_ns = ::stat("/proc/self/ns/pid", &ns) == 0 ? ns.st_ino : 0;
  const std::string id = boot + "/" + std::to_string(pid_ns);
  std::memcpy(node.data(), id.data(), std::min(id.size(), node.size() - 1));
  return node;
}

bool provider_allowed(const std::string& list, const char* name) {
  std::vector<std::string> parts;
  std::stringstream components(name != nullptr ? name : "");
  for (std::string part; std::getline(components, part, ';');) parts.push_back(part);
  bool any_include = false, included = false;
  std::stringstream entries(list);
  for (std::string entry; std::getline(entries, entry, ',');) {
    if (entry.empty() || entry == "^") continue;
    const bool exclude = entry[0] == '^';
    const std::string word = exclude ? entry.substr(1) : entry;
    const bool hit = std::find(parts.begin(), parts.end(), word) != parts.end();
    if (exclude && hit) return false;
    if (!exclude) {
      any_include = true;
      included = included || hit;
    }
  }
  return !any_include || included;
}

}  // namespace ferry::transport::ofi
