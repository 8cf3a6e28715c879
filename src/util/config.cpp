// The config registry's table, parsing and validation.
#include "util/config.hpp"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <sstream>

#include "ferry/status.hpp"

extern char** environ;

namespace ferry::util {
namespace {

constexpr VarSpec kRegistry[] = {
#define FERRY_VAR_SPEC(id, name, type, def, min, max, allowed, doc) \
  {Var::id, name, VarType::type, def, min, max, allowed, doc},
    FERRY_CONFIG_VARS(FERRY_VAR_SPEC)
#undef FERRY_VAR_SPEC
};
static_assert(sizeof(kRegistry) / sizeof(kRegistry[0]) == static_cast<std::size_t>(Var::kCount));

std::vector<std::string> split(const std::string& text, char sep) {
  std::vector<std::string> words;
  std::string word;
  std::istringstream in(text);
  while (std::getline(in, word, sep)) {
    if (!word.empty()) words.push_back(word);
  }
  return words;
}

[[noreturn]] void reject(const VarSpec& spec, const std::string& text, const std::string& allowed) {
  throw Error(Code::kInvalidArgument, std::string("invalid value '") + text + "' for " + spec.name +
                                          ": " + allowed + " (" + spec.doc + ")");
}

std::string range_text(const VarSpec& spec) {
  std::ostringstream out;
  out << "expected " << type_name(spec.type) << " in [";
  if (spec.type == VarType::kSeconds) {
    out << spec.min << ", " << spec.max;
  } else {  // whole numbers, printed whole (2^50 is not 1.1259e+15)
    out << static_cast<long long>(spec.min) << ", " << static_cast<long long>(spec.max);
  }
  out << "]";
  return out.str();
}

bool is_power_of_two(std::int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

const VarSpec* find_spec(const std::string& name) {
  std::string full = name.rfind("FERRY_", 0) == 0 ? name : "FERRY_" + name;
  for (const auto& spec : kRegistry) {
    if (full == spec.name) return &spec;
  }
  return nullptr;
}

}  // namespace

std::span<const VarSpec> registry() noexcept { return kRegistry; }

const char* type_name(VarType type) noexcept {
  switch (type) {
    case VarType::kBool:
      return "boolean";
    case VarType::kInt:
      return "integer";
    case VarType::kSize:
      return "size";
    case VarType::kSeconds:
      return "seconds";
    case VarType::kEnum:
      return "one of";
    case VarType::kList:
      return "list of";
    case VarType::kString:
      return "string";
  }
  return "?";
}

void parse_value(const VarSpec& spec, const std::string& text, std::int64_t* integer,
                 double* real) {
  switch (spec.type) {
    case VarType::kBool: {
      static const char* kTrue[] = {"1", "y", "yes", "on", "true"};
      static const char* kFalse[] = {"0", "n", "no", "off", "false"};
      for (const char* t : kTrue) {
        if (strcasecmp(text.c_str(), t) == 0) {
          *integer = 1;
          return;
        }
      }
      for (const char* f : kFalse) {
        if (strcasecmp(text.c_str(), f) == 0) {
          *integer = 0;
          return;
        }
      }
      reject(spec, text, "expected a boolean (1/0, yes/no, on/off, true/false)");
    }
    case VarType::kInt:
    case VarType::kSize: {
      if (text.empty()) reject(spec, text, range_text(spec));
      errno = 0;
      char* end = nullptr;
      long long v = std::strtoll(text.c_str(), &end, 10);
      if (errno != 0 || end == text.c_str()) reject(spec, text, range_text(spec));
      std::string suffix(end);
      long long scale = 1;
      if (spec.type == VarType::kSize && !suffix.empty()) {
        if (strcasecmp(suffix.c_str(), "k") == 0 || strcasecmp(suffix.c_str(), "kib") == 0) {
          scale = 1LL << 10;
        } else if (strcasecmp(suffix.c_str(), "m") == 0 || strcasecmp(suffix.c_str(), "mib") == 0) {
          scale = 1LL << 20;
        } else if (strcasecmp(suffix.c_str(), "g") == 0 || strcasecmp(suffix.c_str(), "gib") == 0) {
          scale = 1LL << 30;
        } else {
          reject(spec, text, range_text(spec) + ", with an optional suffix k, m or g");
        }
      } else if (!suffix.empty()) {
        reject(spec, text, range_text(spec));
      }
      // Bound before scaling, so that scaling cannot overflow (no llabs: LLONG_MIN has none).
      const long long limit = std::numeric_limits<long long>::max() / scale;
      if (v > limit || v < -limit) reject(spec, text, range_text(spec));
      v *= scale;
      if (static_cast<double>(v) < spec.min || static_cast<double>(v) > spec.max) {
        reject(spec, text, range_text(spec));
      }
      *integer = v;
      return;
    }
    case VarType::kSeconds: {
      errno = 0;
      char* end = nullptr;
      double v = std::strtod(text.c_str(), &end);
      if (errno != 0 || end == text.c_str() || *end != '\0' || !std::isfinite(v) || v < spec.min ||
          v > spec.max) {
        reject(spec, text, range_text(spec));
      }
      *real = v;
      return;
    }
    case VarType::kEnum: {
      auto words = split(spec.allowed, '|');
      for (std::size_t i = 0; i < words.size(); ++i) {
        if (text == words[i]) {
          *integer = static_cast<std::int64_t>(i);
          return;
        }
      }
      reject(spec, text, std::string("expected one of ") + spec.allowed);
    }
    case VarType::kList: {
      auto allowed = split(spec.allowed, '|');
      auto given = split(text, ',');
      if (given.empty()) reject(spec, text, std::string("expected a list of ") + spec.allowed);
      for (const auto& w : given) {
        bool ok = false;
        for (const auto& a : allowed) ok = ok || (a == w);
        if (!ok) reject(spec, text, std::string("'") + w + "' is not one of " + spec.allowed);
      }
      return;
    }
    case VarType::kString:
      return;
  }
}

Config Config::load(const std::map<std::string, std::string>& overrides) {
  Config config;
  config.values_.resize(std::size(kRegistry));
  for (const auto& spec : kRegistry) {
    Value& value = config.values_[static_cast<std::size_t>(spec.id)];
    value.text = spec.default_value;
    value.source = "default";
    if (const char* env = std::getenv(spec.name)) {
      value.text = env;
      value.source = "environment";
    }
  }
  for (const auto& [name, text] : overrides) {
    const VarSpec* spec = find_spec(name);
    if (spec == nullptr) {
      throw Error(Code::kInvalidArgument, "unknown configuration variable '" + name +
                                              "' in Options (ferry-info lists them all)");
    }
    Value& value = config.values_[static_cast<std::size_t>(spec->id)];
    value.text = text;
    value.source = "options";
  }
  for (const auto& spec : kRegistry) {
    Value& value = config.values_[static_cast<std::size_t>(spec.id)];
    parse_value(spec, value.text, &value.integer, &value.real);
  }
  // Constraints that involve a single variable beyond its range.
  for (Var var : {Var::kShmFifoSize, Var::kShmReleaseBatch}) {
    const VarSpec& spec = kRegistry[static_cast<std::size_t>(var)];
    const Value& value = config.values_[static_cast<std::size_t>(var)];
    if (!is_power_of_two(value.integer)) reject(spec, value.text, "expected a power of two");
  }
  // The release batch's default follows a smaller FIFO (16 elements take batches of 8), so that
  // every FIFO size ferry-info prints works when set alone; a batch given too large is refused.
  Value& batch = config.values_[static_cast<std::size_t>(Var::kShmReleaseBatch)];
  if (batch.source == "default" && batch.integer * 2 > config.get_int(Var::kShmFifoSize)) {
    batch.integer = config.get_int(Var::kShmFifoSize) / 2;
    batch.text = std::to_string(batch.integer);
  }
  if (config.get_int(Var::kShmReleaseBatch) * 2 > config.get_int(Var::kShmFifoSize)) {
    reject(kRegistry[static_cast<std::size_t>(Var::kShmReleaseBatch)],
           config.values_[static_cast<std::size_t>(Var::kShmReleaseBatch)].text,
           "expected at most half of FERRY_SHM_FIFO_SIZE (" +
               std::to_string(config.get_int(Var::kShmFifoSize)) + ")");
  }
  for (char** env = environ; env != nullptr && *env != nullptr; ++env) {
    std::string entry(*env);
    if (entry.rfind("FERRY_", 0) != 0) continue;
    std::string name = entry.substr(0, entry.find('='));
    if (find_spec(name) == nullptr) config.unknown_.push_back(name);
  }
  return config;
}

bool Config::get_bool(Var var) const { return values_[static_cast<std::size_t>(var)].integer != 0; }
std::int64_t Config::get_int(Var var) const {
  return values_[static_cast<std::size_t>(var)].integer;
}
double Config::get_seconds(Var var) const { return values_[static_cast<std::size_t>(var)].real; }
const std::string& Config::get_string(Var var) const {
  return values_[static_cast<std::size_t>(var)].text;
}
std::vector<std::string> Config::get_list(Var var) const { return split(get_string(var), ','); }
bool Config::list_contains(Var var, const std::string& word) const {
  for (const auto& w : get_list(var)) {
    if (w == word) return true;
  }
  return false;
}

bool job_wide(Var var) noexcept {
  for (Var v : kJobWide) {
    if (v == var) return true;
  }
  return false;
}

std::string Config::canonical(Var var) const {
  const VarSpec& spec = kRegistry[static_cast<std::size_t>(var)];
  const Value& value = values_[static_cast<std::size_t>(var)];
  switch (spec.type) {
    case VarType::kBool:
    case VarType::kInt:
    case VarType::kSize:
      return std::to_string(value.integer);
    case VarType::kSeconds: {
      char text[32];
      std::snprintf(text, sizeof(text), "%.17g", value.real);
      return text;
    }
    case VarType::kEnum:
      return split(spec.allowed, '|')[static_cast<std::size_t>(value.integer)];
    case VarType::kList:
    case VarType::kString:
      return value.text;
  }
  return value.text;
}

std::vector<Config::Entry> Config::entries() const {
  std::vector<Entry> out;
  for (const auto& spec : kRegistry) {
    const Value& value = values_[static_cast<std::size_t>(spec.id)];
    out.push_back({&spec, value.text, value.source});
  }
  return out;
}

}  // namespace ferry::util
