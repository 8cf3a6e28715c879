// Tells a registration cache when memory it registered is unmapped, remapped or discarded, so that
// a later buffer at the same address is not taken for the old one (a NIC that pinned the old pages
// would read stale data). The kernel reports it through userfaultfd: each cached range is watched
// in write-protect mode (no page is ever write-protected, so no fault is ever raised) with the
// unmap, remove (madvise) and remap events on. A thread of the monitor's own reads the events,
// since the thread that unmaps waits in the kernel until its event is read.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry::mem {

struct AddressRange {
  std::uintptr_t begin = 0;
  std::uintptr_t end = 0;  // one past the last byte
  [[nodiscard]] bool overlaps(std::uintptr_t b, std::uintptr_t e) const {
    return b < end && begin < e;
  }
};

class UnmapMonitor {
 public:
  // The process's monitor, shared by every cache that uses it; null (with *why) where the kernel
  // refuses userfaultfd (a seccomp filter, an old kernel): callers then cache nothing.
  static std::shared_ptr<UnmapMonitor> shared(std::string* why);
  ~UnmapMonitor();
  UnmapMonitor(const UnmapMonitor&) = delete;
  UnmapMonitor& operator=(const UnmapMonitor&) = delete;

  // Watches the pages [begin, end) lie on. False (with *why) where the kernel refuses this memory
  // (a file mapping, a range another monitor watches): it must not be cached. Watching splits
  // the mapping at those page bounds until unwatch (an mremap across a bound fails meanwhile).
  bool watch(std::uintptr_t begin, std::uintptr_t end, std::string* why);
  // Ends a watch() of the same range once no other watch of it, or over it, remains.
  void unwatch(std::uintptr_t begin, std::uintptr_t end);
  // Each cache reads the events through a subscription of its own; -1 when kSubscribers are
  // taken (that cache then caches nothing).
  int subscribe();
  void unsubscribe(int subscriber);
  // Appends what was unmapped, discarded or moved since the subscriber's last call. *everything:
  // more events came than the monitor could keep: treat every range as gone.
  void drain(int subscriber, std::vector<AddressRange>* gone, bool* everything);
  // Events seen so far (tests).
  [[nodiscard]] std::uint64_t events() const;

 private:
  explicit UnmapMonitor(int fd, int stop_fd);
  void run();
  // Reads every queued event into ring_; the caller holds mutex_. Allocates nothing: a thread
  // that unmaps watched memory waits for this read, and so would an allocation made here.
  void read_events_locked();

  static constexpr std::size_t kRing = 512;
  static constexpr std::size_t kSubscribers = 8;
  struct Subscriber {
    bool used = false;
    bool overflow = false;
    std::size_t queued = 0;
    AddressRange ring[kRing];
  };
  int fd_;
  int stop_fd_;
  mutable std::mutex mutex_;  // the event rings (never held while allocating)
  std::mutex watch_mutex_;    // watched_ (never taken by the event thread)
  std::map<std::pair<std::uintptr_t, std::uintptr_t>, int> watched_;  // page ranges, counted
  std::unique_ptr<Subscriber[]> subscribers_;  // made once: the event path allocates nothing
  std::uint64_t events_ = 0;
  std::thread thread_;
};

}  // namespace ferry::mem
