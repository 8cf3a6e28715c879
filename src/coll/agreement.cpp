// Surviving failures: revoke, the fault-tolerant agreement, and shrink (see group.hpp).
//
// The agreement assumes what the engine's failure detection gives: a rank seen dead is dead (a
// pidfd on a node; across nodes a keepalive, whose bound is FERRY_KEEPALIVE), and a dead rank is
// seen dead by every survivor eventually. On that, two phases:
//  1. Every member sends its contribution (its flag, the members it knows failed, its next free
//     communicator id) to every other member and waits for each one's, or for its death. Each
//     member's estimate merges what it got: so every survivor's flag is in every estimate.
//  2. Rotating coordinator: in round c, member c sends its estimate to all others, and each
//     member that does not know c to be dead waits for it (or for c's death) and adopts it whole.
//     After the first round whose coordinator survives, every survivor holds that coordinator's
//     estimate, and later coordinators send the same one: every survivor decides alike, however
//     many members die meanwhile (a coordinator that dies mid-send leaves some members with its
//     estimate and some without, which the next surviving coordinator's round evens out).
// Messages: n-1 per member in each phase, small; n rounds in the second, each one message deep.
// A member that finalized (its Context ended) sends nothing more after what it sent before: to
// the agreement it is a member that died after its last message, and counts as failed.
#include <algorithm>
#include <cstring>

#include "coll/group.hpp"
#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "util/clock.hpp"

namespace ferry::coll {
namespace {

// A member's contribution or estimate, as sent: the flag, the largest next free id, the member
// count, then one bit per member that is known to have failed.
struct View {
  std::uint64_t flag = 0;
  std::uint64_t next_id = 0;
  std::vector<std::uint64_t> failed;  // a bit per member

  explicit View(int members) : failed((static_cast<std::size_t>(members) + 63) / 64) {}
  [[nodiscard]] bool has_failed(int m) const {
    return (failed[static_cast<std::size_t>(m) / 64] >> (m % 64) & 1) != 0;
  }
  void set_failed(int m) {
    failed[static_cast<std::size_t>(m) / 64] |= std::uint64_t{1} << (m % 64);
  }
  void merge(const View& other) {
    flag &= other.flag;
    next_id = std::max(next_id, other.next_id);
    for (std::size_t w = 0; w < failed.size(); ++w) failed[w] |= other.failed[w];
  }

  static std::size_t bytes(int members) {
    return 2 * sizeof(std::uint64_t) + (static_cast<std::size_t>(members) + 63) / 64 * 8;
  }
  void encode(std::byte* out) const {
    std::memcpy(out, &flag, 8);
    std::memcpy(out + 8, &next_id, 8);
    std::memcpy(out + 16, failed.data(), failed.size() * 8);
  }
  // False when the bits name members that do not exist (a corrupt message).
  bool decode(const std::byte* in, int members) {
    std::memcpy(&flag, in, 8);
    std::memcpy(&next_id, in + 8, 8);
    std::memcpy(failed.data(), in + 16, failed.size() * 8);
    const int spare = static_cast<int>(failed.size()) * 64 - members;
    return spare == 0 || (failed.back() >> (64 - spare)) == 0;
  }
};

// Waits for requests of an agreement to complete, within its deadline (one for the whole call).
class Waiter {
 public:
  Waiter(Group& g, double timeout)
      : engine_(g.engine()),
        deadline_(timeout > 0 ? util::deadline_after(timeout) : util::Clock::time_point::max()) {}

