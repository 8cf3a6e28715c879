// Fuzzes util::parse_value, which validates FERRY_* values from the environment (set by users and
// by ferryrun), against every variable in the registry: a bad value must throw ferry::Error, and an
// accepted one must lie within what the variable allows.
#include <cmath>
#include <string>

#include "ferry/status.hpp"
#include "fuzz_input.hpp"
#include "util/config.hpp"

using ferry::util::VarType;

namespace {

std::size_t word_count(const char* allowed) {
  std::size_t words = 1;
  for (const char* c = allowed; *c != '\0'; ++c) words += *c == '|' ? 1 : 0;
  return words;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  for (const ferry::util::VarSpec& spec : ferry::util::registry()) {
    std::int64_t integer = -12345;
    double real = -12345;
    try {
      ferry::util::parse_value(spec, text, &integer, &real);
    } catch (const ferry::Error& e) {
      FUZZ_CHECK(e.code() == ferry::Code::kInvalidArgument, "%s: %s", spec.name, e.what());
      continue;
    }
    switch (spec.type) {
      case VarType::kBool:
        FUZZ_CHECK(integer == 0 || integer == 1, "%s accepted as %lld", spec.name,
                   static_cast<long long>(integer));
        break;
      case VarType::kInt:
      case VarType::kSize:
        FUZZ_CHECK(
            static_cast<double>(integer) >= spec.min && static_cast<double>(integer) <= spec.max,
            "%s='%s' accepted as %lld, outside [%g, %g]", spec.name, text.c_str(),
            static_cast<long long>(integer), spec.min, spec.max);
        break;
      case VarType::kSeconds:
        FUZZ_CHECK(std::isfinite(real) && real >= spec.min && real <= spec.max,
                   "%s='%s' accepted as %g, outside [%g, %g]", spec.name, text.c_str(), real,
                   spec.min, spec.max);
        break;
      case VarType::kEnum:
        FUZZ_CHECK(integer >= 0 && static_cast<std::size_t>(integer) < word_count(spec.allowed),
                   "%s accepted as word %lld", spec.name, static_cast<long long>(integer));
        break;
      case VarType::kList:
      case VarType::kString:
        break;
    }
  }
  return 0;
}
