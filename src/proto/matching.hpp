// Tag matching: the posted-receive queue and the unexpected-message queue. Both are searched in
// arrival order, which is what keeps messages of one sender with matching tags from overtaking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
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
};

struct Unexpected {
  int source = -1;
  Tag tag = 0;
  std::size_t size = 0;
  bool rendezvous = false;
  bool device = false;        // RTS_DEV: data holds the cuda::IpcKey, if the sender sent one
  std::uint64_t sreq = 0;     // rendezvous: the sender's request
  std::uint64_t address = 0;  // rendezvous: where the data is in the sender
  bool readable = false;      // RTS_READ: `address` and `key` read it (Endpoint::read_direct)
  std::uint64_t key = 0;
  std::vector<std::byte> data;  // eager: a copy of the message
};

class Matcher {
 public:
  void post(const PostedRecv& recv) { posted_.push_back(recv); }
  // The first posted receive that matches (removed from the queue).
  std::optional<std::uint32_t> match_posted(int source, Tag tag);
  // Removes a posted receive (cancel); false if it is no longer posted.
  bool remove_posted(std::uint32_t request);

  void add_unexpected(Unexpected&& message) { unexpected_.push_back(std::move(message)); }
  // The first unexpected message that a receive with these arguments matches (removed).
  std::optional<Unexpected> take_unexpected(int source, Tag tag, Tag mask);
  [[nodiscard]] const Unexpected* find_unexpected(int source, Tag tag, Tag mask) const;
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

 private:
  std::deque<PostedRecv> posted_;
  std::deque<Unexpected> unexpected_;
  std::vector<std::vector<std::byte>> spare_;
};

}  // namespace ferry::proto
