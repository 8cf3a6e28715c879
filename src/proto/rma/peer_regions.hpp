// The initiator's side of direct one-sided access on this node: peers' allocated regions mapped
// here (loads, stores and CPU atomics, no message), and peers' registered regions reached through
// their guard tables (CMA, or a CUDA copy through an IPC mapping). A mapping is made on first use
// and kept until its owner deregisters the region (then swept) or dies. Layout and rules:
// layout.hpp.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "proto/rma/layout.hpp"
#include "proto/rma/target.hpp"
#include "util/fd.hpp"

namespace ferry::proto {
class Engine;
}

namespace ferry::proto::rma {

class Regions;

class PeerRegions {
 public:
  PeerRegions(Engine& engine, const Regions& own, int ranks)
      : engine_(engine), own_(own), peers_(static_cast<std::size_t>(ranks)) {}
  ~PeerRegions() { unmap(-1); }
  PeerRegions(const PeerRegions&) = delete;
  PeerRegions& operator=(const PeerRegions&) = delete;

  // Where a one-sided access of `length` bytes goes when it needs no message: this process's own
  // region, or a peer's allocated region mapped here; *device says whether it is device memory.
  // Null: by active messages; null with *refusal set: refused (a RmaRefusal code). `write`: a
  // put or atomic.
  std::byte* target(const RmaTarget& target, std::size_t length, bool write, std::uint32_t* refusal,
                    bool* device);
  // Where a put or get of `bytes` at `target` can be done now by a CPU copy (mapped host memory,
  // a local buffer in host memory, valid arguments), or null: then it goes through a request,
  // which reports what is wrong.
  std::byte* now(const RmaTarget& target, const void* local, std::size_t bytes, bool local_device,
                 bool write);
  // now()'s answer without its calls, for another access to the peer region that the last direct
  // access reached: the same key (rank, region, secret), in range of both the key's size and the
  // size mapped, the region still registered. Null: ask now() (a first access, another region,
  // device memory, anything it would refuse). `local_device`: whether `local` is device memory,
  // asked only when everything else allows the access.
  template <typename IsDevice>
  [[gnu::always_inline]] std::byte* again(int rank, std::uint64_t region, std::uint64_t secret,
                                          std::size_t key_size, std::uint64_t offset,
                                          const void* local, std::size_t bytes,
                                          IsDevice local_device) const {
    const LastDirect& last = last_direct_;
    if (last.data == nullptr || last.rank != rank || last.region != region ||
        last.secret != secret || bytes == 0 || local == nullptr ||
        offset > std::min(key_size, last.size) || bytes > std::min(key_size, last.size) - offset ||
        std::atomic_ref<std::uint32_t>(*last.live).load(std::memory_order_acquire) == 0 ||
        local_device(local)) {
      return nullptr;
    }
    return last.data + offset;
  }
  // A put or get (request `index`) on a peer's registered region through its guard table: true
  // when done here (host memory by CMA, completed) or started (device memory, a CUDA copy that
  // completes in progress, then access_ended()); false when it goes through the owner.
  // `local_gpu`: the GPU holding `local`, -1 for host memory.
  bool guarded(std::uint32_t index, const RmaTarget& target, void* local, std::size_t bytes,
               bool put, int local_gpu);
  // The end of a started access to `rank`'s guard table (this rank's `ended` counter).
  void access_ended(int rank);
  // Unmaps the peers' regions that their owners deregistered since: a mapping keeps the memory
  // alive (the owner's munmap frees nothing while a peer maps it), so this runs before every new
  // mapping and every few thousand progress calls, and what a deregistration frees is freed
  // once each rank that accessed the region next calls into ferry.
  void sweep();
  [[nodiscard]] bool mapped_any() const { return !mappings_.empty(); }
  // Drops every mapping of `rank`'s memory (-1: of every rank): it died, or the Context ends.
  void unmap(int rank);
  // Why `rank`'s registered memory is not reached directly, for describe_peer (empty: it is).
  [[nodiscard]] std::string refusals(int rank) const;

 private:
  struct Mapping {
    std::byte* mapping = nullptr;
    std::size_t mapping_length = 0;
    std::size_t size = 0;  // the region's, as its header said when mapped (the header may change)
  };
  // The peer region that the last direct access reached, for again(); forgotten with the
  // mapping used last (the mapping gone, the peer failed).
  struct LastDirect {
    int rank = -1;
    std::uint64_t region = 0;
    std::uint64_t secret = 0;
    std::size_t size = 0;
    std::byte* data = nullptr;      // the region's first byte here; null: none
    std::uint32_t* live = nullptr;  // its header's word that deregistration clears
  };
  // Why a peer's memory is not reached directly (empty: it is, or it was not tried yet).
  struct Refused {
    std::string map;     // its allocated regions cannot be mapped here
    std::string cma;     // its registered host memory is not reached by CMA
    std::string device;  // its registered device memory is not mapped here
  };
  void forget_last() {
    last_mapping_ = nullptr;
    last_direct_.data = nullptr;
  }
  // The mapping of a peer's allocated region, made on first use; null: not mappable here.
  const Mapping* map(const RmaTarget& target);
  // A peer's descriptor `fd`, taken with pidfd_getfd; invalid if it cannot be (then the
  // peer's map refusal says why, unless the descriptor is simply closed: a stale key).
  util::Fd descriptor(int rank, int fd);
  // A peer's guard table mapped here, made on first use.
  GuardTable* guard_table(const RmaTarget& target);

  Engine& engine_;
  const Regions& own_;
  std::vector<Refused> peers_;
  std::map<std::pair<int, std::uint64_t>, Mapping> mappings_;  // by (rank, region id)
  // The mapping used last and its key (an 8-byte get is a few dozen instructions: the tree's
  // lookup was a tenth of them).
  const Mapping* last_mapping_ = nullptr;
  std::pair<int, std::uint64_t> last_mapped_{-1, 0};
  LastDirect last_direct_;
  std::map<int, GuardTable*> guard_tables_;  // peers' tables mapped here, by rank
  int guard_index_ = -2;  // this rank's counters in the tables of this node's ranks; -1: none
};

}  // namespace ferry::proto::rma
