// How a collective runs: an algorithm describes it to a Plan as rounds of sends and receives to
// other members, each followed by local reductions and copies. A Schedule records the rounds and
// the engine advances it in every progress call (the non-blocking forms; libNBC's model); an
// Immediate runs each round as it is described and waits for it (the blocking forms, with no
// allocation once warm).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "proto/operation.hpp"

namespace ferry::coll {

class Group;

// Describes a collective in errors: "allreduce of 1024 float32 (sum) over 4 members".
struct Description {
  const char* name = "collective";
  std::size_t count = 0;
  DataType type = DataType::kUint8;
  ReduceOp op = ReduceOp::kSum;
  bool reduces = false;
};

// What an algorithm builds with. Peers are members of the group (not job ranks). The transfers of
// a round run together; its local actions run in order once they all completed.
class Plan {
 public:
  virtual ~Plan() = default;
  // What this collective is (first, before any transfer).
  void describe(const Description& what) { what_ = what; }
  // Where its buffers are: host memory, or a CUDA device, whose kernels then do the reductions
  // and copies and whose memory holds the scratch buffers. Group::check places the plan.
  static constexpr int kHost = -1;
  void place(int device) {
    device_ = device;
    placed_ = true;
  }
  [[nodiscard]] bool placed() const { return placed_; }
  // Whether the collective runs as it is described, the caller waiting (the blocking forms).
  [[nodiscard]] virtual bool immediate() const { return false; }
  [[nodiscard]] int device() const { return device_; }
  virtual void send(int member, const void* data, std::size_t bytes) = 0;
  virtual void recv(int member, void* data, std::size_t bytes) = 0;
  // out = a op b over `count` elements (out may be a or b).
  virtual void reduce(void* out, const void* a, const void* b, std::size_t count) = 0;
  virtual void copy(void* to, const void* from, std::size_t bytes) = 0;
  // The whole collective as one kernel on every member's GPU (DeviceOneShot::ready(),
  // mesh_ready()): a local action that waits for the peers' kernels.
  // `root`: a broadcast's or a reduce's.
  enum class OneShot : std::uint8_t {
    kAllreduce,
    kAllreduceRing,
    kAllgather,
    kReduceScatter,
    kBroadcast,
    kReduce
  };
  virtual void oneshot(void* out, const void* in, std::size_t count, std::uint64_t sequence,
                       OneShot form, int root) = 0;
  virtual void next_round() = 0;
  // Memory that lasts until the collective completes.
  virtual std::byte* scratch(std::size_t bytes) = 0;

 protected:
  Description what_;
  int device_ = kHost;
  bool placed_ = false;
};

// What Schedule and Immediate share: posting transfers, watching them, and withdrawing them.
class Execution : public Plan {
 public:
  Execution(Group* group, Tag tag) : group_(group), tag_(tag) {}

  struct Action {
    enum Kind : std::uint8_t { kSend, kRecv, kReduce, kCopy, kOneShot } kind;
    int member = -1;                  // send, recv; oneshot: its Plan::OneShot
    const std::byte* from = nullptr;  // send: data; reduce: operand b; copy, oneshot: source
    const std::byte* a = nullptr;     // reduce: operand a
    std::byte* to = nullptr;          // recv: destination; reduce, copy, oneshot: result
    std::size_t size = 0;             // bytes (reduce, oneshot: elements)
    std::uint64_t sequence = 0;       // oneshot: the call's number in the group
    int root = 0;                     // oneshot: a broadcast's or a reduce's root
    [[nodiscard]] bool local() const {
      return kind == kReduce || kind == kCopy || kind == kOneShot;
    }
  };
  struct InFlight {
    Request request;
    Action action;
  };

 protected:
  enum class State { kRunning, kDone, kFailed };

  void post(const Action& action);
  // Host: done on return. Device: queued on the GPU; gpu_idle() says when it finished.
  Status run_local(const Action& action);
  [[nodiscard]] bool gpu_idle();
  // Waiting for the GPU: a member that died fails the collective (checked every 1024 calls), and
  // a one-shot kernel waiting for it is told to stop (then waited for).
  [[nodiscard]] bool gpu_member_died(Status* failure);
  // Once the GPU is idle: what a one-shot kernel found wrong, or ok.
  Status gpu_outcome();
  void stop_gpu();
  // Device memory until the collective ends (released to the CUDA module's cache), or null
  // with *failure set.
  std::byte* device_scratch(std::size_t bytes, Status* failure);
  void release_device_scratch();
  // Whether the round's transfers are done; on a failure (theirs, or a member's death) the rest
  // are withdrawn and *failure says what happened.
  State poll(Status* failure);
  // Cancels unmatched receives, withdraws unsent data and waits for matched transfers, so that
  // nothing touches the caller's buffers afterwards.
  void withdraw();
  // kCanceled naming the member that finalized first (it joins no more calls), with `context`
  // (where the failure showed, on a transfer with `peer`), or ok when none finalized.
  [[nodiscard]] Status member_departure(const std::string& context, int peer) const;
  // kPeerFailed naming the member that died first, with `context` (where the failure showed),
  // or ok when no member is known dead (`ask_transports`: after asking the transports now).
  Status member_death(const std::string& context, bool ask_transports);
  // A transfer that failed without a death seen yet is held until then (Execution::poll).
  using Clock = std::chrono::steady_clock;
  Clock::time_point blame_by_{};
  Status held_;  // that failure, reported if nothing better comes
  [[nodiscard]] std::string what() const;
  // "; not arrived: member 2 (rank 5), ..." naming the members whose transfers of this round
  // are not done, or empty.
  [[nodiscard]] std::string not_arrived() const;
  [[nodiscard]] std::string peer_name(int member) const;

