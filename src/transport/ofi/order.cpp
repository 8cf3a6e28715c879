#include "transport/ofi/order.hpp"

#include <cstring>

namespace ferry::transport::ofi {

void PeerOrder::stamp(Wire* wire) const {
  wire->seq = next_seq_;
  wire->ack = expected_;
  if (!acknowledged_ || kept_.size() + 1 >= kKeepLimit / 4 || kept_bytes_ >= kKeepBytes / 4) {
    wire->flags |= kWireAckMe;
  }
}

void PeerOrder::sent(std::span<const std::byte> message) {
  kept_.emplace_back(next_seq_, std::vector<std::byte>(message.begin(), message.end()));
  kept_bytes_ += message.size();
  ++next_seq_;
}

std::vector<std::span<const std::byte>> PeerOrder::resend(std::uint32_t from,
                                                          std::uint32_t until) const {
  std::vector<std::span<const std::byte>> out;
  for (const auto& [seq, bytes] : kept_) {
    if (static_cast<std::int32_t>(seq - from) >= 0 && static_cast<std::int32_t>(until - seq) > 0) {
      out.emplace_back(bytes);
    }
  }
  return out;
}

void PeerOrder::take_ack(std::uint32_t ack) {
  // Acknowledgements only grow; one beyond what was sent is a peer's error, taken as nothing.
  if (static_cast<std::int32_t>(next_seq_ - ack) < 0) return;
  while (!kept_.empty() && static_cast<std::int32_t>(ack - kept_.front().first) > 0) {
    kept_bytes_ -= kept_.front().second.size();
    kept_.pop_front();
  }
  if (ack != 0) acknowledged_ = true;
}

PeerOrder::Arrival PeerOrder::arrive(const Wire& wire, std::span<const std::byte> message,
                                     Clock::time_point now) {
  take_ack(wire.ack);
  const auto ahead = static_cast<std::int32_t>(wire.seq - expected_);
  if (ahead < 0) return Arrival::kDuplicate;
  if (ahead == 0) {
    // Acknowledged at once only when it is news (the expected one), or two ranks asking with a
    // gap would trade keepalives for ever.
    if ((wire.flags & kWireAckMe) != 0) ack_due_ = true;
    return Arrival::kNext;
  }
  if (held_.count(wire.seq) != 0) return Arrival::kDuplicate;
  if (held_.empty()) {
    gap_since_ = now;
    last_request_ = {};
  }
  held_.emplace(wire.seq, std::vector<std::byte>(message.begin(), message.end()));
  if (wire.id == kWireKeepaliveId) ++keepalives_behind_;
  return Arrival::kHeld;
}

std::vector<std::byte> PeerOrder::take_ready() {
  auto it = held_.find(expected_);
  if (it == held_.end()) return {};
  std::vector<std::byte> message = std::move(it->second);
  held_.erase(it);
  Wire wire{};
  std::memcpy(&wire, message.data(), sizeof wire);
  if (wire.id == kWireKeepaliveId) --keepalives_behind_;
  if ((wire.flags & kWireAckMe) != 0) ack_due_ = true;
  if (held_.empty()) keepalives_behind_ = 0;
  return message;
}

bool PeerOrder::resend_due(Clock::time_point now) {
  if (held_.empty() || now - gap_since_ < kAskAfter || now - last_request_ < kAskEvery) {
    return false;
  }
  last_request_ = now;
  return true;
}

}  // namespace ferry::transport::ofi
