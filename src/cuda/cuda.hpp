// ferry's CUDA module as the protocol layer sees it, free of cuda.h: memory classification, IPC
// export and a bounded cache of opened peer mappings, asynchronous copies completed by polling
// (never a blocking synchronize in progress), and pinned staging rings in shared memory.
// Built from impl/ (the parts that call the driver) where the CUDA headers exist, else from
// none.cpp (create() says why not).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "ferry/status.hpp"
#include "mem/memory.hpp"
#include "util/config.hpp"
#include "util/fd.hpp"

namespace ferry::cuda {

// What a sender puts in a device rendezvous so that a peer can map its buffer. Everything in it is
// checked by the receiver before use. A kPosixFd key travels with a file descriptor of the
// allocation, passed beside it (util::FdMailbox, tagged with buffer_id).
struct IpcKey {
  std::array<std::byte, 64> handle{};  // kLegacy: CUipcMemHandle of the allocation
  std::array<std::byte, 16> uuid{};    // the GPU it lives on (ordinals differ between processes)
  std::uint64_t base = 0;              // the allocation, in the sender's address space
  std::uint64_t extent = 0;
  std::uint64_t buffer_id = 0;  // changes when the allocation is freed and replaced
  std::uint64_t offset = 0;     // of the message within the allocation
  mem::IpcKind kind = mem::IpcKind::kLegacy;
  std::array<std::uint8_t, 7> process{};  // the exporting process (ipc_cache.cpp: process_token)
};
static_assert(sizeof(IpcKey) == 120);

// A copy in flight: complete when done(ticket). Tickets of one stream complete in the order of
// their sequence numbers.
struct Ticket {
  std::uint32_t stream = 0;
  std::uint32_t sequence = 0;
};

class StageRing;

class Cuda {
 public:
  // Null, with *why set, when CUDA cannot be used (not built in, no driver, no device,
  // FERRY_CUDA=0). Throws nothing.
  static std::unique_ptr<Cuda> create(const util::Config& config, std::string* why);
  // Tests on machines without a GPU: while a factory is set, create returns what it makes (a
  // stand-in of host memory and threads, tests/helpers/fake_cuda.hpp) whatever the driver. Set
  // before the first Context.
  using Factory = std::unique_ptr<Cuda> (*)();
  static void set_factory_for_tests(Factory factory);
  virtual ~Cuda() = default;

  // One driver query (cuPointerGetAttributes): bench/cuda_probe measured 87 ns for device and
  // 234 ns for host pointers on an H100. Unknown pointers are host memory.
  virtual mem::MemoryInfo classify(const void* pointer) = 0;
  // The GPU holding `buffer` where only a CUDA device can read it, else -1 (also without CUDA).
  static int device_of(Cuda* cuda, const void* buffer) {
    if (cuda == nullptr) return -1;
    const mem::MemoryInfo info = cuda->classify(buffer);
    return info.device_only() ? info.device : -1;
  }
  // The GPU that page-locked host memory is staged through: the caller's current one (the GPU
  // its process works with; a portable allocation names device 0 for every process), else the
  // one the memory names.
  [[nodiscard]] int bounce_device(const mem::MemoryInfo& memory) const {
    const int current = current_device();
    return current >= 0 ? current : memory.device;
  }

  // Exports the allocation holding `pointer` (info.ipc says how). kLegacy: the handle is cached per
  // buffer id. kPosixFd: *fd receives a new descriptor of the allocation, never cached (an open
  // descriptor keeps freed GPU memory alive); the caller passes it to the peer and closes it.
  virtual Status export_ipc(const void* pointer, const mem::MemoryInfo& info, IpcKey* key,
                            util::Fd* fd) = 0;

  // Can this process's `device` copy from the peer GPU named by `uuid`? Empty when yes, else why.
  virtual std::string ipc_refusal(const std::array<std::byte, 16>& uuid, int device) = 0;
  // The GPU of the calling thread's current CUDA context (the one the application works on), or
  // -1 where it has none.
  [[nodiscard]] virtual int current_device() const = 0;
  // This process's ordinal of the GPU named by `uuid`; -1 where it does not see it.
  [[nodiscard]] virtual int ordinal(const std::array<std::byte, 16>& uuid) const = 0;

