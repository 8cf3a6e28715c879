// Tag matching: the posted-receive queue and the unexpected-message queue. Both are searched in
// arrival order, which is what keeps messages of one sender with matching tags from overtaking.
//
// A short queue is scanned (the common case: a receive or two posted, a message or two early).
// Past kIndexFrom entries each queue also indexes its exact entries by (source, tag), so that a
// receive naming its source and whole tag, or a message meeting exact receives, finds its match
// without a scan: 100,000 unexpected messages taken in reverse tag order cost a lookup each, not
// a scan of the rest. Receives with a wildcard (any source, a partial mask) are scanned, as in
// every MPI.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::proto {

[[gnu::always_inline]] inline bool tag_matches(int want_source, Tag want_tag, Tag mask, int source,
                                               Tag tag) {
  return (want_source == kAnySource || want_source == source) && ((want_tag ^ tag) & mask) == 0;
}

struct PostedRecv {
  int source;
  Tag tag;
  Tag mask;
  std::uint32_t request;
  // Names one source and every tag bit: found by (source, tag) in an indexed queue.
  [[nodiscard]] bool exact() const { return source != kAnySource && mask == kFullMask; }
};

struct Unexpected {
  int source = -1;
  Tag tag = 0;
  std::size_t size = 0;
  bool rendezvous = false;
  bool device = false;        // RTS_DEV: data holds the cuda::IpcKey, if the sender sent one
  std::uint64_t sreq = 0;     // rendezvous: the sender's request
  std::uint64_t address = 0;  // rendezvous: where the data is in the sender
  bool readable = false;      // RTS_READ: `address` and `key` read it (OneSidedReads::read_direct)
  std::uint64_t key = 0;
  std::vector<std::byte> data;  // eager: a copy of the message
};

// Entries in arrival order under increasing sequence numbers, in a vector whose dead front is
// skipped by an offset (a deque cost ~250 instructions per posted-receive match: iterator
// arithmetic and a second lookup to take what the scan found). A taken entry leaves a hole until
// the front passes it, or until holes outnumber the entries (then the queue is compacted), so
// scans stay proportional to the entries left. An emptied queue rewinds to the vector's start.
// Pointers into it last until the next push.
template <typename T>
class Arrivals {
 public:
  struct Entry {
    std::uint64_t seq;
    bool live;
    T value;
  };
  std::uint64_t push(T&& value) {
    entries_.push_back({next_, true, std::move(value)});
    ++live_;
    return next_++;
  }
  // The live entry `seq`, or null.
  T* find(std::uint64_t seq) {
    Entry* e = locate(seq);
    return e != nullptr && e->live ? &e->value : nullptr;
  }
  T take(std::uint64_t seq) { return take_at(*locate(seq)); }
  // Takes a live entry found by a scan of entries().
  T take_at(Entry& entry) {
    T value = std::move(entry.value);
    entry.live = false;
    --live_;
    tidy();
    return value;
  }
  [[nodiscard]] std::size_t size() const { return live_; }
  // The entries from the first not yet passed, holes included (test `live`).
  std::span<Entry> entries() { return std::span<Entry>(entries_).subspan(front_); }
  void clear() {
    entries_.clear();
    front_ = 0;
    live_ = 0;
  }

 private:
  Entry* locate(std::uint64_t seq) {
    if (front_ == entries_.size()) return nullptr;
    const std::uint64_t offset = seq - entries_[front_].seq;
    if (offset < entries_.size() - front_ && entries_[front_ + offset].seq == seq) {
      return &entries_[front_ + offset];
    }
    // Compacted: still in order.
    auto it =
        std::lower_bound(entries_.begin() + static_cast<std::ptrdiff_t>(front_), entries_.end(),
                         seq, [](const Entry& e, std::uint64_t s) { return e.seq < s; });
    return it != entries_.end() && it->seq == seq ? &*it : nullptr;
  }
  void tidy() {
    if (live_ == 0) {
      entries_.clear();  // keeps the capacity: no allocation once warm
      front_ = 0;
      return;
    }
    while (!entries_[front_].live) ++front_;
    const std::size_t held = entries_.size() - front_;
    if (front_ > held || held > 2 * live_ + 64) {
      std::erase_if(entries_, [](const Entry& e) { return !e.live; });
      front_ = 0;
    }
  }
  std::vector<Entry> entries_;
  std::size_t front_ = 0;  // entries_[0, front_) are holes already passed
  std::uint64_t next_ = 0;
  std::size_t live_ = 0;
};

class Matcher {
 public:
  // Queues from this length on are indexed (and stay so until they empty).
  static constexpr std::size_t kIndexFrom = 16;

  void post(const PostedRecv& recv);
  // The first posted receive that matches (removed from the queue).
  std::optional<std::uint32_t> match_posted(int source, Tag tag);
  // Removes a posted receive (cancel); false if it is no longer posted.
  bool remove_posted(std::uint32_t request);

  void add_unexpected(Unexpected&& message);
  // The first unexpected message that a receive with these arguments matches (removed).
  std::optional<Unexpected> take_unexpected(int source, Tag tag, Tag mask);
  [[nodiscard]] const Unexpected* find_unexpected(int source, Tag tag, Tag mask);
  // Every unexpected message, oldest first, the queue emptied (finalize).
  std::vector<Unexpected> take_all_unexpected();
  // Drops the rendezvous announcements of `source` (its data died with it); returns how many.
  std::size_t drop_rendezvous_from(int source);
  // Drops the rendezvous announcement `sreq` of `source`; false if it is not (or no longer) here.
  bool drop_rendezvous(int source, std::uint64_t sreq);

  // A buffer for an unexpected eager message, reusing released ones (no allocation once warm).
  std::vector<std::byte> buffer();
  void recycle(std::vector<std::byte>&& buffer);

  [[nodiscard]] std::size_t posted_count() const { return posted_.size(); }
  [[nodiscard]] std::size_t unexpected_count() const { return unexpected_.size(); }
  // Entries looked at by scans so far: what matching costs, beside a lookup per call.
  [[nodiscard]] std::uint64_t examined() const { return examined_; }

 private:
  struct Key {
    int source;
    Tag tag;
    bool operator==(const Key&) const = default;
  };
  struct KeyHash {
    std::size_t operator()(const Key& k) const noexcept {
      return static_cast<std::size_t>(
          (k.tag * 0x9e3779b97f4a7c15ull) ^
          static_cast<std::uint64_t>(static_cast<std::uint32_t>(k.source)));
    }
  };
  // Sequence numbers of a queue's exact entries by key, oldest first.
  using Index = std::unordered_map<Key, std::deque<std::uint64_t>, KeyHash>;
  static void unindex(Index* index, const Key& key, std::uint64_t seq);

  // Posted receives: all in order; indexed, the exact ones by key and the others' numbers.
  void index_posted();
  void remove_posted_at(std::uint64_t seq);
  Arrivals<PostedRecv> posted_;
  bool posted_indexed_ = false;
  Index posted_exact_;
  std::deque<std::uint64_t> posted_wild_;

  // Unexpected messages (every one has a source and a whole tag).
  void index_unexpected();
  // The first matching message's number, or none.
  std::optional<std::uint64_t> first_unexpected(int source, Tag tag, Tag mask);
  Unexpected take_unexpected_at(std::uint64_t seq);
  Arrivals<Unexpected> unexpected_;
  bool unexpected_indexed_ = false;
  Index unexpected_by_key_;

  std::vector<std::vector<std::byte>> spare_;
  std::uint64_t examined_ = 0;
};

}  // namespace ferry::proto
