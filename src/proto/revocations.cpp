// Revoked communicators and the passing on of revocations (see revocations.hpp).
#include "proto/revocations.hpp"

#include <algorithm>

#include "proto/engine.hpp"
#include "proto/wire.hpp"
#include "util/log.hpp"

namespace ferry::proto {
namespace {

// Communicator ids are below 2^22 (coll/group.hpp: the top bit of 23 marks stream twins).
constexpr std::uint32_t kIdLimit = 1u << 22;
// Notices for communicators not made here yet, kept at most: a peer that sends notices for ids
// nobody will make must not grow this rank's memory without bound.
constexpr std::size_t kMaxUnenrolled = 4096;

}  // namespace

void Revocations::enroll(std::uint32_t id, const std::vector<int>& members) {
  Entry& entry = entries_[id];
  entry.members = members;
  if (!entry.revoked) return;
  if (std::find(members.begin(), members.end(), entry.source) == members.end()) {
    // The notice came from a rank that is not a member: not a revocation of this communicator.
    protocol_error(entry.source, "revoked a communicator it is not a member of");
    entries_.erase(id);
    return;
  }
  tell(id, entry);
}

void Revocations::revoke(std::uint32_t id, int by) {
  Entry& entry = entries_[id];
  if (entry.revoked) return;
  entry.revoked = true;
  entry.by = entry.source = by;
  entry.why =
      "revoked by rank " + std::to_string(by) + (by == engine_.rank() ? " (this rank)" : "");
  ++epoch_;
  tell(id, entry);
}

void Revocations::tell(std::uint32_t id, Entry& entry) {
  if (entry.told || entry.members.empty()) return;
  entry.told = true;
  const int me = engine_.rank();
  bool first = true;
  for (int member : entry.members) {
    if (member == me || member == entry.source || engine_.liveness().failure(member) != nullptr) {
      continue;
    }
    engine_.links().send_control(member, kAmRevoke, as_bytes(RevokeHeader{id, entry.by}));
    if (first && entry.by == me) {
      // FERRY_TEST_CRASH_AT=mid-revoke: dies having told one member only (the others must
      // still learn it, from that member).
      engine_.links().drain();
      engine_.crashes().here(util::CrashPoint::kMidRevoke);
    }
    first = false;
  }
}

void Revocations::on_am(int source, std::span<const std::byte> data) {
  RevokeHeader header{};
  if (data.size() != sizeof(header) || !decode(data, &header)) {
    return protocol_error(source, "revoke notice of the wrong size");
  }
  if (header.id >= kIdLimit || header.by < 0 || header.by >= engine_.size()) {
    return protocol_error(source, "revoke notice with a communicator id or rank out of range");
  }
  auto found = entries_.find(header.id);
  if (found == entries_.end() && entries_.size() >= kMaxUnenrolled) {
    const auto unenrolled = static_cast<std::size_t>(std::count_if(
        entries_.begin(), entries_.end(), [](const auto& e) { return e.second.members.empty(); }));
    if (unenrolled >= kMaxUnenrolled) {
      return protocol_error(source, "revoke notices for too many communicators not made here");
    }
  }
  Entry& entry = entries_[header.id];
  if (entry.revoked) return;  // known already: passed on when it was learned
  if (!entry.members.empty() &&
      (std::find(entry.members.begin(), entry.members.end(), source) == entry.members.end() ||
       std::find(entry.members.begin(), entry.members.end(), header.by) == entry.members.end())) {
    return protocol_error(source, "revoked a communicator it is not a member of");
  }
  entry.revoked = true;
  entry.by = header.by;
  entry.source = source;
  entry.why = "revoked by rank " + std::to_string(header.by);
  if (source != header.by) entry.why += " (told by rank " + std::to_string(source) + ")";
  ++epoch_;
  FERRY_LOG(kDebug, "communicator %u %s", header.id, entry.why.c_str());
  tell(header.id, entry);
}

const std::string* Revocations::why(std::uint32_t id) const {
  auto found = entries_.find(id);
  return found != entries_.end() && found->second.revoked ? &found->second.why : nullptr;
}

}  // namespace ferry::proto
