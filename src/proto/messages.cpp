// Tag-matched messages (see messages.hpp): sends, receives, eager delivery, probing, and what a
// sender or receiver that gives up does.
#include "proto/messages.hpp"

#include <algorithm>
#include <cstring>

#include "proto/chunked.hpp"
#include "proto/device_path.hpp"
#include "proto/engine.hpp"
#include "proto/wire.hpp"
#include "util/copy.hpp"
#include "util/extent.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"

namespace ferry::proto {
namespace {

template <typename H>
void set_header(std::uint8_t am, const H& header, std::uint8_t* am_out, std::uint8_t* size_out,
                std::array<std::byte, 40>* bytes) {
  static_assert(sizeof(H) <= 40);
  *am_out = am;
  *size_out = sizeof(H);
  std::memcpy(bytes->data(), &header, sizeof(H));
}

}  // namespace

Messages::Messages(Engine& engine, const util::Config& config)
    : engine_(engine),
      requests_(engine.requests()),
      test_host_staging_(config.get_bool(util::Var::kTestHostStaging)),
      test_get_delay_(config.get_seconds(util::Var::kTestGetDelay)) {}

bool Messages::on_am(std::uint8_t id, int source, std::span<const std::byte> data) {
  switch (id) {
    case kAmEager:
      handle_eager(source, data);
      return true;
    case kAmRts:
      handle_rts(source, data);
      return true;
    case kAmRtsRead:
      handle_rts_read(source, data);
      return true;
    case kAmCts:
      handle_cts(source, data);
      return true;
    case kAmCtsDirect:
      handle_cts_direct(source, data);
      return true;
    case kAmFrag:
      handle_frag(source, data);
      return true;
    case kAmFin:
      handle_fin(source, data);
      return true;
    case kAmCancel:
      handle_cancel(source, data);
      return true;
    case kAmNack:
      handle_nack(source, data);
      return true;
    case kAmCtsSplit:
      handle_cts_split(source, data);
      return true;
    case kAmTailWritten:
      handle_tail_written(source, data);
      return true;
    default:
      return false;
  }
}

void Messages::end_posted_receives(int rank, const Status& status) {
  const bool none_left = engine_.liveness().none_can_come(kAnySource);
  const Status any_source = none_left ? engine_.liveness().no_one_left() : Status();
  for (std::uint32_t i = 0; i < requests_.capacity(); ++i) {
    const RequestSlot& slot = requests_[i];
    if (slot.state == RequestState::kPosted &&
        (slot.peer == rank || (slot.peer == kAnySource && none_left))) {
      matcher_.remove_posted(i);
      engine_.complete(i, slot.peer == rank ? status : any_source);
    }
  }
}

void Messages::peer_departed(int rank) {
  end_posted_receives(rank, engine_.liveness().cannot_come(rank));
}

void Messages::peer_failed(int rank, const Status& status) {
  end_posted_receives(rank, status);
  matcher_.drop_rendezvous_from(rank);
  // Receives whose tail it was writing: no write can come any more; the engine fails them next.
  Link& link = engine_.links().link(rank);
  for (std::uint32_t i = 0; i < requests_.capacity(); ++i) {
    RequestSlot& slot = requests_[i];
    if (slot.kind == RequestKind::kRecv && slot.state == RequestState::kActive &&
        slot.transfer.split && slot.info.source == rank) {
      slot.transfer.split = false;
      --slot.transfer.device_ops;
      link.split->close_claim({slot.transfer.split_slot, slot.transfer.split_ticket});
      if (slot.transfer.deferred && slot.transfer.device_ops == 0) engine_.complete(i, slot.status);
    }
  }
}

std::size_t Messages::finalize() {
  finalizing_ = true;
  std::size_t dropped = 0;
  for (const Unexpected& message : matcher_.take_all_unexpected()) {
    ++dropped;
    if (message.rendezvous && engine_.liveness().failure(message.source) == nullptr) {
      refuse_unmatched(message.source, message.sreq);
    }
  }
  return dropped;
}

Request Messages::isend(const void* buffer, std::size_t bytes, int destination, Tag tag,
                        bool synchronous) {
  std::uint32_t index = requests_.allocate(RequestKind::kSend);
  RequestSlot& slot = requests_[index];
  slot.peer = destination;
  slot.tag = tag;
  slot.send_buffer = static_cast<const std::byte*>(buffer);
  slot.size = bytes;
  slot.info = {engine_.rank(), tag, bytes};
  Request request = engine_.request(index);
  if (destination < 0 || destination >= engine_.size()) {
    engine_.complete(index, Status(Code::kInvalidArgument,
                                   "isend: destination rank " + std::to_string(destination) +
                                       " is not in [0, " + std::to_string(engine_.size()) + ")"));
    return request;
  }
  if (buffer == nullptr && bytes > 0) {
    engine_.complete(index, Status(Code::kInvalidArgument,
                                   "isend: null buffer with " + std::to_string(bytes) + " bytes"));
    return request;
  }
  if (Status bad = util::check_extent("isend", "buffer", buffer, bytes); !bad) {
    engine_.complete(index, std::move(bad));
    return request;
  }
  Link& peer = engine_.links().link(destination);
  if (peer.endpoint == nullptr || peer.failed) {
    engine_.complete(index, Status(peer.failed ? Code::kPeerFailed : Code::kUnsupported, peer.why));
    return request;
  }
  engine_.crashes().here(util::CrashPoint::kFirstSend);
  // What a rendezvous announces: our buffer, for a receiver that can read it directly.
  auto rts_address = reinterpret_cast<std::uint64_t>(buffer);
  if (engine_.cuda() != nullptr && bytes > 0 && !send_gpu_memory(index, peer, &rts_address)) {
    return request;  // taken by the device path, or failed
  }
  const bool eager = bytes <= peer.eager_limit && !synchronous;
  if (eager && peer.pending.empty()) {
    // The fast path: straight to the transport, no queue entry built (8 B latency -5%).
    Status status = send_eager(peer, slot.send_buffer, bytes, tag);
    if (status.code() != Code::kWouldBlock) {
      engine_.complete(index, std::move(status));
      return request;
    }
  }
  Pending pending;
  pending.request = index;
  pending.payload = slot.send_buffer;
  if (eager) {
    set_header(kAmEager, EagerHeader{tag}, &pending.am, &pending.header_size, &pending.header);
    pending.payload_size = bytes;
    pending.complete_on_send = true;
  } else {
    announce_rendezvous(index, peer, rts_address, &pending);
  }
  engine_.links().send_or_queue(destination, std::move(pending));
  if (slot.transfer.exposed && engine_.crashes().at(util::CrashPoint::kMidPipeline)) {
    // FERRY_TEST_CRASH_AT=mid-pipeline: die with the buffer exposed and announced (the
    // receiver's read then meets a dead process). A few polls first, so the RTS leaves.
    for (int i = 0; i < 1000; ++i) engine_.progress();
    engine_.crashes().here(util::CrashPoint::kMidPipeline);
  }
  return request;
}

Status Messages::send_eager(Link& peer, const void* buffer, std::size_t bytes, Tag tag) {
  const EagerHeader header{tag};
  return peer.endpoint->am_send(
      kAmEager, as_bytes(header),
      std::span<const std::byte>(static_cast<const std::byte*>(buffer), bytes),
      transport::AmHint::kNone);
}

std::optional<Status> Messages::send_now(const void* buffer, std::size_t bytes, int destination,
                                         Tag tag) {
  // With CUDA in use the buffer would be classified here and again by isend for device memory
  // (a driver call each): those sends keep isend's one.
  if (engine_.cuda() != nullptr || destination < 0 || destination >= engine_.size() ||
      (buffer == nullptr && bytes > 0) || !util::fits_address_space(buffer, bytes)) {
    return std::nullopt;
  }
  Link& peer = engine_.links().link(destination);
  if (peer.endpoint == nullptr || peer.failed || bytes > peer.eager_limit ||
      !peer.pending.empty()) {
    return std::nullopt;
  }
  engine_.crashes().here(util::CrashPoint::kFirstSend);
  Status status = send_eager(peer, buffer, bytes, tag);
  if (status.code() == Code::kWouldBlock) return std::nullopt;
  return status;
}

bool Messages::send_gpu_memory(std::uint32_t index, Link& peer, std::uint64_t* rts_address) {
  RequestSlot& slot = requests_[index];
  const std::size_t bytes = slot.size;
  // One driver query per send while CUDA is in use (bench/cuda_probe: 87-234 ns).
  const mem::MemoryInfo memory = engine_.cuda()->classify(slot.send_buffer);
  if (memory.device_only() && peer.shares_memory) {
    engine_.device().send(index, slot.peer, memory);
    return false;
  }
  if (memory.pinned) slot.gpu.pinned_device = engine_.cuda()->bounce_device(memory);
  if (memory.device_only() && (bytes <= peer.eager_limit || peer.direct == nullptr)) {
    // No shared memory with the peer (ofi), and small (or no direct transfers): the message
    // goes as host data, from a copy.
    slot.gpu.host_copy.resize(bytes);
    Status status = engine_.cuda()->copy(slot.gpu.host_copy.data(), slot.send_buffer, bytes);
    if (!status) {
      engine_.complete(index, std::move(status));
      return false;
    }
    slot.send_buffer = slot.gpu.host_copy.data();
    *rts_address = reinterpret_cast<std::uint64_t>(slot.send_buffer);
  } else if (memory.device_only()) {
    // Larger: announced as device data; the receiver asks for chunks (proto/chunked.cpp).
    slot.gpu.device = memory.device;
    *rts_address = kRtsFromDevice;
  }
  return true;
}

void Messages::announce_rendezvous(std::uint32_t index, Link& peer, std::uint64_t rts_address,
                                   Pending* out) {
  RequestSlot& slot = requests_[index];
  Pending& pending = *out;
  const std::size_t bytes = slot.size;
  const Tag tag = slot.tag;
  const int destination = slot.peer;
  slot.rendezvous = true;
  const std::uint64_t sreq = requests_.wire_id(index);
  transport::Endpoint::RemoteRegion region;
  // Below the endpoint's read size, where it has a direct transfer, that goes instead.
  const bool read_size = bytes >= peer.read_from || peer.direct == nullptr || peer.direct_failed;
  if (slot.gpu.device < 0 && rts_address != kRtsFromDevice && (peer.reads != nullptr) &&
      !peer.read_failed && !engine_.chunked().forced() && read_size) {
    // The receiver may read the buffer itself (no clear-to-send round trip).
    Status status = peer.reads->expose(slot.send_buffer, bytes, sreq, &region);
    if (status) {
      slot.transfer.exposed = true;
    } else {
      peer.read_failed = true;
      FERRY_LOG(kWarn,
                "%s: exposing a send buffer to rank %d failed (%s); clear-to-send from "
                "now on",
                peer.transport.c_str(), destination, status.to_string().c_str());
    }
  }
  if (slot.transfer.exposed) {
    RtsReadHeader rts{tag, bytes, sreq, region.address, region.key};
    set_header(kAmRtsRead, rts, &pending.am, &pending.header_size, &pending.header);
  } else {
    RtsHeader rts{tag, bytes, sreq, rts_address};
    set_header(kAmRts, rts, &pending.am, &pending.header_size, &pending.header);
  }
}

Request Messages::irecv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask) {
  return engine_.request(post_recv(buffer, capacity, source, tag, mask));
}

