// Device data with a peer that shares no memory with us (ofi): without GPU memory registered with
// the NIC, a message in device memory on either side travels as a series of direct transfers of
// FERRY_OFI_CHUNK bytes, each through a pinned host bounce on the device side:
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
#include "util/log.hpp"

namespace ferry::proto {

std::byte* Engine::take_bounce() {
  if (!bounce_pool_.empty()) {
    std::byte* bounce = bounce_pool_.back();
    bounce_pool_.pop_back();
    return bounce;
  }
  auto* bounce = static_cast<std::byte*>(std::aligned_alloc(4096, ofi_chunk_));
  if (bounce == nullptr) return nullptr;
  if (!cuda_->register_host(bounce, ofi_chunk_)) {
    // Pageable is slower for the copy engine but still correct.
    FERRY_LOG(kDebug, "a chunk bounce could not be pinned; using it pageable");
  }
  return bounce;
}

void Engine::return_bounce(RequestSlot* slot) {
  constexpr std::size_t kKeep = 16;  // pinned bounces kept for reuse; more are freed
  std::byte* bounce = std::exchange(slot->bounce, nullptr);
  if (bounce_pool_.size() < kKeep) {
    bounce_pool_.push_back(bounce);
  } else {
    cuda_->unregister_host(bounce);
    std::free(bounce);
  }
}

void Engine::start_chunked_receive(std::uint32_t index, int source, std::uint64_t sreq) {
  RequestSlot& slot = requests_[index];
  Peer& peer = peers_[static_cast<std::size_t>(source)];
  const std::uint64_t rreq = requests_.wire_id(index);
  slot.state = RequestState::kActive;
  slot.stage_rreq = sreq;  // the sender's request, for a FIN that fails it
  slot.expected = slot.info.bytes;
  slot.received = 0;
  slot.chunk = std::min(ofi_chunk_, slot.expected);
  slot.direct = true;
  Status status = peer.endpoint->has_direct()
                      ? Status::ok()
                      : Status(Code::kUnsupported, peer.transport + " has no direct transfers");
  if (status && slot.device >= 0 && (slot.bounce = take_bounce()) == nullptr) {
    status = Status(Code::kNoResources, "no memory for a chunk bounce");
  }
  if (status) status = post_chunk(index);
  if (!status) {
    // The sender must not wait for a CTS: FIN with a code fails it.
    send_control(source, kAmFin, as_bytes(FinHeader{sreq, 1, 0}));
    return complete(index, std::move(status));
  }
  send_control(source, kAmCtsChunked,
               as_bytes(ChunkCtsHeader{sreq, rreq, slot.expected, slot.chunk}));
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
  if (status && slot->device >= 0) {
    if (header.chunk > ofi_chunk_) {
      status = Status(Code::kProtocolError, "rank " + std::to_string(source) +
                                                " asked for chunks larger than FERRY_OFI_CHUNK");
    } else if ((slot->bounce = take_bounce()) == nullptr) {
      status = Status(Code::kNoResources, "no memory for a chunk bounce");
    }
  }
  if (status) status = post_chunk(index);
  if (!status) {
    send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    complete(index, std::move(status));
  }
}

// Posts the next chunk of a chunked send or receive (sync copy out of device memory first).
Status Engine::post_chunk(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  const bool send = slot.kind == RequestKind::kSend;
  const int peer_rank = send ? slot.peer : slot.info.source;
  Peer& peer = peers_[static_cast<std::size_t>(peer_rank)];
  const std::size_t offset = send ? slot.staged : slot.received;
  const std::size_t bytes = std::min(slot.chunk, slot.expected - offset);
  Status status;
  if (send) {
    const std::byte* source = slot.send_buffer + offset;
    if (slot.bounce != nullptr) {
      status = cuda_->copy(slot.bounce, source, bytes);
      source = slot.bounce;
    }
    if (status) {
      status = peer.endpoint->send_direct(source, bytes, slot.stage_rreq, requests_.wire_id(index));
    }
  } else {
    std::byte* target = slot.bounce != nullptr ? slot.bounce : slot.recv_buffer + offset;
    const std::uint64_t rreq = requests_.wire_id(index);
    status = peer.endpoint->recv_direct(target, bytes, rreq, rreq);
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
      send_control(peer_rank, kAmFin, as_bytes(FinHeader{slot.stage_rreq, 1, 0}));
    }
    return complete(index, std::move(status));
  }
  done += bytes;
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
