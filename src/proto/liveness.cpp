// Which peers are alive (see liveness.hpp).
#include "proto/liveness.hpp"

namespace ferry::proto {

void Liveness::connected(int rank) {
  rank_ = rank;
  others_left_ = 0;
  for (std::size_t r = 0; r < links_.size(); ++r) {
    if (links_[r].endpoint != nullptr && static_cast<int>(r) != rank_) ++others_left_;
  }
}

bool Liveness::record_failure(Link* link, int rank, const std::string& why) {
  if (link->failed) return false;
  link->failed = true;
  link->failure_order = ++failures_seen_;
  link->why = why;
  if (link->endpoint != nullptr && rank != rank_ && !link->departed()) --others_left_;
  last_failed_ = rank;
  return true;
}

bool Liveness::record_departure(Link* link, int rank) {
  if (link->failed || link->departed() || link->endpoint == nullptr || rank == rank_) return false;
  link->departure_order = ++departures_seen_;
  --others_left_;
  return true;
}

std::string Liveness::reason(int rank) const {
  const Link& link = links_[static_cast<std::size_t>(rank)];
  if (link.departed() && !link.failed) {
    return "rank " + std::to_string(rank) +
           " finalized (its Context ended) without sending a message this receive matches";
  }
  return link.why;  // why it died, or why no transport reaches it
}

Status Liveness::cannot_come(int source) const {
  if (source < 0 || source >= static_cast<int>(links_.size())) {
    return Status(Code::kInvalidArgument, "no rank " + std::to_string(source));
  }
  const Link& link = links_[static_cast<std::size_t>(source)];
  const Code code = link.failed       ? Code::kPeerFailed
                    : link.departed() ? Code::kCanceled
                                      : Code::kUnsupported;
  return Status(code, reason(source));
}

bool Liveness::none_can_come(int source) const {
  const int size = static_cast<int>(links_.size());
  if (source == kAnySource) return others_left_ == 0 && size > 1;
  if (source < 0 || source >= size) return true;
  const Link& link = links_[static_cast<std::size_t>(source)];
  return source != rank_ && (link.failed || link.departed() || link.endpoint == nullptr);
}

Status Liveness::no_one_left() const {
  int failed = 0, finalized = 0, unreachable = 0;
  int example = last_failed_;
  for (std::size_t r = 0; r < links_.size(); ++r) {
    const Link& link = links_[r];
    if (static_cast<int>(r) == rank_ ||
        (!link.failed && !link.departed() && link.endpoint != nullptr)) {
      continue;
    }
    ++(link.failed ? failed : link.departed() ? finalized : unreachable);
    if (example < 0) example = static_cast<int>(r);
  }
  // The last failure seen, else the first finalized or unreachable rank.
  const Code code = failed > 0      ? Code::kPeerFailed
                    : finalized > 0 ? Code::kCanceled
                                    : Code::kUnsupported;
  return Status(code, "a receive from any source: no other rank is left to send it (" +
                          std::to_string(failed) + " failed, " +
                          (finalized > 0 ? std::to_string(finalized) + " finalized, " : "") +
                          std::to_string(unreachable) + " unreachable; " +
                          (example >= 0 ? reason(example) : "") + ")");
}

}  // namespace ferry::proto
