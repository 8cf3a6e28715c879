// Named fault injection for tests (FERRY_TEST_CRASH_AT / FERRY_TEST_CRASH_RANK): the chosen rank
// kills itself with SIGKILL at the named point, so tests can prove nothing hangs or leaks.
#pragma once

#include <unistd.h>

#include <csignal>

#include "util/config.hpp"

namespace ferry::util {

// In the order of FERRY_TEST_CRASH_AT's allowed words.
enum class CrashPoint : int {
  kNone = 0,
  kSegmentCreated,
  kInitialized,
  kFirstSend,
  kFinalize,
  kMidPipeline,  // after the first fragment (or staging-ring chunk) of a large message
  kMidClaim,     // between claiming a shm FIFO element and publishing it
};

inline void crash_point(const Config& config, int rank, CrashPoint point) {
  if (config.get_int(Var::kTestCrashAt) == static_cast<int>(point) &&
      config.get_int(Var::kTestCrashRank) == rank) {
    ::kill(::getpid(), SIGKILL);
  }
}

}  // namespace ferry::util