  // Until `request` completes: true; false when the deadline passed first (the request is then
  // withdrawn: a receive canceled, a send abandoned, and waited for).
  bool wait(Request& request) {
    const std::uint32_t index = proto::Engine::index_of(request);
    if (engine_->waiting().wait_until([&] { return engine_->requests().done(index); }, deadline_)) {
      return true;
    }
    withdraw(request);
    return false;
  }
  void withdraw(Request& request) {
    const std::uint32_t index = proto::Engine::index_of(request);
    if (!request.valid() || engine_->requests().done(index)) return;
    if (!engine_->messages().cancel(index)) engine_->messages().abandon_send(index);
    int idle = 0;
    while (!engine_->requests().done(index)) engine_->waiting().step(&idle);
  }
  [[nodiscard]] const Status& status(const Request& request) const {
    return engine_->requests()[proto::Engine::index_of(request)].status;
  }
  [[nodiscard]] std::size_t received(const Request& request) const {
    return engine_->requests()[proto::Engine::index_of(request)].info.bytes;
  }

 private:
  proto::Engine* engine_;
  util::Clock::time_point deadline_;
};

}  // namespace

Status Group::revoked_status(const std::string& what) const {
  const std::string* why = revocations_->why(base_id());
  std::string text =
      what + ": the communicator is " + (why != nullptr ? *why : std::string("revoked"));
  // A revocation usually follows a death, and the member that revoked is seldom the one that
  // died: name the members this rank knows to have failed.
  std::string failed;
  for (int m = 0; m < size(); ++m) {
    if (const std::string* failure = engine_->liveness().failure(member(m)); failure != nullptr) {
      failed += (failed.empty() ? "" : "; ") + peer_label(m) + " failed: " + *failure;
    }
  }
  if (!failed.empty()) text += " (" + failed + ")";
  return Status(Code::kRevoked, text);
}

void Group::revoke() { revocations_->revoke(base_id(), engine_->rank()); }

std::vector<int> Group::failed_members() {
  engine_->look_for_failures();
  std::vector<int> failed;
  for (int m = 0; m < size(); ++m) {
    if (engine_->liveness().failure(member(m)) != nullptr) failed.push_back(m);
  }
  return failed;
}

namespace {

// One agreement of a member: its estimate through the two phases (see the top of this file).
class Agreement {
 public:
  Agreement(Group& g, Tag tag, std::string what, View estimate)
      : g_(g),
        engine_(g.engine()),
        n_(g.size()),
        tag_(tag),
        what_(std::move(what)),
        bytes_(View::bytes(n_)),
        waiter_(g, g.timeout()),
        estimate_(std::move(estimate)),
        mine_(bytes_),
        sends_(static_cast<std::size_t>(n_)) {}

  // Phase 1: every member's contribution to every other, merged into the estimate.
  Status gather() {
    const auto n = static_cast<std::size_t>(n_);
    std::vector<std::byte> theirs(bytes_ * n);
    std::vector<Request> receives(n);
    for (int m = 0; m < n_; ++m) {
      if (m == g_.rank()) continue;
      receives[static_cast<std::size_t>(m)] = engine_->messages().irecv(
          &theirs[bytes_ * static_cast<std::size_t>(m)], bytes_, g_.member(m), tag_ | 1, kFullMask);
    }
    estimate_.encode(mine_.data());
    send_to_all(1, util::CrashPoint::kMidAgree);
    std::string missing;
    for (int m = 0; m < n_; ++m) {
      if (m != g_.rank() && !waiter_.wait(receives[static_cast<std::size_t>(m)])) {
        missing += (missing.empty() ? "" : ", ") + g_.peer_label(m);
      }
    }
    if (!missing.empty()) {
      for (Request& r : receives) waiter_.withdraw(r);
      withdraw_sends();
      return timed_out("no contribution came from " + missing);
    }
    View contribution(n_);
    for (int m = 0; m < n_; ++m) {
      if (m == g_.rank()) continue;
      const Request& r = receives[static_cast<std::size_t>(m)];
      const Status& s = waiter_.status(r);
      if (s.code() == Code::kPeerFailed || gone(m, s)) {
        estimate_.set_failed(m);
        continue;
      }
      if (!s.is_ok() || waiter_.received(r) != bytes_ ||
          !contribution.decode(&theirs[bytes_ * static_cast<std::size_t>(m)], n_)) {
        withdraw_sends();
        return malformed(m, "contribution", s);
      }
      estimate_.merge(contribution);
    }
    wait_sends();
    return Status();
  }

