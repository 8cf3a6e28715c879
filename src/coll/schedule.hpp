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
  virtual void send(int member, const void* data, std::size_t bytes) = 0;
  virtual void recv(int member, void* data, std::size_t bytes) = 0;
  // out = a op b over `count` elements (out may be a or b).
  virtual void reduce(void* out, const void* a, const void* b, std::size_t count) = 0;
  virtual void copy(void* to, const void* from, std::size_t bytes) = 0;
  virtual void next_round() = 0;
  // Memory that lasts until the collective completes.
  virtual std::byte* scratch(std::size_t bytes) = 0;

 protected:
  Description what_;
};

// What Schedule and Immediate share: posting transfers, watching them, and withdrawing them.
class Execution : public Plan {
 public:
  Execution(Group* group, Tag tag) : group_(group), tag_(tag) {}

  struct Action {
    enum Kind : std::uint8_t { kSend, kRecv, kReduce, kCopy } kind;
    int member = -1;
    const std::byte* from = nullptr;  // send: data; reduce: operand b; copy: source
    const std::byte* a = nullptr;     // reduce: operand a
    std::byte* to = nullptr;          // recv: destination; reduce, copy: result
    std::size_t size = 0;             // bytes (reduce: elements)
  };
  struct InFlight {
    Request request;
    Action action;
  };

 protected:
  enum class State { kRunning, kDone, kFailed };

  void post(const Action& action);
  void run_local(const Action& action) const;
  // Whether the round's transfers are done; on a failure (theirs, or a member's death) the rest
  // are withdrawn and *failure says what happened.
  State poll(Status* failure);
  // Cancels unmatched receives, withdraws unsent data and waits for matched transfers, so that
  // nothing touches the caller's buffers afterwards.
  void withdraw();
  [[nodiscard]] std::string what() const;
  [[nodiscard]] std::string peer_name(int member) const;

  Group* group_;  // kept alive by the caller (Immediate) or by the Schedule
  Tag tag_;
  std::size_t round_ = 0;
  std::vector<InFlight> in_flight_;
  std::uint32_t polls_ = 0;
};

class Schedule final : public Execution, public proto::Operation {
 public:
  Schedule(std::shared_ptr<Group> group, Tag tag)
      : Execution(group.get(), tag), keep_(std::move(group)) {}
  void send(int member, const void* data, std::size_t bytes) override;
  void recv(int member, void* data, std::size_t bytes) override;
  void reduce(void* out, const void* a, const void* b, std::size_t count) override;
  void copy(void* to, const void* from, std::size_t bytes) override;
  void next_round() override;
  std::byte* scratch(std::size_t bytes) override;

  bool advance(Status* status) override;

 private:
  std::shared_ptr<Group> keep_;  // a non-blocking collective may outlive its Communicator
  std::vector<Action> actions_;
  std::vector<std::size_t> round_ends_;  // actions_[round_ends_[r-1], round_ends_[r]) is round r
  bool posted_ = false;
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
  void send(int member, const void* data, std::size_t bytes) override;
  void recv(int member, void* data, std::size_t bytes) override;
  void reduce(void* out, const void* a, const void* b, std::size_t count) override;
  void copy(void* to, const void* from, std::size_t bytes) override;
  void next_round() override;
  std::byte* scratch(std::size_t bytes) override;
  // Runs what is left and returns the outcome.
  Status finish();

 private:
  double timeout_;
  std::chrono::steady_clock::time_point deadline_;
  Status status_;
  std::unique_ptr<Reusable> reusable_;  // locals of the current round, scratch buffers
  std::size_t scratch_used_ = 0;
};

}  // namespace ferry::coll