std::uint32_t Messages::post_recv(void* buffer, std::size_t capacity, int source, Tag tag,
                                  Tag mask) {
  std::uint32_t index = requests_.allocate(RequestKind::kRecv);
  RequestSlot& slot = requests_[index];
  slot.peer = source;
  slot.tag = tag;
  slot.mask = mask;
  slot.recv_buffer = static_cast<std::byte*>(buffer);
  slot.size = capacity;
  if (source != kAnySource && (source < 0 || source >= engine_.size())) {
    engine_.complete(index,
                     Status(Code::kInvalidArgument, "irecv: source rank " + std::to_string(source) +
                                                        " is neither kAnySource nor in [0, " +
                                                        std::to_string(engine_.size()) + ")"));
    return index;
  }
  if (buffer == nullptr && capacity > 0) {
    engine_.complete(index, Status(Code::kInvalidArgument,
                                   "irecv: null buffer with capacity " + std::to_string(capacity)));
    return index;
  }
  if (Status bad = util::check_extent("irecv", "buffer", buffer, capacity); !bad) {
    engine_.complete(index, std::move(bad));
    return index;
  }
  if (engine_.cuda() != nullptr && capacity > 0) {
    const mem::MemoryInfo memory = engine_.cuda()->classify(buffer);
    if (memory.device_only()) slot.gpu.device = memory.device;
    if (memory.pinned) slot.gpu.pinned_device = engine_.cuda()->bounce_device(memory);
  }
  std::optional<Unexpected> message = matcher_.take_unexpected(source, tag, mask);
  if (!message && engine_.liveness().none_can_come(source)) {
    // A dead, finalized or unreachable rank (for kAnySource: every other one) will send nothing:
    // fail now rather than wait forever.
    engine_.complete(index, source != kAnySource ? engine_.liveness().cannot_come(source)
                                                 : engine_.liveness().no_one_left());
  } else if (!message) {
    slot.state = RequestState::kPosted;
    matcher_.post({source, tag, mask, index});
  } else if (message->device) {
    cuda::IpcKey key;
    const bool has_key = message->data.size() == sizeof(key);
    if (has_key) std::memcpy(&key, message->data.data(), sizeof(key));
    engine_.device().start_receive(index, message->source, message->tag, message->size,
                                   message->sreq, has_key ? &key : nullptr);
  } else if (!message->rendezvous) {
    deliver_eager(index, message->source, message->tag, message->data);
    matcher_.recycle(std::move(message->data));
  } else {
    const transport::Endpoint::RemoteRegion remote{message->address, message->key};
    start_rendezvous(index, message->source, message->tag, message->size, message->sreq,
                     message->address, message->readable ? &remote : nullptr);
  }
  return index;
}

