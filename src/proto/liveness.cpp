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
  if (link->endpoint != nullptr && rank != rank_) --others_left_;
  last_failed_ = rank;
  return true;
}

bool Liveness::none_can_come(int source) const {
  const int size = static_cast<int>(links_.size());
  if (source == kAnySource) return others_left_ == 0 && size > 1;
  if (source < 0 || source >= size) return true;
  const Link& link = links_[static_cast<std::size_t>(source)];
  return source != rank_ && (link.failed || link.endpoint == nullptr);
}

Status Liveness::no_one_left() const {
  int failed = 0, unreachable = 0;
  const Link* example =
      last_failed_ >= 0 ? &links_[static_cast<std::size_t>(last_failed_)] : nullptr;
  for (std::size_t r = 0; r < links_.size(); ++r) {
    const Link& link = links_[r];
    if (static_cast<int>(r) == rank_ || (!link.failed && link.endpoint != nullptr)) continue;
    ++(link.failed ? failed : unreachable);
    if (example == nullptr) example = &link;
  }
  // The last failure seen, else the first unreachable rank.
  return Status(failed > 0 ? Code::kPeerFailed : Code::kUnsupported,
                "a receive from any source: no other rank is left to send it (" +
                    std::to_string(failed) + " failed, " + std::to_string(unreachable) +
                    " unreachable; " + (example != nullptr ? example->why : "") + ")");
}

}  // namespace ferry::proto
