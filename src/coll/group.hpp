// The state behind a Communicator: its members (job ranks), its id in the tags of its messages,
// the sequence number of its next collective, and the algorithms that build each collective's
// schedule.
#pragma once

#include <algorithm>
#include <array>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "coll/device_oneshot.hpp"
#include "coll/node_area.hpp"
#include "coll/node_collectives.hpp"
#include "coll/schedule.hpp"
#include "coll/stream_p2p.hpp"
#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "proto/revocations.hpp"
#include "proto/waiting.hpp"

namespace ferry::proto {
class Engine;
}

namespace ferry::coll {

// The tag of a collective message: the reserved bit, the communicator id (23 bits), the
// collective's sequence number (24 bits); the low 16 bits stay zero.
inline constexpr int kIdBits = 23;
// Ids with this bit are the stream twins of the others (Group::stream_twin); with this one too,
// their kernel twins (Group::kernel_twin). A communicator's own id is below kIdLimit.
inline constexpr std::uint32_t kStreamTwinBit = 1u << (kIdBits - 1);
inline constexpr std::uint32_t kKernelTwinBit = 1u << (kIdBits - 2);
inline constexpr std::uint32_t kIdLimit = kKernelTwinBit;
inline constexpr Tag tag_of(std::uint32_t id, std::uint32_t sequence) {
  return kReservedTagBit | (Tag{id & ((1u << kIdBits) - 1)} << 40) |
         (Tag{sequence & 0xffffffu} << 16);
}
// The low bits of an agreement's messages (agreement.cpp), whose sequence is the agreement's
// own number: no collective's tag has them (a stream send's has bit 0 alone).
inline constexpr Tag kAgreementTag = 0x4000;

// `count` elements cut into n blocks whose sizes differ by at most one (the first count % n have
// one more): the ring's blocks, and the shares of an allreduce split in the node's area.
struct Blocks {
  Blocks(std::size_t count, int n, std::size_t element)
      : base(count / static_cast<std::size_t>(n)),
        extra(count % static_cast<std::size_t>(n)),
        element(element) {}
  [[nodiscard]] std::size_t elements(int b) const {
    return base + (static_cast<std::size_t>(b) < extra ? 1 : 0);
  }
  [[nodiscard]] std::size_t bytes(int b) const { return elements(b) * element; }
  [[nodiscard]] std::size_t offset(int b) const {
    const auto ub = static_cast<std::size_t>(b);
    return (ub * base + std::min(ub, extra)) * element;
  }
  std::size_t base, extra, element;
};

// The collectives the node's shared area runs.
enum class Kind : std::uint8_t {
  kBarrier = 1,
  kBroadcast,
  kAllreduce,
  kAllgather,
  kReduceScatter,
  kReduce
};

class Group : public std::enable_shared_from_this<Group> {
 public:
  // Every rank of the job.
  static std::shared_ptr<Group> world(proto::Engine* engine);

  [[nodiscard]] proto::Engine* engine() const { return engine_; }
  // Its Context is gone (the Communicator outlived it): nothing of the engine may be touched.
  [[nodiscard]] bool detached() const { return *handle_ == nullptr; }
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return static_cast<int>(members_.size()); }
  [[nodiscard]] int member(int rank) const { return members_[static_cast<std::size_t>(rank)]; }
  [[nodiscard]] const std::vector<int>& members() const { return members_; }
  // Its id in the tags of its messages.
  [[nodiscard]] std::uint32_t id() const { return id_; }
  // "#17 on communicator 3" (its last collective's number; "on communicator 3's stream twin"):
  // which call of which communicator, as every member numbers them, for messages.
  [[nodiscard]] std::string call_label(std::uint32_t sequence) const;
  [[nodiscard]] std::uint32_t last_sequence() const { return sequence_ - 1; }
  // FERRY_TIMEOUT in seconds (0: none).
  [[nodiscard]] double timeout() const { return timeout_; }
  // "member 2 (rank 5)", for messages.
  [[nodiscard]] std::string peer_label(int m) const;
  // The member whose finalize notice came first (it joins no more calls), or -1.
  [[nodiscard]] int first_departed() const;
  // "member 2 (rank 5) finalized (its Context ended) without joining it", for messages.
  [[nodiscard]] std::string departed_label(int m) const;