std::optional<MessageInfo> Messages::iprobe(int source, Tag tag, Tag mask) {
  engine_.progress();
  const Unexpected* message = matcher_.find_unexpected(source, tag, mask);
  if (message == nullptr) return std::nullopt;
  return MessageInfo{message->source, message->tag, message->size};
}

void Messages::deliver_eager(std::uint32_t index, int source, Tag tag,
                             std::span<const std::byte> payload) {
  RequestSlot& slot = requests_[index];
  std::size_t copied = std::min(payload.size(), slot.size);
  slot.info = {source, tag, copied};
  if (slot.gpu.device >= 0 && copied > 0) {
    // Into device memory: a synchronous copy (eager messages are small).
    Status status = engine_.cuda()->copy(slot.recv_buffer, payload.data(), copied);
    if (!status) return engine_.complete(index, std::move(status));
  } else if (copied > 0) {
    util::copy(slot.recv_buffer, payload.data(), copied);
  }
  engine_.complete(index, payload.size() > slot.size ? truncation(source, payload.size(), slot.size)
                                                     : Status::ok());
}

void Messages::handle_eager(int source, std::span<const std::byte> data) {
  EagerHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short eager header");
  auto payload = data.subspan(sizeof(header));
  if (std::optional<std::uint32_t> index = matcher_.match_posted(source, header.tag)) {
    deliver_eager(*index, source, header.tag, payload);
    return;
  }
  Unexpected message;
  message.source = source;
  message.tag = header.tag;
  message.size = payload.size();
  message.data = matcher_.buffer();
  message.data.resize(payload.size());
  if (!payload.empty()) util::copy(message.data.data(), payload.data(), payload.size());
  matcher_.add_unexpected(std::move(message));
}

