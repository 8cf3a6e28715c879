// Logging implementation: one fprintf per line so lines of different ranks do not interleave.
#include "util/log.hpp"

#include <cstdio>
#include <cstring>

namespace ferry::util {
namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kWarn)};
std::atomic<int> g_rank{-1};
const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::kError:
      return "error";
    case LogLevel::kWarn:
      return "warning";
    case LogLevel::kInfo:
      return "info";
    case LogLevel::kDebug:
      return "debug";
  }
  return "?";
}
}  // namespace

void set_log_level(LogLevel level) noexcept { g_level.store(static_cast<int>(level)); }
void set_log_rank(int rank) noexcept { g_rank.store(rank); }
bool log_enabled(LogLevel level) noexcept { return static_cast<int>(level) <= g_level.load(); }

void log(LogLevel level, const char* format, ...) noexcept {
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  int rank = g_rank.load();
  if (rank >= 0) {
    std::fprintf(stderr, "ferry[%d] %s: %s\n", rank, level_name(level), text);
  } else {
    std::fprintf(stderr, "ferry %s: %s\n", level_name(level), text);
  }
}

}  // namespace ferry::util
