// The shared-memory transport: one segment per process holding its receive FIFO and its bounce
// pool, mapped by every local peer. Inline messages ride in FIFO elements; larger ones in bounce
// buffers of the sender's pool; zero-copy get by CMA (process_vm_readv) where a probe shows it
// works.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "transport/shm/address.hpp"
#include "transport/shm/segment.hpp"
#include "transport/transport.hpp"

namespace ferry::util {
class Config;
}

namespace ferry::transport::shm {

class ShmTransport final : public Transport {
 public:
  // `local_ranks`: global ranks of this node's processes in local order; `local_index` is ours.
  // Throws ferry::Error when the segment cannot be made.
  ShmTransport(const util::Config& config, std::string job_id, int rank, int local_index,
               std::vector<int> local_ranks, AmHandler* handler);
  ~ShmTransport() override;

  [[nodiscard]] const Capabilities& capabilities() const override { return capabilities_; }
  [[nodiscard]] std::vector<std::byte> address() const override { return address_.encode(); }
  [[nodiscard]] Reachability reach(const PeerInfo& peer) const override;
  std::unique_ptr<Endpoint> connect(const PeerInfo& peer) override;
  void on_all_connected() override { own_.unlink(); }
  void check_peers(std::vector<std::pair<int, std::string>>* failed) override;
  int progress() override;
  // Whether progress() would find nothing to do: no element published, no tail to publish, no
  // dead producer's hole to look for. Inline, for the engine's idle poll.
  [[nodiscard]] bool quiet() const {
    return consumer_.peek() == nullptr && consumer_.all_released() && dead_producers_ == 0;
  }
  [[nodiscard]] int wait_fd() const override { return doorbell_.get(); }
  bool arm() override;
  void disarm() override;

  // Used by endpoints. `receiver`: the local index whose FIFO will name the slot.
  int alloc_bounce(int receiver);
  void free_bounce(std::uint32_t slot);
  [[nodiscard]] const Segment& own() const { return own_; }
  [[nodiscard]] int local_index() const { return local_index_; }
  // FERRY_TEST_CRASH_AT=mid-claim names this rank: die between claim and publish.
  [[nodiscard]] bool crash_mid_claim() const { return crash_mid_claim_; }
  // FERRY_TEST_SPLIT_REFUSED: writes into peers are refused.
  [[nodiscard]] bool split_refused() const { return split_refused_; }
  // After publishing into `peer`'s FIFO: wakes it if it sleeps (one relaxed load otherwise).
  void wake(SegmentHeader* peer, int peer_rank) const {
    auto& armed = peer->armed;
    if (armed.load(std::memory_order_relaxed) != 0 &&
        armed.exchange(0, std::memory_order_acq_rel) != 0) {
      ring(peer_rank);
    }
  }
  void ring(int peer_rank) const;
  // Claim words in our own segment for messages copied from both ends (SplitCopies).
  bool open_claim(SplitCopies::Claim* claim);
  bool claim_tail(const SplitCopies::Claim& claim);
  void close_claim(const SplitCopies::Claim& claim);

 private:
  struct Peer {
    int rank = -1;
    int pid = 0;
    util::Fd pidfd;  // readable once the process has exited (-1: watched with kill(pid, 0))
    bool reported = false;
    Segment segment;
  };
  void handle(const FifoElem& elem);
  // `local_index` was found dead: its FIFO is read no more; frees the bounce slots it holds.
  void reclaim_bounce(int local_index);
  // Steps over an element a dead producer claimed and never published; true when it did.
  bool skip_hole();

  std::string job_id_;
  int rank_;
  int local_index_;
  util::Fd doorbell_;  // a datagram socket peers ring while we are armed (invalid: none)
  std::vector<int> local_ranks_;
  AmHandler* handler_;
  bool cma_enabled_;
  Capabilities capabilities_;
  Segment own_;
  Address address_;
  FifoConsumer consumer_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by local index; mapped segments
  std::uint32_t bounce_cursor_ = 0;
  // Whose FIFO each busy bounce slot was sent into (local index): a receiver that dies never
  // frees its slots, so they are taken back when it is found dead (else 64 messages to a dead
  // peer leave none for the living: every larger message waits for ever).
  std::vector<std::int32_t> bounce_to_;
  int dead_producers_ = 0;         // peers check_peers found dead
  std::uint64_t claims_used_ = 0;  // bit i: split_claims[i] is open
  std::uint64_t next_ticket_ = 1;
  bool crash_mid_claim_ = false;
  bool split_refused_ = false;
};

}  // namespace ferry::transport::shm
