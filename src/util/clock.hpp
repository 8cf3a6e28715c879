// Deadlines for bounded waits, from a number of seconds as the config registry gives them.
#pragma once

#include <chrono>

namespace ferry::util {

using Clock = std::chrono::steady_clock;

inline Clock::time_point deadline_after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

}  // namespace ferry::util
