// Tag-matched point-to-point messages, the engine's part for isend and irecv. Up to the peer's
// eager limit a message goes whole in one active message (EAGER) and a receive that has not been
// posted finds it in the unexpected queue. Above it, a rendezvous: the sender announces it (RTS,
// or RTS_READ with its buffer exposed for a one-sided read); once a receive matches, the
// receiver takes the data by the best way the link offers:
//   - a one-sided read of the exposed buffer, then FIN;
//   - a zero-copy get (shm: CMA), then FIN;
//   - a direct transfer (ofi: the provider's own rendezvous) after CTS_DIRECT;
//   - else CTS, and the sender streams fragments (FRAG).
// Device buffers take the device paths (device_path.hpp, chunked.hpp). A sender that gives up
// withdraws what it can (CANCEL, NACK); a receiver that fails says so in a FIN with a code.
// Every header from a peer is size-checked and every request id in it is checked against the
// pool before use (messages.cpp, rendezvous.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "ferry/ferry.hpp"
#include "proto/matching.hpp"
#include "proto/request_pool.hpp"
#include "transport/transport.hpp"
#include "util/config.hpp"

namespace ferry::proto {

class Engine;
struct CtsHeader;
struct Link;     // proto/link.hpp
struct Pending;  // proto/link.hpp

// A message of `size` bytes from `source` that a receive of `capacity` bytes cut short.
inline Status truncation(int source, std::size_t size, std::size_t capacity) {
  return Status(Code::kTruncated, "message of " + std::to_string(size) + " bytes from rank " +
                                      std::to_string(source) + " truncated to the " +
                                      std::to_string(capacity) + "-byte receive buffer");
}

class Messages {
 public:
  Messages(Engine& engine, const util::Config& config);
  Messages(const Messages&) = delete;
  Messages& operator=(const Messages&) = delete;

