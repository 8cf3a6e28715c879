// Device data with a peer that shares no memory with us (ofi): a message in device memory on
// either side travels as a series of direct transfers of FERRY_OFI_CHUNK bytes. Where the NIC
// registers that GPU's memory (Endpoint::device_direct: FI_HMEM, and a trial registration that
// succeeded) a device side sends from or receives into its buffer as it is; elsewhere each chunk
// goes through a pinned host bounce on the device side:
//   sender:   RTS (address kRtsFromDevice when its buffer is device memory)
//   receiver: posts a direct receive for chunk 0 (into its buffer, or into its bounce), answers
//             CTS_CHUNKED {length, chunk}
//   sender:   chunk k: copy device -> bounce (a device buffer), direct send; on completion, k + 1
//   receiver: chunk k arrived: copy bounce -> device (a device buffer), post k + 1
// Chunks of one message share a key and the provider matches them in order. Memory in flight is
// one chunk per message on each side. Copies are synchronous; the network is the slower leg.
#include <cstdlib>
#include <cstring>
#include <utility>

#include "proto/engine.hpp"
#include "proto/wire.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"

namespace ferry::proto {

namespace {
constexpr std::size_t kMaxBounces = 16;  // pinned bounces per process; more transfers wait
}  // namespace

std::byte* Engine::take_bounce() {
  if (!bounce_pool_.empty()) {
    std::byte* bounce = bounce_pool_.back();
    bounce_pool_.pop_back();
    return bounce;
  }
  if (bounces_made_ >= kMaxBounces) return nullptr;  // the caller waits for one
  auto* bounce = static_cast<std::byte*>(std::aligned_alloc(4096, ofi_chunk_));
  if (bounce == nullptr) return nullptr;
  ++bounces_made_;
  if (!cuda_->register_host(bounce, ofi_chunk_)) {
    // Pageable is slower for the copy engine but still correct.
    FERRY_LOG(kDebug, "a chunk bounce could not be pinned; using it pageable");
  }
  return bounce;
}

void Engine::return_bounce(RequestSlot* slot) {
  bounce_pool_.push_back(std::exchange(slot->bounce, nullptr));
  // A transfer that waited for a bounce starts now (registering one costs a millisecond; a
  // bounded set reused beats one per message).
  while (!bounce_waiters_.empty() && !bounce_pool_.empty()) {
    const std::uint64_t wire = bounce_waiters_.front();
    bounce_waiters_.pop_front();
    std::uint32_t index = 0;
    RequestSlot* waiting = requests_.lookup(wire, &index);
    if (waiting == nullptr || waiting->state != RequestState::kActive || waiting->chunk == 0 ||
        waiting->bounce != nullptr || waiting->deferred) {
      continue;  // ended (failed, timed out) while it waited
    }
    waiting->bounce = take_bounce();
    start_chunks(index);
  }
}

// The first chunk of a transfer that has its bounce (if it needs one): post it, and on the
// receiving side ask the sender for the chunks.
void Engine::start_chunks(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  const bool send = slot.kind == RequestKind::kSend;
  const int peer_rank = send ? slot.peer : slot.info.source;
  Status status = post_chunk(index);
  if (!status) return chunk_done(index, std::move(status));
  if (!send) {
    send_control(peer_rank, kAmCtsChunked,
                 as_bytes(ChunkCtsHeader{slot.stage_rreq, requests_.wire_id(index), slot.expected,
                                         slot.chunk}));
  }
}

void Engine::start_chunked_receive(std::uint32_t index, int source, std::uint64_t sreq) {
  RequestSlot& slot = requests_[index];
  Peer& peer = peers_[static_cast<std::size_t>(source)];
  slot.state = RequestState::kActive;
  slot.stage_rreq = sreq;  // the sender's request, for a FIN that fails it
  slot.expected = slot.info.bytes;
  slot.received = 0;
  slot.chunk = std::min(ofi_chunk_, slot.expected);
  slot.direct = true;
  if (!peer.endpoint->has_direct()) {
    // The sender must not wait for a CTS: FIN with a code fails it.
    send_control(source, kAmFin, as_bytes(FinHeader{sreq, kFinFailed, 0}));
    return complete(index, Status(Code::kUnsupported, peer.transport + " has no direct transfers"));
  }
  if (needs_bounce(slot, *peer.endpoint) && (slot.bounce = take_bounce()) == nullptr) {
    bounce_waiters_.push_back(requests_.wire_id(index));  // started by return_bounce
    return;
  }
  start_chunks(index);
}

bool Engine::needs_bounce(const RequestSlot& slot, transport::Endpoint& endpoint) {
  if (slot.device < 0) return false;
  const bool send = slot.kind == RequestKind::kSend;
  const void* buffer = send ? static_cast<const void*>(slot.send_buffer) : slot.recv_buffer;
  return !endpoint.device_direct(slot.device, buffer, slot.expected);
}

void Engine::handle_cts_chunked(int source, std::span<const std::byte> data) {
  ChunkCtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short CTS_CHUNKED header");
  std::uint32_t index = 0;
  RequestSlot* slot =
      cts_target(source, CtsHeader{header.sreq, header.rreq, header.length}, &index);
  if (slot == nullptr) return;
  Peer& peer = peers_[static_cast<std::size_t>(source)];
  Status status;
  if (header.chunk == 0 || header.chunk > (std::uint64_t{1} << 30) ||
      !peer.endpoint->has_direct()) {
    status = Status(Code::kProtocolError,
                    "rank " + std::to_string(source) + " asked for chunks of " +
                        std::to_string(header.chunk) + " bytes over " + peer.transport);
  }
  slot->expected = header.length;
  slot->staged = 0;
  slot->stage_rreq = header.rreq;
  slot->chunk = static_cast<std::size_t>(header.chunk);
  slot->direct = true;
  if (status && slot->device >= 0 && header.chunk > ofi_chunk_) {
    status = Status(Code::kProtocolError, "rank " + std::to_string(source) +
                                              " asked for chunks larger than FERRY_OFI_CHUNK");
  }
  if (!status) {
    send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    return complete(index, std::move(status));
  }
  if (needs_bounce(*slot, *peer.endpoint) && (slot->bounce = take_bounce()) == nullptr) {
    bounce_waiters_.push_back(requests_.wire_id(index));  // started by return_bounce
    return;
  }
  start_chunks(index);
}

// Posts the next chunk of a chunked send or receive (sync copy out of device memory first).
Status Engine::post_chunk(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  const bool send = slot.kind == RequestKind::kSend;
  const int peer_rank = send ? slot.peer : slot.info.source;
  Peer& peer = peers_[static_cast<std::size_t>(peer_rank)];
  const std::size_t offset = send ? slot.staged : slot.received;
  const std::size_t bytes = std::min(slot.chunk, slot.expected - offset);
  // Device memory without a bounce: the NIC registers it (device_direct said so).
  const int device = slot.bounce == nullptr ? slot.device : -1;
  Status status;
  if (send) {
    const std::byte* source = slot.send_buffer + offset;
    if (slot.bounce != nullptr) {
      status = cuda_->copy(slot.bounce, source, bytes);
      source = slot.bounce;
    }
    if (status) {
      status = peer.endpoint->send_direct(source, bytes, device, slot.stage_rreq,
                                          requests_.wire_id(index));
    }
  } else {
    std::byte* target = slot.bounce != nullptr ? slot.bounce : slot.recv_buffer + offset;
    const std::uint64_t rreq = requests_.wire_id(index);
    status = peer.endpoint->recv_direct(target, bytes, device, rreq, rreq);
  }
  if (status) ++slot.device_ops;
  return status;
}

void Engine::chunk_done(std::uint32_t index, Status status) {
  RequestSlot& slot = requests_[index];
  const bool send = slot.kind == RequestKind::kSend;
  const int peer_rank = send ? slot.peer : slot.info.source;
  std::size_t& done = send ? slot.staged : slot.received;
  const std::size_t bytes = std::min(slot.chunk, slot.expected - done);
  if (status && !send && slot.bounce != nullptr) {
    status = cuda_->copy(slot.recv_buffer + done, slot.bounce, bytes);
  }
  if (!status) {
    // Tell the other side, so that it does not wait for chunks that will never come.
    if (send) {
      send_control(peer_rank, kAmNack, as_bytes(NackHeader{slot.stage_rreq}));
    } else {
      // The receiver's failure reaches the sender as a FIN with a code (handle_fin).
      send_control(peer_rank, kAmFin, as_bytes(FinHeader{slot.stage_rreq, kFinFailed, 0}));
    }
    return complete(index, std::move(status));
  }
  done += bytes;
  // FERRY_TEST_CRASH_AT=mid-pipeline: a sender dies after its first chunk.
  if (send && crash_mid_pipeline_)
    util::crash_point(config_, rank_, util::CrashPoint::kMidPipeline);
  if (done < slot.expected) {
    status = post_chunk(index);
    if (status) return;
    return chunk_done(index, std::move(status));  // reports the failure as above
  }
  if (send) return complete(index, Status::ok());
  complete(index,
           slot.message_size > slot.size
               ? Status(Code::kTruncated, "message of " + std::to_string(slot.message_size) +
                                              " bytes from rank " + std::to_string(peer_rank) +
                                              " truncated to the " + std::to_string(slot.size) +
                                              "-byte receive buffer")
               : Status::ok());
}

}  // namespace ferry::proto