  // Null for Communicator::kUndefined. Throws ferry::Error.
  std::shared_ptr<Group> split(int color, int key);

  // ---- Surviving failures (agreement.cpp; Communicator's revoke, agree, shrink) ----
  // Revoked here or by a member: every collective of it (and of its stream twin) fails.
  [[nodiscard]] bool revoked() {
    if (revocations_->epoch() != revoke_epoch_) {
      revoke_epoch_ = revocations_->epoch();
      revoked_ = revocations_->why(base_id()) != nullptr;
    }
    return revoked_;
  }
  // kRevoked for `what` ("allreduce of ..."), saying who revoked the communicator.
  [[nodiscard]] Status revoked_status(const std::string& what) const;
  void revoke();
  // The members this rank knows to have failed (after asking the transports), ascending.
  std::vector<int> failed_members();
  // A fault-tolerant agreement of the members still alive: *flag becomes the AND of their flags,
  // *failed (unless null) the members they count as failed; the same on every survivor.
  Status agree(std::uint64_t* flag, std::vector<int>* failed);
  // A communicator of the members that survive, agreed by them. Throws ferry::Error.
  std::shared_ptr<Group> shrink();
  // The communicator that runs this one's stream-ordered operations (proto/stream_ops.hpp), so
  // that they never interleave with its host-synchronous collectives: the same members, and an
  // id that every member derives alike (kStreamTwinBit), made without a message.
  std::shared_ptr<Group> stream_twin();
  // The communicator whose one-shot area (oneshot(), in its on-stream mode) runs this one's
  // stream allreduces as kernels on the application's stream: its collectives are only the
  // area's set-up, made by the thread that makes the first such call (kKernelTwinBit).
  std::shared_ptr<Group> kernel_twin();

  // Runs a collective that `build(Plan&)` describes (one of the algorithms below, which return
  // what is wrong with their arguments): start() behind a Request, advanced by the engine; run()
  // now, waiting (and withdrawing it under FERRY_TIMEOUT).
  template <class Build>
  Request start(Build&& build) {
    auto schedule = std::make_unique<Schedule>(shared_from_this(), next_tag());
    if (Status bad = build(*schedule); !bad.is_ok()) return failed(std::move(bad));
    schedule->next_round();  // closes the last round, if the algorithm left it open
    return start_schedule(std::move(schedule));
  }
  template <class Build>
  Status run(Build&& build) {
    Immediate now(this, next_tag(), timeout_);
    const proto::Waiting::Note note = waiting_note(&now);
    if (Status bad = build(now); !bad.is_ok()) return bad;
    return now.finish();
  }

  // The algorithms (algorithms.cpp): they describe the collective for this member.
  Status barrier(Plan& p);
  Status broadcast(Plan& p, void* buffer, std::size_t count, DataType type, int root);
  Status reduce(Plan& p, const void* send, void* recv, std::size_t count, DataType type,
                ReduceOp op, int root);
  Status allreduce(Plan& p, const void* send, void* recv, std::size_t count, DataType type,
                   ReduceOp op);
  Status allgather(Plan& p, const void* send, void* recv, std::size_t count, DataType type);
  Status allgatherv(Plan& p, const void* send, void* recv, std::span<const std::size_t> counts,
                    std::span<const std::size_t> displacements, DataType type);
  Status reduce_scatter(Plan& p, const void* send, void* recv, std::size_t count, DataType type,
                        ReduceOp op);
  Status alltoallv(Plan& p, const void* send, std::span<const std::size_t> send_counts,
                   std::span<const std::size_t> send_displacements, void* recv,
                   std::span<const std::size_t> recv_counts,
                   std::span<const std::size_t> recv_displacements, DataType type,
                   const char* name);
  Status gather(Plan& p, const void* send, void* recv, std::size_t count, DataType type, int root);
  Status scatter(Plan& p, const void* send, void* recv, std::size_t count, DataType type, int root);

