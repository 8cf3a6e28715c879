// Tag matching (see matching.hpp).
#include "proto/matching.hpp"

#include <algorithm>

namespace ferry::proto {

void Matcher::unindex(Index* index, const Key& key, std::uint64_t seq) {
  auto bucket = index->find(key);
  if (bucket == index->end()) return;
  std::deque<std::uint64_t>& seqs = bucket->second;
  if (!seqs.empty() && seqs.front() == seq) {
    seqs.pop_front();  // the usual case: the oldest of its key
  } else {
    seqs.erase(std::find(seqs.begin(), seqs.end(), seq));
  }
  if (seqs.empty()) index->erase(bucket);
}

// ---- posted receives ----

void Matcher::post(const PostedRecv& recv) {
  const std::uint64_t seq = posted_.push(PostedRecv(recv));
  if (posted_indexed_) {
    if (recv.exact()) {
      posted_exact_[Key{recv.source, recv.tag}].push_back(seq);
    } else {
      posted_wild_.push_back(seq);
    }
  } else if (posted_.size() >= kIndexFrom) {
    index_posted();
  }
}

void Matcher::index_posted() {
  posted_indexed_ = true;
  for (const auto& entry : posted_.entries()) {
    if (!entry.live) continue;
    if (entry.value.exact()) {
      posted_exact_[Key{entry.value.source, entry.value.tag}].push_back(entry.seq);
    } else {
      posted_wild_.push_back(entry.seq);
    }
  }
}

void Matcher::remove_posted_at(std::uint64_t seq) {
  const PostedRecv recv = posted_.take(seq);
  if (posted_indexed_) {
    if (recv.exact()) {
      unindex(&posted_exact_, Key{recv.source, recv.tag}, seq);
    } else {
      posted_wild_.erase(std::find(posted_wild_.begin(), posted_wild_.end(), seq));
    }
    if (posted_.size() == 0) {
      posted_indexed_ = false;
      posted_exact_.clear();
      posted_wild_.clear();
    }
  }
}

std::optional<std::uint32_t> Matcher::match_posted(int source, Tag tag) {
  if (posted_.size() == 0) return std::nullopt;
  std::optional<std::uint64_t> found;
  if (!posted_indexed_) {
    // Not indexed: nothing to unindex, so what the scan finds is taken where it lies.
    for (auto& entry : posted_.entries()) {
      const PostedRecv& r = entry.value;
      ++examined_;
      if (entry.live && tag_matches(r.source, r.tag, r.mask, source, tag)) {
        return posted_.take_at(entry).request;
      }
    }
    return std::nullopt;
  } else {
    // The older of the oldest exact receive for (source, tag) and the first wildcard that fits.
    if (auto bucket = posted_exact_.find(Key{source, tag}); bucket != posted_exact_.end()) {
      found = bucket->second.front();
    }
    for (std::uint64_t seq : posted_wild_) {
      if (found && seq > *found) break;
      ++examined_;
      const PostedRecv& r = *posted_.find(seq);
      if (tag_matches(r.source, r.tag, r.mask, source, tag)) {
        found = seq;
        break;
      }
    }
  }
  if (!found) return std::nullopt;
  const std::uint32_t request = posted_.find(*found)->request;
  remove_posted_at(*found);
  return request;
}

bool Matcher::remove_posted(std::uint32_t request) {
  for (const auto& entry : posted_.entries()) {
    if (entry.live && entry.value.request == request) {
      remove_posted_at(entry.seq);
      return true;
    }
  }
  return false;
}

// ---- unexpected messages ----

void Matcher::add_unexpected(Unexpected&& message) {
  const Key key{message.source, message.tag};
  const std::uint64_t seq = unexpected_.push(std::move(message));
  if (unexpected_indexed_) {
    unexpected_by_key_[key].push_back(seq);
  } else if (unexpected_.size() >= kIndexFrom) {
    index_unexpected();
  }
}

void Matcher::index_unexpected() {
  unexpected_indexed_ = true;
  for (const auto& entry : unexpected_.entries()) {
    if (entry.live)
      unexpected_by_key_[Key{entry.value.source, entry.value.tag}].push_back(entry.seq);
  }
}

std::optional<std::uint64_t> Matcher::first_unexpected(int source, Tag tag, Tag mask) {
  if (unexpected_.size() == 0) return std::nullopt;
  if (unexpected_indexed_ && source != kAnySource && mask == kFullMask) {
    auto bucket = unexpected_by_key_.find(Key{source, tag});
    if (bucket == unexpected_by_key_.end()) return std::nullopt;
    return bucket->second.front();
  }
  for (const auto& entry : unexpected_.entries()) {
    ++examined_;
    if (entry.live && tag_matches(source, tag, mask, entry.value.source, entry.value.tag)) {
      return entry.seq;
    }
  }
  return std::nullopt;
}

Unexpected Matcher::take_unexpected_at(std::uint64_t seq) {
  Unexpected message = unexpected_.take(seq);
  if (unexpected_indexed_) {
    unindex(&unexpected_by_key_, Key{message.source, message.tag}, seq);
    if (unexpected_.size() == 0) {
      unexpected_indexed_ = false;
      unexpected_by_key_.clear();
    }
  }
  return message;
}

std::optional<Unexpected> Matcher::take_unexpected(int source, Tag tag, Tag mask) {
  const std::optional<std::uint64_t> seq = first_unexpected(source, tag, mask);
  if (!seq) return std::nullopt;
  return take_unexpected_at(*seq);
}

const Unexpected* Matcher::find_unexpected(int source, Tag tag, Tag mask) {
  const std::optional<std::uint64_t> seq = first_unexpected(source, tag, mask);
  return seq ? unexpected_.find(*seq) : nullptr;
}

std::vector<Unexpected> Matcher::take_all_unexpected() {
  std::vector<Unexpected> all;
  for (auto& entry : unexpected_.entries()) {
    if (entry.live) all.push_back(std::move(entry.value));
  }
  unexpected_.clear();
  unexpected_indexed_ = false;
  unexpected_by_key_.clear();
  return all;
}

std::size_t Matcher::drop_rendezvous_from(int source) {
  std::vector<std::uint64_t> doomed;
  for (const auto& entry : unexpected_.entries()) {
    if (entry.live && entry.value.rendezvous && entry.value.source == source) {
      doomed.push_back(entry.seq);
    }
  }
  for (std::uint64_t seq : doomed) take_unexpected_at(seq);
  return doomed.size();
}

bool Matcher::drop_rendezvous(int source, std::uint64_t sreq) {
  for (const auto& entry : unexpected_.entries()) {
    if (entry.live && entry.value.rendezvous && entry.value.source == source &&
        entry.value.sreq == sreq) {
      take_unexpected_at(entry.seq);
      return true;
    }
  }
  return false;
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
