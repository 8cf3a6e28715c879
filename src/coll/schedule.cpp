// Running a collective's schedule (see schedule.hpp).
#include "coll/schedule.hpp"

#include <cstring>
#include <utility>

#include "coll/group.hpp"
#include "coll/reduce.hpp"
#include "proto/engine.hpp"

namespace ferry::coll {

Schedule::Schedule(std::shared_ptr<Group> group, Tag tag, const char* name, std::size_t count,
                   DataType type, ReduceOp op, bool reduces)
    : group_(std::move(group)),
      tag_(tag),
      name_(name),
      count_(count),
      type_(type),
      op_(op),
      reduces_(reduces) {}

std::string Schedule::what() const {
  return std::string(name_) + " of " + std::to_string(count_) + " " + to_string(type_) +
         (reduces_ ? std::string(" (") + to_string(op_) + ")" : std::string()) + " over " +
         std::to_string(group_->size()) + " members";
}

void Schedule::send(int member, const void* data, std::size_t bytes) {
  actions_.push_back(
      {Action::kSend, member, static_cast<const std::byte*>(data), nullptr, nullptr, bytes});
}

void Schedule::recv(int member, void* data, std::size_t bytes) {
  actions_.push_back(
      {Action::kRecv, member, nullptr, nullptr, static_cast<std::byte*>(data), bytes});
}

void Schedule::reduce(void* out, const void* a, const void* b, std::size_t count) {
  if (count == 0) return;
  actions_.push_back({Action::kReduce, -1, static_cast<const std::byte*>(b),
                      static_cast<const std::byte*>(a), static_cast<std::byte*>(out), count});
}

void Schedule::copy(void* to, const void* from, std::size_t bytes) {
  if (bytes == 0 || to == from) return;
  actions_.push_back({Action::kCopy, -1, static_cast<const std::byte*>(from), nullptr,
                      static_cast<std::byte*>(to), bytes});
}

void Schedule::next_round() {
  const std::size_t begin = round_ends_.empty() ? 0 : round_ends_.back();
  if (actions_.size() > begin) round_ends_.push_back(actions_.size());
}

std::byte* Schedule::scratch(std::size_t bytes) {
  scratch_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes > 0 ? bytes : 1));
  return scratch_.back().get();
}

void Schedule::post_round() {
  proto::Engine* engine = group_->engine();
  // One tag per collective: each pair of members exchanges its messages in the same order on
  // both sides, and messages of one sender that match arrive in order.
  const Tag tag = tag_;
  const std::size_t begin = round_ == 0 ? 0 : round_ends_[round_ - 1];
  for (std::size_t i = begin; i < round_ends_[round_]; ++i) {
    const Action& a = actions_[i];
    const int peer = group_->member(a.member);
    if (a.kind == Action::kRecv) {
      in_flight_.push_back({engine->irecv(a.to, a.size, peer, tag, kFullMask), i});
    } else if (a.kind == Action::kSend) {
      in_flight_.push_back({engine->isend(a.from, a.size, peer, tag), i});
    }
  }
  posted_ = true;
}

std::string Schedule::peer_name(int member) const {
  const int rank = group_->member(member);
  return member == rank
             ? "rank " + std::to_string(rank)
             : "member " + std::to_string(member) + " (rank " + std::to_string(rank) + ")";
}

Status Schedule::check_round() {
  proto::Engine* engine = group_->engine();
  for (const InFlight& f : in_flight_) {
    const std::uint32_t index = proto::Engine::index_of(f.request);
    if (!engine->done(index)) continue;
    const Action& a = actions_[f.action];
    Status s = engine->status(index);
    const char* dir = a.kind == Action::kSend ? "send to " : "receive from ";
    if (!s.is_ok()) {
      const Code code = s.code() == Code::kTruncated ? Code::kInvalidArgument : s.code();
      withdraw();
      return Status(code, what() + ": " + dir + peer_name(a.member) + " in round " +
                              std::to_string(round_) + ": " +
                              (s.code() == Code::kTruncated
                                   ? "the peer sent more than expected (do the members pass the "
                                     "same counts, types and root?)"
                                   : s.message()));
    }
    if (a.kind == Action::kRecv && engine->info(index).bytes != a.size) {
      withdraw();
      return Status(Code::kInvalidArgument,
                    what() + ": " + dir + peer_name(a.member) + " in round " +
                        std::to_string(round_) + ": " + std::to_string(engine->info(index).bytes) +
                        " bytes came, " + std::to_string(a.size) +
                        " were expected (do the members pass the same counts, types and root?)");
    }
  }
  return Status();
}

void Schedule::withdraw() {
  // Receives not yet matched are canceled and unsent data withdrawn, so that nothing touches the
  // caller's buffers after the operation completes; matched transfers finish (or fail) first.
  proto::Engine* engine = group_->engine();
  for (InFlight& f : in_flight_) {
    const std::uint32_t index = proto::Engine::index_of(f.request);
    if (engine->done(index)) continue;
    if (actions_[f.action].kind == Action::kRecv) {
      engine->cancel(index);
    } else {
      engine->abandon_send(index);
    }
  }
  int idle = 0;
  for (InFlight& f : in_flight_) {
    while (!engine->done(proto::Engine::index_of(f.request))) engine->wait_step(&idle);
  }
  in_flight_.clear();
}

bool Schedule::advance(Status* status) {
  proto::Engine* engine = group_->engine();
  while (round_ < round_ends_.size()) {
    if (!posted_) post_round();
    bool all_done = true;
    bool any_failed = false;
    for (const InFlight& f : in_flight_) {
      const std::uint32_t index = proto::Engine::index_of(f.request);
      if (!engine->done(index)) {
        all_done = false;
      } else if (!engine->status(index).is_ok()) {
        any_failed = true;
      }
    }
    if (!all_done && !any_failed) {
      // A member that died fails the collective everywhere, also on members that wait for a
      // live one (which gave up when it saw the death), so nobody waits forever.
      if ((++polls_ & 1023) == 0) {
        for (int m = 0; m < group_->size(); ++m) {
          if (const std::string* why = engine->peer_failure(group_->member(m))) {
            withdraw();
            *status = Status(Code::kPeerFailed,
                             what() + " failed: " + peer_name(m) + " is gone: " + *why);
            return true;
          }
        }
      }
      return false;
    }
    if (Status s = check_round(); !s.is_ok()) {
      *status = std::move(s);
      return true;
    }
    in_flight_.clear();
    const std::size_t begin = round_ == 0 ? 0 : round_ends_[round_ - 1];
    for (std::size_t i = begin; i < round_ends_[round_]; ++i) {
      const Action& a = actions_[i];
      if (a.kind == Action::kReduce) {
        reduce_to(a.to, a.a, a.from, a.size, type_, op_);
      } else if (a.kind == Action::kCopy) {
        std::memmove(a.to, a.from, a.size);
      }
    }
    ++round_;
    posted_ = false;
  }
  *status = Status();
  return true;
}

void Schedule::abandon() { withdraw(); }

}  // namespace ferry::coll
