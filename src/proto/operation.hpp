// A multi-step operation (a collective's schedule) that the engine moves forward in every
// progress call, behind an ordinary Request; and the engine's list of those in flight.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "ferry/ferry.hpp"
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
  // Its caller gave up on it (a stream operation past FERRY_TIMEOUT): work on a GPU that waits
  // for peers stops, so that nothing keeps the device busy for ever. It still ends by advance.
  virtual void abandon() {}
};

class Engine;

class Operations {
 public:
  explicit Operations(Engine& engine) : engine_(engine) {}

  // Runs `operation` behind a request; it moves forward in every progress call.
  Request start(std::unique_ptr<Operation> operation);
  // A request that has already failed with `status` (bad arguments found above the engine).
  Request failed(Status status);
  // Moves every operation forward once (not from inside an operation's own advance); completes
  // the requests of those that finished, and says how many.
  int advance();
  // Operation::abandon of the operation behind request `index`, if it still runs.
  void abandon(std::uint32_t index);
  [[nodiscard]] bool empty() const { return operations_.empty(); }

 private:
  Engine& engine_;
  // By request slot; the Engine declares this after its requests, so that operations (and the
  // requests they hold) go first.
  std::vector<std::pair<std::uint32_t, std::unique_ptr<Operation>>> operations_;
  bool advancing_ = false;  // an operation's own calls must not advance operations again
};

}  // namespace ferry::proto
