// Stream send and receive between the GPUs of one node as kernels on the application's stream
// (kernels/p2p.cuh), so that a graph replays them with no host in the loop; one per
// communicator's stream twin.
//
// A pair of members decides once, at the first stream send or receive between them (each side's,
// in its group_end where it makes one), whether its messages go through kernels: both exchange
// whether they can (the same node, kernels loaded, an inbox of device memory exported by CUDA
// IPC), map each other's inbox, and tell each other whether that worked. The first stream send or
// receive between two members therefore waits for the other's first one (as NCCL's first
// send/recv between two ranks connects them); a group makes every pair it needs at once. A pair
// that cannot keeps ferry's thread for good.
//
// On a kernel pair every message passes through the sender's kernel: up to the pair's inline
// limit (FERRY_STREAM_P2P, the smaller of the two members') as LL lines into the receiver's
// inbox; larger ones as a header, their data then through a ring in the receiver's inbox that
// both kernels stream it through (kernels/p2p.cuh), so that ferry's thread never touches device
// data: a CUDA call of that thread can wait for ever behind an application thread that holds the
// driver's lock while it waits for its stream (design/streams.md). Where the receive's buffer is
// host memory (the receiver answers the header), or the send's, the data goes by ferry's thread
// (the host path). A receive that can take any size, or whose buffer the kernel cannot write,
// reads the header in a kernel and leaves ferry's thread a verdict: the data came (inline into a
// host buffer: copied from a bounce there), or comes by the thread; a send through the ring
// likewise. Where a group is one launch and only verdicts may give the thread work, the launch
// starts the thread only where one does, and else releases the stream itself (proto::Release):
// device buffers through the ring need no host in the loop. A send from memory the kernel cannot
// read is copied into device memory on the stream first where it fits inline.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "coll/departed_wait.hpp"
#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "proto/stream_ops.hpp"
#include "util/config.hpp"

namespace ferry::coll {

class Group;

class StreamP2p final : public proto::Fuser {
 public:
  StreamP2p(Group& twin, const util::Config& config);
  ~StreamP2p() override;
  StreamP2p(const StreamP2p&) = delete;
  StreamP2p& operator=(const StreamP2p&) = delete;

  // A stream send (or receive) of `bytes` at `buffer` to (from) member `peer`, for
  // StreamOps::enqueue. `twin` keeps the group alive while the work waits.
  static std::shared_ptr<proto::DeviceWork> work(std::shared_ptr<Group> twin, bool sending,
                                                 void* buffer, std::size_t bytes, int peer);
  Status enqueue(CudaStream stream, std::span<const std::shared_ptr<proto::DeviceWork>> work,
                 std::vector<proto::Start>* thread, const proto::TakeRelease& take) override;
  // Asked by ferry's stream thread about every millisecond (engine lock held), as
  // DeviceOneShot::watch: stops the kernels where a member failed or the communicator was revoked,
  // and says why they are not valid (that, a size mismatch, a timeout), else ok.
  Status watch();

 private:
  struct Pair {
    bool decided = false;
    bool kernel = false;  // through kernels (else ferry's thread, for good)
    int device = -1;
    std::size_t inline_max = 0;
    void* inbox = nullptr;       // ours, device memory (cuda.hpp: p2p_inbox_bytes)
    void* peer_inbox = nullptr;  // the peer's, mapped here
    cuda::IpcKey peer_key;       // to unpin
    void* counters = nullptr;    // device: [0] sent, [1] received, then the ring's counts
    void* bounce = nullptr;      // device: kP2pSlots sends from memory the kernel cannot read
    unsigned* host = nullptr;    // host: kP2pMaxOps verdicts of 16 bytes, then receive bounces
    void* host_view = nullptr;
  };
  struct Offer;
  // Makes the pairs with `peers` (members not decided yet) on `device`, all at once.
  Status connect(const std::vector<int>& peers, int device);
  // The host rings that device data to and from `ranks` is staged through, made and mapped here
  // (connect's third round, with those ranks only), and `device`'s bounces for staged copies.
  Status prepare_staging(const std::vector<int>& ranks, int device);
  // One round of the set-up's messages with every rank of `ranks` at once.
  template <typename T>
  Status exchange(const std::vector<int>& ranks, const T* out, T* in);
  // This side's part of a pair: its memory and key; false (with *why) where it cannot.
  bool prepare(Pair& pair, int device, cuda::IpcKey* key, std::string* why);
  void release(Pair& pair);
  // Frees a pair's memory and unpins the peer's inbox (member `rank`'s).
  static void free_pair(cuda::Cuda* gpu, int rank, Pair& pair);
  // Common state on first use: stop words and scratch on `device`.
  Status prepare_common(int device);
  void release_all();
  void stop();

  Group& twin_;
  std::size_t inline_max_;    // FERRY_STREAM_P2P (0 where CUDA IPC is off)
  cuda::Cuda::P2pRing ring_;  // FERRY_STREAM_RING_*
  std::map<int, Pair> pairs_;
  int device_ = -1;
  unsigned* words_ = nullptr;  // host side of the stop words
  void* words_view_ = nullptr;
  void* scratch_ = nullptr;  // device: the launches' block counts
  int watch_ = -1;
  bool reported_ = false;
  DepartedWait departed_;  // kernels waiting for a member that finalized
};

}  // namespace ferry::coll
