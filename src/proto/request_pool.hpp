// Request slots: stable storage (chunks that never move), a free list, and a generation per slot
// so that a stale or forged request id from a peer is recognised instead of trusted.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"

namespace ferry::proto {

enum class RequestKind : std::uint8_t { kSend, kRecv, kOperation };
enum class RequestState : std::uint8_t {
  kFree,
  kPosted,  // recv: waiting in the posted queue
  kActive,  // send: queued or waiting for the peer; recv: receiving fragments
  kDone,
};

// A request: its life and outcome, its message (one-sided requests use the peer, buffers and size
// too), then the state of the parts that move it, each typed and reset on its own.
struct RequestSlot {
  std::uint32_t generation = 1;
  RequestKind kind = RequestKind::kSend;
  RequestState state = RequestState::kFree;
  bool handle_alive = false;  // a Request object refers to it
  bool rendezvous = false;    // send: waiting for the receiver's CTS or FIN
  int peer = -1;
  Tag tag = 0;
  Tag mask = 0;
  const std::byte* send_buffer = nullptr;
  std::byte* recv_buffer = nullptr;
  std::size_t size = 0;      // send: message size; recv: capacity
  std::size_t expected = 0;  // recv by fragments: bytes to receive
  std::size_t received = 0;
  std::size_t message_size = 0;  // recv: the sender's size (for truncation)
  Status status;
  MessageInfo info;
  // How the bytes move beyond active messages, and what completion waits for. Reset as a whole
  // when the slot is taken.
  struct Transfer {
    std::uint32_t device_ops = 0;  // copies or direct transfers in flight that use the buffer
    bool direct = false;           // a transport moves the whole message (Endpoint::*_direct)
    bool exposed = false;          // send: the buffer is exposed for the receiver's read
    bool reading = false;          // recv: reading the sender's exposed buffer (read_sreq's)
    std::uint64_t read_sreq = 0;
    bool withdrawn = false;  // recv: the sender withdrew the message being read (kAmCancel)
    bool deferred = false;   // completion waits for those copies (then `status`)
    // recv copied from both ends (transport::SplitCopies): the sender claimed the tail and
    // writes it from `split_head` on; its kAmTailWritten ends the receive, and until then
    // device_ops counts the write and `status` holds how the head's get went. The claim word is
    // open while `split` is.
    bool split = false;
    std::uint32_t split_slot = 0;
    std::uint64_t split_ticket = 0;
    std::uint64_t split_sreq = 0;
    std::uint64_t split_address = 0;  // the sender's buffer
    std::uint64_t split_head = 0;
  } transfer;
  // Device buffers and page-locked host memory (DevicePath, ChunkedPath): taken with the slot
  // by RequestPool::allocate (device, pinned_device, staged, offered), let go by free (host_copy,
  // chunk, bounce); the rest is set before it is read.
  struct Gpu {
    int device = -1;  // CUDA ordinal of the buffer; -1: host memory
    // Host memory page-locked by CUDA: the GPU whose copy engines move it to and from a staging
    // ring (Cuda::copy_through_device_async); -1: the CPU copies it.
    int pinned_device = -1;
    std::size_t staged = 0;        // staged send: bytes put into the ring so far
    std::uint64_t stage_rreq = 0;  // staged send: the receiver's request
    // Device send: what the RTS carries. Staged receive into device memory: what STAGE_CTS
    // offers a page-locked sender to write into (`offered`).
    cuda::IpcKey key;
    bool offered = false;
    // With a peer that shares no memory with us (ofi): an eager message travels from this host
    // copy; larger ones in chunks (proto/chunked.cpp) through a pinned bounce.
    std::vector<std::byte> host_copy;
    std::size_t chunk = 0;        // chunked transfer: bytes per direct transfer (0: not chunked)
    std::byte* bounce = nullptr;  // chunked transfer of device memory: the pinned bounce in use
  } gpu;
  // One-sided operations (proto/rma/): what this request is, and for an answer to a peer's
  // get, the region it is sent from; an atomic's result goes to `result` (`width` bytes). Reset
  // as a whole when the slot is taken.
  enum class Rma : std::uint8_t { kNone, kPut, kGet, kAtomic, kGetReply };
  struct OneSided {
    Rma kind = Rma::kNone;
    std::uint8_t width = 0;
    bool native = false;       // a native put or get (its grant counts it in flight)
    std::uint64_t region = 0;  // a get's answer: the region read; else the region accessed
    void* result = nullptr;
    std::uint64_t operands[2] = {};  // an atomic's operand and compare: its payload until sent
    std::byte* device = nullptr;     // a get into device memory by messages: where host_copy goes
  } rma;
};

class RequestPool {
 public:
  std::uint32_t allocate(RequestKind kind) {
    std::uint32_t index;
    if (!free_.empty()) {
      index = free_.back();
      free_.pop_back();
    } else {
      index = size_++;
      if (index % kChunk == 0) chunks_.push_back(std::make_unique<RequestSlot[]>(kChunk));
    }
    // Only what a previous use can have left behind (free() reset the status and let go of the
    // device buffers' memory): the message field by field, the parts' state by part.
    RequestSlot& slot = (*this)[index];
    if (kind == RequestKind::kSend) ++sends_;
    slot.kind = kind;
    slot.state = RequestState::kActive;
    slot.handle_alive = true;
    slot.rendezvous = false;
    slot.peer = -1;
    slot.tag = 0;
    slot.mask = 0;
    slot.send_buffer = nullptr;
    slot.recv_buffer = nullptr;
    slot.size = slot.expected = slot.received = slot.message_size = 0;
    slot.info = {};
    slot.transfer = {};
    slot.gpu.device = -1;
    slot.gpu.pinned_device = -1;
    slot.gpu.staged = 0;
    slot.gpu.offered = false;
    slot.rma = {};
    return index;
  }
  void free(std::uint32_t index) {
    RequestSlot& slot = (*this)[index];
    slot.state = RequestState::kFree;
    slot.status = Status();
    std::vector<std::byte>().swap(slot.gpu.host_copy);
    slot.gpu.chunk = 0;
    slot.gpu.bounce = nullptr;
    ++slot.generation;
    if (slot.generation == 0) slot.generation = 1;
    free_.push_back(index);
  }
  // A shift and a mask: several lookups per message (a deque of slots this size took ~30
  // instructions per lookup).
  RequestSlot& operator[](std::uint32_t index) { return chunks_[index / kChunk][index % kChunk]; }
  const RequestSlot& operator[](std::uint32_t index) const {
    return chunks_[index / kChunk][index % kChunk];
  }
  [[nodiscard]] std::size_t capacity() const { return size_; }
  // Send-like requests (sends, one-sided answers and puts) not complete yet: finalize waits for
  // them; complete() counts each one's end.
  [[nodiscard]] std::size_t sends() const { return sends_; }
  void send_ended() { --sends_; }
  [[nodiscard]] bool done(std::uint32_t index) const {
    return (*this)[index].state == RequestState::kDone;
  }

