// Running a collective: recorded and advanced by the engine (Schedule), or run as described
// (Immediate). See schedule.hpp.
#include "coll/schedule.hpp"

#include <algorithm>
#include <cstring>
#include <utility>

#include "coll/group.hpp"
#include "coll/reduce.hpp"
#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "util/clock.hpp"

namespace ferry::coll {

// ---- Execution: what both share ----

std::string Execution::what() const {
  return std::string(what_.name) + " " +
         group_->call_label(static_cast<std::uint32_t>(tag_ >> 16)) + " (" +
         std::to_string(what_.count) + " " + to_string(what_.type) +
         (what_.reduces ? std::string(", ") + to_string(what_.op) : std::string()) + ", " +
         std::to_string(group_->size()) + " members)";
}

std::string Execution::not_arrived() const {
  std::vector<int> members;
  proto::Engine* engine = group_->engine();
  for (const InFlight& f : in_flight_) {
    if (engine->requests().done(proto::Engine::index_of(f.request))) continue;
    if (std::find(members.begin(), members.end(), f.action.member) == members.end()) {
      members.push_back(f.action.member);
    }
  }
  std::sort(members.begin(), members.end());
  std::string text;
  for (int m : members) text += (text.empty() ? "" : ", ") + peer_name(m);
  return text.empty() ? std::string() : "; not arrived: " + text;
}

std::string Execution::peer_name(int member) const {
  const int rank = group_->member(member);
  return member == rank
             ? "rank " + std::to_string(rank)
             : "member " + std::to_string(member) + " (rank " + std::to_string(rank) + ")";
}

void Execution::post(const Action& a) {
  // One tag per collective: each pair of members exchanges its messages in the same order on
  // both sides, and messages of one sender that match arrive in order.
  proto::Engine* engine = group_->engine();
  const int peer = group_->member(a.member);
  if (a.kind == Action::kRecv) {
    in_flight_.push_back({engine->messages().irecv(a.to, a.size, peer, tag_, kFullMask), a});
  } else {
    in_flight_.push_back({engine->messages().isend(a.from, a.size, peer, tag_), a});
  }
}

Status Execution::run_local(const Action& a) {
  if (device_ == kHost) {
    if (a.kind == Action::kReduce) {
      reduce_to(a.to, a.a, a.from, a.size, what_.type, what_.op);
    } else {
      std::memmove(a.to, a.from, a.size);
    }
    return Status();
  }
  // One lane (stream) for all of them, so each starts after the one before.
  cuda::Cuda* gpu = group_->engine()->cuda();
  Status s;
  if (a.kind == Action::kReduce) {
    s = gpu->reduce_async(device_, kLane, a.to, a.a, a.from, a.size, what_.type, what_.op,
                          &gpu_work_);
  } else if (a.kind == Action::kOneShot) {
    s = group_->oneshot().launch(a, what_.type, what_.op, kLane, blocking_, &gpu_work_);
    oneshot_queued_ = s.is_ok();
  } else {
    s = gpu->copy_async(device_, kLane, a.to, a.from, a.size, &gpu_work_);
  }
  if (!s.is_ok()) {
    return Status(s.code(), what() + ": in round " + std::to_string(round_) + ": " + s.message());
  }
  gpu_busy_ = true;
  return s;
}

bool Execution::gpu_idle() {
  if (gpu_busy_ && group_->engine()->cuda()->done(gpu_work_)) gpu_busy_ = false;
  return !gpu_busy_;
}

bool Execution::gpu_member_died(Status* failure) {
  if (!death_check_due()) return false;
  if (group_->revoked()) {
    *failure = group_->revoked_status(what());
    return true;
  }
  proto::Engine* engine = group_->engine();
  for (int m = 0; m < group_->size(); ++m) {
    if (const std::string* why = engine->liveness().failure(group_->member(m))) {
      *failure =
          Status(Code::kPeerFailed, what() + " failed: " + peer_name(m) + " is gone: " + *why);
      return true;
    }
  }
  return false;
}

Status Execution::gpu_outcome() {
  if (!oneshot_queued_) return Status();
  oneshot_queued_ = false;
  Status s = group_->oneshot().outcome();
  return s.is_ok() ? s : Status(s.code(), what() + ": " + s.message());
}

void Execution::stop_gpu() {
  group_->oneshot().stop();
  while (!gpu_idle()) {
  }
}

std::byte* Execution::device_scratch(std::size_t bytes, Status* failure) {
  void* memory = nullptr;
  const Status s = group_->engine()->cuda()->allocate(device_, bytes, &memory);
  if (!s.is_ok()) {
    *failure = Status(s.code(), what() + ": scratch memory: " + s.message());
    return nullptr;
  }
  device_scratch_.push_back(memory);
  return static_cast<std::byte*>(memory);
}

void Execution::release_device_scratch() {
  if (device_scratch_.empty()) return;
  // Nothing may still use them: a failed round's queued GPU work finishes first.
  cuda::Cuda* gpu = group_->engine()->cuda();
  while (!gpu_idle()) {
  }
  for (void* memory : device_scratch_) gpu->release(device_, memory);
  device_scratch_.clear();
}

Execution::State Execution::poll(Status* failure) {
  proto::Engine* engine = group_->engine();
  if (group_->revoked()) {
    *failure = group_->revoked_status(what());
    withdraw();
    return State::kFailed;
  }
  bool running = false;
  for (const InFlight& f : in_flight_) {
    const std::uint32_t index = proto::Engine::index_of(f.request);
    if (!engine->requests().done(index)) {
      running = true;
      continue;
    }
    const Status& s = engine->requests()[index].status;
    const bool short_message = f.action.kind == Action::kRecv && s.is_ok() &&
                               engine->requests()[index].info.bytes != f.action.size;
    if (s.is_ok() && !short_message) continue;
    const std::string where =
        what() + ": " + (f.action.kind == Action::kSend ? "send to " : "receive from ") +
        peer_name(f.action.member) + " in round " + std::to_string(round_) + ": ";
    if (short_message || s.code() == Code::kTruncated) {
      *failure = Status(Code::kInvalidArgument,
                        where +
                            (short_message ? std::to_string(engine->requests()[index].info.bytes) +
                                                 " bytes came, " + std::to_string(f.action.size) +
                                                 " were expected"
                                           : std::string("the peer sent more than ") +
                                                 std::to_string(f.action.size) + " bytes") +
                            " (do the members pass the same counts, types and root?)");
    } else if (Status dead = member_death(where + s.message(), true); !dead.is_ok()) {
      // A member died: that is the cause wherever the failure showed (a live member that gave
      // up on its part because of it withdrew what it sent here: kCanceled).
      *failure = std::move(dead);
    } else if (Status gone = member_departure(where + s.message(), f.action.member);
               !gone.is_ok()) {
      // A member finalized without joining: the cause, also where a live member gave up
      // because of it.
      *failure = std::move(gone);
    } else if (s.code() != Code::kPeerFailed && blame_by_ == Clock::time_point{}) {
      // No death seen yet, though a live member may have given up because of one: deaths are
      // seen within milliseconds on a node and within keepalives across nodes, so look a while
      // before blaming the member that gave up.
      const double keepalive = engine->config().get_seconds(util::Var::kKeepalive);
      const double grace = engine->links().link(group_->member(f.action.member)).shares_memory
                               ? 0.15
                               : std::min(3.0, 0.5 + 2 * keepalive);
      blame_by_ = util::deadline_after(grace);
      held_ = Status(s.code(), where + s.message());
      running = true;
      continue;
    } else if (s.code() != Code::kPeerFailed && Clock::now() < blame_by_) {
      running = true;
      continue;
    } else {
      *failure = Status(s.code(), where + s.message());
    }
    withdraw();
    return State::kFailed;
  }
  if (!running) return State::kDone;
  // A member that died fails the collective everywhere, also on members that wait for a live
  // one (which gave up when it saw the death), so nobody waits forever.
  if (death_check_due()) {
    if (Status dead = member_death("", false); !dead.is_ok()) {
      *failure = std::move(dead);
      withdraw();
      return State::kFailed;
    }
  }
  return State::kRunning;
}

Status Execution::member_departure(const std::string& context, int peer) const {
  const int first = group_->first_departed();
  if (first < 0) return Status();
  if (first == peer) return Status(Code::kCanceled, context);  // it says so already
  return Status(Code::kCanceled,
                what() + " failed: " + group_->departed_label(first) + " (" + context + ")");
}

Status Execution::member_death(const std::string& context, bool ask_transports) {
  proto::Engine* engine = group_->engine();
  if (ask_transports) engine->look_for_failures();
  int first = -1;
  std::uint64_t earliest = 0;
  for (int m = 0; m < group_->size(); ++m) {
    const std::uint64_t order = engine->liveness().failure_order(group_->member(m));
    if (order != 0 && (first < 0 || order < earliest)) {
      first = m;
      earliest = order;
    }
  }
  if (first < 0) return Status();
  return Status(Code::kPeerFailed, what() + " failed: " + peer_name(first) + " is gone: " +
                                       *engine->liveness().failure(group_->member(first)) +
                                       (context.empty() ? std::string() : " (" + context + ")"));
}

void Execution::withdraw() {
  proto::Engine* engine = group_->engine();
  for (InFlight& f : in_flight_) {
    const std::uint32_t index = proto::Engine::index_of(f.request);
    if (engine->requests().done(index)) continue;
    if (f.action.kind == Action::kRecv) {
      engine->messages().withdraw_recv(index);
    } else {
      engine->messages().abandon_send(index);
    }
  }
  int idle = 0;
  for (InFlight& f : in_flight_) {
    while (!engine->requests().done(proto::Engine::index_of(f.request)))
      engine->waiting().step(&idle);
  }
  in_flight_.clear();
}

// ---- Schedule: recorded, advanced by the engine ----

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

void Schedule::oneshot(void* out, const void* in, std::size_t count, std::uint64_t sequence,
                       OneShot form, int root) {
  actions_.push_back({Action::kOneShot, static_cast<int>(form), static_cast<const std::byte*>(in),
                      nullptr, static_cast<std::byte*>(out), count, sequence, root});
}

void Schedule::next_round() {
  const std::size_t begin = round_ends_.empty() ? 0 : round_ends_.back();
  if (actions_.size() > begin) round_ends_.push_back(actions_.size());
}

Schedule::~Schedule() { release_device_scratch(); }

std::byte* Schedule::scratch(std::size_t bytes) {
  if (device_ != kHost) return device_scratch(bytes, &scratch_failure_);
  scratch_.push_back(std::make_unique_for_overwrite<std::byte[]>(bytes > 0 ? bytes : 1));
  return scratch_.back().get();
}

void Schedule::abandon() {
  if (device_ != kHost && !gpu_idle()) stop_gpu();
}

bool Schedule::advance(Status* status) {
  if (!scratch_failure_.is_ok()) {
    *status = scratch_failure_;
    return true;
  }
  while (round_ < round_ends_.size()) {
    const std::size_t begin = round_ == 0 ? 0 : round_ends_[round_ - 1];
    if (locals_queued_) {
      if (!gpu_idle()) {
        if (!gpu_member_died(status)) return false;
        stop_gpu();
        return true;
      }
      if (Status wrong = gpu_outcome(); !wrong.is_ok()) {
        *status = std::move(wrong);
        return true;
      }
      locals_queued_ = false;
      ++round_;
      posted_ = false;
      continue;
    }
    if (!posted_) {
      for (std::size_t i = begin; i < round_ends_[round_]; ++i) {
        const Action& a = actions_[i];
        if (!a.local()) post(a);
      }
      posted_ = true;
    }
    switch (poll(status)) {
      case State::kRunning:
        return false;
      case State::kFailed:
        return true;
      case State::kDone:
        break;
    }
    in_flight_.clear();
    for (std::size_t i = begin; i < round_ends_[round_]; ++i) {
      const Action& a = actions_[i];
      if (!a.local()) continue;
      if (Status failed = run_local(a); !failed.is_ok()) {
        *status = std::move(failed);
        return true;
      }
    }
    if (!gpu_idle()) {
      locals_queued_ = true;
      return false;
    }
    if (Status wrong = gpu_outcome(); !wrong.is_ok()) {
      *status = std::move(wrong);
      return true;
    }
    ++round_;
    posted_ = false;
  }
  *status = Status();
  return true;
}

// ---- Immediate: run as described, waiting at the end of each round ----

Immediate::Immediate(Group* group, Tag tag, double timeout)
    : Execution(group, tag), timeout_(timeout) {
  blocking_ = true;
  if (timeout_ > 0) deadline_ = util::deadline_after(timeout_);
  reusable_ = group_->take_reusable();
  std::swap(in_flight_, reusable_->in_flight);
}

Immediate::~Immediate() {
  if (!in_flight_.empty()) withdraw();  // finish() was not called (an early return)
  release_device_scratch();
  std::swap(in_flight_, reusable_->in_flight);
  reusable_->locals.clear();
  group_->give_back(std::move(reusable_));
}

void Immediate::send(int member, const void* data, std::size_t bytes) {
  if (status_.is_ok()) {
    post({Action::kSend, member, static_cast<const std::byte*>(data), nullptr, nullptr, bytes});
  }
}

void Immediate::recv(int member, void* data, std::size_t bytes) {
  if (status_.is_ok()) {
    post({Action::kRecv, member, nullptr, nullptr, static_cast<std::byte*>(data), bytes});
  }
}

void Immediate::reduce(void* out, const void* a, const void* b, std::size_t count) {
  if (count > 0) {
    reusable_->locals.push_back({Action::kReduce, -1, static_cast<const std::byte*>(b),
                                 static_cast<const std::byte*>(a), static_cast<std::byte*>(out),
                                 count});
  }
}

void Immediate::copy(void* to, const void* from, std::size_t bytes) {
  if (bytes > 0 && to != from) {
    reusable_->locals.push_back({Action::kCopy, -1, static_cast<const std::byte*>(from), nullptr,
                                 static_cast<std::byte*>(to), bytes});
  }
}

void Immediate::oneshot(void* out, const void* in, std::size_t count, std::uint64_t sequence,
                        OneShot form, int root) {
  reusable_->locals.push_back({Action::kOneShot, static_cast<int>(form),
                               static_cast<const std::byte*>(in), nullptr,
                               static_cast<std::byte*>(out), count, sequence, root});
}

void Immediate::next_round() {
  if (!status_.is_ok()) return;
  if (!in_flight_.empty()) {
    proto::Engine* engine = group_->engine();
    int idle = 0;
    for (;;) {
      const State state = poll(&status_);
      if (state == State::kFailed) return;
      if (state == State::kDone) break;
      engine->waiting().step(&idle);
      if (timeout_ > 0 && util::Clock::now() >= deadline_) {
        const std::string missing = not_arrived();
        withdraw();
        // A failure held while deaths were looked for is the better answer than the timeout.
        status_ = !held_.is_ok() ? held_
                                 : Status(Code::kTimeout,
                                          what() + ": not complete after FERRY_TIMEOUT (" +
                                              std::to_string(timeout_) + " s, in round " +
                                              std::to_string(round_) + "); withdrawn" + missing);
        return;
      }
    }
    in_flight_.clear();
  }
  for (const Action& a : reusable_->locals) {
    if (status_ = run_local(a); !status_.is_ok()) break;
  }
  reusable_->locals.clear();
  if (!gpu_idle()) {
    proto::Engine* engine = group_->engine();
    struct Awaiting {  // no wait sleeps on the wake-ups meanwhile
      explicit Awaiting(proto::Engine* e) : engine(e) { engine->awaiting_gpu(1); }
      ~Awaiting() { engine->awaiting_gpu(-1); }
      proto::Engine* engine;
    } awaiting(engine);
    int idle = 0;
    while (!gpu_idle()) {
      if (gpu_member_died(&status_)) {
        stop_gpu();
        return;
      }
      if (timeout_ > 0 && util::Clock::now() >= deadline_) {
        stop_gpu();
        status_ = Status(Code::kTimeout, what() + ": not complete after FERRY_TIMEOUT (" +
                                             std::to_string(timeout_) + " s, in round " +
                                             std::to_string(round_) + ", on the GPU); stopped");
        return;
      }
      engine->waiting().step(&idle);
    }
  }
  if (status_.is_ok()) status_ = gpu_outcome();
  ++round_;
}

std::byte* Immediate::scratch(std::size_t bytes) {
  if (device_ != kHost) return status_.is_ok() ? device_scratch(bytes, &status_) : nullptr;
  auto& buffers = reusable_->scratch;
  if (scratch_used_ == buffers.size()) buffers.emplace_back();
  std::vector<std::byte>& b = buffers[scratch_used_++];
  if (b.size() < bytes) b.resize(bytes);
  return b.data();
}

Status Immediate::finish() {
  next_round();
  release_device_scratch();
  // Buffers of up to 16 MiB are kept for the next collective, which would otherwise fault in
  // fresh pages every call (3 ranks, 16 MiB reduce on this VM: 2.2 GB/s kept against 1.0
  // released); larger ones go.
  constexpr std::size_t kKeep = std::size_t{16} << 20;
  for (std::size_t i = 0; i < scratch_used_; ++i) {
    auto& b = reusable_->scratch[i];
    if (b.capacity() > kKeep) std::vector<std::byte>().swap(b);
  }
  return status_;
}

}  // namespace ferry::coll