  // The one-shot device allreduce of this group (coll/device_oneshot.hpp).
  [[nodiscard]] DeviceOneShot& oneshot() { return *oneshot_; }
  // A stream twin's sends and receives by kernels (coll/stream_p2p.hpp), made on first use.
  StreamP2p& stream_p2p();
  ~Group();

  // The blocking form's shortcut, once the area is set up: runs the call through the area (and
  // returns true, *status its outcome) where Group's algorithm would, with arguments it accepts;
  // returns false for everything else, which then goes through run(). For barrier and
  // broadcast, `send` is unused (broadcast's buffer is `recv`).
  bool quick(Status* status, Kind kind, const void* send, void* recv, std::size_t count,
             DataType type, ReduceOp op, int root);

  // Storage an Immediate reuses from one collective to the next.
  std::unique_ptr<Reusable> take_reusable() {
    return reusable_ ? std::move(reusable_) : std::make_unique<Reusable>();
  }
  void give_back(std::unique_ptr<Reusable> reusable) { reusable_ = std::move(reusable); }

  // A Request that failed at its start.
  Request failed(Status status);
  // What a blocking collective waits for, on the job's wait board (proto/waiting.hpp).
  proto::Waiting::Note waiting_note(const Immediate* call);

  // Whether FERRY_COLL_ALLREDUCE forces an algorithm; whether an allreduce takes the ring's
  // order (else recursive doubling's).
  [[nodiscard]] bool allreduce_forced() const { return allreduce_ != 0; }
  [[nodiscard]] bool allreduce_by_ring(std::size_t bytes, std::size_t count) const {
    return allreduce_ == 2 || (allreduce_ == 0 && bytes >= small_ && count >= members_.size());
  }
  // Whether a device call of `kind` (Cuda::OneShot's count) may take the kernels of the one-shot
  // area where they are set up: no algorithm is forced (a reduce's kernel also keeps the host
  // algorithm's order, reduce_by_ring).
  [[nodiscard]] bool by_device_kernel(cuda::Cuda::OneShot::Kind kind, std::size_t count) const {
    switch (kind) {
      case cuda::Cuda::OneShot::Kind::kAllreduce:
        return allreduce_ == 0 && count > 0;
      case cuda::Cuda::OneShot::Kind::kAllgather:
        return allgather_ == 0;
      case cuda::Cuda::OneShot::Kind::kBroadcast:
        return broadcast_ == 0;
      case cuda::Cuda::OneShot::Kind::kReduce:
        return reduce_ == 0;
      case cuda::Cuda::OneShot::Kind::kReduceScatter:
        return true;
    }
    return false;
  }
  // Whether a reduce takes the ring's order (else the binomial tree's).
  [[nodiscard]] bool reduce_in_ring_order(std::size_t bytes) const { return reduce_by_ring(bytes); }
  // Its id without the twins' bits: a communicator and its twins are revoked together.
  [[nodiscard]] std::uint32_t base_id() const { return id_ & ~(kStreamTwinBit | kKernelTwinBit); }

