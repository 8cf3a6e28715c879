// The order and completeness of one peer's active messages over ofi, free of libfabric so that
// unit tests drive it. Two things the providers do not give:
//  - completion order: under tcp;ofi_rxm a message larger than the provider's eager size goes by
//    its own rendezvous and completes after smaller ones sent behind it, so the receiver holds
//    what arrives ahead of `expected` and releases it in order;
//  - delivery while the provider connects: when two ranks send to each other first at the same
//    time, rxm (libfabric 1.17) makes two connections, keeps one, and a message already sent on
//    the other is lost although its send completed (ofiwg/libfabric#7396). So a sender keeps a
//    copy of what it sends until the peer acknowledges one of its messages (every message
//    carries the sender's `ack`: the next sequence number it expects from the receiver), and a
//    receiver that sees a gap while the sender still keeps copies asks for them again.
// A gap that is not filled while the sender goes on sending (its keepalives arrive behind it) is
// a message the provider lost after the connection was up: the peer is failed, saying so, rather
// than waited for forever.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <span>
#include <vector>

#include "transport/ofi/wire.hpp"

namespace ferry::transport::ofi {

class PeerOrder {
 public:
  using Clock = std::chrono::steady_clock;
  // Copies kept while the peer has acknowledged nothing; a sender at the limit waits (the
  // receiver acknowledges a keeping sender at once, see ack_due).
  static constexpr std::size_t kKeepLimit = 64;
  // Keepalives of the peer that arrived behind a gap: it is sending, so the gap is a loss.
  static constexpr int kLostAfterKeepalives = 3;

  // Sender side.
  [[nodiscard]] std::uint32_t next_seq() const { return next_seq_; }
  // The header's sequence number, acknowledgement and flags for the next message.
  void stamp(Wire* wire) const;
  // Whether a message may be sent now (false: keeping kKeepLimit copies, wait for an ack).
  [[nodiscard]] bool can_send() const { return !keeping() || kept_.size() < kKeepLimit; }
  // The message (header included) went to the provider as next_seq(): counted, and kept while
  // the peer has acknowledged nothing.
  void sent(std::span<const std::byte> message);
  // Whether copies are kept (nothing acknowledged yet).
  [[nodiscard]] bool keeping() const { return !acknowledged_; }
  // Copies of the kept messages from `from` on, in order, for a receiver that asked again.
  [[nodiscard]] std::vector<std::span<const std::byte>> resend_from(std::uint32_t from) const;
  [[nodiscard]] std::size_t kept() const { return kept_.size(); }

  // Receiver side. What an arriving message is, in order of the stream:
  enum class Arrival {
    kNext,       // the one expected: deliver it, then take_ready() what it released
    kHeld,       // ahead of a gap: kept until the gap fills
    kDuplicate,  // delivered or held already (a copy sent again): dropped
  };
  // `wire` parsed from `message`; also takes its acknowledgement (sender side).
  Arrival arrive(const Wire& wire, std::span<const std::byte> message, Clock::time_point now);
  // The next held message that is now in order (its bytes, header included), or empty.
  [[nodiscard]] std::vector<std::byte> take_ready();
  // After delivering a kNext (or take_ready) message: counts it.
  void delivered() { ++expected_; }
  [[nodiscard]] std::uint32_t expected() const { return expected_; }
  [[nodiscard]] std::size_t held() const { return held_.size(); }
  // A keeping sender is owed an acknowledgement (a keepalive carries it); cleared by the caller.
  [[nodiscard]] bool ack_due() const { return ack_due_; }
  void ack_sent() { ack_due_ = false; }
  // Whether to ask the sender for its copies from expected() on now (a gap while it keeps them,
  // asked at most every `interval`); the caller sends the request.
  bool resend_due(Clock::time_point now, Clock::duration interval);
  // Whether the gap is a loss: the sender went on (kLostAfterKeepalives of its keepalives
  // arrived behind it) without filling it.
  [[nodiscard]] bool lost() const {
    return !held_.empty() && keepalives_behind_ >= kLostAfterKeepalives;
  }

 private:
  // Sender side.
  std::uint32_t next_seq_ = 0;
  bool acknowledged_ = false;
  std::deque<std::pair<std::uint32_t, std::vector<std::byte>>> kept_;
  void take_ack(std::uint32_t ack);
  // Receiver side.
  std::uint32_t expected_ = 0;
  std::map<std::uint32_t, std::vector<std::byte>> held_;
  bool ack_due_ = false;
  bool sender_keeps_ = false;  // the newest held message says its sender keeps copies
  int keepalives_behind_ = 0;  // keepalives held behind the gap
  Clock::time_point last_request_{};
};

}  // namespace ferry::transport::ofi
