// The owner's side of one-sided operations by message: a peer's put, get or atomic applied to
// this rank's region (guarded: memory the application unmapped or made read-only fails at the
// peer, not here), and the answers, batched per peer (see one_sided.hpp).
#include <algorithm>
#include <cstring>

#include "mem/fault_guard.hpp"
#include "proto/engine.hpp"
#include "proto/rma/one_sided.hpp"
#include "util/copy.hpp"
#include "util/extent.hpp"
#include "util/log.hpp"

namespace ferry::proto::rma {

void OneSided::ack(int peer, std::uint64_t id, std::uint64_t value, std::uint32_t code) {
  std::vector<RmaAckHeader>& acks = peers_[static_cast<std::size_t>(peer)].acks;
  if (acks.empty()) ack_peers_.push_back(peer);
  acks.push_back(RmaAckHeader{id, value, code, 0});
}

// A window of atomics or put fragments from one peer is mostly handled in one pass; answering
// it with one message instead of one each halves the messages of a window over the network
// (docs/PERFORMANCE.md, "Atomics over tcp"). A lone answer keeps its own message, and answers
// that cannot go at once are queued one by one, in order.
int OneSided::send_acks() {
  int sent = 0;
  for (int rank : ack_peers_) {
    PeerState& peer = peers_[static_cast<std::size_t>(rank)];
    const Link& link = engine_.links().link(rank);
    std::span<const RmaAckHeader> acks = peer.acks;
    const std::size_t room = link.frag_size > sizeof(RmaAcksHeader)
                                 ? (link.frag_size - sizeof(RmaAcksHeader)) / sizeof(RmaAckHeader)
                                 : 1;
    const std::size_t most = std::clamp<std::size_t>(room, 1, kMaxAcksPerMessage);
    while (!acks.empty() && !link.failed) {
      const std::size_t count = std::min(acks.size(), most);
      const auto batch = acks.first(count);
      acks = acks.subspan(count);
      // Together where there are several and nothing is queued before them; otherwise (or
      // when the transport has no room now) each goes as its own kAmRmaAck, queued in order.
      Status status(Code::kWouldBlock);
      if (count > 1 && link.pending.empty()) {
        const RmaAcksHeader header{static_cast<std::uint32_t>(count), 0};
        status = link.endpoint->am_send(kAmRmaAcks, as_bytes(header), std::as_bytes(batch),
                                        transport::AmHint::kNone);
      }
      if (status.code() == Code::kWouldBlock) {
        for (const RmaAckHeader& ack : batch)
          engine_.links().send_control(rank, kAmRmaAck, as_bytes(ack));
        peer.ack_messages += count;
      } else if (status) {
        ++peer.ack_messages;
      } else if (status.code() != Code::kPeerFailed) {
        FERRY_LOG(kError, "%s: %zu one-sided answers lost: %s", link.transport.c_str(), count,
                  status.to_string().c_str());
      }
      peer.acks_sent += count;
      ++sent;
    }
    peer.acks.clear();
  }
  ack_peers_.clear();
  return sent;
}

void OneSided::on_put(int source, std::span<const std::byte> data) {
  PutHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short PUT header");
  auto payload = data.subspan(sizeof(header));
  std::uint32_t refusal = kRmaOk;
  bool device = false;
  std::byte* base = regions_.check(header.region, header.secret, header.offset, payload.size(),
                                   true, &refusal, &device);
  if (base != nullptr && regions_.find(header.region)->user_host) {
    // The application's memory, which it may have unmapped or made read-only since: a write
    // that cannot land is the initiator's error, not a fault here.
    std::byte* destination = base + header.offset;
    if (!mem::guarded(destination, payload.size(), mem::Touch::kWrite,
                      [&] { util::copy(destination, payload.data(), payload.size()); })) {
      FERRY_LOG(kWarn,
                "a put from rank %d into region %llu faulted: its memory is no longer "
                "mapped writable",
                source, static_cast<unsigned long long>(header.region));
      refusal = kRmaUnmapped;
    }
  } else if (base != nullptr) {
    Status status = move(base + header.offset, payload.data(), payload.size(), device);
    if (!status) {
      FERRY_LOG(kWarn, "a put from rank %d into device memory failed: %s", source,
                status.message().c_str());
      refusal = kRmaDeviceCopy;
    }
  }
  ack(source, header.id, payload.size(), refusal);
}

void OneSided::on_get(int source, std::span<const std::byte> data) {
  GetHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short GET header");
  std::uint32_t refusal = kRmaOk;
  bool device = false;
  std::byte* base = regions_.check(header.region, header.secret, header.offset, header.length,
                                   false, &refusal, &device);
  if (base == nullptr || header.length == 0) {
    return ack(source, header.id, 0, base == nullptr ? refusal : kRmaOutOfRange);
  }
  if (regions_.find(header.region)->user_host &&
      !mem::readable(base + header.offset, header.length)) {
    return ack(source, header.id, 0, kRmaUnmapped);  // streaming it would fault here
  }
  // Device memory is sent from a host copy, taken now.
  std::vector<std::byte> copy;
  if (device) {
    copy.resize(header.length);
    if (Status status = engine_.cuda()->copy(copy.data(), base + header.offset, header.length);
        !status) {
      FERRY_LOG(kWarn, "a get by rank %d from device memory failed: %s", source,
                status.message().c_str());
      return ack(source, header.id, 0, kRmaDeviceCopy);
    }
  }
  // The answer is a stream of fragments into the initiator's request, from the region itself.
  std::uint32_t index = engine_.requests().allocate(RequestKind::kSend);
  RequestSlot& slot = engine_.requests()[index];
  slot.handle_alive = false;  // freed when sent
  slot.rma.kind = Rma::kGetReply;
  slot.rma.region = header.region;
  slot.peer = source;
  slot.send_buffer = base + header.offset;
  if (device) {
    slot.gpu.host_copy = std::move(copy);
    slot.send_buffer = slot.gpu.host_copy.data();
  }
  slot.size = header.length;
  engine_.links().send_or_queue(source, Links::stream(kAmFrag, index, header.id, header.length));
}

void OneSided::on_atomic(int source, std::span<const std::byte> data) {
  AtomicHeader header;
  if (!decode(data, &header) || data.size() != sizeof(header) + 16) {
    return protocol_error(source, "ATOMIC of the wrong size");
  }
  std::uint64_t operand = 0;
  std::uint64_t compare = 0;
  std::memcpy(&operand, data.data() + sizeof(header), 8);
  std::memcpy(&compare, data.data() + sizeof(header) + 8, 8);
  std::uint32_t refusal = kRmaOk;
  std::byte* base = nullptr;
  bool device = false;
  std::uint64_t previous = 0;
  if ((header.width != 4 && header.width != 8) || header.op > 5 ||
      header.offset % header.width != 0) {
    refusal = kRmaBadAtomic;
  } else {
    base = regions_.check(header.region, header.secret, header.offset, header.width, true, &refusal,
                          &device);
    if (base != nullptr &&
        reinterpret_cast<std::uintptr_t>(base + header.offset) % header.width != 0) {
      base = nullptr;  // a region at an unaligned address
      refusal = kRmaBadAtomic;
    } else if (base != nullptr && regions_.find(header.region)->user_host) {
      // Unmapped or made read-only since, the atomic faults: ended here, refused there.
      std::byte* word = base + header.offset;
      base = nullptr;
      if (!mem::guarded(word, header.width, mem::Touch::kWrite, [&] {
            previous =
                atomic_at(word, static_cast<AtomicOp>(header.op), header.width, operand, compare);
          })) {
        refusal = kRmaUnmapped;
      }
    }
  }
  if (base != nullptr) {
    Status status = atomic(base + header.offset, device, static_cast<AtomicOp>(header.op),
                           header.width, operand, compare, &previous);
    if (!status) {
      FERRY_LOG(kWarn, "an atomic by rank %d on device memory failed: %s", source,
                status.message().c_str());
      refusal = kRmaDeviceCopy;
    }
  }
  ack(source, header.id, previous, refusal);
}

}  // namespace ferry::proto::rma
