// Which peers are alive, as far as this rank knows: who died, in which order, why, and whether
// anyone is left to send a receive from any source. The transports say who died (the engine
// asks them, Engine::look_for_failures); this records it and answers from it. What a death fails
// (queued sends, receives, one-sided and device operations) is each part's, told by the engine.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "proto/link.hpp"

namespace ferry::proto {

class Liveness {
 public:
  // `links`: the engine's, one per rank (this rank's own included).
  explicit Liveness(const std::vector<Link>& links) : links_(links) {}

  // Once the links are made: every rank but `rank` (this one) with an endpoint can still send.
  void connected(int rank);
  // Records `rank`'s death; false if it was already recorded (nothing more to do).
  bool record_failure(Link* link, int rank, const std::string& why);
  // Records that `rank` finalized: alive, but nothing not already here will come from it. False
  // where it is known already, or dead.
  bool record_departure(Link* link, int rank);

  // Why `rank` can no longer be reached (it died), or null.
  [[nodiscard]] const std::string* failure(int rank) const {
    const Link& link = links_[static_cast<std::size_t>(rank)];
    return link.failed ? &link.why : nullptr;
  }
  // `rank` finalized (kAmBye): alive, but it sends nothing more and joins no more calls.
  [[nodiscard]] bool departed(int rank) const {
    const Link& link = links_[static_cast<std::size_t>(rank)];
    return link.departed() && !link.failed;
  }
  // When `rank`'s finalize notice came, among those seen here (1 the first); 0 while departed()
  // is false.
  [[nodiscard]] std::uint64_t departure_order(int rank) const {
    const Link& link = links_[static_cast<std::size_t>(rank)];
    return link.failed ? 0 : link.departure_order;
  }
  // When `rank`'s death was seen, as an order among the deaths seen here (1 the first); 0 while
  // it is alive. Whoever died first is the cause of what failed after.
  [[nodiscard]] std::uint64_t failure_order(int rank) const {
    return links_[static_cast<std::size_t>(rank)].failure_order;
  }
  // No message not already here can come from `source` any more: it failed, finalized, cannot be
  // reached or is no rank (kAnySource: no other rank is left). Never this rank itself.
  [[nodiscard]] bool none_can_come(int source) const;
  // The failure of a receive from `source`, for which none_can_come: kPeerFailed (it died),
  // kCanceled (it finalized) or kUnsupported (unreachable), with why.
  [[nodiscard]] Status cannot_come(int source) const;
  // The failure of a receive from any source once no other rank is left.
  [[nodiscard]] Status no_one_left() const;
  // Why nothing more comes from `rank`: it died, finalized, or no transport reaches it.
  [[nodiscard]] std::string reason(int rank) const;

 private:
  const std::vector<Link>& links_;
  int rank_ = -1;
  // Other ranks that have an endpoint and have neither failed nor finalized: at 0 no one is left
  // to match a receive from any source but this rank itself.
  int others_left_ = 0;
  int last_failed_ = -1;  // the rank whose failure was seen last
  std::uint64_t failures_seen_ = 0;
  std::uint64_t departures_seen_ = 0;
};

}  // namespace ferry::proto