  // Phase 2: rotating coordinator; each member adopts the estimate of each coordinator it hears.
  Status decide() {
    std::vector<std::byte> coordinated(bytes_);
    for (int c = 0; c < n_; ++c) {
      if (c == g_.rank()) {
        estimate_.encode(mine_.data());
        send_to_all(2, util::CrashPoint::kMidDecide);
        wait_sends();
        continue;
      }
      if (estimate_.has_failed(c) || engine_->liveness().failure(g_.member(c)) != nullptr ||
          engine_->liveness().departed(g_.member(c))) {
        continue;
      }
      Request r =
          engine_->messages().irecv(coordinated.data(), bytes_, g_.member(c), tag_ | 2, kFullMask);
      if (!waiter_.wait(r)) {
        return timed_out("no estimate came from " + g_.peer_label(c) +
                         ", the coordinator of round " + std::to_string(c));
      }
      const Status& s = waiter_.status(r);
      if (s.code() == Code::kPeerFailed || gone(c, s)) continue;
      View adopted(n_);
      if (!s.is_ok() || waiter_.received(r) != bytes_ || !adopted.decode(coordinated.data(), n_)) {
        return malformed(c, "estimate", s);
      }
      estimate_ = std::move(adopted);
    }
    return Status();
  }

  [[nodiscard]] const View& estimate() const { return estimate_; }
  [[nodiscard]] const std::string& what() const { return what_; }

 private:
  // A receive from member `m` that ended because it finalized (kCanceled: it sends nothing
  // more): it counts as failed, as one that died after its last message.
  [[nodiscard]] bool gone(int m, const Status& s) const {
    return s.code() == Code::kCanceled && engine_->liveness().departed(g_.member(m));
  }
  // Sends `mine_` to every other member with the phase's tag; a test's crash point dies having
  // sent to one only.
  void send_to_all(Tag phase, util::CrashPoint point) {
    bool first = true;
    for (int m = 0; m < n_; ++m) {
      if (m == g_.rank()) continue;
      Request& send = sends_[static_cast<std::size_t>(m)];
      send = engine_->messages().isend(mine_.data(), bytes_, g_.member(m), tag_ | phase);
      if (first && engine_->crashes().at(point)) {
        waiter_.wait(send);
        engine_->links().drain();
        engine_->crashes().here(point);
      }
      first = false;
    }
  }
  // Small: on their way or failed (a dead member) at once.
  void wait_sends() {
    for (Request& r : sends_) {
      if (r.valid()) waiter_.wait(r);
    }
  }
  void withdraw_sends() {
    for (Request& r : sends_) waiter_.withdraw(r);
  }
  Status timed_out(const std::string& waiting_for) const {
    return Status(Code::kTimeout, what_ + ": not complete after FERRY_TIMEOUT (" +
                                      std::to_string(g_.timeout()) + " s): " + waiting_for);
  }
  Status malformed(int m, const char* part, const Status& s) const {
    return Status(Code::kProtocolError, what_ + ": " + g_.peer_label(m) + "'s " + part + ": " +
                                            (s.is_ok() ? "malformed" : s.message()));
  }

