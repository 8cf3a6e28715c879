// The one-shot device allreduce of one Group (cuda.hpp, kernels.cu): every member's exchange area
// in device memory, mapped by every other member by CUDA IPC; the stop words a failed collective
// raises; the two-shot kernel for two members' large calls; and the resident kernel that takes
// blocking calls of one block without a launch. Set up by the first call that can use it (a
// collective: every member decides alike), released with the Group or, before, when its engine
// goes (a Communicator may outlive its Context).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "coll/schedule.hpp"
#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "util/config.hpp"

namespace ferry::coll {

class Group;

class DeviceOneShot {
 public:
  DeviceOneShot(Group& group, const util::Config& config);
  ~DeviceOneShot();
  DeviceOneShot(const DeviceOneShot&) = delete;
  DeviceOneShot& operator=(const DeviceOneShot&) = delete;

  // Whether it can run `count` elements of `type` on `device` for this group, setting it up on
  // first use (a collective: every member makes the same call at the same point, so the answer
  // is the same everywhere).
  bool ready(int device, std::size_t count, DataType type);
  // The next call's number (the same on every member).
  std::uint64_t next() { return ++state_->sequence; }
  Status launch(const Execution::Action& action, DataType type, ReduceOp op, int lane,
                bool blocking, cuda::Ticket* ticket);
  // After a one-shot kernel finished: a mismatch it saw between the members' calls, or ok.
  Status outcome();
  // Tells a one-shot kernel to stop waiting for its peers, and stops using the path.
  void stop();
  // Whether a call of `bytes` takes the two-shot kernel (two members, FERRY_COLL_DEVICE_TWOSHOT).
  [[nodiscard]] bool by_twoshot(std::size_t bytes) const;

 private:
  struct State {
    bool usable = false;
    int device = -1;
    void* area = nullptr;                                    // ours, device memory
    cuda::IpcKey key;                                        // of our area
    std::array<void*, cuda::Cuda::kOneShotMembers> areas{};  // every member's, mapped here
    std::vector<std::pair<int, cuda::IpcKey>> mapped;        // (job rank, key) to unpin
    unsigned* words = nullptr;                               // host side of the stop words
    void* words_device = nullptr;
    std::uint64_t sequence = 0;
    // The resident kernel (cuda.hpp, resident_open) for blocking calls of one block, or -1.
    int resident = -1;
    bool shared = false;  // off because members share a GPU
    // Blocks per launched call: kOneShotBlocks divided by the most members on one GPU (so where
    // they share one under MPS, every member's blocks fit on it at once).
    unsigned max_blocks = cuda::Cuda::kOneShotBlocks;
    cuda::Ticket last_launch;  // of the last launched one-shot kernel, if `launched`
    bool launched = false;
  };
  // Each member makes its exchange area, they swap IPC keys and map each other's, then agree
  // that every member succeeded.
  Status prepare(int device);
  void prepare_resident();
  void release();

  Group& group_;
  std::size_t bytes_;             // FERRY_COLL_DEVICE_ONESHOT, per peer
  std::size_t slice_;             // FERRY_COLL_DEVICE_ONESHOT_SLICE
  std::size_t twoshot_from_;      // FERRY_COLL_DEVICE_TWOSHOT
  std::uint64_t resident_us_;     // FERRY_COLL_DEVICE_RESIDENT
  bool shared_gpu_;               // FERRY_COLL_DEVICE_SHARED_GPU
  std::unique_ptr<State> state_;  // set up by the first ready() on a device
};

}  // namespace ferry::coll
