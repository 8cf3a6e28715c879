// The face every transport shows the protocol layer: active messages (an id, a small header and an
// optional payload, copied by the transport) and, where the transport can, a zero-copy get from a
// peer's memory. Transports obey; src/proto decides what to send and when.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::transport {

struct Capabilities {
  std::string name;
  std::size_t max_am = 0;             // largest header + payload one am_send carries
  std::size_t max_inline = 0;         // header + payload at or under this go in one FIFO element
  std::size_t get_from = 0;           // messages from this size up are better fetched with get()
  std::size_t split_from = SIZE_MAX;  // and from this size up copied from both ends (SplitCopies)
  std::size_t read_from = 0;          // rendezvous by one-sided read from this size up; below, by a
                                      // direct transfer where the endpoint has one
  double latency_us = 0;              // estimates used to rank transports
  double bandwidth_GBps = 0;
};

// What the protocol layer knows about a peer when it asks a transport to reach it.
struct PeerInfo {
  int rank = -1;
  bool same_node = false;
  int local_index = -1;                // index among the node's processes, when same_node
  std::span<const std::byte> address;  // what the peer's transport published
};

struct Reachability {
  bool reachable = false;
  std::string reason;  // why, either way
};

// How the data of an active message will be used; transports may pick a copy method by it.
enum class AmHint : std::uint8_t {
  kNone,
  kBulk,  // one piece of a large transfer: the sender will not touch it again (streaming stores)
};

// Receives active messages. `data` is header + payload, valid only during the call.
class AmHandler {
 public:
  virtual ~AmHandler() = default;
  virtual void on_am(std::uint8_t id, int source_rank, std::span<const std::byte> data) = 0;
  // A direct transfer (DirectTransfers, OneSidedReads, OneSidedWrites) finished, well or not:
  // `cookie` is the one its caller passed. Called from the transport's progress.
  virtual void on_direct(std::uint64_t /*cookie*/, Status /*status*/) {}
  // The messages the transport had at hand were delivered (more may follow in the same
  // progress): answers the handler collected while handling them can go now. A transport whose
  // every poll costs a system call says so between polls; otherwise the end of progress does.
  virtual void on_batch_end() {}
};

// A region of a peer's memory as the transport names it for one-sided access.
struct RemoteRegion {
  std::uint64_t address = 0;
  std::uint64_t key = 0;
};

// What an endpoint may offer beyond active messages, each an interface of its own: an endpoint
// that offers one returns it (Endpoint::zero_copy_get, split_copies, direct, reads, writes), and
// one that does not returns null, fixed once connected. Callers keep the pointers (proto::Link).

// A synchronous copy out of the peer's memory at its virtual address (self: memcpy; shm: CMA).
class ZeroCopyGet {
 public:
  virtual ~ZeroCopyGet() = default;
  // Copies `length` bytes at the peer's address `remote` into `local`. kUnsupported: refused,
  // and will be again (CMA not permitted); other errors concern this copy only.
  virtual Status get(void* local, std::uint64_t remote, std::size_t length) = 0;
};

// A message copied from both ends at once (shm: two CPUs, each its own system call): the
// receiver gets the head [0, offset) while the sender puts the tail [offset, length) into the
// receive buffer. The tail goes to whichever side claims it first, through a claim word in the
// receiver's memory, so a sender that does not call in soon costs the receiver nothing: it gets
// the tail too. A claim word is the receiver's from open_claim until close_claim; once the
// receiver claimed it or learnt the sender's outcome, a late or forged sender's claim fails.
class SplitCopies {
 public:
  struct Claim {
    std::uint32_t slot = 0;
    std::uint64_t ticket = 0;
  };
  virtual ~SplitCopies() = default;
  // Receiver: a claim word for one message (false: all are in use; copy it alone).
  virtual bool open_claim(Claim* claim) = 0;
  // Receiver: claims the tail; false: the sender did first (its answer follows).
  virtual bool claim_tail(const Claim& claim) = 0;
  virtual void close_claim(const Claim& claim) = 0;
  // Sender: claims the tail in the receiver's word; false: the receiver did, or no such claim.
  virtual bool claim_peer_tail(const Claim& claim) = 0;
  // Sender: copies `length` bytes at `local` to the peer's address `remote`. kUnsupported:
  // refused, and will be again; other errors concern this copy only.
  virtual Status put(std::uint64_t remote, const void* local, std::size_t length) = 0;
};

