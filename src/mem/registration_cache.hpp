// Keeps memory registrations (a NIC's view of a buffer) for reuse, so that a buffer sent again is
// not registered again. Bounded by entries and bytes (least recently used unheld ones go first);
// an entry whose memory is unmapped, discarded or moved is dropped, as the unmap monitor reports,
// before any lookup can find it. Without a monitor nothing is kept: every registration is made
// for one use. Not thread-safe: its owner serializes calls.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <string>

#include "mem/unmap_monitor.hpp"

namespace ferry::mem {

class RegistrationCache {
 public:
  // Registers [base, base + length) for `access` (a transport's flags); 0, or a negative error.
  using Register =
      std::function<int(void* base, std::size_t length, std::uint64_t access, void** handle)>;
  using Deregister = std::function<void(void* handle)>;

  struct Entry {
    std::uintptr_t begin = 0;  // registered range (page bounds of the buffers it serves)
    std::uintptr_t end = 0;
    std::uint64_t access = 0;
    void* handle = nullptr;
    int holders = 0;
    bool cached = false;  // watched and kept; else deregistered when its holder lets go
    bool gone = false;    // invalidated while held: deregistered at the last release
    std::list<Entry>::iterator self;
  };
  struct Stats {
    std::uint64_t hits = 0;
    std::uint64_t misses = 0;
    std::uint64_t evictions = 0;      // dropped for room
    std::uint64_t invalidations = 0;  // dropped because their memory went away
    std::size_t entries = 0;
    std::size_t bytes = 0;
  };

  // entries == 0 or a null monitor: nothing is kept (`why_off` says why, for describe()).
  RegistrationCache(std::size_t max_entries, std::size_t max_bytes, Register reg, Deregister dereg,
                    std::shared_ptr<UnmapMonitor> monitor, std::string why_off);
  ~RegistrationCache();
  RegistrationCache(const RegistrationCache&) = delete;
  RegistrationCache& operator=(const RegistrationCache&) = delete;

  // A registration covering [data, data + length) with at least `access`, held until release().
  // Null with *error (the registrar's) when registering fails.
  Entry* acquire(const void* data, std::size_t length, std::uint64_t access, int* error);
  // revoke: the registration must not serve anyone after this holder (a withdrawn rendezvous).
  void release(Entry* entry, bool revoke);

  [[nodiscard]] const Stats& stats() const { return stats_; }
  // "registration cache: 3 of 1024 entries, 12 MiB of 16 GiB (unmaps seen by userfaultfd)"
  [[nodiscard]] std::string describe() const;

 private:
  void invalidate_gone();
  void drop(Entry* entry);  // deregisters and forgets an unheld entry
  void make_room();

  std::size_t max_entries_;
  std::size_t max_bytes_;
  Register register_;
  Deregister deregister_;
  std::shared_ptr<UnmapMonitor> monitor_;
  int subscriber_ = -1;
  std::string why_off_;
  std::list<Entry> entries_;  // most recently used first
  Stats stats_;
};

}  // namespace ferry::mem
