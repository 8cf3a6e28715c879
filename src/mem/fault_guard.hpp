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

// Runs `access`, which touches [address, address + bytes) and nothing else that can fault; false
// when a fault inside that range ended it (what it wrote before the fault stays written).
template <typename Access>
[[nodiscard]] bool guarded(const void* address, std::size_t bytes, Access&& access) {
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
