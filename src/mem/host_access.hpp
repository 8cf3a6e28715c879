// What this process may do with a range of its own host memory, and writes into it that fail
// instead of faulting. One-sided operations let peers put into, get from and apply atomics to
// memory the application registered: memory it may have registered read-only (to expose data for
// gets), or unmapped since (freed without deregistering). A peer's operation must then fail at the
// peer with an error, never end the owner with SIGSEGV.
#pragma once

#include <cstddef>
#include <string>

#include "ferry/status.hpp"

namespace ferry::mem {

enum class HostAccess { kUnmapped, kReadOnly, kReadWrite };

// From /proc/self/maps: kReadWrite when every byte of the range is mapped readable and
// writable, kReadOnly when readable but not all writable, kUnmapped when some byte is not mapped
// readable (*why then names the first such address). Reads the table once (registration, not a
// data path).
HostAccess host_access(const void* address, std::size_t bytes, std::string* why);

// Whether every page of the range is still mapped (msync: one system call, no page touched).
[[nodiscard]] bool still_mapped(const void* address, std::size_t bytes);

// Copies into this process's own memory with process_vm_writev, so that a destination unmapped
// or made read-only since its registration is an error (kInvalidArgument, "Bad address") and not
// a fault. Where that call is refused (a seccomp filter) it checks still_mapped and copies.
Status checked_write(void* destination, const void* source, std::size_t bytes);

// Whether the aligned 4-byte word at `word` is writable now: the kernel adds 0 to it atomically
// (FUTEX_WAKE_OP, waking nobody), which fails with EFAULT instead of faulting and leaves the word
// and any concurrent atomic on it untouched.
[[nodiscard]] bool word_writable(void* word);

}  // namespace ferry::mem