void Messages::handle_cancel(int source, std::span<const std::byte> data) {
  CancelHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short cancel header");
  if (matcher_.drop_rendezvous(source, header.sreq)) return;
  // Already matched: the receive gets a FIN or a NACK, unless it reads the sender's buffer,
  // which the sender no longer exposes. That read fails, and the receive ends then, without
  // asking for the data by clear-to-send (the sender would only refuse) and without waiting to
  // see whether the sender died (a suspect of DirectEnds: a second or more over a network).
  for (std::uint32_t index = 0; index < requests_.capacity(); ++index) {
    RequestSlot& slot = requests_[index];
    if (slot.kind != RequestKind::kRecv || slot.state != RequestState::kActive ||
        slot.info.source != source || !slot.transfer.reading ||
        slot.transfer.read_sreq != header.sreq) {
      continue;
    }
    slot.transfer.withdrawn = true;
    // No read in flight: it failed already and its failure is held.
    if (slot.transfer.device_ops == 0) engine_.complete(index, withdrawn_while_read(source));
    return;
  }
}

Status Messages::withdrawn_while_read(int source) {
  return Status(Code::kCanceled, "rank " + std::to_string(source) +
                                     " withdrew this message while it was being read (it gave "
                                     "up on the send)");
}

bool Messages::withdraw_recv(std::uint32_t index) {
  if (cancel(index)) return true;
  RequestSlot& slot = requests_[index];
  if (slot.kind != RequestKind::kRecv || slot.state != RequestState::kActive ||
      !slot.transfer.reading || slot.transfer.device_ops > 0) {
    return false;
  }
  engine_.links().send_control(slot.info.source, kAmFin,
                               as_bytes(FinHeader{slot.transfer.read_sreq, kFinFailed, 0}));
  engine_.complete(
      index, Status(Code::kCanceled, "withdrawn after its read of rank " +
                                         std::to_string(slot.info.source) + "'s buffer failed"));
  return true;
}

