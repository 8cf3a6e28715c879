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
  virtual bool advance(Status* status) = 0;
  // The caller gives up (a blocking call's FERRY_TIMEOUT): withdraw what can be withdrawn and
  // wait for what cannot, so that no buffer of the operation is touched after this returns.
  virtual void abandon() = 0;
};

}  // namespace ferry::proto