  // Maps a peer's allocation (cached per (peer, base, buffer id); a stale entry for the same base
  // is closed; LRU-bounded) and returns the address of key.offset in it. Pins the entry until
  // unpin(); a failure says what was tried. A kPosixFd key not in the cache needs the descriptor
  // that came with it in *fd (imported, then closed).
  virtual Status import_ipc(int peer, const IpcKey& key, int device, util::Fd* fd,
                            void** mapped) = 0;
  virtual void unpin(int peer, int device, const IpcKey& key) = 0;
  // This rank's number in the job: a key this process exported for another rank living in it
  // maps to the allocation's own address; for this rank itself it stays refused, as the driver
  // refuses it (a rank's transfers with itself take the paths they always took).
  virtual void set_rank(int rank) = 0;
  // Whether import_ipc would find `key` in the cache (so a kPosixFd key needs no descriptor).
  [[nodiscard]] virtual bool ipc_cached(int peer, const IpcKey& key, int device) const = 0;
  // Drops every mapping of a peer (it died or finalized).
  virtual void forget_peer(int peer) = 0;

  // Asynchronous copy on `device`'s stream for `lane` (a peer index); pointers may be device,
  // IPC-mapped, pinned or pageable host memory.
  virtual Status copy_async(int device, int lane, void* dst, const void* src, std::size_t bytes,
                            Ticket* ticket) = 0;
  // As copy_async, where both ends are device memory (either may be a peer's IPC mapping). By
  // the copy engine, or, when `streaming` (other copies are in flight, so a kernel's launch is
  // hidden behind them) and the size is in FERRY_CUDA_IPC_KERNEL_COPY..._MAX, by a copy kernel.
  virtual Status copy_device_async(int device, int lane, void* dst, const void* src,
                                   std::size_t bytes, bool streaming, Ticket* ticket) = 0;
  // A copy between host memory (a staging ring's pinned slot) and `device`'s memory, on the
  // device's own stream for that direction (`to_device`), completed by an event: fills and drains
  // of the host-staged path overlap at the copy engines' rate.
  virtual Status copy_staged_async(int device, bool to_device, void* dst, const void* src,
                                   std::size_t bytes, Ticket* ticket) = 0;
  // A copy between two pieces of pinned host memory (a staging ring and a page-locked user buffer)
  // through `device`'s memory: host to device, then device to host, on the two staging streams,
  // so both directions of the GPU's link work at once (55 GB/s on an H100, where the copy
  // engine's direct host-to-host copy reaches 17 and one CPU thread's memcpy 12-13).
  // kWouldBlock when every device bounce (16 per device) is in use, or, while unmaps are deferred
  // (stream operations exist: see defer_unmaps), every one made so far: then ferry's thread
  // makes none, as cuMemAlloc there may wait for ever for a driver lock held by an application
  // thread blocked launching onto a stream that waits for ferry's thread (two H200s, graph
  // replays of staged send/recv from page-locked memory: stopped at the first). prepare_bounces
  // makes them ahead, on the enqueueing thread.
  virtual Status copy_through_device_async(int device, void* dst, const void* src,
                                           std::size_t bytes, Ticket* ticket) = 0;
  // Makes `device`'s bounces for copy_through_device_async, kPreparedBounces of at least `bytes`
  // (fewer where some exist).
  static constexpr int kPreparedBounces = 4;
  virtual Status prepare_bounces(int device, std::size_t bytes) = 0;
  [[nodiscard]] virtual bool done(const Ticket& ticket) = 0;
  // Synchronous copy (small eager messages into device memory, tools, tests), by the context of
  // the GPU that holds dst (else src).
  virtual Status copy(void* dst, const void* src, std::size_t bytes) = 0;
  // As copy, by `device`'s context: where one end is a peer's allocation mapped for `device`
  // only (a cuMem import), which the GPU that holds it may not reach at that address.
  virtual Status copy_on(int device, void* dst, const void* src, std::size_t bytes) = 0;