// Zero-copy transfer of one whole message by the transport's own matching: the receiver posts
// recv_direct(buffer, length, key) with a key of its choosing and tells the sender (CTS), which
// calls send_direct with that key. Each side learns that its buffer is free again through
// AmHandler::on_direct(cookie). cancel_direct asks for it back early (the completion still comes,
// with an error). `device` is the GPU whose memory `buffer` is (-1: host memory); only what
// device_direct() allowed is passed.
class DirectTransfers {
 public:
  virtual ~DirectTransfers() = default;
  virtual Status send_direct(const void* buffer, std::size_t length, int device, std::uint64_t key,
                             std::uint64_t cookie) = 0;
  virtual Status recv_direct(void* buffer, std::size_t length, int device, std::uint64_t key,
                             std::uint64_t cookie) = 0;
  virtual void cancel_direct(std::uint64_t cookie) = 0;
  // Whether direct transfers may use GPU `device`'s memory as it is (the NIC registers GPU
  // memory). The first question per GPU registers `buffer` for real to find out, and the answer
  // is kept. False: the caller stages the data through host memory.
  [[nodiscard]] virtual bool device_direct(int device, const void* buffer, std::size_t length) = 0;
  // How device data moves over this endpoint, and why.
  [[nodiscard]] virtual std::string device_route() const = 0;
};

// One-sided reads (RMA rendezvous, and native gets): the sender exposes its buffer (registered
// for remote reads; `region` is what the peer needs to read it) until unexpose(cookie); the
// receiver reads it into its own buffer with read_direct, and learns the end through
// AmHandler::on_direct(cookie). revoke: the peer must not read it any more (the send was
// withdrawn or failed), whatever registration caching would keep. Host memory only.
class OneSidedReads {
 public:
  virtual ~OneSidedReads() = default;
  virtual Status expose(const void* buffer, std::size_t length, std::uint64_t cookie,
                        RemoteRegion* region) = 0;
  virtual void unexpose(std::uint64_t cookie, bool revoke) = 0;
  virtual Status read_direct(void* buffer, std::size_t length, RemoteRegion region,
                             std::uint64_t cookie) = 0;
};

// One-sided writes by the transport itself (native one-sided over ofi) into a peer's region that
// the peer registered with Transport::register_region: write_direct copies `length` bytes at
// `buffer` there and reports (AmHandler::on_direct(cookie)) once they are in the peer's memory;
// gets use OneSidedReads::read_direct. Offered only where the provider checks keys. Host memory
// only.
class OneSidedWrites {
 public:
  virtual ~OneSidedWrites() = default;
  virtual Status write_direct(const void* buffer, std::size_t length, RemoteRegion region,
                              std::uint64_t cookie) = 0;
};