  // ---- What a Request handle does with its slot ----
  // The handle lets its slot go; true when it was the last handle held after retire() (its
  // engine can go then).
  bool release(std::uint32_t index) {
    RequestSlot& slot = (*this)[index];
    if (slot.state == RequestState::kDone) {  // retire() ended every slot a handle names
      free(index);
    } else {
      slot.handle_alive = false;
    }
    return retired_ && --held_after_ == 0;
  }
  // The engine is finalized: every slot a handle still names ends (those not complete with
  // kInvalidArgument); true when there are such handles, and the last one's release says so.
  bool retire() {
    retired_ = true;
    held_after_ = 0;
    for (std::uint32_t i = 0; i < size_; ++i) {
      RequestSlot& slot = (*this)[i];
      if (slot.state == RequestState::kFree || !slot.handle_alive) continue;
      ++held_after_;
      if (slot.state != RequestState::kDone) {
        slot.state = RequestState::kDone;
        slot.status = Status(Code::kInvalidArgument,
                             "its Context was finalized (destroyed) before it completed");
      }
    }
    return held_after_ > 0;
  }

  // The wire form of a request id: generation and index.
  [[nodiscard]] std::uint64_t wire_id(std::uint32_t index) const {
    return (std::uint64_t{(*this)[index].generation} << 32) | index;
  }
  // The slot a wire id names, if it is live with that generation; nullptr otherwise.
  RequestSlot* lookup(std::uint64_t wire, std::uint32_t* index_out) {
    auto index = static_cast<std::uint32_t>(wire & 0xffffffffu);
    auto generation = static_cast<std::uint32_t>(wire >> 32);
    if (index >= size_) return nullptr;
    RequestSlot& slot = (*this)[index];
    if (slot.generation != generation || slot.state == RequestState::kFree) return nullptr;
    *index_out = index;
    return &slot;
  }

 private:
  static constexpr std::uint32_t kChunk = 64;
  std::vector<std::unique_ptr<RequestSlot[]>> chunks_;
  std::uint32_t size_ = 0;
  std::vector<std::uint32_t> free_;
  std::size_t sends_ = 0;
  bool retired_ = false;
  std::size_t held_after_ = 0;  // after retire(): Request handles still held
};

}  // namespace ferry::proto
