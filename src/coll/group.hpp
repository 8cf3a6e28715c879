// The state behind a Communicator: its members (job ranks), its id in the tags of its messages,
// the sequence number of its next collective, and the algorithms that build each collective's
// schedule.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::proto {
class Engine;
}

namespace ferry::coll {

class Schedule;

inline constexpr int kUndefinedColor = -1;  // Communicator::kUndefined

// The tag of a collective message: the reserved bit, the communicator id (23 bits), the
// collective's sequence number (24 bits) and the round (16 bits).
inline constexpr int kIdBits = 23;
inline constexpr Tag tag_of(std::uint32_t id, std::uint32_t sequence) {
  return kReservedTagBit | (Tag{id & ((1u << kIdBits) - 1)} << 40) |
         (Tag{sequence & 0xffffffu} << 16);
}

class Group : public std::enable_shared_from_this<Group> {
 public:
  // Every rank of the job.
  static std::shared_ptr<Group> world(proto::Engine* engine);

  [[nodiscard]] proto::Engine* engine() const { return engine_; }
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return static_cast<int>(members_.size()); }
  [[nodiscard]] int member(int rank) const { return members_[static_cast<std::size_t>(rank)]; }

  // Null for kUndefinedColor. Throws ferry::Error.
  std::shared_ptr<Group> split(int color, int key);

  Request barrier();
  Request broadcast(void* buffer, std::size_t count, DataType type, int root);
  Request reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                 int root);
  Request allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  Request allgather(const void* send, void* recv, std::size_t count, DataType type);
  Request allgatherv(const void* send, void* recv, std::span<const std::size_t> counts,
                     std::span<const std::size_t> displacements, DataType type);
  Request reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op);
  Request alltoallv(const void* send, std::span<const std::size_t> send_counts,
                    std::span<const std::size_t> send_displacements, void* recv,
                    std::span<const std::size_t> recv_counts,
                    std::span<const std::size_t> recv_displacements, DataType type,
                    const char* name);
  Request gather(const void* send, void* recv, std::size_t count, DataType type, int root);
  Request scatter(const void* send, void* recv, std::size_t count, DataType type, int root);

  // Waits for a collective started by a blocking call; under FERRY_TIMEOUT it withdraws it.
  Status wait(Request request);

 private:
  struct Ids;  // the communicator ids this process has used
  Group(proto::Engine* engine, std::vector<int> members, int rank, std::uint32_t id,
        std::shared_ptr<Ids> ids);
  // A new schedule for the next collective (every member numbers them alike).
  std::unique_ptr<Schedule> begin(const char* name, std::size_t count, DataType type,
                                  ReduceOp op = ReduceOp::kSum, bool reduces = false);
  Request start(std::unique_ptr<Schedule> schedule);
  // The failed request for bad arguments, or an invalid Request when they are fine.
  Request check(const char* name, std::initializer_list<const void*> buffers, std::size_t elements,
                DataType type, int root = 0);

  proto::Engine* engine_;
  std::vector<int> members_;
  int rank_;
  std::uint32_t id_;
  std::uint32_t sequence_ = 0;
  std::shared_ptr<Ids> ids_;
  std::size_t small_;  // FERRY_COLL_SMALL
  int allreduce_, broadcast_, reduce_, allgather_;
  std::size_t chunk_;
};

}  // namespace ferry::coll
