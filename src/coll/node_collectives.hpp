// A communicator's small blocking collectives through the node's shared area (node_area.hpp has
// the area's rules, node_collectives.cpp the calls'): set up on the first call that could use it
// (a collective decision, the same on every member), given up on every member once one leaves it.
// Each call stands in for the latency algorithm of its kind (Group, algorithms.cpp) and gives the
// same bits.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "coll/node_area.hpp"
#include "coll/schedule.hpp"
#include "ferry/ferry.hpp"
#include "util/copy.hpp"

namespace ferry::coll {

class Group;

class NodeCollectives {
 public:
  // `bytes`: the most bytes per member a call may take through the area (FERRY_COLL_NODE, capped
  // by the area's size); 0: never.
  NodeCollectives(Group& group, std::size_t bytes) : g_(group), bytes_(bytes) {}

  // Whether a call of plan `p` with `bytes` per member can go through the area, setting it up on
  // the first call that could.
  bool ready(const Plan& p, std::size_t bytes);
  // Once ready() set the area up: whether it is still used (a member that left it takes the
  // others with it).
  [[nodiscard]] bool set_up() const { return area_ != nullptr; }
  bool usable();
  // The most bytes per member a call may take (the smaller area's, where it is one).
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

  Status barrier();
  // From cma_bytes(), where the root's process lets the others read its memory (CMA,
  // FERRY_SHM_CMA), the root announces its buffer's address instead of copying it into the area;
  // each member copies it straight into its own buffer (one copy, not two), and the root returns
  // once they all have. A member that cannot read it says so, and the root copies it into the area
  // for them (and that member asks no more).
  Status broadcast(void* buffer, std::size_t count, DataType type, int root);
  static constexpr std::size_t kCmaBytes = 16384;
  // Where the kernel's copy is slow (it copies by rep movsb, util::kRepMovsbSlow), the area's two
  // vector copies beat one CMA read up to 64 KiB (AMD EPYC VM, OSU, 2 ranks, 5 interleaved
  // rounds: broadcast 16/32/64 KiB 1.0/1.9/3.8 us against 4.6/6.2/9.9, reduce and allgather
  // alike; from 128 KiB the area's copies leave the cache and CMA is ahead).
  static constexpr std::size_t kCmaBytesSlowCopy = 128 << 10;
  static std::size_t cma_bytes() { return util::kRepMovsbSlow ? kCmaBytesSlowCopy : kCmaBytes; }
  // A broadcast larger than the area's slots, streamed through its ring (ready(p, 0) first).
  Status stream_broadcast(void* buffer, std::size_t count, DataType type, int root);
  // In the order of the ring's reduce-scatter where `ring_order`, else of recursive doubling.
  // With 3 or more members and kSplitBytes or more, each member reduces a block only.
  Status allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                   bool ring_order);
  static constexpr std::size_t kSplitBytes = 16384;
  // From kPiecedBytes per member, a reduce's inputs are posted in pieces (eight, of 4 KiB or
  // more), which the root reduces as they come: the members' copies into the area overlap the
  // root's reduction instead of preceding it. (Broadcast and allgather in pieces were no faster:
  // OSU, 2 and 4 ranks, 16-64 KiB, 3 interleaved rounds; allgather took 1.2-2x as long.)
  static constexpr std::size_t kPiecedBytes = 16384;
  // A reduce between two members reads the other's input by CMA (as broadcast) from cma_bytes() up
  // to kCmaReduceEnd, and goes in pieces from there: the root, which reduces the whole call,
  // then overlaps its reduction with the other's copies (OSU, 2 ranks, 3 interleaved rounds: 1 MiB
  // 92-96 us in pieces, 159-169 by CMA, Open MPI 119-141; 128 and 256 KiB alike either way).
  // Each member reducing half, through the area, was slower from 16 KiB (3.1-3.4 us against 2.0-2.1
  // by CMA): the halves cross between the CPUs' caches twice; so was the other writing half its
  // input into the root's scratch (process_vm_writev) while the root read the other half (16 KiB
  // 3.3-4.1 us, 64 KiB 8.5-10.0 against 5.1-6.1).
  static constexpr std::size_t kCmaReduceEnd = 256 << 10;
  struct Pieces {
    std::size_t size;
    std::uint64_t count;
    [[nodiscard]] std::size_t at(std::uint64_t k) const { return k * size; }
    [[nodiscard]] std::size_t length(std::uint64_t k, std::size_t bytes) const {
      return std::min(size, bytes - at(k));
    }
  };
  static Pieces pieces(std::size_t bytes, std::size_t element) {
    std::size_t size = std::max<std::size_t>(4096, (bytes / 8 + 4095) / 4096 * 4096);
    size = std::max(element, size / element * element);  // whole elements
    return {size, (bytes + size - 1) / size};
  }
  // The slots of the smaller area made where /dev/shm has no room for the whole one.
  static constexpr std::size_t kSmallBytes = 65536;
  Status allgather(const void* send, void* recv, std::size_t count, DataType type);
  // In the order of the ring reduce-scatter: each member reduces its own block of everyone's
  // input (`count` elements each) from the slots.
  Status reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                        ReduceOp op);
  // Every member posts its input, the root alone reduces, in the ring's order where
  // `ring_order`, else the binomial tree's.
  Status reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                int root, bool ring_order);

 private:
  class Call;  // node_call.hpp
  Status reduce_in_pieces(Call& call, const void* send, void* recv, std::size_t count,
                          DataType type, ReduceOp op, int root, bool ring_order);
  Status prepare();
  // Member `root`'s `from` into every other member's `into` (broadcast's comment says how).
  Status pass_by_address(Call& call, const void* from, void* into, std::size_t bytes, int root);
  Status allgather_by_address(Call& call, const void* send, std::byte* out, std::size_t bytes);
  // `bytes` at `address` in member `owner`'s process into `into` by CMA. kUnsupported where CMA
  // is refused (then, or before: from then on this member reads no more and says so), kPeerFailed
  // where the owner is gone.
  Status read_by_address(int owner, void* into, std::uint64_t address, std::size_t bytes);

  Group& g_;
  std::size_t bytes_;
  bool decided_ = false;                  // prepare() ran
  std::unique_ptr<NodeArea> area_;        // null: not used (not decided, not possible, or failed)
  std::uint64_t calls_ = 0;               // calls through the area so far
  std::vector<std::uint64_t> done_seen_;  // each member's `done` word, as last read
  std::vector<const std::byte*> inputs_;  // each member's slot in the current call
  std::vector<const std::byte*> pieces_;  // the same, a piece in (reduce)
  std::vector<std::byte> own_;            // the root's piece of an in-place reduce
  std::uint64_t stream_call_ = 0;         // the last streamed broadcast (0: none yet)
  std::uint64_t stream_pieces_ = 0;       // and its pieces
  std::vector<std::byte> scratch_;
  bool cma_ = false;  // the root of a broadcast announces its address; a reader reads by CMA
};

}  // namespace ferry::coll
