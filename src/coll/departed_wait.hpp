// Kernels on a stream that wait for a member that finalized. A member that ends its Context joins
// no more calls, but it is alive, so no death stops the kernels that wait for it: without
// FERRY_TIMEOUT they would spin for ever. Every 4,096 spins of a wait, a kernel writes the member
// it waits for, plus one, to a host word (cuda/kernels/on_stream.cuh, spin_must_stop); ferry's
// thread reads and clears the word about every millisecond (StreamOps::watch). Seen naming a
// member whose finalize notice came, again and again over kGrace, that member cannot come: what
// it wrote before it finalized reached the GPU long before (the grace covers a kernel of its
// still finishing), so the calls stop with kCanceled naming it. A wait for a member that
// finalized after joining every call it was waited for never lasts that long.
#pragma once

#include <chrono>
#include <functional>

#include "util/clock.hpp"

namespace ferry::coll {

class DepartedWait {
 public:
  // How long a departed member must be seen waited for.
  static constexpr std::chrono::milliseconds kGrace{200};
  // A pause between sightings longer than this starts the count again (a kernel writes the word
  // every few milliseconds while it waits, less often where the GPU is time-sliced).
  static constexpr std::chrono::milliseconds kGap{100};

  // One look at the word (its value, already cleared by the caller: 0, or a member plus one).
  // Returns the member that finalized and is waited for in vain, or -1. `departed(m)`: member m's
  // finalize notice came.
  int observe(unsigned word, util::Clock::time_point now,
              const std::function<bool(int)>& departed) {
    if (word == 0) return -1;
    const int m = static_cast<int>(word) - 1;
    // A wait for a live member says nothing of the departed one (blocks of one call may wait
    // for different members at once).
    if (!departed(m)) return -1;
    if (m != member_ || now - last_ > kGap) {
      member_ = m;
      since_ = now;
    }
    last_ = now;
    return now - since_ >= kGrace ? m : -1;
  }

  // observe() on the host word a kernel writes (taking and clearing it), for the members of
  // `group` (a coll::Group: size(), member(j), engine()).
  template <class Members>
  int look(unsigned* word, const Members& group) {
    const unsigned waited = __atomic_exchange_n(word, 0u, __ATOMIC_ACQ_REL);
    return observe(waited, util::Clock::now(), [&](int j) {
      return j < group.size() && group.engine()->liveness().departed(group.member(j));
    });
  }

 private:
  int member_ = -1;  // the departed member seen waited for
  util::Clock::time_point since_{};
  util::Clock::time_point last_{};
};

}  // namespace ferry::coll