Status Messages::abandon_send(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  if (slot.state == RequestState::kDone) return slot.status;
  Link& peer = engine_.links().link(slot.peer);
  const Status timeout(Code::kTimeout, "send to rank " + std::to_string(slot.peer) +
                                           " not complete after FERRY_TIMEOUT (" +
                                           std::to_string(engine_.waiting().timeout()) +
                                           " s); withdrawn");
  for (auto it = peer.pending.begin(); it != peer.pending.end(); ++it) {
    if (it->request == index && it->am != kAmFrag) {
      // Never reached the transport: withdraw it.
      peer.pending.erase(it);
      engine_.complete(index, timeout);
      return timeout;
    }
    if (it->stream == index) {
      // Mid-stream: the receive waiting for the rest is told.
      const std::uint64_t rreq = it->rreq;
      peer.pending.erase(it);
      engine_.links().send_control(slot.peer, kAmNack, as_bytes(NackHeader{rreq}));
      engine_.complete(index, timeout);
      return timeout;
    }
  }
  if (engine_.device().withdraw_staged(index, slot.peer, slot.gpu.stage_rreq)) {
    engine_.complete_when_idle(index, timeout);
    int idle = 0;
    while (!engine_.requests().done(index)) engine_.waiting().step(&idle);
    return timeout;
  }
  if (slot.transfer.direct && slot.transfer.device_ops > 0) {
    // The transport is sending the buffer: ask for it back, and wait until it lets go.
    if (peer.direct != nullptr) peer.direct->cancel_direct(requests_.wire_id(index));
    int idle = 0;
    while (!engine_.requests().done(index)) engine_.waiting().step(&idle);
    return slot.status;
  }
  if (slot.rendezvous) {
    // Announced: withdraw the announcement; a CTS that still comes is answered with a NACK, and
    // a receiver reading the buffer by zero-copy get sees the mark afterwards and drops the data.
    slot.rendezvous = false;
    peer.endpoint->mark_withdrawn(requests_.wire_id(index));
    engine_.links().send_control(slot.peer, kAmCancel,
                                 as_bytes(CancelHeader{requests_.wire_id(index)}));
    engine_.complete(index, timeout);
    return timeout;
  }
  int idle = 0;  // nothing else can keep a send pending; finish it
  while (!engine_.requests().done(index)) engine_.waiting().step(&idle);
  return slot.status;
}

bool Messages::cancel(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  if (slot.kind != RequestKind::kRecv || slot.state != RequestState::kPosted) return false;
  if (!matcher_.remove_posted(index)) return false;
  engine_.complete(index, Status(Code::kCanceled, "receive canceled before it matched"));
  return true;
}

}  // namespace ferry::proto
