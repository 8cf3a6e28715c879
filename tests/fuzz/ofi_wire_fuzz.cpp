// Fuzzes the ofi transport's decoders (src/transport/ofi/wire.hpp): a received message header and a
// published address. Whatever parses must describe bytes inside the input. Then the input as a
// peer's stream of headers (any seq, ack, flags) into one PeerOrder (order.hpp), with a message
// of ours sent between them: what is delivered is in order, what is held lies ahead of it, and
// what is kept or sent again stays within bounds.
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>

#include "transport/ofi/order.hpp"
#include "transport/ofi/wire.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace ferry::transport::ofi;
  auto input = std::span<const std::byte>(reinterpret_cast<const std::byte*>(data), size);
  Wire wire{};
  if (parse_message(input, 8, 1, &wire)) {
    if (sizeof(Wire) + wire.length != size) std::abort();
    if (wire.source < 0 || wire.source >= 8 || wire.source == 1) std::abort();
  }
  AddressHeader header{};
  std::span<const std::byte> name;
  if (parse_address(input, &header, &name)) {
    if (name.empty() || name.data() < input.data() ||
        name.data() + name.size() != input.data() + input.size() || size > kMaxAddress) {
      std::abort();
    }
    if (header.node.back() != '\0') std::abort();
  }

  PeerOrder order;
  const auto start = PeerOrder::Clock::now();
  std::uint32_t delivered = 0;
  for (std::size_t at = 0; at + sizeof(Wire) <= size; at += sizeof(Wire)) {
    Wire ours{1, 0, kWireMagic, 1, 0, 0, 0, 0};
    order.stamp(&ours);
    if (order.can_send(sizeof ours)) order.sent(std::as_bytes(std::span(&ours, 1)));
    Wire peer{};
    std::memcpy(&peer, data + at, sizeof peer);
    const auto message = input.subspan(at, sizeof(Wire));
    const auto now = start + std::chrono::milliseconds(at);
    if ((peer.flags & kWireResend) != 0) {
      for (auto copy : order.resend(peer.ack, peer.until)) {
        if (copy.size() != sizeof(Wire)) std::abort();
      }
      continue;
    }
    if (order.arrive(peer, message, now) == PeerOrder::Arrival::kNext) {
      if (peer.seq != delivered) std::abort();
      order.delivered();
      ++delivered;
      for (auto next = order.take_ready(); !next.empty(); next = order.take_ready()) {
        Wire held{};
        std::memcpy(&held, next.data(), sizeof held);
        if (held.seq != delivered) std::abort();
        order.delivered();
        ++delivered;
      }
    }
    if (order.expected() != delivered) std::abort();
    if (order.held() != 0 && static_cast<std::int32_t>(order.first_held() - delivered) <= 0) {
      std::abort();
    }
    if (order.kept() > PeerOrder::kKeepLimit) std::abort();
    (void)order.resend_due(now);
    (void)order.lost();
  }
  return 0;
}
