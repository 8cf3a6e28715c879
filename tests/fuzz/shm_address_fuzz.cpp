// Fuzzes shm::Address::decode, which reads the address blob another process published through the
// bootstrap: it must reject what is malformed, and what it accepts must be a usable shm name and
// pid that re-encode to the very same bytes.
#include <algorithm>

#include "fuzz_input.hpp"
#include "transport/shm/address.hpp"

using ferry::transport::shm::Address;

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  Address address;
  address.name = "untouched";
  ferry::Status status = Address::decode(bytes, &address);
  if (!status) {
    FUZZ_CHECK(status.code() == ferry::Code::kProtocolError, "%s", status.to_string().c_str());
    FUZZ_CHECK(address.name == "untouched", "a failed decode wrote its output");
    return 0;
  }
  FUZZ_CHECK(!address.name.empty() && address.name.size() <= 255, "name of %zu bytes",
             address.name.size());
  FUZZ_CHECK(address.name[0] == '/' && address.name.find('/', 1) == std::string::npos,
             "name '%s' is no shm_open name", address.name.c_str());
  FUZZ_CHECK(address.pid > 0, "pid %d", address.pid);
  std::vector<std::byte> again = address.encode();
  FUZZ_CHECK(again.size() == size && std::equal(again.begin(), again.end(), bytes.begin()),
             "re-encoding gives %zu bytes, not the %zu decoded", again.size(), size);
  return 0;
}
