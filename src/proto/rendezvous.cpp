// Rendezvous messages (see messages.hpp): announcements, the receiver's choice of how to take
// the data, clear-to-send and fragments, FIN and NACK.
#include <unistd.h>

#include <algorithm>

#include "proto/chunked.hpp"
#include "proto/device_path.hpp"
#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "util/copy.hpp"
#include "util/extent.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"

namespace ferry::proto {

bool Messages::read_ended(std::uint32_t index, const Status& status) {
  RequestSlot& slot = requests_[index];
  slot.transfer.reading = false;
  slot.transfer.direct = false;
  const int source = slot.info.source;
  if (slot.transfer.withdrawn) {  // what was read may be a buffer the sender reused meanwhile
    engine_.complete(index, withdrawn_while_read(source));
    return true;
  }
  if (status) {
    engine_.links().send_control(source, kAmFin,
                                 as_bytes(FinHeader{slot.transfer.read_sreq, 0, 0}));
    return false;
  }
  if (status.code() == Code::kPeerFailed) return false;
  // The sender still waits, exposed: ask for the data the other way. (Providers report a
  // refused key differently: tcp as canceled. A read we canceled ourselves was deferred.)
  Link& peer = engine_.links().link(source);
  peer.read_failed = true;
  FERRY_LOG(kWarn, "%s: reading a message of rank %d failed (%s); clear-to-send from now on",
            peer.transport.c_str(), source, status.to_string().c_str());
  request_data(index, source, slot.transfer.read_sreq, slot.info.bytes);
  return true;
}

void Messages::handle_rts(int source, std::span<const std::byte> data) {
  RtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RTS header");
  if (header.size > util::kAddressSpaceEnd) {
    return protocol_error(source, "RTS for a message larger than any buffer can be");
  }
  if (std::optional<std::uint32_t> index = matcher_.match_posted(source, header.tag)) {
    start_rendezvous(*index, source, header.tag, header.size, header.sreq, header.address, nullptr);
    return;
  }
  if (finalizing_) return refuse_unmatched(source, header.sreq);
  Unexpected message = unexpected_rendezvous(source, header.tag, header.size, header.sreq);
  message.address = header.address;
  matcher_.add_unexpected(std::move(message));
}

void Messages::handle_rts_read(int source, std::span<const std::byte> data) {
  RtsReadHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RTS_READ header");
  if (header.size > util::kAddressSpaceEnd) {
    return protocol_error(source, "RTS_READ for a message larger than any buffer can be");
  }
  const Link& peer = engine_.links().link(source);
  if (peer.endpoint == nullptr || peer.reads == nullptr) {
    // Only a transport with one-sided reads announces one; anything else is a forgery.
    return protocol_error(source, "RTS_READ over a transport without one-sided reads");
  }
  if (std::optional<std::uint32_t> index = matcher_.match_posted(source, header.tag)) {
    const transport::Endpoint::RemoteRegion remote{header.address, header.key};
    start_rendezvous(*index, source, header.tag, header.size, header.sreq, 0, &remote);
    return;
  }
  if (finalizing_) return refuse_unmatched(source, header.sreq);
  Unexpected message = unexpected_rendezvous(source, header.tag, header.size, header.sreq);
  message.address = header.address;
  message.readable = true;
  message.key = header.key;
  matcher_.add_unexpected(std::move(message));
}

void Messages::refuse_unmatched(int source, std::uint64_t sreq) {
  ++refused_unmatched_;
  engine_.links().send_control(source, kAmFin, as_bytes(FinHeader{sreq, kFinNeverMatched, 0}));
}

Unexpected Messages::unexpected_rendezvous(int source, Tag tag, std::uint64_t size,
                                           std::uint64_t sreq) {
  Unexpected message;
  message.source = source;
  message.tag = tag;
  message.size = size;
  message.rendezvous = true;
  message.sreq = sreq;
  return message;
}

void Messages::start_rendezvous(std::uint32_t index, int source, Tag tag, std::size_t size,
                                std::uint64_t sreq, std::uint64_t address,
                                const transport::Endpoint::RemoteRegion* remote) {
  RequestSlot& slot = requests_[index];
  const std::size_t length = std::min(size, slot.size);
  slot.info = {source, tag, length};
  slot.message_size = size;
  Link& peer = engine_.links().link(source);
  if (!peer.shares_memory && length > 0 &&
      (slot.gpu.device >= 0 || address == kRtsFromDevice || engine_.chunked().forced())) {
    // Device memory on either side, no shared memory (ofi): in chunks through pinned bounces.
    return engine_.chunked().start_receive(index, source, sreq);
  }
  if (address == kRtsFromDevice && length > 0) {
    engine_.links().send_control(source, kAmFin,
                                 as_bytes(FinHeader{sreq, kFinFailed, 0}));  // the send fails too
    return engine_.complete(
        index, Status(Code::kProtocolError,
                      "rank " + std::to_string(source) +
                          " announced device data over a transport that shares memory"));
  }
  if ((slot.gpu.device >= 0 || test_host_staging_) && length > 0) {
    // A host sender, a device receiver: through the staging ring, copied in asynchronously.
    return engine_.device().start_host_receive(index, source, sreq);
  }
  if (remote == nullptr && length > 0 && length >= peer.get_from && (peer.zero_copy != nullptr) &&
      !peer.get_failed) {
    if (length >= peer.split_from && peer.split != nullptr && !peer.split_failed &&
        start_split(index, source, sreq, address, length)) {
      return;
    }
    if (test_get_delay_ > 0) ::usleep(static_cast<useconds_t>(test_get_delay_ * 1e6));
    if (got(index, source, sreq, peer.zero_copy->get(slot.recv_buffer, address, length))) return;
  }
  if (length == 0) {
    engine_.complete(index, size > slot.size ? truncation(source, size, slot.size) : Status::ok());
    engine_.links().send_control(source, kAmFin, as_bytes(FinHeader{sreq, 0, 0}));
    return;
  }
  slot.state = RequestState::kActive;
  if (remote != nullptr && slot.gpu.device < 0 && (peer.reads != nullptr) && !peer.read_failed) {
    // One-sided: read the sender's buffer, then tell it (FIN).
    if (test_get_delay_ > 0) ::usleep(static_cast<useconds_t>(test_get_delay_ * 1e6));
    Status status =
        peer.reads->read_direct(slot.recv_buffer, length, *remote, requests_.wire_id(index));
    if (status) {
      slot.transfer.direct = true;
      slot.transfer.reading = true;
      slot.transfer.read_sreq = sreq;
      ++slot.transfer.device_ops;  // the buffer is the transport's until on_direct
      return;
    }
    peer.read_failed = true;
    FERRY_LOG(kWarn,
              "%s: reading a message of rank %d failed to start (%s); clear-to-send from "
              "now on",
              peer.transport.c_str(), source, status.to_string().c_str());
  }
  request_data(index, source, sreq, length);
}

bool Messages::got(std::uint32_t index, int source, std::uint64_t sreq, Status status) {
  RequestSlot& slot = requests_[index];
  Link& peer = engine_.links().link(source);
  if (status && peer.endpoint->was_withdrawn(sreq)) {
    // The sender gave up on the send (its timeout, or its collective failed) while we read:
    // its buffer may have been reused.
    engine_.complete(index, withdrawn_while_read(source));
    return true;
  }
  if (!status && status.code() == Code::kPeerFailed) {
    engine_
        .look_for_failures();  // the sender is gone: fail what involves it, this receive included
    if (engine_.requests().done(index)) return true;
  }
  if (!status && status.code() == Code::kUnsupported) {
    peer.get_failed = true;
    FERRY_LOG(kWarn,
              "%s: zero-copy get from rank %d refused (%s); its large messages are "
              "pipelined from now on",
              peer.transport.c_str(), source, status.to_string().c_str());
  } else if (!status) {
    // A failure of this copy only (a range not mapped, a transient error): this message goes
    // pipelined, the next ones try again.
    FERRY_LOG(kInfo, "%s: zero-copy get from rank %d failed (%s); this message is pipelined",
              peer.transport.c_str(), source, status.to_string().c_str());
  }
  if (!status) return false;
  engine_.complete(index, slot.message_size > slot.size
                              ? truncation(source, slot.message_size, slot.size)
                              : Status::ok());
  engine_.links().send_control(source, kAmFin, as_bytes(FinHeader{sreq, 0, 0}));
  return true;
}

bool Messages::start_split(std::uint32_t index, int source, std::uint64_t sreq,
                           std::uint64_t address, std::size_t length) {
  // Halves on a page boundary where there are pages to split.
  const std::size_t head = length >= 8192 ? (length / 2) & ~std::size_t{4095} : length / 2;
  Link& peer = engine_.links().link(source);
  transport::SplitCopies::Claim claim;
  if (head == 0 || !peer.split->open_claim(&claim)) return false;
  RequestSlot& slot = requests_[index];
  engine_.links().send_control(
      source, kAmCtsSplit,
      as_bytes(CtsSplitHeader{sreq, requests_.wire_id(index),
                              reinterpret_cast<std::uint64_t>(slot.recv_buffer), head, length,
                              claim.ticket, claim.slot, 0}));
  // (FERRY_TEST_GET_DELAY: after the offer, so that a sender calling in claims the tail.)
  if (test_get_delay_ > 0) ::usleep(static_cast<useconds_t>(test_get_delay_ * 1e6));
  Status status = peer.zero_copy->get(slot.recv_buffer, address, head);
  if (peer.split->claim_tail(claim)) {
    // The sender has not called in yet: the tail is ours too.
    peer.split->close_claim(claim);
    if (status)
      status = peer.zero_copy->get(slot.recv_buffer + head, address + head, length - head);
    if (!got(index, source, sreq, std::move(status))) {
      slot.state = RequestState::kActive;
      request_data(index, source, sreq, length);
    }
    return true;
  }
  // The sender writes the tail into the buffer, which stays its until kAmTailWritten, whatever
  // else ends the receive meanwhile.
  slot.state = RequestState::kActive;
  slot.status = std::move(status);
  slot.transfer.split = true;
  slot.transfer.split_slot = claim.slot;
  slot.transfer.split_ticket = claim.ticket;
  slot.transfer.split_sreq = sreq;
  slot.transfer.split_address = address;
  slot.transfer.split_head = head;
  ++slot.transfer.device_ops;
  return true;
}

void Messages::handle_cts_split(int source, std::span<const std::byte> data) {
  CtsSplitHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short split CTS header");
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(header.sreq, &index);
  // A send that ended (withdrawn after FERRY_TIMEOUT) or is no longer announced: the receiver
  // copies the tail itself and then sees the withdrawal.
  if (slot == nullptr || slot->state != RequestState::kActive || !slot->rendezvous) return;
  Link& peer = engine_.links().link(source);
  if (slot->kind != RequestKind::kSend || slot->peer != source || header.offset == 0 ||
      header.offset >= header.length || header.length > slot->size || peer.split == nullptr) {
    return protocol_error(source, "split CTS for no rendezvous send of that size");
  }
  if (!peer.split->claim_peer_tail({header.slot, header.ticket})) return;  // the receiver's
  // FERRY_TEST_CRASH_AT=mid-pipeline: die with the tail claimed, before writing it.
  engine_.crashes().here(util::CrashPoint::kMidPipeline);
  Status status = peer.split->put(header.address + header.offset, slot->send_buffer + header.offset,
                                  header.length - header.offset);
  if (!status && status.code() == Code::kPeerFailed) {
    engine_.look_for_failures();  // the receiver is gone: nothing waits for the answer
    return;
  }
  if (!status) {
    FERRY_LOG(kInfo, "%s: writing a message's second half into rank %d failed (%s); it reads it",
              peer.transport.c_str(), source, status.to_string().c_str());
  }
  engine_.links().send_control(
      source, kAmTailWritten,
      as_bytes(TailWrittenHeader{header.rreq, static_cast<std::uint32_t>(status.code()), 0}));
}

void Messages::handle_tail_written(int source, std::span<const std::byte> data) {
  TailWrittenHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short tail-written header");
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(header.rreq, &index);
  if (slot == nullptr || slot->kind != RequestKind::kRecv || slot->state != RequestState::kActive ||
      slot->info.source != source || !slot->transfer.split) {
    return protocol_error(source, "tail written for no receive copied from both ends");
  }
  Link& peer = engine_.links().link(source);
  RequestSlot::Transfer& transfer = slot->transfer;
  transfer.split = false;
  --transfer.device_ops;
  peer.split->close_claim({transfer.split_slot, transfer.split_ticket});
  const std::uint64_t sreq = transfer.split_sreq;
  if (transfer.deferred) {
    // The receive ended meanwhile (its communicator revoked): now the buffer is free.
    engine_.links().send_control(source, kAmFin, as_bytes(FinHeader{sreq, kFinFailed, 0}));
    if (transfer.device_ops == 0) engine_.complete(index, slot->status);
    return;
  }
  Status status = std::move(slot->status);  // the head's get
  if (header.code != 0) {
    // The sender could not write (its copy failed, or CMA is refused that way): copy it here.
    if (header.code == static_cast<std::uint32_t>(Code::kUnsupported)) {
      peer.split_failed = true;
      FERRY_LOG(kWarn, "%s: rank %d cannot write into this process; its messages are read whole",
                peer.transport.c_str(), source);
    }
    if (status) {
      status = peer.zero_copy->get(slot->recv_buffer + transfer.split_head,
                                   transfer.split_address + transfer.split_head,
                                   slot->info.bytes - transfer.split_head);
    }
  }
  if (!got(index, source, sreq, std::move(status))) {
    request_data(index, source, sreq, requests_[index].info.bytes);
  }
}

void Messages::request_data(std::uint32_t index, int source, std::uint64_t sreq,
                            std::size_t length) {
  RequestSlot& slot = requests_[index];
  Link& peer = engine_.links().link(source);
  const std::uint64_t rreq = requests_.wire_id(index);
  if ((peer.direct != nullptr) && !peer.direct_failed) {
    // The transport moves the whole message into the receive buffer (its own rendezvous).
    Status status = peer.direct->recv_direct(slot.recv_buffer, length, -1, rreq, rreq);
    if (status) {
      slot.transfer.direct = true;
      ++slot.transfer.device_ops;  // the buffer is the transport's until on_direct
      engine_.links().send_control(source, kAmCtsDirect, as_bytes(CtsHeader{sreq, rreq, length}));
      return;
    }
    peer.direct_failed = true;
    FERRY_LOG(kWarn, "%s: a direct receive from rank %d failed (%s); pipelined from now on",
              peer.transport.c_str(), source, status.to_string().c_str());
  }
  slot.expected = length;
  slot.received = 0;
  engine_.links().send_control(source, kAmCts, as_bytes(CtsHeader{sreq, rreq, length}));
}

RequestSlot* Messages::cts_target(int source, const CtsHeader& header, std::uint32_t* index) {
  RequestSlot* slot = requests_.lookup(header.sreq, index);
  if (slot == nullptr) {
    // A send that is gone (withdrawn after FERRY_TIMEOUT): the receive must not wait for it.
    engine_.links().send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    FERRY_LOG(kDebug, "CTS from rank %d for a send that is gone: answered with NACK", source);
    return nullptr;
  }
  if (slot->kind != RequestKind::kSend || !slot->rendezvous ||
      slot->state != RequestState::kActive || slot->peer != source || header.length == 0 ||
      header.length > slot->size) {
    // Also what a send abandoned after FERRY_TIMEOUT sees: the receiver must not wait for
    // fragments that will never come.
    engine_.links().send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    protocol_error(source, "CTS for no rendezvous send of that size (answered with NACK)");
    return nullptr;
  }
  slot->rendezvous = false;  // a second CTS or FIN for it is an error
  return slot;
}

void Messages::handle_cts(int source, std::span<const std::byte> data) {
  CtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short CTS header");
  std::uint32_t index = 0;
  if (cts_target(source, header, &index) == nullptr) return;
  engine_.links().send_or_queue(source, Links::stream(kAmFrag, index, header.rreq, header.length));
}

void Messages::handle_cts_direct(int source, std::span<const std::byte> data) {
  CtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short CTS header");
  std::uint32_t index = 0;
  RequestSlot* slot = cts_target(source, header, &index);
  if (slot == nullptr) return;
  Link& peer = engine_.links().link(source);
  if (peer.direct == nullptr) {
    engine_.links().send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    engine_.complete(index, Status(Code::kProtocolError, "rank " + std::to_string(source) +
                                                             " asked for a direct transfer over " +
                                                             peer.transport + ", which has none"));
    return;
  }
  // FERRY_TEST_CRASH_AT=mid-pipeline: die with the receiver's direct receive posted.
  engine_.crashes().here(util::CrashPoint::kMidPipeline);
  Status status = peer.direct->send_direct(slot->send_buffer, header.length, -1, header.rreq,
                                           requests_.wire_id(index));
  if (!status) {
    engine_.links().send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    engine_.complete(index, std::move(status));
    return;
  }
  slot->transfer.direct = true;
  ++slot->transfer.device_ops;
}

void Messages::handle_frag(int source, std::span<const std::byte> data) {
  FragHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short fragment header");
  auto payload = data.subspan(sizeof(header));
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(header.rreq, &index);
  if (slot == nullptr || slot->kind != RequestKind::kRecv || slot->state != RequestState::kActive ||
      slot->info.source != source || header.offset > slot->expected ||
      payload.size() > slot->expected - header.offset ||
      payload.size() > slot->expected - slot->received) {
    return protocol_error(source, "fragment outside any receive in progress");
  }
  util::copy(slot->recv_buffer + header.offset, payload.data(), payload.size());
  slot->received += payload.size();
  if (slot->received == slot->expected) {
    engine_.complete(index, slot->message_size > slot->size
                                ? truncation(source, slot->message_size, slot->size)
                                : Status::ok());
  }
}

void Messages::handle_fin(int source, std::span<const std::byte> data) {
  FinHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short FIN header");
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(header.sreq, &index);
  if (slot == nullptr) {
    // A send that is gone: withdrawn after FERRY_TIMEOUT while the receiver finished it.
    FERRY_LOG(kDebug, "FIN from rank %d for a send that is gone", source);
    return;
  }
  if (header.code != 0 && slot->kind == RequestKind::kSend &&
      slot->state == RequestState::kActive && slot->peer == source && !slot->transfer.deferred) {
    return receiver_failed(index, source, header.code);  // the receiver failed or finalized
  }
  if (slot->kind != RequestKind::kSend || !slot->rendezvous ||
      slot->state != RequestState::kActive || slot->peer != source) {
    return protocol_error(source, "FIN for no rendezvous send");
  }
  slot->rendezvous = false;
  engine_.complete(index, Status::ok());
}

void Messages::handle_nack(int source, std::span<const std::byte> data) {
  NackHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NACK header");
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(header.rreq, &index);
  if (slot == nullptr || slot->kind != RequestKind::kRecv || slot->state != RequestState::kActive ||
      slot->info.source != source) {
    return;  // a receive that already ended: nothing waits
  }
  if (slot->transfer.direct && slot->transfer.device_ops > 0) {
    if (auto* direct = engine_.links().link(source).direct) direct->cancel_direct(header.rreq);
  }
  engine_.complete_when_idle(index, Status(Code::kCanceled, "rank " + std::to_string(source) +
                                                                " gave up sending this message"));
}

void Messages::receiver_failed(std::uint32_t index, int source, std::uint32_t code) {
  engine_.device().forget_staged(index, source);
  if (code == kFinNeverMatched) {
    ++never_matched_;
    return engine_.complete_when_idle(
        index, Status(Code::kCanceled, "rank " + std::to_string(source) +
                                           " finalized without a receive for this message"));
  }
  engine_.complete_when_idle(index,
                             Status(Code::kIoError, "rank " + std::to_string(source) +
                                                        " reported that it could not receive "
                                                        "this message"));
}

}  // namespace ferry::proto
