// ferry's device kernels (kernels.cu, embedded as a fatbin) as the host launches them: the module
// loaded per device on first use, and the copy, reduction and one-shot allreduce kernels queued
// on a device's lanes with tickets like any copy's.
#pragma once

#include "cuda/impl/devices.hpp"

namespace ferry::cuda {

class Launches {
 public:
  Launches(Devices& devices, const util::Config& config);

  // Cuda::kernels_missing: empty once the module is loaded on `ordinal`, else why it is not.
  std::string missing(int ordinal);
  // Cuda::copy_device_async: the copy kernel for a stream of mid-sized copies, else the engine.
  Status copy_device(int ordinal, int lane, void* dst, const void* src, std::size_t bytes,
                     bool streaming, Ticket* ticket);
  Status reduce(int ordinal, int lane, void* out, const void* a, const void* b, std::size_t count,
                DataType type, ReduceOp op, Ticket* ticket);
  Status allreduce_oneshot(int ordinal, int lane, const Cuda::OneShot& call, Ticket* ticket);
  Status collective_on_stream(void* stream, int ordinal, const Cuda::OneShot& call);
  Status scale_on_stream(void* stream, int ordinal, void* out, const void* in, std::size_t count,
                         DataType type, const Cuda::Scale& scale);
  Status p2p_on_stream(void* stream, int ordinal, std::span<const Cuda::P2pOp> ops,
                       const Cuda::P2pRing& ring, void* words, std::uint64_t timeout_ns,
                       void* scratch, const Cuda::P2pRelease* release);

 private:
  Devices& devices_;
  const Driver* d_;
  std::size_t kernel_copy_from_;  // FERRY_CUDA_IPC_KERNEL_COPY (0: never)
  std::size_t kernel_copy_max_;   // FERRY_CUDA_IPC_KERNEL_COPY_MAX
};

}  // namespace ferry::cuda
