// Device buffers between processes that share memory (shm, self). Every device send is a
// rendezvous: RTS_DEV carries an IPC key unless IPC to that peer failed before. The receiver
// climbs down the fallback ladder:
//   1. CUDA IPC: map the sender's allocation (cached) and copy on a stream; FIN when done.
//   2. Host staging: STAGE_CTS; the sender fills slots of a pinned ring in shared memory
//      (device -> host copy), announces each with STAGE_FRAG; the receiver empties it (host ->
//      device copy) and returns the slot with STAGE_ACK. Slots double-buffer, so the copy out of
//      chunk k overlaps the copy into chunk k+1.
// A receiver that cannot use the key says so in STAGE_CTS, so both sides stop trying IPC with
// that peer. Host senders to device receivers take rung 2 as well (a CTS would bring fragments
// the receiver could only copy synchronously), except that where CUDA IPC with the peer stands,
// STAGE_CTS carries the receive buffer's key: a sender of page-locked host memory maps it and
// writes the message by its own GPU's copy engine in one pass (host to peer device), then says
// STAGE_WRITTEN; a pageable sender, or one that cannot map it, stages as before (page-locked
// memory through its process's GPU). Copies complete by polling, never by blocking.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "cuda/cuda.hpp"
#include "cuda/stage_ring.hpp"
#include "ferry/ferry.hpp"
#include "proto/link.hpp"
#include "proto/request_pool.hpp"
#include "util/config.hpp"
#include "util/fd.hpp"
#include "util/fd_mailbox.hpp"

namespace ferry::proto {

class Engine;

class DevicePath {
 public:
  // `mailbox`: where cuMem allocations' descriptors arrive (null: mailbox_why says why).
  DevicePath(Engine& engine, const util::Config& config, std::unique_ptr<util::FdMailbox> mailbox,
             std::string mailbox_why, int ranks);
  ~DevicePath();
  DevicePath(const DevicePath&) = delete;
  DevicePath& operator=(const DevicePath&) = delete;

  // A send from device memory to a peer that shares memory with us: RTS_DEV.
  void send(std::uint32_t index, int destination, const mem::MemoryInfo& memory);
  // A receive matched RTS_DEV (`key`: the sender's IPC key, if it sent one): IPC, else staged.
  void start_receive(std::uint32_t index, int source, Tag tag, std::size_t size, std::uint64_t sreq,
                     const cuda::IpcKey* key);
  // Rung 2 for a matched receive.
  void start_staged_receive(std::uint32_t index, int source, std::uint64_t sreq,
                            std::uint32_t flags);
  // A host sender's message into a device buffer: rung 2, offering the buffer's IPC key.
  void start_host_receive(std::uint32_t index, int source, std::uint64_t sreq);
  // Makes a staging ring with `peer` now, on the calling thread, which holds no lock of the
  // engine's (it may hold it: rings_mutex_ comes after it): ours to it, or (`theirs`) its to us,
  // where it has made it. A stream operation runs on ferry's thread while the application's
  // threads may be launching onto a full stream or graph, holding a driver lock that registering
  // a ring's memory waits for: made there, it waits for ever (one H200 shared by two ranks: graph
  // replays of an allreduce stopped at the first). So stream operations make their rings where
  // they are enqueued, and without the engine's lock, which ferry's thread needs to drain that
  // stream. The first staged message takes a ring made here; what fails here is tried again, and
  // reported, by it.
  void prepare_staging(int peer, bool theirs);
  // The device bounces that staged copies of page-locked memory through `device` take (made
  // ahead for the same reason: Cuda::copy_through_device_async). The engine's lock held.
  void prepare_copies(int device);
  // An active message of the device path (true), or another's (false).
  bool on_am(std::uint8_t id, int source, std::span<const std::byte> data);
  // A send that ends before its staging does (its receiver failed): no more slots for it.
  void forget_staged(std::uint32_t index, int peer);
  // A blocking send withdrawn mid-staging: true if it was staging (the receive is told).
  bool withdraw_staged(std::uint32_t index, int peer, std::uint64_t stage_rreq);
  // Copies in flight, polled in progress; drain() waits for them (they never wait on a peer).
  [[nodiscard]] bool busy() const { return !ops_.empty(); }
  void add(const DeviceOp& op) { ops_.push_back(op); }
  int poll();
  void drain();
  void peer_failed(int rank, const Status& status);
  // Finalize: the rings go (the shared memory is unlinked once both sides mapped it).
  void close_rings();
  [[nodiscard]] std::string describe(int rank) const;

