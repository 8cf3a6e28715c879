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
  kMidRevoke,    // Communicator::revoke, having told one member
  kMidAgree,     // agree or shrink, having sent this member's contribution to one member
  kMidDecide,    // agree or shrink, having sent this member's estimate to one member
};

inline void crash_point(const Config& config, int rank, CrashPoint point) {
  if (config.get_int(Var::kTestCrashAt) == static_cast<int>(point) &&
      config.get_int(Var::kTestCrashRank) == rank) {
    ::kill(::getpid(), SIGKILL);
  }
}

// The point this rank dies at, read once (for the points on the data path, where a lookup per
// message would cost).
class CrashPoints {
 public:
  CrashPoints() = default;
  CrashPoints(const Config& config, int rank)
      : point_(config.get_int(Var::kTestCrashRank) == rank
                   ? static_cast<CrashPoint>(config.get_int(Var::kTestCrashAt))
                   : CrashPoint::kNone) {}
  // Whether this rank dies at `point`.
  [[nodiscard]] bool at(CrashPoint point) const {
    return point != CrashPoint::kNone && point == point_;
  }
  // Dies here if this rank dies at `point`.
  void here(CrashPoint point) const {
    if (at(point)) ::kill(::getpid(), SIGKILL);
  }

 private:
  CrashPoint point_ = CrashPoint::kNone;
};

}  // namespace ferry::util
