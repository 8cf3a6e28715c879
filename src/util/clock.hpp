// Deadlines for bounded waits, from a number of seconds as the config registry or a caller gives
// them. Any double is safe: a span too long for the clock (INFINITY, DBL_MAX, 1e300) is "never",
// and NaN or a negative span is "now".
#pragma once

#include <chrono>
#include <cmath>

namespace ferry::util {

using Clock = std::chrono::steady_clock;

// `seconds` as the clock's duration, saturated at its largest value (a plain conversion of
// ~9.2e9 s or more overflows the clock's 64-bit nanoseconds and lands in the past).
inline Clock::duration duration_of(double seconds) {
  if (!(seconds > 0)) return Clock::duration::zero();  // NaN too
  // A century is long enough for anyone to wait, and far from the clock's range (292 years).
  constexpr double kLongest = 100.0 * 365 * 24 * 3600;
  if (seconds >= kLongest) return Clock::duration::max() / 2;
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

inline Clock::time_point deadline_after(double seconds) {
  const Clock::time_point now = Clock::now();
  const Clock::duration span = duration_of(seconds);
  return span >= Clock::time_point::max() - now ? Clock::time_point::max() : now + span;
}

}  // namespace ferry::util
