#include "transport/ofi/order.hpp"

#include <cstring>

namespace ferry::transport::ofi {

void PeerOrder::stamp(Wire* wire) const {
  wire->seq = next_seq_;
  wire->ack = expected_;
  if (!acknowledged_ || kept_count_ + 1 >= kKeepLimit / 4 || kept_bytes_ >= kKeepBytes / 4) {
    wire->flags |= kWireAckMe;
  }
}

void PeerOrder::sent(std::span<const std::byte> message) {
  // The caller asked can_send() first: a free slot.
  Kept& slot = kept_[(kept_head_ + kept_count_) % kKeepLimit];
  slot.seq = next_seq_;
  slot.bytes.assign(message.begin(), message.end());
  ++kept_count_;
  kept_bytes_ += message.size();
  ++next_seq_;
}

std::vector<std::span<const std::byte>> PeerOrder::resend(std::uint32_t from,
                                                          std::uint32_t until) const {
  std::vector<std::span<const std::byte>> out;
  for (std::size_t i = 0; i < kept_count_; ++i) {
    const Kept& kept = kept_at(i);
    if (static_cast<std::int32_t>(kept.seq - from) >= 0 &&
        static_cast<std::int32_t>(until - kept.seq) > 0) {
      out.emplace_back(kept.bytes);
    }
  }
  return out;
}

void PeerOrder::take_ack(std::uint32_t ack) {
  // Acknowledgements only grow; one beyond what was sent is a peer's error, taken as nothing.
  if (static_cast<std::int32_t>(next_seq_ - ack) < 0) return;
  while (kept_count_ > 0 && static_cast<std::int32_t>(ack - kept_[kept_head_].seq) > 0) {
    Kept& oldest = kept_[kept_head_];
    kept_bytes_ -= oldest.bytes.size();
    if (oldest.bytes.capacity() > kSlotReuse) std::vector<std::byte>().swap(oldest.bytes);
    kept_head_ = (kept_head_ + 1) % kKeepLimit;
    --kept_count_;
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
  if (static_cast<std::size_t>(ahead) > kKeepLimit) return Arrival::kRefused;
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