  Group& g_;
  proto::Engine* engine_;
  int n_;
  Tag tag_;
  std::string what_;
  std::size_t bytes_;
  Waiter waiter_;
  View estimate_;
  std::vector<std::byte> mine_;  // what this member sends (its contribution, then its estimate)
  std::vector<Request> sends_;
};

}  // namespace

Status Group::agreement(std::uint64_t flag, const char* name, Agreed* agreed) {
  const int n = size();
  const std::uint32_t number = agreements_++;
  View mine(n);
  mine.flag = flag;
  mine.next_id = ids_->next;
  engine_->look_for_failures();
  // A member that finalized joins no more calls: failed, as far as the agreement goes.
  for (int m = 0; m < n; ++m) {
    if (engine_->liveness().failure(member(m)) != nullptr ||
        engine_->liveness().departed(member(m))) {
      mine.set_failed(m);
    }
  }
  Agreement agreement(*this, tag_of(base_id(), number) | kAgreementTag,
                      std::string(name) + " over " + std::to_string(n) + " members (agreement " +
                          std::to_string(number) + ")",
                      std::move(mine));
  const proto::Waiting::Note note = engine_->waiting().note(
      [](const void* text, std::uintptr_t) { return *static_cast<const std::string*>(text); },
      &agreement.what());
  if (Status s = agreement.gather(); !s.is_ok()) return s;
  if (Status s = agreement.decide(); !s.is_ok()) return s;

  const View& decided = agreement.estimate();
  agreed->flag = decided.flag;
  agreed->next_id = decided.next_id;
  agreed->failed.assign(static_cast<std::size_t>(n), false);
  for (int m = 0; m < n; ++m) agreed->failed[static_cast<std::size_t>(m)] = decided.has_failed(m);
  if (decided.has_failed(rank_)) {
    return Status(Code::kPeerFailed, agreement.what() + ": the other members count this one (" +
                                         peer_label(rank_) + ") as failed");
  }
  return Status();
}

Status Group::agree(std::uint64_t* flag, std::vector<int>* failed) {
  Agreed agreed;
  if (Status s = agreement(*flag, "agree", &agreed); !s.is_ok()) return s;
  *flag = agreed.flag;
  if (failed != nullptr) {
    failed->clear();
    for (int m = 0; m < size(); ++m) {
      if (agreed.failed[static_cast<std::size_t>(m)]) failed->push_back(m);
    }
  }
  return Status();
}

std::shared_ptr<Group> Group::shrink() {
  Agreed agreed;
  for (;;) {
    if (Status s = agreement(~std::uint64_t{0}, "shrink", &agreed); !s.is_ok()) {
      throw Error(s.code(), "shrink: " + s.message());
    }
    // A member that died during the agreement may have been decided alive: a second agreement
    // asks whether any survivor knows one of those kept to be dead now, and if one does, the
    // survivors agree again (each time leaving out more; the deaths are finite).
    engine_->look_for_failures();
    std::uint64_t none_dead = 1;
    for (int m = 0; m < size(); ++m) {
      if (!agreed.failed[static_cast<std::size_t>(m)] &&
          (engine_->liveness().failure(member(m)) != nullptr ||
           engine_->liveness().departed(member(m)))) {
        none_dead = 0;
      }
    }
    Agreed check;
    if (Status s = agreement(none_dead, "shrink", &check); !s.is_ok()) {
      throw Error(s.code(), "shrink: " + s.message());
    }
    bool more_failed = false;
    for (int m = 0; m < size(); ++m) {
      more_failed |=
          check.failed[static_cast<std::size_t>(m)] && !agreed.failed[static_cast<std::size_t>(m)];
    }
    if (check.flag == 1 && !more_failed) break;
  }
  if (agreed.next_id >= std::uint64_t{kIdLimit}) {
    throw Error(Code::kNoResources, "shrink: this process has made " +
                                        std::to_string(agreed.next_id) +
                                        " communicators, the most a job may have");
  }
  std::vector<int> members;
  int rank = -1;
  for (int m = 0; m < size(); ++m) {
    if (agreed.failed[static_cast<std::size_t>(m)]) continue;
    if (m == rank_) rank = static_cast<int>(members.size());
    members.push_back(member(m));
  }
  const auto id = static_cast<std::uint32_t>(agreed.next_id);
  ids_->next = id + 1;
  return std::shared_ptr<Group>(new Group(engine_, std::move(members), rank, id, ids_));
}

}  // namespace ferry::coll
