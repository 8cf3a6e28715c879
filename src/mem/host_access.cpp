// Access checks on this process's own host memory (see host_access.hpp).
#include "mem/host_access.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstring>

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

}  // namespace

HostAccess host_access(const void* address, std::size_t bytes, std::string* why) {
  const auto start = reinterpret_cast<std::uintptr_t>(address);
  const std::uintptr_t end = start + bytes;  // the caller checked the range fits
  std::FILE* maps = std::fopen("/proc/self/maps", "re");
  if (maps == nullptr) {
    // Without the table (a restricted /proc) nothing is known: the accesses themselves are
    // guarded (fault_guard.hpp), so assume the best.
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

}  // namespace ferry::mem
