// This process's memory regions for one-sided access (the owner's side): the table of registered
// and allocated regions that every access is checked against, and the guard table through which
// peers on this node reach registered memory without the owner (layout.hpp describes both).
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <unordered_map>
#include <vector>

#include "ferry/status.hpp"
#include "mem/memory.hpp"
#include "proto/rma/layout.hpp"
#include "proto/rma/target.hpp"

namespace ferry::proto {
class Engine;
}

namespace ferry::proto::rma {

struct Region {
  std::byte* base = nullptr;
  std::size_t size = 0;
  std::uint64_t secret = 0;
  int fd = -1;  // allocated: the memfd, and its mapping (a header page, then base)
  std::byte* mapping = nullptr;
  std::size_t mapping_length = 0;
  int device = -1;  // device memory: its CUDA ordinal (reached by CUDA copies, never mapped)
  int slot = -1;    // its slot in the guard table (registered regions peers reach directly)
  int ipc_fd = -1;  // device memory exported as a file descriptor, for those peers
  // The application's own host memory (not allocated here, not device memory): it may be
  // unmapped behind the registration, so the owner's accesses run guarded (mem/fault_guard.hpp).
  bool user_host = false;
  bool read_only = false;  // registered while not all writable: puts and atomics refused
};

class Regions {
 public:
  explicit Regions(Engine& engine) : engine_(engine) {}
  ~Regions();
  Regions(const Regions&) = delete;
  Regions& operator=(const Regions&) = delete;

  // The application's memory (host or device); `access`, where given, receives what the key
  // carries (allocate() passes none: its memory is reached by mapping, not by the guard table).
  Status add(void* address, std::size_t bytes, std::uint64_t* id, std::uint64_t* secret,
             RegionAccess* access);
  // Shared memory for one-sided access: *address is the caller's part of it, *fd what peers on
  // this node map.
  Status allocate(std::size_t bytes, void** address, std::uint64_t* id, std::uint64_t* secret,
                  int* fd);
  // Takes a region out of the guard table (waiting for the accesses begun), unmaps allocated
  // memory after clearing its `live` word, and forgets it.
  Status remove(std::uint64_t id);
  // A region's bytes for an access of `length` at `offset` through the key (region, secret), or
  // null with *refusal set (a RmaRefusal). `write`: a put or atomic (refused on read-only memory).
  std::byte* check(std::uint64_t region, std::uint64_t secret, std::uint64_t offset,
                   std::uint64_t length, bool write, std::uint32_t* refusal, bool* device) const;
  [[nodiscard]] const Region* find(std::uint64_t id) const {
    auto it = regions_.find(id);
    return it == regions_.end() ? nullptr : &it->second;
  }
  [[nodiscard]] std::size_t count() const { return regions_.size(); }
  // The Context's end: every region still registered goes (their MemoryRegions outlive it).
  void clear();

 private:
  Status make_guard();
  void release_guard();
  // Gives `region` a slot where peers find it (none where they cannot reach it directly).
  void guard_region(Region* region, std::uint64_t id, const mem::MemoryInfo& info);
  // Clears the slot, waits for the accesses begun, then frees it (and closes `ipc_fd`).
  Status release_guard_slot(int index, int ipc_fd);

  Engine& engine_;
  std::unordered_map<std::uint64_t, Region> regions_;
  std::uint64_t next_region_ = 1;
  std::mt19937_64 secrets_{std::random_device{}()};
  GuardTable* guard_ = nullptr;  // this process's table (made on first registration)
  int guard_fd_ = -1;
  std::vector<int> guard_free_;  // free slots
};

}  // namespace ferry::proto::rma
