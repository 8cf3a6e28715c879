// Tag matching (see matching.hpp).
#include "proto/matching.hpp"

namespace ferry::proto {

std::optional<std::uint32_t> Matcher::match_posted(int source, Tag tag) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (tag_matches(it->source, it->tag, it->mask, source, tag)) {
      std::uint32_t request = it->request;
      // Mostly the oldest: pop_front is far cheaper than deque::erase.
      if (it == posted_.begin()) {
        posted_.pop_front();
      } else {
        posted_.erase(it);
      }
      return request;
    }
  }
  return std::nullopt;
}

bool Matcher::remove_posted(std::uint32_t request) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    if (it->request == request) {
      posted_.erase(it);
      return true;
    }
  }
  return false;
}

std::optional<Unexpected> Matcher::take_unexpected(int source, Tag tag, Tag mask) {
  for (auto it = unexpected_.begin(); it != unexpected_.end(); ++it) {
    if (tag_matches(source, tag, mask, it->source, it->tag)) {
      Unexpected message = std::move(*it);
      if (it == unexpected_.begin()) {
        unexpected_.pop_front();
      } else {
        unexpected_.erase(it);
      }
      return message;
    }
  }
  return std::nullopt;
}

const Unexpected* Matcher::find_unexpected(int source, Tag tag, Tag mask) const {
  for (const auto& message : unexpected_) {
    if (tag_matches(source, tag, mask, message.source, message.tag)) return &message;
  }
  return nullptr;
}

std::vector<Unexpected> Matcher::take_all_unexpected() {
  std::vector<Unexpected> all(std::make_move_iterator(unexpected_.begin()),
                              std::make_move_iterator(unexpected_.end()));
  unexpected_.clear();
  return all;
}

std::size_t Matcher::drop_rendezvous_from(int source) {
  std::size_t before = unexpected_.size();
  std::erase_if(unexpected_,
                [source](const Unexpected& m) { return m.rendezvous && m.source == source; });
  return before - unexpected_.size();
}

bool Matcher::drop_rendezvous(int source, std::uint64_t sreq) {
  return std::erase_if(unexpected_, [&](const Unexpected& m) {
           return m.rendezvous && m.source == source && m.sreq == sreq;
         }) > 0;
}

std::vector<std::byte> Matcher::buffer() {
  if (spare_.empty()) return {};
  std::vector<std::byte> buffer = std::move(spare_.back());
  spare_.pop_back();
  return buffer;
}

void Matcher::recycle(std::vector<std::byte>&& buffer) {
  constexpr std::size_t kMaxSpare = 256;
  constexpr std::size_t kMaxSpareCapacity = 64 * 1024;
  if (spare_.size() < kMaxSpare && buffer.capacity() <= kMaxSpareCapacity) {
    buffer.clear();
    spare_.push_back(std::move(buffer));
  }
}

}  // namespace ferry::proto
