#include "util/cma.hpp"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <string>

namespace ferry::util {
namespace {

// What a failure means for the next copy (cma.hpp).
Code code_of(int error) {
  switch (error) {
    case EPERM:
    case EACCES:
    case ENOSYS:
      return Code::kUnsupported;  // refused: the same call will be refused again
    case ESRCH:
      return Code::kPeerFailed;  // no such process
    case EFAULT:
      return Code::kInvalidArgument;  // a range not mapped (here or there): this copy only
    default:
      return Code::kIoError;  // ENOMEM and the like: transient
  }
}

Status cma_copy(int pid, void* local, std::uint64_t remote, std::size_t length, bool write) {
  auto* near = static_cast<char*>(local);
  const char* call = write ? "process_vm_writev" : "process_vm_readv";
  std::size_t done = 0;
  while (done < length) {
    iovec local_iov{near + done, length - done};
    iovec remote_iov{reinterpret_cast<void*>(remote + done), length - done};
    const ssize_t n = write ? ::process_vm_writev(pid, &local_iov, 1, &remote_iov, 1, 0)
                            : ::process_vm_readv(pid, &local_iov, 1, &remote_iov, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status(code_of(errno), std::string(call) + " of " + std::to_string(length) +
                                        " bytes " + (write ? "to" : "from") + " pid " +
                                        std::to_string(pid) + " failed: " + std::strerror(errno));
    }
    if (n == 0) {
      return Status(Code::kIoError,
                    std::string(call) + " with pid " + std::to_string(pid) + " made no progress");
    }
    done += static_cast<std::size_t>(n);
  }
  return Status::ok();
}

}  // namespace

Status cma_read(int pid, void* local, std::uint64_t remote, std::size_t length) {
  return cma_copy(pid, local, remote, length, false);
}

Status cma_write(int pid, std::uint64_t remote, const void* local, std::size_t length) {
  return cma_copy(pid, const_cast<void*>(local), remote, length, true);
}

}  // namespace ferry::util
