// A collective as a schedule: rounds of sends and receives to other members, each followed by
// local reductions and copies. The engine advances it in every progress call (libNBC's model).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "proto/operation.hpp"

namespace ferry::coll {

class Group;

class Schedule final : public proto::Operation {
 public:
  // `name`, `count`, `type` and `op` describe the collective in errors ("allreduce of 1024
  // float32 (sum)"); `op` is ignored where `reduces` is false.
  Schedule(std::shared_ptr<Group> group, Tag tag, const char* name, std::size_t count,
           DataType type, ReduceOp op, bool reduces);

  // Building: actions go into the current round; next_round() closes it. Peers are members of
  // the group (not job ranks). Within a round the transfers run together; the local actions run,
  // in order, once all of them completed.
  void send(int member, const void* data, std::size_t bytes);
  void recv(int member, void* data, std::size_t bytes);
  // out = a op b, `count` elements (out may be a or b).
  void reduce(void* out, const void* a, const void* b, std::size_t count);
  void copy(void* to, const void* from, std::size_t bytes);
  void next_round();
  // Scratch memory that lives as long as the schedule.
  std::byte* scratch(std::size_t bytes);

  bool advance(Status* status) override;
  void abandon() override;

 private:
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
    std::size_t action;
  };
  void post_round();
  // The first transfer of the round that failed, or ok; withdraws the others on failure.
  Status check_round();
  void withdraw();
  [[nodiscard]] std::string peer_name(int member) const;
  [[nodiscard]] std::string what() const;

  std::shared_ptr<Group> group_;
  Tag tag_;
  const char* name_;
  std::size_t count_;
  DataType type_;
  ReduceOp op_;
  bool reduces_;
  std::vector<Action> actions_;
  std::vector<std::size_t> round_ends_;  // actions_[round_ends_[r-1], round_ends_[r]) is round r
  std::size_t round_ = 0;
  bool posted_ = false;
  std::vector<InFlight> in_flight_;
  std::vector<std::unique_ptr<std::byte[]>> scratch_;
  std::uint32_t polls_ = 0;
};

}  // namespace ferry::coll
