// What kind of memory a buffer is, as the protocol layer needs to know it: host memory is read and
// written by the CPU; CUDA device memory only by the GPU (copy engine, kernels) or through an IPC
// mapping. Managed memory is moved by the copy engine too (a CPU copy would migrate its pages to
// the host and back), through host staging since it has no IPC handle.
#pragma once

#include <cstdint>
#include <string>

namespace ferry::mem {

enum class MemoryKind : std::uint8_t { kHost, kCudaDevice, kCudaManaged };

// How a process of the same node can map a device allocation: legacy CUDA IPC (cudaMalloc), or a
// POSIX file descriptor of a cuMem (VMM) allocation made shareable that way. Anything else
// (cudaMallocAsync pools, VMM without a shareable handle type, managed memory) is not mappable.
enum class IpcKind : std::uint8_t { kNone = 0, kLegacy = 1, kPosixFd = 2 };

struct MemoryInfo {
  MemoryKind kind = MemoryKind::kHost;
  bool pinned = false;           // host memory registered with (or allocated by) CUDA
  int device = -1;               // CUDA ordinal of device or pinned memory
  std::uint64_t base = 0;        // the allocation the buffer lies in (for VMM: its mapping)
  std::uint64_t extent = 0;      // its size
  std::uint64_t buffer_id = 0;   // CUDA's id of that allocation: new for every allocation
  IpcKind ipc = IpcKind::kNone;  // device memory: how a local peer can map it

  // Moved by CUDA copies rather than by the CPU.
  [[nodiscard]] bool device_only() const { return kind != MemoryKind::kHost; }
};

// "host", "host (pinned)", "cuda:0", "cuda managed"
std::string to_string(const MemoryInfo& info);

}  // namespace ferry::mem
