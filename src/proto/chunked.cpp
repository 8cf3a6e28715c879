// Device data over ofi in chunks (see chunked.hpp).
#include "proto/chunked.hpp"

#include <cstdlib>
#include <cstring>
#include <utility>

#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"

namespace ferry::proto {

namespace {
constexpr std::size_t kMaxBounces = 16;  // pinned bounces per process; more transfers wait
}  // namespace

ChunkedPath::ChunkedPath(Engine& engine, const util::Config& config)
    : engine_(engine),
      chunk_(config.get_size(util::Var::kOfiChunk)),
      forced_(config.get_bool(util::Var::kTestOfiChunked)) {}

ChunkedPath::~ChunkedPath() {
  for (std::byte* bounce : pool_) {
    engine_.cuda()->unregister_host(bounce);
    std::free(bounce);
  }
}

std::byte* ChunkedPath::take_bounce() {
  if (!pool_.empty()) {
    std::byte* bounce = pool_.back();
    pool_.pop_back();
    return bounce;
  }
  if (made_ >= kMaxBounces) return nullptr;  // the caller waits for one
  auto* bounce = static_cast<std::byte*>(std::aligned_alloc(4096, chunk_));
  if (bounce == nullptr) return nullptr;
  ++made_;
  if (!engine_.cuda()->register_host(bounce, chunk_)) {
    // Pageable is slower for the copy engine but still correct.
    FERRY_LOG(kDebug, "a chunk bounce could not be pinned; using it pageable");
  }
  return bounce;
}

void ChunkedPath::return_bounce(RequestSlot* slot) {
  pool_.push_back(std::exchange(slot->gpu.bounce, nullptr));
  // A transfer that waited for a bounce starts now (registering one costs a millisecond; a
  // bounded set reused beats one per message).
  while (!waiting_.empty() && !pool_.empty()) {
    const std::uint64_t wire = waiting_.front();
    waiting_.pop_front();
    std::uint32_t index = 0;
    RequestSlot* waiting = engine_.requests().lookup(wire, &index);
    if (waiting == nullptr || waiting->state != RequestState::kActive || waiting->gpu.chunk == 0 ||
        waiting->gpu.bounce != nullptr || waiting->transfer.deferred) {
      continue;  // ended (failed, timed out) while it waited
    }
    waiting->gpu.bounce = take_bounce();
    start_chunks(index);
  }
}

// The first chunk of a transfer that has its bounce (if it needs one): post it, and on the
// receiving side ask the sender for the chunks.
void ChunkedPath::start_chunks(std::uint32_t index) {
  RequestSlot& slot = engine_.requests()[index];
  const bool send = slot.kind == RequestKind::kSend;
  const int peer_rank = send ? slot.peer : slot.info.source;
  Status status = post_chunk(index);
  if (!status) return chunk_done(index, std::move(status));
  if (!send) {
    engine_.links().send_control(
        peer_rank, kAmCtsChunked,
        as_bytes(ChunkCtsHeader{slot.gpu.stage_rreq, engine_.requests().wire_id(index),
                                slot.expected, slot.gpu.chunk}));
  }
}

void ChunkedPath::start_receive(std::uint32_t index, int source, std::uint64_t sreq) {
  RequestSlot& slot = engine_.requests()[index];
  const Link& peer = engine_.links().link(source);
  slot.state = RequestState::kActive;
  slot.gpu.stage_rreq = sreq;  // the sender's request, for a FIN that fails it
  slot.expected = slot.info.bytes;
  slot.received = 0;
  slot.gpu.chunk = std::min(chunk_, slot.expected);
  slot.transfer.direct = true;
  if (peer.direct == nullptr) {
    // The sender must not wait for a CTS: FIN with a code fails it.
    engine_.links().send_control(source, kAmFin, as_bytes(FinHeader{sreq, kFinFailed, 0}));
    return engine_.complete(
        index, Status(Code::kUnsupported, peer.transport + " has no direct transfers"));
  }
  if (needs_bounce(slot, *peer.direct) && (slot.gpu.bounce = take_bounce()) == nullptr) {
    waiting_.push_back(engine_.requests().wire_id(index));  // started by return_bounce
    return;
  }
  start_chunks(index);
}

bool ChunkedPath::needs_bounce(const RequestSlot& slot, transport::DirectTransfers& direct) {
  if (slot.gpu.device < 0) return false;
  const bool send = slot.kind == RequestKind::kSend;
  const void* buffer = send ? static_cast<const void*>(slot.send_buffer) : slot.recv_buffer;
  return !direct.device_direct(slot.gpu.device, buffer, slot.expected);
}

void ChunkedPath::on_cts(int source, std::span<const std::byte> data) {
  ChunkCtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short CTS_CHUNKED header");
  std::uint32_t index = 0;
  RequestSlot* slot = engine_.messages().cts_target(
      source, CtsHeader{header.sreq, header.rreq, header.length}, &index);
  if (slot == nullptr) return;
  const Link& peer = engine_.links().link(source);
  Status status;
  if (header.chunk == 0 || header.chunk > (std::uint64_t{1} << 30) || peer.direct == nullptr) {
    status = Status(Code::kProtocolError,
                    "rank " + std::to_string(source) + " asked for chunks of " +
                        std::to_string(header.chunk) + " bytes over " + peer.transport);
  }
  slot->expected = header.length;
  slot->gpu.staged = 0;
  slot->gpu.stage_rreq = header.rreq;
  slot->gpu.chunk = static_cast<std::size_t>(header.chunk);
  slot->transfer.direct = true;
  if (status && slot->gpu.device >= 0 && header.chunk > chunk_) {
    status = Status(Code::kProtocolError, "rank " + std::to_string(source) +
                                              " asked for chunks larger than FERRY_OFI_CHUNK");
  }
  if (!status) {
    engine_.links().send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    return engine_.complete(index, std::move(status));
  }
  if (needs_bounce(*slot, *peer.direct) && (slot->gpu.bounce = take_bounce()) == nullptr) {
    waiting_.push_back(engine_.requests().wire_id(index));  // started by return_bounce
    return;
  }
  start_chunks(index);
}

// Posts the next chunk of a chunked send or receive (sync copy out of device memory first).
Status ChunkedPath::post_chunk(std::uint32_t index) {
  RequestSlot& slot = engine_.requests()[index];
  const bool send = slot.kind == RequestKind::kSend;
  const int peer_rank = send ? slot.peer : slot.info.source;
  const Link& peer = engine_.links().link(peer_rank);
  const std::size_t offset = send ? slot.gpu.staged : slot.received;
  const std::size_t bytes = std::min(slot.gpu.chunk, slot.expected - offset);
  // Device memory without a bounce: the NIC registers it (device_direct said so).
  const int device = slot.gpu.bounce == nullptr ? slot.gpu.device : -1;
  Status status;
  if (send) {
    const std::byte* source = slot.send_buffer + offset;
    if (slot.gpu.bounce != nullptr) {
      status = engine_.cuda()->copy(slot.gpu.bounce, source, bytes);
      source = slot.gpu.bounce;
    }
    if (status) {
      status = peer.direct->send_direct(source, bytes, device, slot.gpu.stage_rreq,
                                        engine_.requests().wire_id(index));
    }
  } else {
    std::byte* target = slot.gpu.bounce != nullptr ? slot.gpu.bounce : slot.recv_buffer + offset;
    const std::uint64_t rreq = engine_.requests().wire_id(index);
    status = peer.direct->recv_direct(target, bytes, device, rreq, rreq);
  }
  if (status) ++slot.transfer.device_ops;
  return status;
}

void ChunkedPath::chunk_done(std::uint32_t index, Status status) {
  RequestSlot& slot = engine_.requests()[index];
  const bool send = slot.kind == RequestKind::kSend;
  const int peer_rank = send ? slot.peer : slot.info.source;
  std::size_t& done = send ? slot.gpu.staged : slot.received;
  const std::size_t bytes = std::min(slot.gpu.chunk, slot.expected - done);
  if (status && !send && slot.gpu.bounce != nullptr) {
    status = engine_.cuda()->copy(slot.recv_buffer + done, slot.gpu.bounce, bytes);
  }
  if (!status) {
    // Tell the other side, so that it does not wait for chunks that will never come.
    if (send) {
      engine_.links().send_control(peer_rank, kAmNack, as_bytes(NackHeader{slot.gpu.stage_rreq}));
    } else {
      // The receiver's failure reaches the sender as a FIN with a code (handle_fin).
      engine_.links().send_control(peer_rank, kAmFin,
                                   as_bytes(FinHeader{slot.gpu.stage_rreq, kFinFailed, 0}));
    }
    return engine_.complete(index, std::move(status));
  }
  done += bytes;
  // FERRY_TEST_CRASH_AT=mid-pipeline: a sender dies after its first chunk.
  if (send) engine_.crashes().here(util::CrashPoint::kMidPipeline);
  if (done < slot.expected) {
    status = post_chunk(index);
    if (status) return;
    return chunk_done(index, std::move(status));  // reports the failure as above
  }
  if (send) return engine_.complete(index, Status::ok());
  engine_.complete(
      index, slot.message_size > slot.size
                 ? Status(Code::kTruncated, "message of " + std::to_string(slot.message_size) +
                                                " bytes from rank " + std::to_string(peer_rank) +
                                                " truncated to the " + std::to_string(slot.size) +
                                                "-byte receive buffer")
                 : Status::ok());
}

}  // namespace ferry::proto
