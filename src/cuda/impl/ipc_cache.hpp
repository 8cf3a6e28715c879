// CUDA IPC both ways: exporting this process's allocations (a legacy handle, cached per buffer id,
// or a cuMem allocation's file descriptor), and the bounded, least-recently-used cache of peers'
// allocations opened here. An entry is pinned while a copy uses it; eviction closes only unpinned
// ones, so the cache holds at most FERRY_CUDA_IPC_CACHE_ENTRIES mappings and
// FERRY_CUDA_IPC_CACHE_SIZE bytes beyond those in use.
#pragma once

#include <cuda.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <map>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cuda/impl/devices.hpp"

namespace ferry::cuda {

class IpcCache {
 public:
  IpcCache(Devices& devices, const util::Config& config);
  ~IpcCache();  // closes every mapping
  IpcCache(const IpcCache&) = delete;
  IpcCache& operator=(const IpcCache&) = delete;

  // Cuda's functions of the same names (cuda/cuda.hpp).
  Status export_ipc(const void* pointer, const mem::MemoryInfo& info, IpcKey* key, util::Fd* fd);
  std::string refusal(const std::array<std::byte, 16>& uuid, int local);
  [[nodiscard]] bool cached(int peer, const IpcKey& key, int local) const;
  Status import(int peer, const IpcKey& key, int local, util::Fd* fd, void** mapped);
  void unpin(int peer, int local, const IpcKey& key);
  void forget_peer(int peer);
  // See Cuda::set_rank.
  void set_rank(int rank) { rank_ = rank; }
  [[nodiscard]] bool inject_failure() const { return inject_failure_; }
  [[nodiscard]] std::size_t size() const { return mappings_.size(); }
  [[nodiscard]] std::uint64_t bytes() const { return bytes_; }
  // Cuda's defer_unmaps, close_deferred and deferred_unmaps.
  void defer_unmaps(bool defer) { defer_ = defer; }
  [[nodiscard]] bool deferring_unmaps() const { return defer_; }
  void close_deferred();
  [[nodiscard]] std::size_t deferred() const {
    return deferred_count_.load(std::memory_order_relaxed);
  }

 private:
  // Buffer ids (cudaMalloc) and memory block ids (cuMem) are separate counters: the kind is part
  // of the key, or one allocation could be taken for another at a reused address.
  struct Key {
    int peer;
    int device;
    std::uint64_t base;
    mem::IpcKind kind;
    std::uint64_t buffer_id;
    bool operator<(const Key& o) const {
      return std::tie(peer, device, base, kind, buffer_id) <
             std::tie(o.peer, o.device, o.base, o.kind, o.buffer_id);
    }
  };
  struct Mapping {
    Key key;
    CUdeviceptr mapped;
    std::uint64_t extent;
    int pins;
    mem::IpcKind kind;
    bool own = false;  // the peer is this process: `mapped` is its own pointer, nothing to close
  };
  using Index = std::map<Key, std::list<Mapping>::iterator>;

  // Opens a legacy handle; closes the peer's unpinned mappings that share its memory and tries
  // again where the driver finds it mapped already.
  Status open_handle(int peer, const IpcKey& key, int local, CUdeviceptr* mapped);
  // The peer is this process: the allocation's own address, with `local`'s peer access to it.
  Status share_own(const IpcKey& key, int local, util::Fd* fd, CUdeviceptr* mapped);
  // Imports a peer's cuMem allocation from its descriptor and maps it for `local`.
  Status map_descriptor(const IpcKey& key, int local, util::Fd* fd, CUdeviceptr* mapped);
  // Closes an unpinned mapping and forgets it; returns the next index entry.
  Index::iterator drop(Index::iterator it);
  // Closes it now, or keeps it for close_deferred while closes are deferred.
  void close_mapping(const Mapping& mapping);
  void close_now(const Mapping& mapping);
  void evict();

  Devices& devices_;
  const Driver* d_;
  std::size_t entries_;                                         // FERRY_CUDA_IPC_CACHE_ENTRIES
  std::size_t limit_;                                           // FERRY_CUDA_IPC_CACHE_SIZE
  bool inject_failure_;                                         // FERRY_TEST_CUDA_IPC_FAIL
  int rank_ = -1;                                               // this rank (set_rank)
  std::unordered_map<std::uint64_t, CUipcMemHandle> exported_;  // by buffer id
  std::list<Mapping> mappings_;                                 // most recently used first
  Index index_;
  std::uint64_t bytes_ = 0;
  bool defer_ = false;
  std::vector<Mapping> deferred_;
  std::atomic<std::size_t> deferred_count_{0};  // deferred_.size(), for any thread
};

}  // namespace ferry::cuda
