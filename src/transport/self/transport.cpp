// The self transport (see transport.hpp).
#include "transport/self/transport.hpp"

#include <cstring>

#include "util/copy.hpp"

namespace ferry::transport::self {
namespace {

class SelfEndpoint final : public Endpoint, public ZeroCopyGet {
 public:
  explicit SelfEndpoint(SelfTransport* transport) : transport_(transport) {}
  Status am_send(std::uint8_t id, std::span<const std::byte> header,
                 std::span<const std::byte> payload, AmHint /*hint*/) override {
    transport_->enqueue(id, header, payload);
    return Status::ok();
  }
  ZeroCopyGet* zero_copy_get() override { return this; }
  Status get(void* local, std::uint64_t remote, std::size_t length) override {
    util::copy(local, reinterpret_cast<const void*>(remote), length);
    return Status::ok();
  }
  [[nodiscard]] std::string describe() const override { return "self (memcpy)"; }

 private:
  SelfTransport* transport_;
};

}  // namespace

SelfTransport::SelfTransport(int rank, AmHandler* handler) : rank_(rank), handler_(handler) {
  capabilities_.name = "self";
  capabilities_.max_am = SIZE_MAX;
  capabilities_.max_inline = SIZE_MAX;
  capabilities_.latency_us = 0.01;
  capabilities_.bandwidth_GBps = 20;
}

Reachability SelfTransport::reach(const PeerInfo& peer) const {
  if (peer.rank == rank_) return {true, "the process itself"};
  return {false, "self reaches only this process"};
}

std::unique_ptr<Endpoint> SelfTransport::connect(const PeerInfo& /*peer*/) {
  return std::make_unique<SelfEndpoint>(this);
}

void SelfTransport::enqueue(std::uint8_t id, std::span<const std::byte> header,
                            std::span<const std::byte> payload) {
  std::vector<std::byte> data;
  if (!spare_.empty()) {
    data = std::move(spare_.back());
    spare_.pop_back();
  }
  data.assign(header.begin(), header.end());
  data.insert(data.end(), payload.begin(), payload.end());
  queue_.push_back({id, std::move(data)});
}

int SelfTransport::progress() {
  // Only what was queued before this call: a handler that sends to itself is seen next time.
  std::size_t count = queue_.size();
  for (std::size_t i = 0; i < count; ++i) {
    Message message = std::move(queue_.front());
    queue_.pop_front();
    handler_->on_am(message.id, rank_, message.data);
    if (spare_.size() < 64 && message.data.capacity() <= 65536) {
      spare_.push_back(std::move(message.data));
    }
  }
  return static_cast<int>(count);
}

}  // namespace ferry::transport::self
