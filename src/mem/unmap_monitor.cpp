// The unmap monitor (see unmap_monitor.hpp): a userfaultfd with the non-cooperative events on, and
// a thread that reads them.
#include "mem/unmap_monitor.hpp"

#include <fcntl.h>
#include <linux/userfaultfd.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>

namespace ferry::mem {
namespace {

std::uintptr_t page_size() {
  static const auto size = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

std::string errno_text(const char* call, int error) {
  return std::string(call) + ": " + std::strerror(error) + " (errno " + std::to_string(error) + ")";
}

}  // namespace

std::shared_ptr<UnmapMonitor> UnmapMonitor::shared(std::string* why) {
  static std::mutex mutex;
  static std::weak_ptr<UnmapMonitor> current;
  std::lock_guard lock(mutex);
  if (auto monitor = current.lock()) return monitor;
#ifdef UFFD_USER_MODE_ONLY
  constexpr int kUserModeOnly = UFFD_USER_MODE_ONLY;  // needs no privilege (Linux 5.11)
#else
  constexpr int kUserModeOnly = 1;
#endif
  int fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK | kUserModeOnly));
  if (fd < 0 && errno == EINVAL) {
    fd = static_cast<int>(::syscall(SYS_userfaultfd, O_CLOEXEC | O_NONBLOCK));
  }
  if (fd < 0) {
    *why = errno_text("userfaultfd", errno);
    return nullptr;
  }
  uffdio_api api{};
  api.api = UFFD_API;
  api.features = UFFD_FEATURE_EVENT_UNMAP | UFFD_FEATURE_EVENT_REMOVE | UFFD_FEATURE_EVENT_REMAP;
  if (::ioctl(fd, UFFDIO_API, &api) != 0) {
    *why = errno_text("userfaultfd UFFDIO_API (unmap, remove and remap events)", errno);
    ::close(fd);
    return nullptr;
  }
  const int stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (stop_fd < 0) {
    *why = errno_text("eventfd", errno);
    ::close(fd);
    return nullptr;
  }
  std::shared_ptr<UnmapMonitor> monitor(new UnmapMonitor(fd, stop_fd));
  current = monitor;
  return monitor;
}

UnmapMonitor::UnmapMonitor(int fd, int stop_fd)
    : fd_(fd),
      stop_fd_(stop_fd),
      subscribers_(std::make_unique<Subscriber[]>(kSubscribers)),
      thread_([this] { run(); }) {}

UnmapMonitor::~UnmapMonitor() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const ssize_t n = ::write(stop_fd_, &one, sizeof one);
  thread_.join();
  // Closing the userfaultfd unwatches every range (and wakes nothing: no fault is pending).
  ::close(fd_);
  ::close(stop_fd_);
}

void UnmapMonitor::run() {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
  for (;;) {
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if ((fds[1].revents & POLLIN) != 0) return;
    if ((fds[0].revents & (POLLIN | POLLERR)) != 0) {
      std::lock_guard lock(mutex_);
      read_events_locked();
    }
  }
}

void UnmapMonitor::read_events_locked() {
  for (;;) {
    uffd_msg msg;
    const ssize_t n = ::read(fd_, &msg, sizeof msg);
    if (n != static_cast<ssize_t>(sizeof msg)) return;  // EAGAIN: none left
    ++events_;
    AddressRange range;
    switch (msg.event) {
      case UFFD_EVENT_UNMAP:
      case UFFD_EVENT_REMOVE:
        range = {static_cast<std::uintptr_t>(msg.arg.remove.start),
                 static_cast<std::uintptr_t>(msg.arg.remove.end)};
        break;
      case UFFD_EVENT_REMAP:
        range = {static_cast<std::uintptr_t>(msg.arg.remap.from),
                 static_cast<std::uintptr_t>(msg.arg.remap.from + msg.arg.remap.len)};
        break;
      case UFFD_EVENT_PAGEFAULT: {
        // Never expected (nothing is write-protected); should one come, the faulting thread
        // must not wait: clear the protection of its page and wake it.
        uffdio_writeprotect clear{};
        clear.range.start = msg.arg.pagefault.address & ~(page_size() - 1);
        clear.range.len = page_size();
        clear.mode = 0;
        ::ioctl(fd_, UFFDIO_WRITEPROTECT, &clear);
        continue;
      }
      default:
        continue;
    }
    for (std::size_t i = 0; i < kSubscribers; ++i) {
      Subscriber& subscriber = subscribers_[i];
      if (!subscriber.used) continue;
      if (subscriber.queued == kRing) {
        subscriber.overflow = true;
      } else {
        subscriber.ring[subscriber.queued++] = range;
      }
    }
  }
}

bool UnmapMonitor::watch(std::uintptr_t begin, std::uintptr_t end, std::string* why) {
  const std::uintptr_t page = page_size();
  uffdio_register reg{};
  reg.range.start = begin & ~(page - 1);
  reg.range.len = ((end + page - 1) & ~(page - 1)) - reg.range.start;
  reg.mode = UFFDIO_REGISTER_MODE_WP;
  std::lock_guard lock(watch_mutex_);
  if (::ioctl(fd_, UFFDIO_REGISTER, &reg) != 0) {
    *why = errno_text("userfaultfd UFFDIO_REGISTER", errno);
    return false;
  }
  ++watched_[{reg.range.start, reg.range.start + reg.range.len}];
  return true;
}

void UnmapMonitor::unwatch(std::uintptr_t begin, std::uintptr_t end) {
  const std::uintptr_t page = page_size();
  const std::uintptr_t first = begin & ~(page - 1);
  const std::uintptr_t last = (end + page - 1) & ~(page - 1);
  std::lock_guard lock(watch_mutex_);
  auto it = watched_.find({first, last});
  if (it == watched_.end() || --it->second > 0) return;
  watched_.erase(it);
  // Another watch over any of these pages keeps them all watched (rare: the same buffer
  // registered for two kinds of access, or by two caches).
  for (const auto& [range, count] : watched_) {
    if (range.first < last && first < range.second) return;
  }
  uffdio_range range{first, last - first};
  // Fails harmlessly where the memory is gone already.
  ::ioctl(fd_, UFFDIO_UNREGISTER, &range);
}

int UnmapMonitor::subscribe() {
  std::lock_guard lock(mutex_);
  for (std::size_t i = 0; i < kSubscribers; ++i) {
    Subscriber& subscriber = subscribers_[i];
    if (subscriber.used) continue;
    subscriber.used = true;
    subscriber.queued = 0;
    subscriber.overflow = false;
    return static_cast<int>(i);
  }
  return -1;
}

void UnmapMonitor::unsubscribe(int subscriber) {
  std::lock_guard lock(mutex_);
  subscribers_[static_cast<std::size_t>(subscriber)].used = false;
}

void UnmapMonitor::drain(int id, std::vector<AddressRange>* gone, bool* everything) {
  std::array<AddressRange, kRing> copy;
  std::size_t count = 0;
  {
    std::lock_guard lock(mutex_);
    read_events_locked();
    Subscriber& subscriber = subscribers_[static_cast<std::size_t>(id)];
    count = subscriber.queued;
    std::copy(subscriber.ring, subscriber.ring + count, copy.begin());
    *everything = subscriber.overflow;
    subscriber.queued = 0;
    subscriber.overflow = false;
  }
  gone->insert(gone->end(), copy.begin(), copy.begin() + static_cast<std::ptrdiff_t>(count));
}

std::uint64_t UnmapMonitor::events() const {
  std::lock_guard lock(mutex_);
  return events_;
}

}  // namespace ferry::mem
