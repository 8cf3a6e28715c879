// What this process may do with a range of its own host memory. One-sided operations let peers
// put into, get from and apply atomics to memory the application registered: memory it may have
// registered read-only (to expose data for gets), or unmapped since (freed without deregistering).
// A peer's operation must then fail at the peer with an error, never end the owner with SIGSEGV:
// registration reads the mapping (host_access), and the owner's own accesses run guarded
// (fault_guard.hpp).
#pragma once

#include <cstddef>
#include <string>

namespace ferry::mem {

enum class HostAccess { kUnmapped, kReadOnly, kReadWrite };

// From /proc/self/maps: kReadWrite when every byte of the range is mapped readable and
// writable, kReadOnly when readable but not all writable, kUnmapped when some byte is not mapped
// readable (*why then names the first such address). Reads the table once (registration, not a
// data path).
HostAccess host_access(const void* address, std::size_t bytes, std::string* why);

// Whether every page of the range is still mapped (msync: one system call, no page touched).
[[nodiscard]] bool still_mapped(const void* address, std::size_t bytes);

}  // namespace ferry::mem