  // ---- Collectives on device buffers ----
  // Empty when `device` can run the reduction kernels (kernels.cu, loaded on first use), else why
  // not (built without nvcc, or the driver refused the module).
  virtual std::string kernels_missing(int device) = 0;
  // Device memory on `device` (the collectives' scratch buffers); release() frees it.
  virtual Status allocate(int device, std::size_t bytes, void** pointer) = 0;
  virtual void release(int device, void* pointer) = 0;
  // out = a op b over `count` elements, on `device`'s stream for `lane` after the work queued
  // there before (copy_async on the same lane included). out may be a or b. The caller checked
  // (type, op) with coll::check_reduction and that kernels_missing(device) is empty.
  virtual Status reduce_async(int device, int lane, void* out, const void* a, const void* b,
                              std::size_t count, DataType type, ReduceOp op, Ticket* ticket) = 0;

  // The one-shot allreduce among the GPUs of one node (kernels.cu, ferry_allreduce_oneshot):
  // each member's exchange area holds 2 generations x `members` slots of `slot_bytes`, then
  // 2 generations x `members` x kOneShotBlocks flags of 16 bytes, then as many again for the
  // two-shot kernel's results (ferry_allreduce_twoshot), then among three or more members
  // 2 generations x `members` slots more for the two-shot mesh kernel's results
  // (ferry_allreduce_twoshot_mesh), zeroed before first use.
  static constexpr int kOneShotMembers = 8;
  static constexpr int kOneShotBlocks = 128;
  static std::size_t oneshot_area_bytes(int members, std::size_t slot_bytes) {
    const auto n = static_cast<std::size_t>(members);
    return 2 * n * slot_bytes + 4 * n * kOneShotBlocks * 16 + (n >= 3 ? 2 * n * slot_bytes : 0);
  }
  // The exchange area of the on-stream kernels (collective_on_stream): the one-shot part, then
  // 2 generations x `members` LL slots (kernels/on_stream.cuh) for calls of up to kLLMaxBytes.
  static constexpr std::size_t kLLMaxBytes = 32768 * 8;
  static constexpr std::size_t kLLSlotBytes = (kLLMaxBytes / 8 + 1) * 16;
  static std::size_t on_stream_area_bytes(int members, std::size_t slot_bytes) {
    return oneshot_area_bytes(members, slot_bytes) +
           2 * static_cast<std::size_t>(members) * kLLSlotBytes;
  }
  struct OneShot {
    // The collective: an allreduce, or among three or more members an allgather (`count` elements
    // per member, `out` members x count), a reduce-scatter (`count` per member's block, `in`
    // members x count), a broadcast from `root` (in == out) or a reduce to `root` (in the ring's
    // order), each at most members x slot_bytes, the reduce-scatter's and the reduce's blocks at
    // most slot_bytes (kernels/mesh.cuh).
    enum class Kind : std::uint8_t { kAllreduce, kAllgather, kReduceScatter, kBroadcast, kReduce };
    Kind kind = Kind::kAllreduce;
    int root = 0;
    void* out = nullptr;
    const void* in = nullptr;
    std::size_t count = 0;  // at most slot_bytes of data (any by the two-shot kernel)
    // collective_on_stream only: an allgather's output or a reduce-scatter's input holds member
    // j's block at j * stride elements (0: count); a round of a larger call takes a part of each.
    std::size_t stride = 0;
    DataType type = DataType::kUint8;
    ReduceOp op = ReduceOp::kSum;
    int members = 0;
    int me = 0;
    bool ring = false;  // reduce in the ring's order (else recursive doubling's)
    // The two-shot kernel (each member reduces its part and the others take it): two members in
    // rounds of slot_bytes where the data is larger than 2 x slot_bytes; more members at most
    // members x slot_bytes (ferry_allreduce_twoshot_mesh).
    bool two_shot = false;
    std::uint64_t sequence = 0;  // 1, 2, ...: the same on every member for the same call
    std::size_t slot_bytes = 0;
    // Bytes per thread block, up to kOneShotBlocks blocks (0: always kOneShotBlocks). Every member
    // must compute the same grid for the same call.
    std::size_t block_bytes = 0;
    // At most this many blocks (1..kOneShotBlocks), the same on every member. Block b spins until
    // block b of every peer has pushed, so where members share a GPU (under MPS) all their blocks
    // must fit on it at once: 3 members of 128 blocks of 512 threads do not fit on an H100
    // (2 such blocks per multiprocessor, 132 of them) and waited for each other until the timeout.
    unsigned max_blocks = kOneShotBlocks;
    std::array<void*, kOneShotMembers> areas{};  // every member's area as mapped here
    // Device view of host words: [0] nonzero ends the waiting; the kernel sets [1] when a
    // member's call differs in count, type or op, and [2] when it waited past timeout_ns; a
    // waiting block writes the member it waits for, plus one, to [3] now and then.
    void* words = nullptr;
    // collective_on_stream only: 16 bytes of device memory, zeroed before the first call, where
    // the GPU keeps the calls' numbers (`sequence` is not used); how long a block may wait for
    // its peers (0: no limit).
    void* counters = nullptr;
    std::uint64_t timeout_ns = 0;
    // collective_on_stream only: allreduces of up to this many bytes (at most kLLMaxBytes) by LL
    // lines.
    std::size_t ll_bytes = 0;
  };
  virtual Status allreduce_oneshot_async(int device, int lane, const OneShot& call,
                                         Ticket* ticket) = 0;
  // The same call enqueued on an application's stream (a CUstream of `device`'s context, the
  // legacy or per-thread default stream included), after the work already there; a stream that
  // captures a graph captures it, and every replay is a call of its own. An allreduce by the
  // one-shot blocks or LL lines (ferry_allreduce_on_stream), or the other kinds among two or more
  // members and among three or more the two-shot kernel (two_shot) (ferry_mesh_on_stream). Nothing
  // tells the host when it ends: errors are in `words` (a stopped call's result is not valid).
  virtual Status collective_on_stream(void* stream, int device, const OneShot& call) = 0;
  // Stream send and receive between two GPUs of one node (kernels/p2p.cuh, coll/stream_p2p.hpp):
  // each member's inbox for a peer is kP2pSlots slot-free words and as many reply words (64 bits
  // each, in the first 128 bytes), then kP2pSlots LL slots of a message of up to kP2pInlineMax
  // bytes each, then (from kP2pBulkOffset) a page of ready and taken words (kP2pTakenOffset) and
  // a ring of P2pRing::places places of P2pRing::chunk bytes for larger messages (from
  // kP2pRingOffset: p2p_inbox_bytes in all). Each member's counters for a peer (kP2pCounterBytes
  // of device memory) are its message counts, then its counts of each ring place filled (from
  // kP2pFilledOffset) and emptied (from kP2pEmptiedOffset).
  static constexpr int kP2pSlots = 4;
  // What the kernel writes in words[1] where a reply word held a value no receiver writes (1:
  // a message did not fit its receive, or its header was not one the receive takes).
  static constexpr unsigned kP2pBadReply = 2;
  static constexpr std::size_t kP2pInlineMax = 262144;
  static constexpr std::size_t kP2pSlotBytes = (kP2pInlineMax / 8 + 1) * 16;
  static constexpr std::size_t kP2pBulkOffset =
      (128 + kP2pSlots * kP2pSlotBytes + 4095) / 4096 * 4096;
  static constexpr int kP2pMaxPlaces = 256;
  static constexpr std::size_t kP2pTakenOffset = kP2pBulkOffset + 8 * kP2pMaxPlaces;
  static constexpr std::size_t kP2pRingOffset = kP2pTakenOffset + 8 * kP2pMaxPlaces;
  static constexpr std::size_t kP2pFilledOffset = 64;
  static constexpr std::size_t kP2pEmptiedOffset = kP2pFilledOffset + 8 * kP2pMaxPlaces;
  static constexpr std::size_t kP2pCounterBytes = kP2pEmptiedOffset + 8 * kP2pMaxPlaces;
  // The bulk ring's shape (FERRY_STREAM_RING_*: the same on every member) and how many blocks
  // each side of a message through it takes at most.
  struct P2pRing {
    std::size_t chunk = 131072;
    int places = 128;
    int blocks = 64;
  };
  static constexpr std::size_t p2p_inbox_bytes(const P2pRing& ring) {
    return kP2pRingOffset + static_cast<std::size_t>(ring.places) * ring.chunk;
  }
  static constexpr int kP2pMaxOps = 32;
  struct P2pOp {
    // A send of up to the inline limit; a header whose data goes by ferry's thread; a receive; a
    // send through the bulk ring (or by ferry's thread, as the receiver answers: `verdict`).
    enum class Kind : std::uint8_t { kSendInline, kSendHeader, kReceive, kSendBulk };
    Kind kind = Kind::kSendInline;
    void* slots = nullptr;    // send: the peer's ring for us (mapped); receive: ours
    void* free = nullptr;     // send: our slot-free words; receive: the peer's (mapped)
    void* counter = nullptr;  // ours (device memory, 64 bits): this direction's messages so far
    void* buffer = nullptr;   // send: the data; receive: where it goes (device-reachable)
    std::size_t bytes = 0;    // send: the size; receive: the most it takes
    void* verdict = nullptr;  // receive with a hand-off after it, bulk send: 3 host words
    void* chunks = nullptr;   // ours (device memory): the counts of each ring place
    int index = 0;            // among the launch's ops of the same peer and direction
    int total = 0;            // their number
    bool direct = true;       // receive: `buffer` is the caller's, not a bounce
    int after = -1;           // the launch's op that takes the bulk ring before this one
    int peer = -1;            // the member at the other end (kernels tell the host they wait)
  };
  // One launch of up to kP2pMaxOps ops on `stream` (of `device`'s context): every op runs at
  // once. `words`: the communicator's stop words (as OneShot::words); `scratch`:
  // kP2pScratchBytes of device memory, zeroed before the first launch.
  // `release`, where given, is the launch's own hand-off (proto::Release): its last block writes
  // `value` to `ready` where an op's verdict leaves ferry's thread work, else to `done`.
  static constexpr std::size_t kP2pScratchBytes = 512;
  struct P2pRelease {
    void* ready = nullptr;  // device views of host words
    void* done = nullptr;
    std::uint32_t value = 0;
    bool reset = false;  // clear done's low word first (a graph's)
  };
  virtual Status p2p_on_stream(void* stream, int device, std::span<const P2pOp> ops,
                               const P2pRing& ring, void* words, std::uint64_t timeout_ns,
                               void* scratch, const P2pRelease* release) = 0;
  // The resident one-shot kernel (kernels.cu, ferry_allreduce_resident): one block that stays on
  // the GPU between one communicator's calls of one block (data up to its block_bytes), so such a
  // call costs no launch. resident_open makes its mailbox and stream (nothing runs yet; `shape`
  // gives members, me, slot_bytes, areas and words); resident_post hands it a call and launches it
  // when it is not running (it leaves after `idle_us` without calls, or when words[0] is raised),
  // with a ticket that done() follows; resident_outcome says (once) why a call could not run;
  // resident_close waits for it to leave (raise words[0] first) and frees what open made.
  virtual Status resident_open(int device, const OneShot& shape, std::uint64_t idle_us,
                               int* id) = 0;
  virtual Status resident_post(int id, const OneShot& call, Ticket* ticket) = 0;
  virtual Status resident_outcome(int id) = 0;
  virtual void resident_close(int id) = 0;
  // Host memory that kernels on `device` read (device_view), for stop words.
  virtual Status map_host(int device, std::size_t bytes, void** host, void** device_view) = 0;
  virtual void unmap_host(int device, void* host) = 0;
  // Sets device memory to zero and waits for it.
  virtual Status zero(int device, void* pointer, std::size_t bytes) = 0;

