// How the end of a direct transfer (a transport's own rendezvous, a one-sided read of a sender's
// buffer, a native put or get: transport::AmHandler::on_direct) becomes its request's outcome.
// A failure while the peer still looks alive is held as a suspect until the peer is seen dead
// (then kPeerFailed) or for a short grace (then its own failure): a provider reports a peer's
// death on the transfers in flight as their own failure before the death itself can be seen.
#pragma once

#include <cstdint>
#include <vector>

#include "ferry/status.hpp"
#include "util/clock.hpp"

namespace ferry::proto {

class Engine;

class DirectEnds {
 public:
  explicit DirectEnds(Engine& engine) : engine_(engine) {}

  // A transport says the transfer of the request whose wire id is `cookie` ended.
  void on_end(std::uint64_t cookie, Status status);
  // What the end means for the request (a chunk, a read, a deferred failure, the message).
  void outcome(std::uint32_t index, Status status);
  // Ends the suspects whose peer died or whose grace ran out; how many ended.
  int settle();
  [[nodiscard]] bool suspects() const { return !suspects_.empty(); }

 private:
  struct Suspect {
    std::uint64_t cookie;  // the request's wire id
    int peer;
    Status status;
    util::Clock::time_point until;
  };

  Engine& engine_;
  std::vector<Suspect> suspects_;
};

}  // namespace ferry::proto
