// An shm endpoint: produces into one peer's FIFO, fills bounce buffers from this process's pool,
// and reads the peer's memory with CMA when the connect-time probe succeeded.
#pragma once

#include <string>

#include "transport/shm/fifo.hpp"
#include "transport/transport.hpp"

namespace ferry::transport::shm {

class ShmTransport;
class Segment;

class ShmEndpoint final : public Endpoint, public ZeroCopyGet, public SplitCopies {
 public:
  ShmEndpoint(ShmTransport* transport, const Segment* peer_segment, int peer_rank,
              int peer_local_index, int peer_pid, bool cma_ok, std::string cma_reason);

  Status am_send(std::uint8_t id, std::span<const std::byte> header,
                 std::span<const std::byte> payload, AmHint hint) override;
  // CMA where the connect-time probe succeeded.
  ZeroCopyGet* zero_copy_get() override { return cma_ok_ ? this : nullptr; }
  Status get(void* local, std::uint64_t remote, std::size_t length) override;
  // Where CMA works (both ways: every process of the job lets the others attach).
  SplitCopies* split_copies() override { return cma_ok_ ? this : nullptr; }
  bool open_claim(Claim* claim) override;
  bool claim_tail(const Claim& claim) override;
  void close_claim(const Claim& claim) override;
  bool claim_peer_tail(const Claim& claim) override;
  Status put(std::uint64_t remote, const void* local, std::size_t length) override;
  void mark_withdrawn(std::uint64_t sreq) override;
  [[nodiscard]] bool was_withdrawn(std::uint64_t sreq) const override;
  [[nodiscard]] int peer_pid() const override { return peer_pid_; }
  [[nodiscard]] std::string describe() const override;

 private:
  ShmTransport* transport_;
  const Segment* peer_segment_;
  FifoProducer producer_;
  int peer_rank_;
  int peer_local_index_;
  int peer_pid_;
  bool cma_ok_;
  std::string cma_reason_;
};

}  // namespace ferry::transport::shm