  // ---- Stream-ordered operations (proto/stream_ops.hpp) ----
  // What an application's stream is: its GPU (an ordinal of this process) and, while it captures
  // a graph, that graph. nullptr and CU_STREAM_LEGACY (0x1) name the legacy default stream and
  // CU_STREAM_PER_THREAD (0x2) the per-thread one, both of the calling thread's current context.
  struct StreamInfo {
    int device = -1;
    void* graph = nullptr;  // the CUgraph being captured, else null
  };
  virtual Status stream_info(void* stream, StreamInfo* info) = 0;
  // The hand-off of one stream operation, on `stream` after the work already there: where
  // `reset`, writes 0 to the low word of *done; writes `value` to *start; then waits until the 64
  // bits at done are at least `value`. `start` and `done` are device views of host words
  // (map_host) that the proxy thread reads and writes; a nonzero high word of *done releases
  // every wait on it, for good.
  virtual Status enqueue_handoff(void* stream, void* start, void* done, std::uint32_t value,
                                 bool reset) = 0;
  // The hand-off's wait alone, where a kernel before it writes `start` or `done` itself
  // (proto::Release): until the 64 bits at `done` are at least `value`.
  virtual Status enqueue_wait(void* stream, void* done, std::uint32_t value) = 0;
  // A copy on `stream` (of `device`'s context) after the work already there: any memory CUDA
  // can copy (pageable host memory makes the call wait for the stream, and a capture refuses it).
  virtual Status copy_on_stream(void* stream, int device, void* dst, const void* src,
                                std::size_t bytes) = 0;
  // Element-wise on `stream` (of `device`'s context) after the work already there: out = in *
  // factor, or, for an integer type where `divisor` is not 0, out = in / divisor truncated toward
  // zero (coll::multiply_to and divide_to on the GPU). The factor is one element of `type`, read
  // from `device_factor` when the work runs where that is not null, else the low bytes of
  // `factor_bits`. out may be in. For NCCL's ncclAvg and pre-multiplied sums (src/nccl).
  struct Scale {
    const void* device_factor = nullptr;
    std::uint64_t factor_bits = 0;
    std::uint64_t divisor = 0;
  };
  virtual Status scale_on_stream(void* stream, int device, void* out, const void* in,
                                 std::size_t count, DataType type, const Scale& scale) = 0;
  // Calls release(arg) once `graph` and every instantiation of it are destroyed (on a thread of
  // the driver's; it must not call CUDA), or at once where the graph could not take it.
  virtual Status retain_with_graph(void* graph, void (*release)(void*), void* arg) = 0;
  // While deferred, the IPC cache keeps the mappings it would close (a stale, evicted or dead
  // peer's) until close_deferred: closing one may wait for the GPU to go idle, which it never does
  // while a stream waits for ferry's proxy. deferred_unmaps says how many wait (any thread).
  virtual void defer_unmaps(bool defer) = 0;
  virtual void close_deferred() = 0;
  [[nodiscard]] virtual std::size_t deferred_unmaps() const = 0;
  // Lets the calling thread make any CUDA call while other threads capture graphs
  // (cuThreadExchangeStreamCaptureMode); returns the mode to restore with restore_capture.
  virtual int relax_capture() = 0;
  virtual void restore_capture(int mode) = 0;

