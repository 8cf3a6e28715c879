// One-sided communication (the rules are ferry::MemoryRegion's): puts, gets and atomics on
// regions, and the parts that carry them. Where the target's bytes are mapped here (this
// process's own regions, peers' allocated regions on this node) an access is a copy or a CPU
// atomic, complete at once; peers' registered memory on this node is reached through their guard
// tables (PeerRegions); other nodes' by the network transport once granted (NativeAccess); and
// everything else by active messages the owner checks and applies in its progress:
//
//   put:    PUT(id, region, secret, offset) + bytes, per fragment  ->  RMA_ACK(id, bytes)
//   get:    GET(id, region, secret, offset, length)  ->  FRAG(id, ...) stream, or RMA_ACK(refusal)
//   atomic: ATOMIC(id, region, secret, offset, op, width) + operand, compare  ->  RMA_ACK(old)
//
// A request completes when the target says the operation is done (puts count the acknowledged
// bytes); the per-peer count of incomplete operations is what flush waits for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "proto/request_pool.hpp"
#include "proto/rma/native.hpp"
#include "proto/rma/peer_regions.hpp"
#include "proto/rma/regions.hpp"
#include "proto/rma/target.hpp"
#include "proto/wire.hpp"

namespace ferry::proto {
class Engine;
}

namespace ferry::proto::rma {

class OneSided {
 public:
  OneSided(Engine& engine, transport::Transport* native, int ranks)
      : engine_(engine),
        regions_(engine),
        peers_direct_(engine, regions_, ranks),
        native_(engine, regions_, native, ranks),
        peers_(static_cast<std::size_t>(ranks)) {}

  // ---- the owner's side ----
  Status register_memory(void* address, std::size_t bytes, std::uint64_t* id, std::uint64_t* secret,
                         RegionAccess* access);
  Status allocate(std::size_t bytes, void** address, std::uint64_t* id, std::uint64_t* secret,
                  int* fd, RegionAccess* access);
  // Revokes native grants, waits for direct accesses begun, cuts short answers to gets still
  // queued from it (their initiators are told), and forgets the region.
  Status deregister(std::uint64_t id);

  // ---- the initiator's side ----
  Request iput(const void* local, std::size_t bytes, const RmaTarget& target);
  Request iget(void* local, std::size_t bytes, const RmaTarget& target);
  Request iatomic(AtomicOp op, std::size_t width, const RmaTarget& target, std::uint64_t operand,
                  void* result, std::uint64_t compare);
  // PeerRegions::again for the API's short path (another access to the peer region accessed
  // last, done in the API layer without a request).
  template <typename IsDevice>
  [[gnu::always_inline]] std::byte* direct_again(int rank, std::uint64_t region,
                                                 std::uint64_t secret, std::size_t key_size,
                                                 std::uint64_t offset, const void* local,
                                                 std::size_t bytes, IsDevice is_device) const {
    return peers_direct_.again(rank, region, secret, key_size, offset, local, bytes, is_device);
  }
  // iatomic's direct case on the peer region accessed last, done here: true when it was; false:
  // ask iatomic (which reports anything wrong).
  bool atomic_again(AtomicOp op, std::size_t width, int rank, std::uint64_t region,
                    std::uint64_t secret, std::size_t key_size, std::uint64_t offset,
                    std::uint64_t operand, void* result, std::uint64_t compare);
  Status flush(int rank);  // -1: every rank

  // ---- the engine's calls ----
  // An active message of one-sided communication (true), or another's (false).
  bool on_am(std::uint8_t id, int source, std::span<const std::byte> data);
  // The answers made while handling one batch of messages go as one message per peer.
  void on_batch_end() {
    if (!ack_peers_.empty()) send_acks();
  }
  [[nodiscard]] bool acks_waiting() const { return !ack_peers_.empty(); }
  int send_acks();
  // A request of one-sided communication completed (flush's count and first error).
  void request_done(const RequestSlot& slot, const Status& status);
  // A native access (request slot) the transport finished.
  void native_ended(int rank, std::uint64_t region) { native_.ended(rank, region); }
  // A CUDA copy of a guarded access to `rank`'s device memory finished.
  void access_ended(int rank) { peers_direct_.access_ended(rank); }
  void peer_failed(int rank);
  // Every few thousand progress calls: lets go of peers' regions deregistered since.
  void sweep() {
    if (peers_direct_.mapped_any()) peers_direct_.sweep();
  }
  [[nodiscard]] std::string describe(int rank, bool native) const;
  // The Context's end: native registrations first (while the transports live), then the rest.
  void close_native() { native_.clear(); }
  void clear();

 private:
  using Rma = RequestSlot::Rma;
  // Per peer: one-sided operations towards it not yet complete, the first failure among those
  // completed since the last flush, and answers to its operations waiting to go.
  struct PeerState {
    std::uint32_t outstanding = 0;
    Status error;
    std::vector<RmaAckHeader> acks;
    std::uint64_t acks_sent = 0;     // answers sent to it so far,
    std::uint64_t ack_messages = 0;  // in this many messages
  };
  // A request for a one-sided operation towards `target`, or a failed one (*early).
  std::uint32_t request(RequestKind kind, Rma rma, const RmaTarget& target, const void* local,
                        std::size_t bytes, Status* early);
  // Completes a one-sided request that needs no message: failed early, empty, refused, or done
  // at once by `apply` on the target's bytes where they are mapped here. False: it goes by
  // messages.
  template <typename Apply>
  bool settled(std::uint32_t index, const RmaTarget& target, std::size_t length, bool write,
               Status early, Apply apply);
  // Moves the bytes of an access where either end may be device memory: by CUDA, waited for,
  // else by the CPU.
  Status move(void* destination, const void* source, std::size_t bytes, bool device);
  // An atomic on a word of a region; one in device memory is read, changed and written back by
  // CUDA copies (atomic only against the other one-sided atomics, which all run here).
  Status atomic(std::byte* word, bool device, AtomicOp op, std::size_t width, std::uint64_t operand,
                std::uint64_t compare, std::uint64_t* previous);
  // A put from, or a get into, device memory by messages goes through the slot's host copy.
  Status bounce(RequestSlot& slot, const void* local, std::size_t bytes, bool put);
  // Answers a put fragment, get or atomic from `peer` (sent by send_acks at the batch's end).
  void ack(int peer, std::uint64_t id, std::uint64_t value, std::uint32_t code);
  void on_put(int source, std::span<const std::byte> data);
  void on_get(int source, std::span<const std::byte> data);
  void on_atomic(int source, std::span<const std::byte> data);
  void on_ack(int source, std::span<const std::byte> data);
  void on_acks(int source, std::span<const std::byte> data);

  Engine& engine_;
  Regions regions_;
  PeerRegions peers_direct_;
  NativeAccess native_;
  std::vector<PeerState> peers_;
  std::vector<int> ack_peers_;  // peers with answers waiting
};

}  // namespace ferry::proto::rma
