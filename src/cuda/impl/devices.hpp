// The GPUs this process uses, as the CUDA module's parts share them: each device's primary
// context (retained on first use), its streams ("lanes") and how their copies report completion,
// and the memory the parts keep per device. Every driver call runs in the context of the device it
// concerns (ScopedContext), the caller's own context restored after.
#pragma once

#include <cuda.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cuda/cuda.hpp"
#include "cuda/driver.hpp"

namespace ferry::cuda {

constexpr int kLanesPerDevice = 4;
// Two more streams per device for the host-staged copies (Cuda::copy_staged_async): one from the
// device to host memory, one to the device; tickets number every device's kLaneSlots streams.
constexpr int kStageToHost = kLanesPerDevice;
constexpr int kStageToDevice = kLanesPerDevice + 1;
constexpr int kLaneSlots = kLanesPerDevice + 2;
// Events each lane that completes by events has from the start (Devices::get).
constexpr int kSpareEvents = 16;

// Makes `context` current for the scope; the one that was current before comes back after.
class ScopedContext {
 public:
  ScopedContext(const Driver* d, CUcontext context) : d_(d) {
    d_->cuCtxGetCurrent(&saved_);
    if (saved_ != context) changed_ = d_->cuCtxSetCurrent(context) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    if (changed_) d_->cuCtxSetCurrent(saved_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver* d_;
  CUcontext saved_ = nullptr;
  bool changed_ = false;
};

// "cuMemAlloc failed: CUDA_ERROR_OUT_OF_MEMORY (out of memory)"
Status driver_error(const std::string& call, CUresult result);
// "GPU-8f0e…", as nvidia-smi names a device.
std::string uuid_string(const std::array<std::byte, 16>& uuid);

// Device memory that host-to-host copies pass through (Cuda::copy_through_device_async).
struct Bounce {
  CUdeviceptr memory = 0;
  std::size_t bytes = 0;
  CUevent filled = nullptr;  // recorded once the copy in has ended
  Ticket ticket;             // of the copy out: free again once done
  bool used = false;
};
constexpr std::size_t kBounces = 16;

struct Lane {
  CUstream stream = nullptr;
  std::uint32_t issued = 0;
  std::uint32_t completed = 0;  // the last sequence seen done (by the flag or an event)
  std::uint32_t* flag = nullptr;
  std::deque<std::pair<std::uint32_t, CUevent>> events;
  std::vector<CUevent> spare_events;
};

struct Device {
  CUdevice handle = 0;
  CUcontext context = nullptr;
  std::array<std::byte, 16> uuid{};
  std::string name;
  std::uint32_t* flags = nullptr;  // host-mapped, one cache line per lane
  // kLanesPerDevice lanes by the flag where the GPU can write one, then the two staging lanes,
  // always by events.
  std::array<Lane, kLaneSlots> lanes;
  std::vector<Bounce> bounces;
  CUstream sync_stream = nullptr;  // copy()'s
  void* flags_device = nullptr;    // flags as kernels see them
  CUdeviceptr counters = 0;        // a kernel's finished blocks, one per lane (zeroed)
  CUmodule module = nullptr;       // kernels.cu, loaded by Launches::missing()
  CUfunction reduce = nullptr;
  CUfunction copy = nullptr;
  CUfunction oneshot = nullptr;
  CUfunction twoshot = nullptr;       // two members
  CUfunction twoshot_mesh = nullptr;  // three or more
  CUfunction allgather_mesh = nullptr;
  CUfunction reduce_scatter_mesh = nullptr;
  CUfunction broadcast_mesh = nullptr;
  CUfunction reduce_mesh = nullptr;
  CUfunction resident = nullptr;
  CUfunction on_stream = nullptr;       // ferry_allreduce_on_stream
  CUfunction mesh_on_stream = nullptr;  // ferry_mesh_on_stream
  CUfunction p2p = nullptr;             // ferry_p2p_on_stream
  CUfunction p2p_2 = nullptr;           // the same for at most two ops
  CUfunction scale = nullptr;           // ferry_scale
  std::string kernels_error;            // why the module could not be loaded
  int multiprocessors = 0;
  std::unordered_map<void*, std::size_t> sizes;  // allocate()'d, in use
  std::multimap<std::size_t, void*> spare;       // released, kept by size
  std::size_t spare_bytes = 0;
};

class Devices {
 public:
  // force_events: FERRY_TEST_CUDA_EVENTS (copies complete by events even where a flag would do).
  Devices(const Driver* d, bool force_events);
  // Every device's streams, events, memory and module, then its primary context.
  ~Devices();
  Devices(const Devices&) = delete;
  Devices& operator=(const Devices&) = delete;

  [[nodiscard]] const Driver* driver() const { return d_; }
  [[nodiscard]] std::size_t count() const { return devices_.size(); }
  // The device, its context and lanes made on first use. Throws ferry::Error for an ordinal out
  // of range or a context the driver refuses.
  Device& get(int ordinal);
  // A device already in use (a ticket's, a mapping's): nothing is made.
  Device& made(int ordinal) { return devices_[static_cast<std::size_t>(ordinal)]; }
  [[nodiscard]] const std::array<std::byte, 16>& uuid(int ordinal) const {
    return devices_[static_cast<std::size_t>(ordinal)].uuid;
  }
  // The device of the calling thread's current context, or -1.
  [[nodiscard]] int current() const;
  // This process's ordinal of the device named by `uuid`, or -1.
  [[nodiscard]] int ordinal(const std::array<std::byte, 16>& uuid) const;

  // One copy on a lane, marked for its completion.
  Status copy_on_lane(int ordinal, std::size_t lane, void* dst, const void* src, std::size_t bytes,
                      Ticket* ticket);
  // The ticket of what was queued on a lane so far.
  Status mark(int ordinal, std::size_t lane, Ticket* ticket);
  // Whether a lane's ticket is done (not a resident kernel's).
  bool done(const Ticket& ticket);

  // Host memory that kernels on `ordinal` read (Cuda::map_host), and its release.
  Status map_host(int ordinal, std::size_t bytes, void** host, void** device_view);
  void unmap_host(int ordinal, void* host);

  // "2 device(s) (NVIDIA H200, NVIDIA H200)"
  [[nodiscard]] std::string describe() const;
  // "cuda:0 by a flag the GPU writes" for each device in use.
  [[nodiscard]] std::string completion() const;

 private:
  // The lanes' completion flags: host memory the GPU writes, where a trial write shows it can.
  void make_flags(Device& dev, int ordinal);

  const Driver* d_;
  bool force_events_;
  std::vector<Device> devices_;
};

}  // namespace ferry::cuda