 private:
  struct Ids;  // the communicator ids this process has used
  Group(proto::Engine* engine, std::vector<int> members, int rank, std::uint32_t id,
        std::shared_ptr<Ids> ids);
  // The tag of the next collective (every member numbers them alike).
  Tag next_tag() { return tag_of(id_, sequence_++); }
  // What the survivors of an agreement decided (agreement.cpp).
  struct Agreed {
    std::uint64_t flag = 0;
    std::uint64_t next_id = 0;  // the largest next free communicator id among them
    std::vector<bool> failed;   // by member
  };
  Status agreement(std::uint64_t flag, const char* name, Agreed* agreed);
  Request start_schedule(std::unique_ptr<Schedule> schedule);
  // What is wrong with the arguments, or ok. Places the plan where its buffers are (host memory
  // or one GPU), which every call of one collective must agree on.
  Status check(Plan& p, const char* name, std::initializer_list<const void*> buffers,
               std::size_t elements, DataType type, int root = 0);
  // The blocks of a v-collective's buffer: each block's end (displacement + count, in
  // elements) must fit the address space from `buffer`.
  static Status check_blocks(const char* name, const void* buffer,
                             std::span<const std::size_t> counts,
                             std::span<const std::size_t> displacements, DataType type);
  // "host memory", "on cuda:1"
  static std::string where(int device);
  // The algorithms' choices by size (FERRY_COLL_SMALL, FERRY_COLL_CHUNK) or by a forced algorithm
  // (FERRY_COLL_<KIND>=2): the bandwidth algorithm against the latency one, which the node's area
  // may stand in for. One place for both the algorithms and the blocking shortcut (quick).
  bool broadcast_by_chain(std::size_t bytes) const {
    return broadcast_ == 2 ||
           (broadcast_ == 0 && bytes >= small_ && bytes >= 2 * chunk_ && members_.size() > 2);
  }
  // The pieces a ring reduce-scatter moves its blocks in: on the host FERRY_COLL_CHUNK, so the
  // reduction finds a received piece in the cache (2 ranks, 16 MiB allreduce, this VM: 5.6-6.5
  // GB/s bus bandwidth against 3.9-4.8 in whole blocks); on a GPU whole blocks (a round there
  // costs a kernel and its completion).
  [[nodiscard]] std::size_t ring_piece(const Plan& p) const {
    return p.device() == Plan::kHost ? chunk_ : SIZE_MAX;
  }
  // A blocking host broadcast among members of one node that streams through the node's area
  // (NodeCollectives::stream_broadcast): with 3 or more members above its slots, or where the chain
  // of messages would be taken (1 MiB, 3 ranks: 42 us streamed, 120-164 by the chain); with two
  // from 2 MiB, where below one message's single copy is faster (128 KiB: 9-10 us against 17-20
  // streamed; 2 MiB: 205-229 us against 237-247 on this VM).
  bool broadcast_by_stream(std::size_t bytes) const {
    return broadcast_ == 0 &&
           (members_.size() > 2 ? bytes > nodes_->bytes() || broadcast_by_chain(bytes)
                                : bytes >= (2u << 20));
  }
  bool reduce_by_ring(std::size_t bytes) const {
    return reduce_ == 2 || (reduce_ == 0 && bytes >= small_ && members_.size() > 2);
  }
  // `bytes` is one member's contribution.
  bool allgather_by_ring(std::size_t bytes) const {
    return allgather_ == 2 || (allgather_ == 0 && bytes * members_.size() >= small_);
  }

  proto::Engine* engine_;
  std::shared_ptr<proto::Engine*> handle_;  // null once the engine is gone
  std::vector<int> members_;
  int rank_;
  std::uint32_t id_;
  std::uint32_t sequence_ = 0;
  std::shared_ptr<Ids> ids_;
  std::unique_ptr<Reusable> reusable_;
  std::size_t small_;  // FERRY_COLL_SMALL
  int allreduce_, broadcast_, reduce_, allgather_;
  std::size_t chunk_;
  double timeout_;  // FERRY_TIMEOUT
  std::unique_ptr<DeviceOneShot> oneshot_;
  std::unique_ptr<StreamP2p> p2p_;
  std::unique_ptr<NodeCollectives> nodes_;
  std::shared_ptr<Group> twin_;         // stream_twin(), made on first use
  std::shared_ptr<Group> kernel_twin_;  // kernel_twin(), made on first use
  proto::Revocations* revocations_;
  std::uint64_t revoke_epoch_ = 0;  // revocations_'s epoch when revoked_ was last asked
  bool revoked_ = false;
  std::uint32_t agreements_ = 0;  // agreements run (agree, shrink): every member numbers alike
};

struct Group::Ids {
  std::uint32_t next = 1;  // 0 is the world
};

}  // namespace ferry::coll
