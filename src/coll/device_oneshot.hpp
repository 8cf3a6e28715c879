// The one-shot device allreduce of one Group (cuda.hpp, kernels.cu): every member's exchange area
// in device memory, mapped by every other member by CUDA IPC; the stop words a failed collective
// raises; the two-shot kernel for two members' large calls; and the resident kernel that takes
// blocking calls of one block without a launch. Set up by the first call that can use it (a
// collective: every member decides alike), released with the Group or, before, when its engine
// goes (a Communicator may outlive its Context).
//
// On-stream mode (the DeviceOneShot of a kernel twin, Group::kernel_twin): the same area, set up
// the same way, for stream collectives enqueued as one kernel on the application's stream, whose
// calls the GPU numbers itself; no resident kernel, the two-shot kernel among three or more
// members only, and the other kinds among two too. Nothing on the host sees such a
// call end, so ferry's stream thread watches for what must stop it (a dead member, a revoke) and
// for what it reports (a mismatch, a timeout): watch() below.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "coll/departed_wait.hpp"
#include "coll/schedule.hpp"
#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "util/config.hpp"

namespace ferry::coll {

class Group;

// A stream collective that may run as one kernel on the application's stream: an allreduce, an
// allgather, a reduce-scatter, a broadcast (send == recv, the
// buffer) or a reduce (recv the root's). Counts as Communicator's stream forms take them.
struct KernelCall {
  const char* name;
  cuda::Cuda::OneShot::Kind kind;
  const void* send;
  void* recv;
  std::size_t count;
  DataType type;
  ReduceOp op;
  int root;
};

// `call` of `group` as one kernel on `stream` (the kernel twin's DeviceOneShot in on-stream mode),
// where every member is on this node with a GPU of its own, no algorithm is forced and the size
// fits the area: then *taken, and the status says whether it was enqueued. Else the call is for
// ferry's stream thread. Every member decides alike (the size, the kind, the set-up's agreement).
// The first call that fits sets the area up: a collective of the members, made here. Takes the
// engine's lock, but not across the launch.
Status collective_by_kernel(Group& group, const KernelCall& call, void* stream, bool* taken);

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
  // Whether an allgather (`bytes` per member), a reduce-scatter (`bytes` per member's block), a
  // broadcast or a reduce among three or more members (on a stream, two or more) runs as one
  // kernel per GPU (kernels/mesh.cuh) on `device`: where it fits the area (a reduce-scatter's or a
  // reduce's block a slot, else the generation's members x slot; a broadcast from 2 MiB), setting
  // the path up on first use as ready() does.
  bool mesh_ready(int device, cuda::Cuda::OneShot::Kind kind, std::size_t bytes);
  // The most bytes one kernel call of `kind` takes where a larger call goes in rounds of them,
  // one call each: a broadcast's (any size, launched among three or more members, on a stream
  // among two or more); on a stream an allgather's and a reduce-scatter's (a part of every
  // member's block a round), and a reduce's and an allreduce's between two members; else 0 (one
  // call, or another path). On a stream the rounds keep ferry's thread, and the CUDA calls it
  // would make while the application's streams wait for it, out of such calls.
  [[nodiscard]] std::size_t round_bytes(cuda::Cuda::OneShot::Kind kind) const;
  // The next call's number (the same on every member).
  std::uint64_t next() { return ++state_->sequence; }
  Status launch(const Execution::Action& action, DataType type, ReduceOp op, int lane,
                bool blocking, cuda::Ticket* ticket);
  // On-stream mode: the call for collective_on_stream (ready() or mesh_ready() said yes) from
  // `in` to `out`, an allreduce in the host algorithm's order (`ring`).
  [[nodiscard]] cuda::Cuda::OneShot on_stream_call(cuda::Cuda::OneShot::Kind kind, void* out,
                                                   const void* in, std::size_t count, DataType type,
                                                   ReduceOp op, int root, bool ring) const;
  // On-stream mode: `bytes` of device memory for a member whose buffers the kernel cannot reach
  // (host memory, another GPU's): made on first use and kept with the area; a larger call makes
  // one of at least twice the size beside it (what is enqueued may still use the smaller).
  Status staging(std::size_t bytes, void** pointer);
  // On-stream mode, asked by ferry's stream thread about every millisecond (engine lock held):
  // raises the stop word where a member has failed or the communicator is revoked, and returns
  // why the calls on the streams are not valid (that, a mismatch, or a timeout), else ok.
  Status watch();
  // After a one-shot kernel finished: a mismatch it saw between the members' calls, or ok.
  Status outcome();
  // Tells a one-shot kernel to stop waiting for its peers, and stops using the path.
  void stop();
  // On-stream mode: the largest part of a call by LL lines (FERRY_STREAM_LL, at most kLLMaxBytes).
  [[nodiscard]] std::size_t ll_limit() const {
    return std::min(ll_bytes_, cuda::Cuda::kLLMaxBytes);
  }
  // Whether a call of `bytes` takes the two-shot kernel (FERRY_COLL_DEVICE_TWOSHOT; on a stream,
  // among three or more members past the one-shot kernel's limit).
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
    void* counters = nullptr;  // on-stream mode: the calls' numbers, kept by the GPU
    std::vector<std::pair<void*, std::size_t>> staging;  // on-stream mode: staging()
    int watch = -1;         // on-stream mode: the stream thread's watch of it
    bool reported = false;  // watch() returned its failure
    DepartedWait departed;  // kernels waiting for a member that finalized
  };
  // Each member makes its exchange area, they swap IPC keys and map each other's, then agree
  // that every member succeeded.
  Status prepare(int device);
  void prepare_resident();
  Status watched_failure();
  void release();
  // release's two halves: the kernels stop waiting for their peers and are no longer watched;
  // then the state's memory goes.
  void stop_kernels();
  static void free_state(cuda::Cuda* gpu, State& o);

  Group& group_;
  bool on_stream_;     // a kernel twin's (see above)
  std::size_t bytes_;  // FERRY_COLL_DEVICE_ONESHOT (on stream: FERRY_STREAM_KERNEL), per peer
  std::size_t slice_;  // FERRY_COLL_DEVICE_ONESHOT_SLICE
  std::size_t twoshot_from_;      // FERRY_COLL_DEVICE_TWOSHOT
  std::uint64_t resident_us_;     // FERRY_COLL_DEVICE_RESIDENT
  bool shared_gpu_;               // FERRY_COLL_DEVICE_SHARED_GPU
  std::size_t ll_bytes_;          // FERRY_STREAM_LL (on stream only)
  std::unique_ptr<State> state_;  // set up by the first ready() on a device
};

}  // namespace ferry::coll
