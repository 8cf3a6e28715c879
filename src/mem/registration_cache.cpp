// The registration cache (see registration_cache.hpp).
#include "mem/registration_cache.hpp"

#include <unistd.h>

#include <vector>

#include "util/log.hpp"

namespace ferry::mem {
namespace {

std::string bytes_text(std::size_t bytes) {
  if (bytes >= (std::size_t{1} << 30) && bytes % (std::size_t{1} << 30) == 0) {
    return std::to_string(bytes >> 30) + " GiB";
  }
  if (bytes >= (std::size_t{1} << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes) + " B";
}

}  // namespace

RegistrationCache::RegistrationCache(std::size_t max_entries, std::size_t max_bytes, Register reg,
                                     Deregister dereg, std::shared_ptr<UnmapMonitor> monitor,
                                     std::string why_off)
    : max_entries_(max_entries),
      max_bytes_(max_bytes),
      register_(std::move(reg)),
      deregister_(std::move(dereg)),
      monitor_(std::move(monitor)),
      why_off_(std::move(why_off)) {
  if (max_entries_ == 0) {
    monitor_.reset();
    if (why_off_.empty()) why_off_ = "no entries allowed";
  }
  if (monitor_ != nullptr) {
    subscriber_ = monitor_->subscribe();
    if (subscriber_ < 0) {
      monitor_.reset();
      why_off_ = "every unmap-monitor subscription is taken";
    }
  }
}

RegistrationCache::~RegistrationCache() {
  for (Entry& entry : entries_) {
    deregister_(entry.handle);
    if (entry.cached) monitor_->unwatch(entry.begin, entry.end);
  }
  if (monitor_ != nullptr) monitor_->unsubscribe(subscriber_);
}

void RegistrationCache::invalidate_gone() {
  if (monitor_ == nullptr) return;
  std::vector<AddressRange> gone;
  bool everything = false;
  monitor_->drain(subscriber_, &gone, &everything);
  if (gone.empty() && !everything) return;
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& entry = *it++;
    if (entry.gone) continue;
    bool hit = everything;
    for (const AddressRange& range : gone) hit = hit || range.overlaps(entry.begin, entry.end);
    if (!hit) continue;
    ++stats_.invalidations;
    if (entry.holders > 0) {
      entry.gone = true;  // its holder's transfer is in flight; deregistered when it ends
    } else {
      drop(&entry);
    }
  }
}

void RegistrationCache::drop(Entry* entry) {
  stats_.entries -= 1;
  stats_.bytes -= entry->end - entry->begin;
  deregister_(entry->handle);
  // The mapping's split at the entry's bounds ends with the watch.
  if (entry->cached) monitor_->unwatch(entry->begin, entry->end);
  entries_.erase(entry->self);
}

void RegistrationCache::make_room() {
  // From the least recently used end, skipping held entries.
  auto it = entries_.end();
  while (it != entries_.begin() && (stats_.entries > max_entries_ || stats_.bytes > max_bytes_)) {
    --it;
    if (it->holders > 0) continue;
    auto victim = it++;
    ++stats_.evictions;
    drop(&*victim);
  }
}

RegistrationCache::Entry* RegistrationCache::acquire(const void* data, std::size_t length,
                                                     std::uint64_t access, int* error) {
  static const auto page = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<std::uintptr_t>(data);
  const std::uintptr_t end = begin + (length == 0 ? 1 : length);
  invalidate_gone();
  for (Entry& entry : entries_) {
    if (entry.gone || !entry.cached || entry.begin > begin || entry.end < end ||
        (entry.access & access) != access) {
      continue;
    }
    ++stats_.hits;
    ++entry.holders;
    entries_.splice(entries_.begin(), entries_, entry.self);
    return &entry;
  }
  ++stats_.misses;
  Entry entry;
  entry.begin = begin & ~(page - 1);
  entry.end = (end + page - 1) & ~(page - 1);
  entry.access = access;
  std::string why;
  // Watched before it is registered: an unmap from here on is seen.
  entry.cached = monitor_ != nullptr && monitor_->watch(entry.begin, entry.end, &why);
  if (monitor_ != nullptr && !entry.cached) {
    FERRY_LOG(kDebug, "registration of %zu bytes not cached: %s", length, why.c_str());
  }
  *error = register_(reinterpret_cast<void*>(entry.begin), entry.end - entry.begin, access,
                     &entry.handle);
  if (*error != 0) return nullptr;
  entry.holders = 1;
  entries_.push_front(entry);
  entries_.front().self = entries_.begin();
  stats_.entries += 1;
  stats_.bytes += entry.end - entry.begin;
  make_room();
  return &entries_.front();
}

void RegistrationCache::release(Entry* entry, bool revoke) {
  if (revoke && !entry->gone) {
    entry->gone = true;
    ++stats_.invalidations;
  }
  if (--entry->holders > 0) return;
  if (entry->gone || !entry->cached) {
    drop(entry);
    return;
  }
  make_room();
}

std::string RegistrationCache::describe() const {
  if (monitor_ == nullptr) return "registration cache off (" + why_off_ + ")";
  return "registration cache: " + std::to_string(stats_.entries) + " of " +
         std::to_string(max_entries_) + " entries, " + bytes_text(stats_.bytes) + " of " +
         bytes_text(max_bytes_) + " (unmaps seen by userfaultfd)";
}

}  // namespace ferry::mem
