// Logging to stderr with the rank in every line; FERRY_LOG_LEVEL picks what is printed.
#pragma once

#include <atomic>
#include <cstdarg>

namespace ferry::util {

enum class LogLevel : int { kError = 0, kWarn = 1, kInfo = 2, kDebug = 3 };

void set_log_level(LogLevel level) noexcept;
void set_log_rank(int rank) noexcept;
bool log_enabled(LogLevel level) noexcept;
void log(LogLevel level, const char* format, ...) noexcept __attribute__((format(printf, 2, 3)));

}  // namespace ferry::util

#define FERRY_LOG(level, ...)                                          \
  do {                                                                 \
    if (::ferry::util::log_enabled(::ferry::util::LogLevel::level))    \
      ::ferry::util::log(::ferry::util::LogLevel::level, __VA_ARGS__); \
  } while (0)

// Logs the first time this line is reached in the process, for verdicts that stay true.
#define FERRY_LOG_ONCE(level, ...)                                         \
  do {                                                                     \
    static std::atomic<bool> ferry_logged_once_{false};                    \
    if (!ferry_logged_once_.exchange(true)) FERRY_LOG(level, __VA_ARGS__); \
  } while (0)
