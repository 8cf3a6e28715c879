// The self transport: messages a process sends to itself. Active messages are queued and delivered
// by progress (never from inside am_send, so the protocol layer is not re-entered); get is memcpy.
#pragma once

#include <deque>
#include <vector>

#include "transport/transport.hpp"

namespace ferry::transport::self {

class SelfTransport final : public Transport {
 public:
  SelfTransport(int rank, AmHandler* handler);
  [[nodiscard]] const Capabilities& capabilities() const override { return capabilities_; }
  [[nodiscard]] std::vector<std::byte> address() const override { return {}; }
  [[nodiscard]] Reachability reach(const PeerInfo& peer) const override;
  std::unique_ptr<Endpoint> connect(const PeerInfo& peer) override;
  int progress() override;
  // Inline check, so the engine's poll skips the virtual call when nothing is queued.
  [[nodiscard]] bool has_work() const { return !queue_.empty(); }

  void enqueue(std::uint8_t id, std::span<const std::byte> header,
               std::span<const std::byte> payload);

 private:
  struct Message {
    std::uint8_t id;
    std::vector<std::byte> data;
  };
  int rank_;
  AmHandler* handler_;
  Capabilities capabilities_;
  std::deque<Message> queue_;
  std::vector<std::vector<std::byte>> spare_;  // recycled buffers: no allocation once warm
};

}  // namespace ferry::transport::self
