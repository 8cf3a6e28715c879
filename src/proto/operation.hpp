// A multi-step operation (a collective's schedule) that the engine moves forward in every
// progress call, behind an ordinary Request.
#pragma once

#include "ferry/status.hpp"

namespace ferry::proto {

class Operation {
 public:
  virtual ~Operation() = default;
  // Moves forward without driving the engine's progress (the engine calls it from there); true
  // once finished, with the outcome in *status.
  // Under FERRY_TIMEOUT a wait on its request returns kTimeout and the operation goes on (wait
  // again), like a point-to-point request's.
  virtual bool advance(Status* status) = 0;
};

}  // namespace ferry::proto
