// The order and completeness of one peer's active messages over ofi, free of libfabric so that
// unit tests drive it. Two things the providers do not give:
//  - completion order: under tcp;ofi_rxm a message larger than the provider's eager size goes by
//    its own rendezvous and completes after smaller ones sent behind it, so the receiver holds
//    what arrives ahead of `expected` and releases it in order;
//  - delivery when a connection goes: rxm (libfabric 1.17) loses a message whose send completed
//    when two ranks connect to each other at once and one of the two connections is dropped
//    (ofiwg/libfabric#7396), and the tcp provider drops a connection, with what was in flight on
//    it, when a read names a key that was just closed (a withdrawn rendezvous). So a sender keeps
//    a copy of every message until the peer acknowledges it (every message carries `ack`: the
//    next sequence number its sender expects from the receiver), and a receiver that sees a gap
//    asks for the copies again.
// A gap that copies sent again do not fill while the sender goes on (its keepalives arrive behind
// it) fails the peer, saying so, rather than waiting for ever.
#pragma once

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "transport/ofi/wire.hpp"

namespace ferry::transport::ofi {

class PeerOrder {
 public:
  using Clock = std::chrono::steady_clock;
  // Copies kept, at most; a sender at either limit waits for an acknowledgement, which it asks
  // for (kWireAckMe) from a quarter of either on, and before the peer acknowledged anything.
  static constexpr std::size_t kKeepLimit = 64;
  static constexpr std::size_t kKeepBytes = 1 << 20;
  // Keepalives of the peer (its periodic ones, not acknowledgements) that arrived behind a gap:
  // it is sending, so the gap is a loss.
  static constexpr int kLostAfterKeepalives = 3;
  // A gap is asked to be filled once it is this old (a message the provider's rendezvous carries
  // is overtaken for a few milliseconds), and again at most this often.
  static constexpr Clock::duration kAskAfter = std::chrono::milliseconds(50);
  static constexpr Clock::duration kAskEvery = std::chrono::milliseconds(200);

  // Sender side.
  [[nodiscard]] std::uint32_t next_seq() const { return next_seq_; }
  // The header's sequence number, acknowledgement and flags for the next message.
  void stamp(Wire* wire) const;
  // Whether a message of `bytes` may be sent now (false: wait for an acknowledgement).
  [[nodiscard]] bool can_send(std::size_t bytes) const {
    return kept_count_ < kKeepLimit && kept_bytes_ + bytes <= kKeepBytes;
  }
  // The message (header included) went to the provider as next_seq(): counted and kept.
  void sent(std::span<const std::byte> message);
  // Copies of the kept messages from `from` up to (not including) `until`, in order, for a
  // receiver that asked again: what it misses before the first message it holds.
  [[nodiscard]] std::vector<std::span<const std::byte>> resend(std::uint32_t from,
                                                               std::uint32_t until) const;
  [[nodiscard]] std::size_t kept() const { return kept_count_; }
  [[nodiscard]] bool acknowledged() const { return acknowledged_; }

  // Receiver side. What an arriving message is, in order of the stream:
  enum class Arrival {
    kNext,       // the one expected: deliver it, then take_ready() what it released
    kHeld,       // ahead of a gap: kept until the gap fills
    kDuplicate,  // delivered or held already (a copy sent again): dropped
    kRefused,    // further ahead than a sender may run unacknowledged (kKeepLimit): a forgery
  };
  // `wire` parsed from `message`; also takes its acknowledgement (sender side).
  Arrival arrive(const Wire& wire, std::span<const std::byte> message, Clock::time_point now);
  // The next held message that is now in order (its bytes, header included), or empty.
  [[nodiscard]] std::vector<std::byte> take_ready();
  // After delivering a kNext (or take_ready) message: counts it.
  void delivered() { ++expected_; }
  [[nodiscard]] std::uint32_t expected() const { return expected_; }
  [[nodiscard]] std::size_t held() const { return held_.size(); }
  // The first held message's seq (the end of the gap); expected() when none is held.
  [[nodiscard]] std::uint32_t first_held() const {
    return held_.empty() ? expected_ : held_.begin()->first;
  }
  // The sender asked for an acknowledgement (a keepalive carries it); cleared by the caller.
  [[nodiscard]] bool ack_due() const { return ack_due_; }
  void ack_sent() { ack_due_ = false; }
  // Whether to ask the sender for its copies from expected() on now (kAskAfter, kAskEvery); the
  // caller sends the request.
  bool resend_due(Clock::time_point now);
  // Whether the gap is a loss: the sender went on (kLostAfterKeepalives of its keepalives
  // arrived behind it) and its copies did not fill it.
  [[nodiscard]] bool lost() const {
    return !held_.empty() && keepalives_behind_ >= kLostAfterKeepalives;
  }

 private:
  // Sender side.
  std::uint32_t next_seq_ = 0;
  bool acknowledged_ = false;
  // A ring of kept_count_ copies from kept_head_, oldest first. Each slot's buffer is reused (no
  // allocation per message), except that one above kSlotReuse is given back when released.
  struct Kept {
    std::uint32_t seq = 0;
    std::vector<std::byte> bytes;
  };
  static constexpr std::size_t kSlotReuse = 16 * 1024;
  std::array<Kept, kKeepLimit> kept_{};
  std::size_t kept_head_ = 0;
  std::size_t kept_count_ = 0;
  std::size_t kept_bytes_ = 0;
  [[nodiscard]] const Kept& kept_at(std::size_t i) const {
    return kept_[(kept_head_ + i) % kKeepLimit];
  }
  void take_ack(std::uint32_t ack);
  // Receiver side.
  std::uint32_t expected_ = 0;
  std::map<std::uint32_t, std::vector<std::byte>> held_;
  bool ack_due_ = false;
  int keepalives_behind_ = 0;  // keepalives held behind the gap
  Clock::time_point gap_since_{};
  Clock::time_point last_request_{};
};

}  // namespace ferry::transport::ofi
