// Fuzzes the PMI-1 decoders (src/bootstrap/pmi.hpp): the launcher's reply lines and the hex
// values inside them. A parsed line starts with cmd and has no empty key; decoded hex re-encodes
// to the same digits.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>
#include <vector>

#include "bootstrap/pmi.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::bootstrap;
  const std::string input(reinterpret_cast<const char*>(data), size);
  std::size_t at = 0;
  while (at <= input.size()) {
    std::size_t end = input.find('\n', at);
    if (end == std::string::npos) end = input.size();
    const std::string line = input.substr(at, end - at);
    at = end + 1;
    std::vector<std::pair<std::string, std::string>> fields;
    if (!pmi::parse_line(line, &fields)) continue;
    if (fields.empty() || fields.front().first != "cmd") std::abort();
    for (const auto& [key, value] : fields) {
      if (key.empty() || key.find(' ') != std::string::npos) std::abort();
      std::vector<std::byte> bytes;
      const std::string hex = value.size() > 1 && value[0] == 'h' ? value.substr(1) : value;
      if (!pmi::from_hex(hex, &bytes)) continue;
      if (bytes.size() * 2 != hex.size()) std::abort();
      std::string lower = hex;
      for (char& c : lower) c = static_cast<char>(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c);
      if (pmi::to_hex(bytes) != lower) std::abort();
    }
  }
  return 0;
}