  // Pins host memory for DMA (staging rings); unregister before unmapping.
  virtual Status register_host(void* pointer, std::size_t bytes) = 0;
  virtual void unregister_host(void* pointer) = 0;

  // The test fault FERRY_TEST_CUDA_IPC_FAIL: import_ipc fails as a driver refusal would.
  [[nodiscard]] virtual bool inject_ipc_failure() const = 0;

  // "CUDA 13000: 1 device (NVIDIA H100 80GB HBM3); ipc cache 3 mappings, 12 MiB"
  [[nodiscard]] virtual std::string describe() const = 0;
  // How each GPU in use reports finished copies ("cuda:0 by a flag the GPU writes"); empty
  // before the first one is used.
  [[nodiscard]] virtual std::string completion() const = 0;
  [[nodiscard]] virtual std::size_t cached_mappings() const = 0;

 private:
  // create's driver-backed part (impl/cuda.cpp, or none.cpp in a build without CUDA's headers).
  static std::unique_ptr<Cuda> create_driver(const util::Config& config, std::string* why);
};

// For its scope, lets the calling thread make any CUDA call while other threads (or its own
// stream) capture graphs (Cuda::relax_capture), then restores its mode.
class RelaxedCapture {
 public:
  explicit RelaxedCapture(Cuda* gpu) : gpu_(gpu), mode_(gpu->relax_capture()) {}
  ~RelaxedCapture() { gpu_->restore_capture(mode_); }
  RelaxedCapture(const RelaxedCapture&) = delete;
  RelaxedCapture& operator=(const RelaxedCapture&) = delete;

 private:
  Cuda* gpu_;
  int mode_;
};

}  // namespace ferry::cuda
