// Access checks on this process's own host memory (see host_access.hpp).
#include "mem/host_access.hpp"

#include <linux/futex.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>

#include "util/copy.hpp"
#include "util/fd.hpp"

namespace ferry::mem {
namespace {

std::uintptr_t page_size() {
  static const auto size = static_cast<std::uintptr_t>(::sysconf(_SC_PAGESIZE));
  return size;
}

std::string hex(std::uintptr_t address) {
  char text[32];
  std::snprintf(text, sizeof(text), "%#" PRIxPTR, address);
  return text;
}

// Whether process_vm_writev on this process works here (a seccomp filter may refuse it).
std::atomic<int> g_self_cma{-1};  // -1: not known yet, 0: refused, 1: works

}  // namespace

HostAccess host_access(const void* address, std::size_t bytes, std::string* why) {
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t end = start + bytes;  // the caller checked the range fits
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) {
    // Without the table (a restricted /proc) nothing is known: writes are still checked one by
    // one (checked_write), so assume the best.
    return HostAccess::kReadWrite;
  }
  HostAccess access = HostAccess::kReadWrite;
  std::uintptr_t covered = start;  // every byte below this is mapped readable
  char line[512];
  while (covered < end && std::fgets(line, sizeof(line), maps) != nullptr) {
    std::uintptr_t low = 0, high = 0;
    char perms[8] = {};
    if (std::sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %7s", &low, &high, perms) != 3) continue;
    if (std::strchr(line, '\n') == nullptr) {  // a long path: skip the rest of the line
      int c;
      while ((c = std::fgetc(maps)) != EOF && c != '\n') {
      }
    }
    if (high <= covered) continue;
    if (low > covered || perms[0] != 'r') break;  // a gap, or a part that cannot be read
    if (perms[1] != 'w') access = HostAccess::kReadOnly;
    covered = high;
  }
  std::fclose(maps);
  if (covered < end) {
    *why = "the range " + hex(start) + "-" + hex(end) + " is not all mapped readable (from " +
           hex(covered) + " on)";
    return HostAccess::kUnmapped;
  }
  if (access == HostAccess::kReadOnly) {
    *why = "the range " + hex(start) + "-" + hex(end) + " is not all writable";
  }
  return access;
}

bool still_mapped(const void* address, std::size_t bytes) {
  if (bytes == 0) return true;
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t first = start & ~(page_size() - 1);
  // MS_ASYNC writes nothing back (since Linux 2.6.19); ENOMEM: part of the range is not mapped.
  return ::msync(reinterpret_cast<void*>(first), start + bytes - first, MS_ASYNC) == 0;
}

Status checked_write(void* destination, const void* source, std::size_t bytes) {
  std::size_t done = 0;
  while (done < bytes && g_self_cma.load(std::memory_order_relaxed) != 0) {
    iovec local{const_cast<std::byte*>(static_cast<const std::byte*>(source)) + done, bytes - done};
    iovec remote{static_cast<std::byte*>(destination) + done, bytes - done};
    const ssize_t n = ::process_vm_writev(::getpid(), &local, 1, &remote, 1, 0);
    if (n > 0) {
      g_self_cma.store(1, std::memory_order_relaxed);
      done += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EFAULT) {
      return Status(Code::kInvalidArgument,
                    "the memory at " + hex(reinterpret_cast<std::uintptr_t>(destination) + done) +
                        " is no longer mapped writable (process_vm_writev: Bad address)");
    }
    if (n < 0 && (errno == EPERM || errno == ENOSYS || errno == EACCES)) {
      g_self_cma.store(0, std::memory_order_relaxed);  // refused here: check, then copy
      break;
    }
    return Status(Code::kIoError, std::string("process_vm_writev into this process failed: ") +
                                      (n == 0 ? "no progress" : std::strerror(errno)));
  }
  if (done == bytes) return Status::ok();
  auto* to = static_cast<std::byte*>(destination) + done;
  if (!still_mapped(to, bytes - done)) {
    return Status(
        Code::kInvalidArgument,
        "the memory at " + hex(reinterpret_cast<std::uintptr_t>(to)) + " is no longer mapped");
  }
  util::copy(to, static_cast<const std::byte*>(source) + done, bytes - done);
  return Status::ok();
}

bool word_writable(void* word) {
  // FUTEX_OP_ADD of 0 on *word (uaddr2), then a wake of no one on the same word (uaddr).
  const auto* address = static_cast<std::uint32_t*>(word);
  constexpr int kAddZero = FUTEX_OP(FUTEX_OP_ADD, 0, FUTEX_OP_CMP_EQ, 0);
  const long rc = ::syscall(SYS_futex, address, FUTEX_WAKE_OP | FUTEX_PRIVATE_FLAG, 0, nullptr,
                            address, kAddZero);
  if (rc >= 0) return true;
  if (errno == ENOSYS) return still_mapped(word, 4);  // no futex: mapped is what can be known
  return false;
}

}  // namespace ferry::mem
