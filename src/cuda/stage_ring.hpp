// A host-staging ring: pinned shared memory between one sender and one receiver, through which
// device data goes when CUDA IPC cannot be used (device -> slot -> device, or a host side).
// The sender makes it on first use; the receiver maps it on the first fragment and removes the
// name, so nothing stays in /dev/shm once both have it (ferryrun sweeps what a crash leaves).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "util/fd.hpp"

namespace ferry::cuda {

class Cuda;

class StageRing {
 public:
  // Throws ferry::Error naming the file, the size and the reason (kNoResources for a full
  // /dev/shm).
  static std::unique_ptr<StageRing> create(Cuda* cuda, const std::string& name, std::size_t bytes);
  static std::unique_ptr<StageRing> open(Cuda* cuda, const std::string& name,
                                         std::size_t max_bytes);
  ~StageRing();
  StageRing(const StageRing&) = delete;
  StageRing& operator=(const StageRing&) = delete;

  [[nodiscard]] std::byte* data() const { return mapping_.bytes(); }
  [[nodiscard]] std::size_t size() const { return mapping_.length(); }
  void unlink();

  // "/ferry-<job>-<sender>-stage-<receiver>"
  static std::string name(const std::string& job_id, int sender, int receiver);

 private:
  StageRing() = default;
  Cuda* cuda_ = nullptr;
  std::string name_;
  bool linked_ = false;
  bool registered_ = false;
  util::Mapping mapping_;
};

}  // namespace ferry::cuda