  Group* group_;  // kept alive by the caller (Immediate) or by the Schedule
  Tag tag_;
  std::size_t round_ = 0;
  std::vector<InFlight> in_flight_;
  // Whether to look for dead members now: every 1024 polls, and at least every 10 ms (a poll
  // may sleep 32 ms under FERRY_WAIT_MODE=block: by polls alone a death took 33 s to show).
  bool death_check_due() {
    const Clock::time_point now = Clock::now();
    if ((++polls_ & 1023) != 0 && now < next_death_check_) return false;
    next_death_check_ = now + std::chrono::milliseconds(10);
    return true;
  }
  std::uint32_t polls_ = 0;
  Clock::time_point next_death_check_{};
  static constexpr int kLane = 0;  // the CUDA module's stream for a device's collective work
  cuda::Ticket gpu_work_;          // the last reduction or copy queued on the GPU
  bool gpu_busy_ = false;
  bool oneshot_queued_ = false;  // a one-shot kernel is part of gpu_work_
  bool blocking_ = false;        // an Immediate: its GPU work is waited for before it returns
  std::vector<void*> device_scratch_;
};

class Schedule final : public Execution, public proto::Operation {
 public:
  Schedule(std::shared_ptr<Group> group, Tag tag)
      : Execution(group.get(), tag), keep_(std::move(group)) {}
  void send(int member, const void* data, std::size_t bytes) override;
  void recv(int member, void* data, std::size_t bytes) override;
  void reduce(void* out, const void* a, const void* b, std::size_t count) override;
  void copy(void* to, const void* from, std::size_t bytes) override;
  void oneshot(void* out, const void* in, std::size_t count, std::uint64_t sequence, OneShot form,
               int root) override;
  void next_round() override;
  std::byte* scratch(std::size_t bytes) override;

  ~Schedule() override;
  bool advance(Status* status) override;
  void abandon() override;

 private:
  std::shared_ptr<Group> keep_;  // a non-blocking collective may outlive its Communicator
  std::vector<Action> actions_;
  std::vector<std::size_t> round_ends_;  // actions_[round_ends_[r-1], round_ends_[r]) is round r
  bool posted_ = false;
  bool locals_queued_ = false;  // the round's local actions run on the GPU
  Status scratch_failure_;
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
};

// The vectors and scratch buffers an Immediate uses, kept by its Group between collectives.
struct Reusable {
  std::vector<Execution::InFlight> in_flight;
  std::vector<Execution::Action> locals;
  std::vector<std::vector<std::byte>> scratch;
};

class Immediate final : public Execution {
 public:
  // `timeout`: FERRY_TIMEOUT in seconds (0: none), for the whole collective.
  Immediate(Group* group, Tag tag, double timeout);
  ~Immediate() override;
  [[nodiscard]] bool immediate() const override { return true; }
  void send(int member, const void* data, std::size_t bytes) override;
  void recv(int member, void* data, std::size_t bytes) override;
  void reduce(void* out, const void* a, const void* b, std::size_t count) override;
  void copy(void* to, const void* from, std::size_t bytes) override;
  void oneshot(void* out, const void* in, std::size_t count, std::uint64_t sequence, OneShot form,
               int root) override;
  void next_round() override;
  std::byte* scratch(std::size_t bytes) override;
  // Runs what is left and returns the outcome.
  Status finish();
  // What it waits for: the call and the members whose transfers of the round are not done.
  [[nodiscard]] std::string describe_wait() const { return what() + not_arrived(); }

 private:
  double timeout_;
  std::chrono::steady_clock::time_point deadline_;
  Status status_;
  std::unique_ptr<Reusable> reusable_;  // locals of the current round, scratch buffers
  std::size_t scratch_used_ = 0;
};

}  // namespace ferry::coll