// One per (transport, peer).
class Endpoint {
 public:
  using RemoteRegion = transport::RemoteRegion;
  virtual ~Endpoint() = default;
  // Copies header and payload to the peer. kWouldBlock when there is no room now (the caller
  // queues and retries after progress); any other error is a real failure.
  virtual Status am_send(std::uint8_t id, std::span<const std::byte> header,
                         std::span<const std::byte> payload, AmHint hint) = 0;
  // What this endpoint offers beyond active messages (null: not offered).
  [[nodiscard]] virtual ZeroCopyGet* zero_copy_get() { return nullptr; }
  [[nodiscard]] virtual SplitCopies* split_copies() { return nullptr; }
  [[nodiscard]] virtual DirectTransfers* direct() { return nullptr; }
  [[nodiscard]] virtual OneSidedReads* reads() { return nullptr; }
  [[nodiscard]] virtual OneSidedWrites* writes() { return nullptr; }
  // A rendezvous send whose buffer the caller may reuse now (withdrawn after FERRY_TIMEOUT) is
  // marked where the peer can see it; a receiver that fetched `sreq` with a ZeroCopyGet asks
  // afterwards whether it was withdrawn (then what it read may be garbage). Marking comes before
  // the send returns, and the check after the read, so a clean check proves the read saw live
  // data. Only transports whose peers read a sender's memory unasked keep marks.
  virtual void mark_withdrawn(std::uint64_t /*sreq*/) {}
  [[nodiscard]] virtual bool was_withdrawn(std::uint64_t /*sreq*/) const { return false; }
  // The peer's process id where it runs on this node and the transport knows it, else 0.
  [[nodiscard]] virtual int peer_pid() const { return 0; }
  // "shm (cma single-copy)" / "shm (pipelined: cma probe failed: EPERM)".
  [[nodiscard]] virtual std::string describe() const = 0;
};

class Transport {
 public:
  virtual ~Transport() = default;
  [[nodiscard]] virtual const Capabilities& capabilities() const = 0;
  // Published to every rank through the bootstrap.
  [[nodiscard]] virtual std::vector<std::byte> address() const = 0;
  [[nodiscard]] virtual Reachability reach(const PeerInfo& peer) const = 0;
  // Throws ferry::Error when the peer's address is malformed or its resources cannot be opened.
  virtual std::unique_ptr<Endpoint> connect(const PeerInfo& peer) = 0;
  // Called once every rank has connected (all mappings are made): a transport may drop names.
  virtual void on_all_connected() {}
  // Appends (rank, why) for each peer found dead since the last call. Called from the engine's
  // idle path, a few hundred times a second at most: it may make a system call.
  virtual void check_peers(std::vector<std::pair<int, std::string>>* /*failed*/) {}
  // Delivers arrived messages to the handler; returns how many.
  virtual int progress() = 0;
  // At finalize, when the ranks' last barrier failed, before the transport is closed: whether
  // every message sent so far has reached its peer (dead peers aside). The first call may start
  // what finds out; progress() completes it. A transport whose sends complete only once
  // delivered has nothing to do.
  [[nodiscard]] virtual bool delivered() { return true; }
  // Registers this process's host memory for the peers' OneSidedWrites / OneSidedReads
  // (native one-sided over ofi). `key` is the key asked for (a provider that chooses its own says
  // which in region->key); `writable`: peers may write it (else reads only); `region` is what the
  // peers need; released by release_region(*handle).
  virtual Status register_region(void* /*buffer*/, std::size_t /*length*/, std::uint64_t /*key*/,
                                 bool /*writable*/, RemoteRegion* /*region*/, void** /*handle*/) {
    return Status(Code::kUnsupported, "no one-sided access by the transport");
  }
  virtual void release_region(void* /*handle*/) {}

  // Event-driven waiting. arm() asks the peers to wake wait_fd() (readable) when they next send
  // here; false when something has arrived already (then progress, do not sleep). disarm() ends
  // it and empties wait_fd(). A transport without a wake-up has wait_fd() -1: a sleeper polls it
  // on a timer.
  [[nodiscard]] virtual int wait_fd() const { return -1; }
  virtual bool arm() { return true; }
  virtual void disarm() {}
};

// Before a peer is taken for dead: reads what it sent before it went (delivered to this process,
// or waiting in a socket), since messages from a failed peer are dropped and a receive may wait
// for its last one. `progress` is one poll of the transports concerned, returning its events;
// polled until two passes in a row find nothing, at most 100.
template <typename Progress>
void drain_until_quiet(Progress&& progress) {
  for (int pass = 0, quiet = 0; pass < 100 && quiet < 2; ++pass) {
    quiet = progress() == 0 ? quiet + 1 : 0;
  }
}

}  // namespace ferry::transport
