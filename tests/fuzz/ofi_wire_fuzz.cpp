// Fuzzes the ofi transport's decoders (src/transport/ofi/wire.hpp): a received message header and a
// published address. Whatever parses must describe bytes inside the input.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "transport/ofi/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::transport::ofi;
  auto input = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size);
  Wire wire{};
  if (parse_message(input, 8, 1, &wire)) {
    if (sizeof(Wire) + wire.length != size) std::abort();
    if (wire.source < 0 || wire.source >= 8 || wire.source == 1) std::abort();
  }
  AddressHeader header{};
  std::span<const std::byte> name;
  if (parse_address(input, &header, &name)) {
    if (name.empty() || name.data() < input.data() ||
        name.data() + name.size() != input.data() + input.size() || size > kMaxAddress) {
      std::abort();
    }
    if (header.node.back() != '\0') std::abort();
  }
  return 0;
}
