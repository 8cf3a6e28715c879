// The job's wait board (see wait_board.hpp).
#include "util/wait_board.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>

namespace ferry::util {
namespace {

constexpr const char* kMemfdName = "ferry-wait-board";

}  // namespace

WaitBoard::~WaitBoard() {
  if (slots_ != nullptr) ::munmap(slots_, static_cast<std::size_t>(ranks_) * kSlotBytes);
}

std::int64_t WaitBoard::now_ns() {
  timespec t{};
  ::clock_gettime(CLOCK_MONOTONIC, &t);
  return std::int64_t{t.tv_sec} * 1000000000 + t.tv_nsec;
}

bool WaitBoard::create(int ranks, std::string* error) {
  const std::size_t bytes = static_cast<std::size_t>(ranks) * kSlotBytes;
  Fd fd(::memfd_create(kMemfdName, MFD_CLOEXEC));
  if (!fd.valid() || ::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) {
    *error = std::string("cannot make the wait board (memfd_create, ftruncate): ") +
             std::strerror(errno);
    return false;
  }
  void* memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (memory == MAP_FAILED) {
    *error = "cannot map the wait board: " + std::string(std::strerror(errno));
    return false;
  }
  slots_ = static_cast<Slot*>(memory);
  ranks_ = ranks;
  fd_ = std::move(fd);
  return true;
}

bool WaitBoard::adopt(int fd, int ranks) {
  if (fd < 0 || ranks <= 0) return false;
  // Only ferryrun's memfd: a descriptor of the program's own must never be mapped or closed.
  char target[64] = {};
  const std::string link = "/proc/self/fd/" + std::to_string(fd);
  const ssize_t length = ::readlink(link.c_str(), target, sizeof(target) - 1);
  const std::string expected = std::string("/memfd:") + kMemfdName;
  if (length <= 0 || std::strncmp(target, expected.c_str(), expected.size()) != 0) return false;
  struct stat info {};
  const std::size_t bytes = static_cast<std::size_t>(ranks) * kSlotBytes;
  void* memory = MAP_FAILED;
  if (::fstat(fd, &info) == 0 && static_cast<std::size_t>(info.st_size) == bytes) {
    memory = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  }
  ::close(fd);  // ours either way; the mapping stays
  if (memory == MAP_FAILED) return false;
  slots_ = static_cast<Slot*>(memory);
  ranks_ = ranks;
  return true;
}

void WaitBoard::post(int rank, std::int64_t since_ns, const std::string& text) {
  if (slots_ == nullptr || rank < 0 || rank >= ranks_) return;
  Slot& slot = slots_[rank];
  const std::uint32_t sequence = slot.sequence.load(std::memory_order_relaxed);
  slot.sequence.store(sequence + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  slot.pid = static_cast<std::int32_t>(::getpid());
  slot.since_ns = since_ns;
  const std::size_t length = std::min(text.size(), sizeof(slot.text) - 1);
  std::memcpy(slot.text, text.data(), length);
  slot.text[length] = '\0';
  slot.sequence.store(sequence + 2, std::memory_order_release);
}

void WaitBoard::clear(int rank) { post(rank, 0, std::string()); }

std::vector<WaitBoard::Entry> WaitBoard::read() const {
  std::vector<Entry> entries(static_cast<std::size_t>(ranks_));
  const std::int64_t now = now_ns();
  for (int r = 0; r < ranks_; ++r) {
    const Slot& slot = slots_[r];
    Entry& entry = entries[static_cast<std::size_t>(r)];
    for (int attempt = 0; attempt < 100; ++attempt) {
      const std::uint32_t before = slot.sequence.load(std::memory_order_acquire);
      if ((before & 1) != 0) continue;
      char text[sizeof(slot.text)];
      std::memcpy(text, slot.text, sizeof(text));
      const std::int64_t since = slot.since_ns;
      const int pid = slot.pid;
      std::atomic_thread_fence(std::memory_order_acquire);
      if (slot.sequence.load(std::memory_order_relaxed) != before) continue;
      text[sizeof(text) - 1] = '\0';
      entry.pid = pid;
      entry.waited_s = since > 0 ? static_cast<double>(now - since) / 1e9 : 0;
      entry.text = text;
      break;
    }
  }
  return entries;
}

}  // namespace ferry::util