  // `synchronous`: announced by rendezvous whatever the size, so the request completes only once
  // the receiver has matched it (MPI_Ssend).
  Request isend(const void* buffer, std::size_t bytes, int destination, Tag tag,
                bool synchronous = false);
  // A blocking send's fast path: an eager message of host memory that the transport takes at
  // once is sent with no request slot, and its status returned; nullopt where isend must do it
  // (bad arguments, CUDA in use, a queue to the peer, a full FIFO, a rendezvous).
  std::optional<Status> send_now(const void* buffer, std::size_t bytes, int destination, Tag tag);
  Request irecv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask);
  // irecv without the handle: the request slot's index (complete already where the message
  // was there or the arguments are bad). A blocking receive waits on it and releases it itself.
  std::uint32_t post_recv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask);
  std::optional<MessageInfo> iprobe(int source, Tag tag, Tag mask);
  // A blocking send ran out of time and its caller is about to release the buffer: withdraw what
  // is still queued, tell the receiver of an announced message, and complete it with kTimeout.
  Status abandon_send(std::uint32_t index);
  // A posted receive that has not matched ends, kCanceled (false if it matched already).
  bool cancel(std::uint32_t index);
  // A failing collective gives up on a receive: as cancel, and also one whose read of the
  // sender's buffer failed and is held while DirectEnds looks whether the sender died (its
  // sender is told by FIN). False: it is still in a transport's hands; wait for its end.
  bool withdraw_recv(std::uint32_t index);
  // An active message of this part (true), or another's (false).
  bool on_am(std::uint8_t id, int source, std::span<const std::byte> data);
  // A one-sided read of a sender's buffer ended: FIN on success; on failure other than the
  // peer's death or the sender's withdrawal, clear-to-send instead (true: the receive goes on
  // that way).
  bool read_ended(std::uint32_t index, const Status& status);
  // `rank` failed: receives posted for it (and, with no other rank left, from any source) end,
  // and its announcements are dropped.
  void peer_failed(int rank, const Status& status);
  // `rank` finalized (kAmBye, after all it sent here): receives posted for it that nothing
  // matched end (and, with no other rank left, those from any source). What it announced stays
  // for the receives that come.
  void peer_departed(int rank);

  // For the device paths: matching, and the CTS check.
  std::optional<std::uint32_t> match_posted(int source, Tag tag) {
    return matcher_.match_posted(source, tag);
  }
  void add_unexpected(Unexpected&& message) { matcher_.add_unexpected(std::move(message)); }
  // An announced rendezvous message that waits for its receive.
  static Unexpected unexpected_rendezvous(int source, Tag tag, std::uint64_t size,
                                          std::uint64_t sreq);
  // Validates a CTS (plain, direct or chunked) for one of our rendezvous sends; null (NACKed) if
  // not.
  RequestSlot* cts_target(int source, const CtsHeader& header, std::uint32_t* index);

  // Finalize: no receive will be posted any more, so an announced message that no posted receive
  // matches never will be: its sender is told (FIN kFinNeverMatched) and its send ends, instead
  // of holding the sender's finalize for FERRY_FINALIZE_TIMEOUT. Returns how many messages sent
  // here were never received.
  std::size_t finalize();
  [[nodiscard]] bool finalizing() const { return finalizing_; }
  void refuse_unmatched(int source, std::uint64_t sreq);
  // Sends of ours that peers refused so.
  [[nodiscard]] std::size_t never_matched() const { return never_matched_; }

 private:
  // Ends the receives posted for `rank` that nothing matched with `status`, and, where no other
  // rank is left, those from any source (Liveness::no_one_left).
  void end_posted_receives(int rank, const Status& status);
  // An eager message straight to the peer's transport (kWouldBlock: it is full).
  Status send_eager(Link& peer, const void* buffer, std::size_t bytes, Tag tag);
  // isend's part for a buffer CUDA knows: device memory goes by the device path where the peer
  // shares memory (false: taken), else from a host copy when small, else announced as device
  // data (*rts_address); page-locked memory notes its GPU. False also when it failed (the
  // request is complete then).
  bool send_gpu_memory(std::uint32_t index, Link& peer, std::uint64_t* rts_address);
  // A send above the peer's eager limit: an RTS, or an RTS the receiver answers by reading the
  // exposed buffer itself.
  void announce_rendezvous(std::uint32_t index, Link& peer, std::uint64_t rts_address,
                           Pending* pending);
  void deliver_eager(std::uint32_t index, int source, Tag tag, std::span<const std::byte> payload);
  void handle_eager(int source, std::span<const std::byte> data);
  void handle_rts(int source, std::span<const std::byte> data);
  void handle_rts_read(int source, std::span<const std::byte> data);
  void handle_cts(int source, std::span<const std::byte> data);
  void handle_cts_direct(int source, std::span<const std::byte> data);
  void handle_frag(int source, std::span<const std::byte> data);
  void handle_fin(int source, std::span<const std::byte> data);
  void handle_cancel(int source, std::span<const std::byte> data);
  static Status withdrawn_while_read(int source);
  void handle_nack(int source, std::span<const std::byte> data);
  // `remote`: the sender exposed its buffer for a one-sided read (null: it did not).
  void start_rendezvous(std::uint32_t index, int source, Tag tag, std::size_t size,
                        std::uint64_t sreq, std::uint64_t address,
                        const transport::Endpoint::RemoteRegion* remote);
  // A rendezvous message got by zero-copy get (`status`: how): ends the receive and tells the
  // sender, or false when it must come pipelined (request_data) instead.
  bool got(std::uint32_t index, int source, std::uint64_t sreq, Status status);
  // Gets the head of a large message while the sender may write the tail (SplitCopies); false
  // when no claim word is free (get it whole).
  bool start_split(std::uint32_t index, int source, std::uint64_t sreq, std::uint64_t address,
                   std::size_t length);
  void handle_cts_split(int source, std::span<const std::byte> data);
  void handle_tail_written(int source, std::span<const std::byte> data);
  // Asks the sender for a matched rendezvous message: a direct transfer, else fragments.
  void request_data(std::uint32_t index, int source, std::uint64_t sreq, std::size_t length);
  // A FIN with a code: the receiver failed; so does the send.
  void receiver_failed(std::uint32_t index, int source, std::uint32_t code);

  Engine& engine_;
  RequestPool& requests_;
  Matcher matcher_;
  bool test_host_staging_;  // FERRY_TEST_HOST_STAGING
  double test_get_delay_;   // FERRY_TEST_GET_DELAY
  bool finalizing_ = false;
  std::size_t refused_unmatched_ = 0;  // announcements refused at finalize
  std::size_t never_matched_ = 0;
};

}  // namespace ferry::proto
