// Accesses to the application's registered memory that a fault ends with an error instead of the
// process. A peer's put, get or atomic that this process applies (by messages) touches memory the
// application registered and may have unmapped or made read-only since: the access runs under a
// SIGSEGV/SIGBUS handler that, for a fault inside the range being accessed on this thread, jumps
// back out of it. Any other fault goes to the handler that was there before (or ends the process
// as before). A check per access (msync, process_vm_writev on itself) cost a system call each:
// puts by messages 22 -> 6.5 GB/s, 8-byte atomics 0.08 -> 0.31 us on this VM.
//
// The handler is installed on first use (install()); an application that installs its own
// SIGSEGV handler afterwards takes faults back from it, and those accesses fault as before.
#pragma once

#include <csetjmp>
#include <cstddef>
#include <cstdint>
#include <string>

#include "mem/host_access.hpp"

#if defined(__SANITIZE_THREAD__)
#define FERRY_UNDER_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define FERRY_UNDER_TSAN 1
#endif
#endif

namespace ferry::mem {

struct FaultGuard {
  sigjmp_buf jump;
  std::uintptr_t low = 0;  // the range being accessed: a fault inside it ends the access
  std::uintptr_t high = 0;
  volatile bool armed = false;
};

// This thread's guard (made on first use, before any fault can need it).
FaultGuard& fault_guard();
// Installs the handler once per process; false if it could not be (the accesses then fault).
bool install_fault_handler();

enum class Touch { kRead, kWrite };

// Runs `access`, which touches [address, address + bytes) as `touch` says and nothing else that
// can fault; false when a fault inside that range ended it (what it wrote before the fault stays
// written).
//
// Under ThreadSanitizer the range is looked up in the process's mappings first and the access
// is not run if it would fault: TSan's atomics hold a lock of the runtime around the access, a
// jump out of a fault there leaves it held, and the next atomic on that word waits forever. (A
// parse of /proc/self/maps per access: TSan builds only.)
template <typename Access>
[[nodiscard]] bool guarded(const void* address, std::size_t bytes, Touch touch, Access&& access) {
#ifdef FERRY_UNDER_TSAN
  std::string why;
  const HostAccess now = host_access(address, bytes, &why);
  if (now == HostAccess::kUnmapped || (touch == Touch::kWrite && now != HostAccess::kReadWrite)) {
    return false;
  }
#else
  (void)touch;
#endif
  FaultGuard& guard = fault_guard();
  guard.low = reinterpret_cast<std::uintptr_t>(address);
  guard.high = guard.low + bytes;
  if (sigsetjmp(guard.jump, 0) != 0) {  // the handler jumped back: the access faulted
    guard.armed = false;
    return false;
  }
  guard.armed = true;
  access();
  guard.armed = false;
  return true;
}

// Reads one byte of every page of the range under the guard: false if some page cannot be read
// (before the transport streams a get's answer from it, which it could not stop midway).
[[nodiscard]] bool readable(const void* address, std::size_t bytes);

}  // namespace ferry::mem
