// Cross Memory Attach: one copy between this process and another one's address space
// (process_vm_readv / process_vm_writev), for the shm transport's zero-copy get and for one-sided
// access to registered host memory. Needs ptrace permission over the other process (same user;
// under Yama, the shm transport lets any process of the job attach: PR_SET_PTRACER).
#pragma once

#include <cstddef>
#include <cstdint>

#include "ferry/status.hpp"

namespace ferry::util {

// Failures say what they mean for the next copy: kUnsupported where CMA is refused (EPERM, EACCES,
// ENOSYS: it will be again), kPeerFailed where the process is gone (ESRCH), kInvalidArgument where
// a range is not mapped (EFAULT: this copy only), kIoError otherwise (transient).
//
// Reads `length` bytes at `remote` in process `pid` into `local`, looping over partial reads.
Status cma_read(int pid, void* local, std::uint64_t remote, std::size_t length);
// Writes `length` bytes from `local` to `remote` in process `pid`, looping over partial writes.
Status cma_write(int pid, std::uint64_t remote, const void* local, std::size_t length);

}  // namespace ferry::util
