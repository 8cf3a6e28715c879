// shm endpoint (see endpoint.hpp).
#include "transport/shm/endpoint.hpp"

#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstring>

#include "transport/shm/segment.hpp"
#include "transport/shm/transport.hpp"
#include "util/cma.hpp"
#include "util/copy.hpp"

namespace ferry::transport::shm {

ShmEndpoint::ShmEndpoint(ShmTransport* transport, const Segment* peer_segment, int peer_rank,
                         int peer_local_index, int peer_pid, bool cma_ok, std::string cma_reason)
    : transport_(transport),
      peer_segment_(peer_segment),
      producer_(&peer_segment->header()->fifo, peer_segment->fifo(),
                peer_segment->layout().fifo_size, &transport->own().header()->claim,
                static_cast<std::uint32_t>(peer_local_index)),
      peer_rank_(peer_rank),
      peer_local_index_(peer_local_index),
      peer_pid_(peer_pid),
      cma_ok_(cma_ok),
      cma_reason_(std::move(cma_reason)) {}

Status ShmEndpoint::am_send(std::uint8_t id, std::span<const std::byte> header,
                            std::span<const std::byte> payload, AmHint hint) {
  const std::size_t length = header.size() + payload.size();
  if (length <= kInlineCapacity) {
    FifoClaim claim = producer_.claim();
    if (claim.elem == nullptr) return Status(Code::kWouldBlock);
    if (transport_->crash_mid_claim()) ::kill(::getpid(), SIGKILL);
    FifoElem* elem = claim.elem;
    elem->am_id = id;
    elem->flags = kElemInline;
    elem->source = static_cast<std::uint16_t>(transport_->local_index());
    elem->length = static_cast<std::uint32_t>(length);
    std::memcpy(elem->data, header.data(), header.size());
    if (!payload.empty()) std::memcpy(elem->data + header.size(), payload.data(), payload.size());
    producer_.publish(claim);
    transport_->wake(peer_segment_->header(), peer_rank_);
    return Status::ok();
  }
  const Segment& own = transport_->own();
  if (length > own.layout().bounce_size) {
    return Status(Code::kInvalidArgument, "shm active message of " + std::to_string(length) +
                                              " bytes exceeds the bounce size " +
                                              std::to_string(own.layout().bounce_size));
  }
  int slot = transport_->alloc_bounce(peer_local_index_);
  if (slot < 0) return Status(Code::kWouldBlock);
  // Fill the buffer before claiming the element: a claimed element stalls the receiver until it
  // is published, so that window stays short.
  std::byte* data = own.bounce_data(static_cast<std::uint32_t>(slot));
  std::memcpy(data, header.data(), header.size());
  if (hint == AmHint::kBulk && payload.size() >= 4096 && util::kHaveAvx2) {
    // Streaming stores for pipelined fragments: no read-for-ownership of lines the receiver last
    // read, which across L3 domains doubles the traffic (64 KiB pipelined: 16 us -> 7-10 us when
    // the two vCPUs are far apart; docs/PERFORMANCE.md). Eager messages keep cached stores.
    util::copy_stream(data + header.size(), payload.data(), payload.size());
  } else if (!payload.empty()) {
    util::copy(data + header.size(), payload.data(), payload.size());
  }
  FifoClaim claim = producer_.claim();
  if (claim.elem == nullptr) {
    transport_->free_bounce(static_cast<std::uint32_t>(slot));
    return Status(Code::kWouldBlock);
  }
  FifoElem* elem = claim.elem;
  elem->am_id = id;
  elem->flags = kElemBounce;
  elem->source = static_cast<std::uint16_t>(transport_->local_index());
  elem->length = static_cast<std::uint32_t>(length);
  elem->bounce = static_cast<std::uint32_t>(slot);
  producer_.publish(claim);
  transport_->wake(peer_segment_->header(), peer_rank_);
  return Status::ok();
}

void ShmEndpoint::mark_withdrawn(std::uint64_t sreq) {
  SegmentHeader* own = transport_->own().header();
  const std::uint32_t slot = own->withdrawn_next.fetch_add(1, std::memory_order_relaxed);
  // seq_cst: ordered before the send returns and the caller reuses the buffer (see
  // was_withdrawn for the other half of the argument).
  own->withdrawn[slot % kWithdrawnSlots].store(sreq, std::memory_order_seq_cst);
}

bool ShmEndpoint::was_withdrawn(std::uint64_t sreq) const {
  // Called after the CMA read: if the sender's mark is not visible now, the mark comes after
  // this load in the single order of seq_cst operations, so the read (before the load) saw the
  // buffer before the send returned. The last kWithdrawnSlots withdrawals are remembered.
  const SegmentHeader* peer = peer_segment_->header();
  for (const auto& id : peer->withdrawn) {
    if (id.load(std::memory_order_seq_cst) == sreq) return true;
  }
  return false;
}

Status ShmEndpoint::get(void* local, std::uint64_t remote, std::size_t length) {
  if (!cma_ok_)
    return Status(Code::kUnsupported,
                  "shm to rank " + std::to_string(peer_rank_) + ": no CMA (" + cma_reason_ + ")");
  return util::cma_read(peer_pid_, local, remote, length);
}

bool ShmEndpoint::open_claim(Claim* claim) { return transport_->open_claim(claim); }
bool ShmEndpoint::claim_tail(const Claim& claim) { return transport_->claim_tail(claim); }
void ShmEndpoint::close_claim(const Claim& claim) { transport_->close_claim(claim); }

bool ShmEndpoint::claim_peer_tail(const Claim& claim) {
  if (claim.slot >= kSplitClaims) return false;
  std::uint64_t open = claim.ticket << 2 | kClaimOpen;
  return peer_segment_->header()->split_claims[claim.slot].compare_exchange_strong(
      open, claim.ticket << 2 | kClaimSender, std::memory_order_acq_rel);
}

Status ShmEndpoint::put(std::uint64_t remote, const void* local, std::size_t length) {
  if (transport_->split_refused()) {
    return Status(Code::kUnsupported, "process_vm_writev refused (FERRY_TEST_SPLIT_REFUSED)");
  }
  if (!cma_ok_)
    return Status(Code::kUnsupported,
                  "shm to rank " + std::to_string(peer_rank_) + ": no CMA (" + cma_reason_ + ")");
  return util::cma_write(peer_pid_, remote, local, length);
}

std::string ShmEndpoint::describe() const {
  return cma_ok_ ? "shm (CMA probe ok)" : "shm (no CMA: " + cma_reason_ + ")";
}

}  // namespace ferry::transport::shm