 private:
  // Per peer: the fallback ladder's verdict per way of mapping memory (legacy CUDA IPC, cuMem
  // descriptors), and the staging rings.
  struct IpcVerdict {
    bool refused = false;  // failed or refused once: staged from now on
    std::string why;
  };
  struct PeerState {
    IpcVerdict ipc_legacy;
    IpcVerdict ipc_fd;
    IpcVerdict& verdict(mem::IpcKind kind) {
      return kind == mem::IpcKind::kPosixFd ? ipc_fd : ipc_legacy;
    }
    std::unique_ptr<cuda::StageRing> ring_tx;  // ours, to this peer (made on first use or ahead)
    std::unique_ptr<cuda::StageRing>
        ring_rx;                            // the peer's, to us (mapped on first fragment or ahead)
    std::vector<std::uint64_t> free_slots;  // offsets of free slots in ring_tx
    std::deque<std::uint32_t> stage_streams;  // staged sends waiting for a slot
    std::uint64_t writes = 0;  // page-locked sends written into the peer's device buffers
  };
  // Rung 1 of a receive from a device buffer: map the sender's buffer for GPU `copier` (the
  // receive buffer's, or the one page-locked host memory is staged through) and start the copies.
  Status start_ipc_get(std::uint32_t index, int source, std::uint64_t sreq, const cuda::IpcKey& key,
                       int copier);
  // A page-locked send whose receiver offered its device buffer (`key`): map the buffer for the
  // GPU the memory is staged through and write the message into it. False: stage it instead.
  bool start_ipc_put(std::uint32_t index, int source, std::uint64_t rreq, std::size_t length,
                     const cuda::IpcKey& key);
  // The rings (throwing ferry::Error): ours to `peer`, with every slot free; the peer's to us.
  // Each takes one made ahead (prepare_staging) where there is one.
  void make_ring_tx(int peer);
  void open_ring_rx(int peer);
  std::unique_ptr<cuda::StageRing> create_ring_tx(int peer) const;
  std::unique_ptr<cuda::StageRing> open_ring_rx_now(int peer) const;
  // The ring made ahead, else one made now: ours to `peer`, or (`theirs`) its to us.
  std::unique_ptr<cuda::StageRing> take_ring(int peer, bool theirs);
  void on_rts(int source, std::span<const std::byte> data);
  void on_stage_cts(int source, std::span<const std::byte> data);
  void on_stage_frag(int source, std::span<const std::byte> data);
  void on_stage_ack(int source, std::span<const std::byte> data);
  void on_stage_written(int source, std::span<const std::byte> data);
  // A staged receive that cannot go on: it fails, and so does the send (FIN with a code).
  void fail_staged_receive(std::uint32_t index, Status status);
  // Records that a way of mapping device memory failed with a peer, once, and logs it.
  void refuse_ipc(int peer, mem::IpcKind kind, const std::string& why);
  // The descriptor that came with a cuMem key from `source` (closed, or invalid if none came).
  util::Fd take_descriptor(int source, std::uint64_t buffer_id);
  void pump_stage(int peer);
  // A ring slot filled from, or emptied into, page-locked host memory: through `device` (host to
  // device, then device to host, so both directions of its link at once, 49-50 GB/s each way on
  // H100s and H200s where one way is 55), except FERRY_CUDA_STAGE_CPU_PART percent of it, which
  // the CPU copies meanwhile. kWouldBlock where the GPU's bounces are all in use.
  Status copy_pinned(int device, std::byte* dst, const std::byte* src, std::size_t bytes,
                     cuda::Ticket* ticket);

  Engine& engine_;
  std::vector<PeerState> peers_;
  // Rings made ahead by prepare_staging, until the first staged message takes them, and whether
  // ferry's thread made (or took) each: guarded by rings_mutex_ alone, so that prepare_staging
  // needs no lock of the engine's.
  struct Ahead {
    std::unique_ptr<cuda::StageRing> tx;
    std::unique_ptr<cuda::StageRing> rx;
    bool tx_taken = false;
    bool rx_taken = false;
  };
  std::mutex rings_mutex_;
  std::map<int, Ahead> ahead_;
  std::vector<DeviceOp> ops_;
  std::size_t ipc_split_;    // FERRY_CUDA_IPC_SPLIT
  std::size_t stage_chunk_;  // FERRY_CUDA_STAGE_CHUNK
  std::size_t stage_slots_;  // FERRY_CUDA_STAGE_SLOTS
  int stage_cpu_part_;       // FERRY_CUDA_STAGE_CPU_PART
  bool test_stage_open_fail_;
  int next_lane_ = 0;  // copies rotate over the device's streams (and so its copy engines)
  // cuMem descriptors: our mailbox, and those received but not yet used, by (sender, memory
  // block id), oldest first for a bound.
  std::unique_ptr<util::FdMailbox> mailbox_;
  std::string mailbox_why_;
  std::deque<std::pair<std::pair<int, std::uint64_t>, util::Fd>> descriptors_;
};

}  // namespace ferry::proto
