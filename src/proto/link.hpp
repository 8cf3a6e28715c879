// What the parts of the protocol engine share about each peer and what they send it: its Link,
// and the Pending active messages queued in order behind one that found no room.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "mem/memory.hpp"
#include "transport/transport.hpp"

namespace ferry::proto {

struct Pending {
  std::uint8_t am = 0;
  std::uint8_t header_size = 0;
  std::array<std::byte, 40> header{};
  const std::byte* payload = nullptr;
  std::size_t payload_size = 0;
  std::uint32_t request = UINT32_MAX;  // completed with the error if sending fails
  bool complete_on_send = false;       // eager sends complete once the transport has the data
  // A pipelined rendezvous stream (am == kAmFrag): send [offset, length) of `stream` in chunks.
  std::uint32_t stream = UINT32_MAX;
  std::uint64_t rreq = 0;
  std::size_t offset = 0;
  std::size_t length = 0;
  // A put (am == kAmPut with a stream): where in which region the stream's bytes go.
  std::uint64_t region = 0;
  std::uint64_t secret = 0;
  std::uint64_t region_offset = 0;
};
// One peer's link: the transport that reaches it, what it was found to allow, and the queue of
// what waits for room in it. Everything else about a peer belongs to the part that uses it.
struct Link {
  transport::Endpoint* endpoint = nullptr;  // null: unreachable (why says why)
  // What the endpoint offers beyond active messages (null: not offered), asked once.
  transport::ZeroCopyGet* zero_copy = nullptr;
  transport::SplitCopies* split = nullptr;  // with zero_copy: copies from both ends
  transport::DirectTransfers* direct = nullptr;
  transport::OneSidedReads* reads = nullptr;
  transport::OneSidedWrites* writes = nullptr;  // native one-sided over ofi
  std::string transport;
  std::string why;
  std::size_t eager_limit = 0;  // largest message sent eagerly
  std::size_t frag_size = 0;    // payload per fragment of a pipelined message
  std::size_t get_from = 0;     // rendezvous messages from this size up use the endpoint's get
  std::size_t split_from = SIZE_MAX;  // zero-copy gets from this size up are split
  std::size_t read_from = 0;          // from this size up the receiver reads them (below: direct)
  bool get_failed = false;            // a zero-copy get failed once: pipeline from now on
  bool split_failed = false;          // the peer could not write a tail once: no more splits
  bool direct_failed = false;         // a direct receive could not be posted: pipeline from now on
  bool read_failed = false;           // a one-sided read failed: clear-to-send from now on
  bool failed = false;                // the peer died: everything involving it fails with `why`
  std::uint64_t failure_order = 0;    // Liveness::failure_order
  // Nonzero once the peer finalized (kAmBye): it sends nothing more. Liveness::departure_order.
  std::uint64_t departure_order = 0;
  [[nodiscard]] bool departed() const { return departure_order != 0; }
  bool shares_memory = false;   // self or shm: device data can go by CUDA IPC or staging ring
  std::deque<Pending> pending;  // in order; nothing bypasses it
};
// A copy in flight on a CUDA stream, polled by progress.
struct DeviceOp {
  // kRmaCopy: a put or get on a peer's device region mapped here (guarded_access). kIpcPut: a
  // send of page-locked host memory written into the receive buffer, mapped here.
  enum Kind : std::uint8_t { kIpcGet, kStageFill, kStageDrain, kRmaCopy, kIpcPut } kind;
  cuda::Ticket ticket;
  std::uint32_t request;
  int peer;
  std::uint64_t wire = 0;    // kIpcGet: the sender's request; kStageFill, kIpcPut: the receiver's
  std::uint64_t offset = 0;  // in the message
  std::uint64_t ring_offset = 0;  // staging: the slot
  std::uint64_t length = 0;
  cuda::IpcKey key;  // kIpcGet, kRmaCopy, kIpcPut: unpinned when done
  int device = -1;   // kIpcGet, kRmaCopy, kIpcPut: the GPU the mapping was made for
};

}  // namespace ferry::proto
