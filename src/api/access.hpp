// What the library's other front ends (NCCL's API, src/nccl) reach behind a Communicator that
// its public interface does not show: its group, and through it the engine and the GPU.
#pragma once

#include "coll/group.hpp"
#include "ferry/ferry.hpp"

namespace ferry {

struct CommunicatorAccess {
  // Null for a communicator that is not valid().
  static coll::Group* group(const Communicator& communicator) { return communicator.group_.get(); }
};

}  // namespace ferry
