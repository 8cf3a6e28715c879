#include "mem/memory.hpp"

namespace ferry::mem {

std::string to_string(const MemoryInfo& info) {
  switch (info.kind) {
    case MemoryKind::kHost:
      return info.pinned ? "host (pinned)" : "host";
    case MemoryKind::kCudaDevice:
      return "cuda:" + std::to_string(info.device) +
             (info.ipc == IpcKind::kPosixFd ? " (cuMem, shared by descriptor)"
              : info.ipc == IpcKind::kNone  ? " (not IPC-capable)"
                                            : "");
    case MemoryKind::kCudaManaged:
      return "cuda managed";
  }
  return "unknown";
}

}  // namespace ferry::mem
