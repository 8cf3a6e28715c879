// The message protocols (see engine.hpp): eager (inline or bounce) up to the peer's eager limit,
// rendezvous above it: RTS, then a zero-copy get and FIN where the endpoint can, else CTS and a
// pipelined stream of fragments. Every header from a peer is size-checked and every request id
// in it is validated against the pool before use.
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "proto/chunked.hpp"
#include "proto/device_path.hpp"
#include "proto/engine.hpp"
#include "proto/wire.hpp"
#include "transport/self/transport.hpp"
#include "transport/shm/transport.hpp"
#include "util/clock.hpp"
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

Status truncation(int source, std::size_t size, std::size_t capacity) {
  return Status(Code::kTruncated, "message of " + std::to_string(size) + " bytes from rank " +
                                      std::to_string(source) + " truncated to the " +
                                      std::to_string(capacity) + "-byte receive buffer");
}

}  // namespace

Request Engine::isend(const void* buffer, std::size_t bytes, int destination, Tag tag) {
  std::uint32_t index = requests_.allocate(RequestKind::kSend);
  RequestSlot& slot = requests_[index];
  slot.peer = destination;
  slot.tag = tag;
  slot.send_buffer = static_cast<const std::byte*>(buffer);
  slot.size = bytes;
  slot.info = {rank_, tag, bytes};
  ++outstanding_sends_;
  Request request(this, index);
  if (destination < 0 || destination >= size_) {
    complete(index, Status(Code::kInvalidArgument,
                           "isend: destination rank " + std::to_string(destination) +
                               " is not in [0, " + std::to_string(size_) + ")"));
    return request;
  }
  if (buffer == nullptr && bytes > 0) {
    complete(index, Status(Code::kInvalidArgument,
                           "isend: null buffer with " + std::to_string(bytes) + " bytes"));
    return request;
  }
  if (Status bad = util::check_extent("isend", "buffer", buffer, bytes); !bad) {
    complete(index, std::move(bad));
    return request;
  }
  Peer& peer = peers_[static_cast<std::size_t>(destination)];
  if (peer.endpoint == nullptr || peer.failed) {
    complete(index, Status(peer.failed ? Code::kPeerFailed : Code::kUnsupported, peer.why));
    return request;
  }
  if (crash_on_send_) util::crash_point(config_, rank_, util::CrashPoint::kFirstSend);
  // What a rendezvous announces: our buffer, for a receiver that can read it directly.
  auto rts_address = reinterpret_cast<std::uint64_t>(buffer);
  if (cuda_ && bytes > 0) {
    // One driver query per send while CUDA is in use (bench/cuda_probe: 87-234 ns).
    const mem::MemoryInfo memory = cuda_->classify(buffer);
    if (memory.device_only() && peer.shares_memory) {
      device_->send(index, destination, memory);
      return request;
    }
    if (memory.pinned) slot.pinned_device = bounce_device(memory);
    if (memory.device_only() && (bytes <= peer.eager_limit || !peer.endpoint->has_direct())) {
      // No shared memory with the peer (ofi), and small (or no direct transfers): the message
      // goes as host data, from a copy.
      slot.host_copy.resize(bytes);
      Status status = cuda_->copy(slot.host_copy.data(), buffer, bytes);
      if (!status) {
        complete(index, std::move(status));
        return request;
      }
      slot.send_buffer = slot.host_copy.data();
      rts_address = reinterpret_cast<std::uint64_t>(slot.send_buffer);
    } else if (memory.device_only()) {
      // Larger: announced as device data; the receiver asks for chunks (proto/chunked.cpp).
      slot.device = memory.device;
      rts_address = kRtsFromDevice;
    }
  }
  if (bytes <= peer.eager_limit && peer.pending.empty()) {
    // The fast path: straight to the transport, no queue entry built (8 B latency -5%).
    const EagerHeader header{tag};
    Status status = peer.endpoint->am_send(kAmEager, as_bytes(header),
                                           std::span<const std::byte>(slot.send_buffer, bytes),
                                           transport::AmHint::kNone);
    if (status.code() != Code::kWouldBlock) {
      complete(index, std::move(status));
      return request;
    }
  }
  Pending pending;
  pending.request = index;
  pending.payload = slot.send_buffer;
  if (bytes <= peer.eager_limit) {
    set_header(kAmEager, EagerHeader{tag}, &pending.am, &pending.header_size, &pending.header);
    pending.payload_size = bytes;
    pending.complete_on_send = true;
  } else {
    slot.rendezvous = true;
    const std::uint64_t sreq = requests_.wire_id(index);
    transport::Endpoint::RemoteRegion region;
    // Below the endpoint's read size, where it has a direct transfer, that goes instead.
    const bool read_size =
        bytes >= peer.read_from || !peer.endpoint->has_direct() || peer.direct_failed;
    if (slot.device < 0 && rts_address != kRtsFromDevice && peer.endpoint->has_read() &&
        !peer.read_failed && !chunked_->forced() && read_size) {
      // The receiver may read the buffer itself (no clear-to-send round trip).
      Status status = peer.endpoint->expose(slot.send_buffer, bytes, sreq, &region);
      if (status) {
        slot.exposed = true;
      } else {
        peer.read_failed = true;
        FERRY_LOG(kWarn,
                  "%s: exposing a send buffer to rank %d failed (%s); clear-to-send from "
                  "now on",
                  peer.transport.c_str(), destination, status.to_string().c_str());
      }
    }
    if (slot.exposed) {
      RtsReadHeader rts{tag, bytes, sreq, region.address, region.key};
      set_header(kAmRtsRead, rts, &pending.am, &pending.header_size, &pending.header);
    } else {
      RtsHeader rts{tag, bytes, sreq, rts_address};
      set_header(kAmRts, rts, &pending.am, &pending.header_size, &pending.header);
    }
  }
  send_or_queue(destination, std::move(pending));
  if (crash_mid_pipeline_ && slot.exposed) {
    // FERRY_TEST_CRASH_AT=mid-pipeline: die with the buffer exposed and announced (the
    // receiver's read then meets a dead process). A few polls first, so the RTS leaves.
    for (int i = 0; i < 1000; ++i) progress();
    util::crash_point(config_, rank_, util::CrashPoint::kMidPipeline);
  }
  return request;
}

Request Engine::irecv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask) {
  std::uint32_t index = requests_.allocate(RequestKind::kRecv);
  RequestSlot& slot = requests_[index];
  slot.peer = source;
  slot.tag = tag;
  slot.mask = mask;
  slot.recv_buffer = static_cast<std::byte*>(buffer);
  slot.size = capacity;
  Request request(this, index);
  if (source != kAnySource && (source < 0 || source >= size_)) {
    complete(index, Status(Code::kInvalidArgument, "irecv: source rank " + std::to_string(source) +
                                                       " is neither kAnySource nor in [0, " +
                                                       std::to_string(size_) + ")"));
    return request;
  }
  if (buffer == nullptr && capacity > 0) {
    complete(index, Status(Code::kInvalidArgument,
                           "irecv: null buffer with capacity " + std::to_string(capacity)));
    return request;
  }
  if (Status bad = util::check_extent("irecv", "buffer", buffer, capacity); !bad) {
    complete(index, std::move(bad));
    return request;
  }
  if (cuda_ && capacity > 0) {
    const mem::MemoryInfo memory = cuda_->classify(buffer);
    if (memory.device_only()) slot.device = memory.device;
    if (memory.pinned) slot.pinned_device = bounce_device(memory);
  }
  std::optional<Unexpected> message = matcher_.take_unexpected(source, tag, mask);
  const Peer* from = source != kAnySource ? &peers_[static_cast<std::size_t>(source)] : nullptr;
  if (!message && none_can_come(source)) {
    // A dead or unreachable rank (for kAnySource: every other one) will send nothing: fail now
    // rather than wait forever.
    complete(index, from != nullptr
                        ? Status(from->failed ? Code::kPeerFailed : Code::kUnsupported, from->why)
                        : no_one_left());
  } else if (!message) {
    slot.state = RequestState::kPosted;
    matcher_.post({source, tag, mask, index});
  } else if (message->device) {
    cuda::IpcKey key;
    const bool has_key = message->data.size() == sizeof(key);
    if (has_key) std::memcpy(&key, message->data.data(), sizeof(key));
    device_->start_receive(index, message->source, message->tag, message->size, message->sreq,
                           has_key ? &key : nullptr);
  } else if (!message->rendezvous) {
    deliver_eager(index, message->source, message->tag, message->data);
    matcher_.recycle(std::move(message->data));
  } else {
    const transport::Endpoint::RemoteRegion remote{message->address, message->key};
    start_rendezvous(index, message->source, message->tag, message->size, message->sreq,
                     message->address, message->readable ? &remote : nullptr);
  }
  return request;
}

std::optional<MessageInfo> Engine::iprobe(int source, Tag tag, Tag mask) {
  progress();
  const Unexpected* message = matcher_.find_unexpected(source, tag, mask);
  if (message == nullptr) return std::nullopt;
  return MessageInfo{message->source, message->tag, message->size};
}

bool Engine::none_can_come(int source) const {
  if (source == kAnySource) return others_left_ == 0 && size_ > 1;
  if (source < 0 || source >= size_) return true;
  const Peer& peer = peers_[static_cast<std::size_t>(source)];
  return source != rank_ && (peer.failed || peer.endpoint == nullptr);
}

// A dead peer is noticed within a few thousand calls (well under a millisecond while waiting):
// one system call per check, amortised to nothing per message.
constexpr std::uint32_t kCheckPeersEvery = 4096;

int Engine::progress() {
  // The idle poll of a job whose peers are all on this node, without calls: nothing armed,
  // queued or in flight, nothing in the shm FIFO. A loop waiting on memory a peer stores into
  // (a put's flag) sees the store sooner the shorter this is (docs/PERFORMANCE.md, "One-sided").
  if (polled_.size() == 1 && polled_.front() == shm_ && !armed_ && shm_->quiet() &&
      (self_ == nullptr || !self_->has_work()) && !rma_->acks_waiting() && pending_peers_.empty() &&
      !device_->busy() && operations_.empty() && suspects_.empty() &&
      progress_calls_ + 1 < kCheckPeersEvery) {
    ++progress_calls_;
    return 0;
  }
  return progress_all();  // a tail call: the idle poll above saves no registers
}

int Engine::progress_all() {
  if (armed_) [[unlikely]]
    disarm();  // the application's arm() ends at its next progress
  int events = 0;
  if (self_ != nullptr && self_->has_work()) events += self_->progress();
  for (transport::Transport* t : polled_) {
    if (t != shm_ || !shm_->quiet()) events += t->progress();
  }
  if (rma_->acks_waiting()) events += rma_->send_acks();
  if (!suspects_.empty()) events += settle_suspects();
  if (!pending_peers_.empty()) events += drain_pending();
  if (device_->busy()) events += device_->poll();
  if (!operations_.empty() && !advancing_) events += advance_operations();
  if (++progress_calls_ >= kCheckPeersEvery) {
    progress_calls_ = 0;
    check_peers();
    rma_->sweep();
  }
  return events;
}

Request Engine::failed(Status status) {
  std::uint32_t index = requests_.allocate(RequestKind::kOperation);
  complete(index, std::move(status));
  return Request(this, index);
}

Request Engine::start(std::unique_ptr<Operation> operation) {
  std::uint32_t index = requests_.allocate(RequestKind::kOperation);
  Request request(this, index);
  Status status;
  advancing_ = true;
  const bool finished = operation->advance(&status);
  advancing_ = false;
  if (finished) {
    complete(index, std::move(status));
  } else {
    operations_.emplace_back(index, std::move(operation));
  }
  return request;
}

int Engine::advance_operations() {
  advancing_ = true;
  int events = 0;
  for (std::size_t i = 0; i < operations_.size();) {
    Status status;
    if (operations_[i].second->advance(&status)) {
      const std::uint32_t index = operations_[i].first;
      operations_[i] = std::move(operations_.back());
      operations_.pop_back();
      complete(index, std::move(status));
      ++events;
    } else {
      ++i;
    }
  }
  advancing_ = false;
  return events;
}

void Engine::check_peers() {
  std::vector<std::pair<int, std::string>> failed;
  for (auto& t : transports_) t->check_peers(&failed);
  for (const auto& [rank, why] : failed) peer_failed(rank, why);
}

void Engine::peer_failed(int rank, const std::string& why) {
  Peer& peer = peers_[static_cast<std::size_t>(rank)];
  if (peer.failed) return;
  peer.failed = true;
  peer.failure_order = ++failures_seen_;
  peer.why = why;
  if (peer.endpoint != nullptr && rank != rank_) --others_left_;
  last_failed_ = rank;
  FERRY_LOG(kWarn, "%s: failing the operations that involve it", why.c_str());
  const Status status(Code::kPeerFailed, why);
  // What waited in its queue, then what waits on it: rendezvous sends, fragment streams into us,
  // receives that name it. Receives from any source stay posted while another rank may still
  // match them; with none left they fail (a message this rank sends itself after that is
  // received by naming this rank).
  for (Pending& pending : peer.pending) {
    std::uint32_t index = pending.stream != UINT32_MAX ? pending.stream : pending.request;
    if (index != UINT32_MAX && requests_[index].state != RequestState::kDone) {
      complete_when_idle(index, status);
    }
  }
  peer.pending.clear();
  device_->peer_failed(rank, status);
  rma_->peer_failed(rank);
  std::erase(pending_peers_, rank);
  const Status none_left = others_left_ == 0 ? no_one_left() : Status();
  for (std::uint32_t i = 0; i < requests_.capacity(); ++i) {
    RequestSlot& slot = requests_[i];
    if (slot.state == RequestState::kPosted &&
        (slot.peer == rank || (slot.peer == kAnySource && others_left_ == 0))) {
      matcher_.remove_posted(i);
      complete(i, slot.peer == rank ? status : none_left);
    } else if (slot.state == RequestState::kActive && !slot.deferred &&
               ((slot.kind == RequestKind::kSend && slot.peer == rank) ||
                (slot.kind == RequestKind::kRecv && slot.info.source == rank))) {
      complete_when_idle(i, status);  // a copy still using the buffer finishes first
    }
  }
  matcher_.drop_rendezvous_from(rank);
}

Status Engine::no_one_left() const {
  int failed = 0, unreachable = 0;
  const Peer* example =
      last_failed_ >= 0 ? &peers_[static_cast<std::size_t>(last_failed_)] : nullptr;
  for (int r = 0; r < size_; ++r) {
    const Peer& peer = peers_[static_cast<std::size_t>(r)];
    if (r == rank_ || (!peer.failed && peer.endpoint != nullptr)) continue;
    ++(peer.failed ? failed : unreachable);
    if (example == nullptr) example = &peer;
  }
  // The last failure seen, else the first unreachable rank.
  return Status(failed > 0 ? Code::kPeerFailed : Code::kUnsupported,
                "a receive from any source: no other rank is left to send it (" +
                    std::to_string(failed) + " failed, " + std::to_string(unreachable) +
                    " unreachable; " + (example != nullptr ? example->why : "") + ")");
}

void Engine::complete(std::uint32_t index, Status status) {
  RequestSlot& slot = requests_[index];
  if (slot.bounce != nullptr) chunked_->return_bounce(&slot);
  if (slot.exposed) {
    // A send that did not end well must not stay readable (its buffer is the caller's again).
    slot.exposed = false;
    peers_[static_cast<std::size_t>(slot.peer)].endpoint->unexpose(requests_.wire_id(index),
                                                                   !status);
  }
  if (slot.rma_device != nullptr) {
    // A get into device memory by messages: the fragments came to the host copy.
    if (status) status = cuda_->copy(slot.rma_device, slot.host_copy.data(), slot.size);
    slot.rma_device = nullptr;
  }
  if (slot.rma != RequestSlot::Rma::kNone) rma_->request_done(slot, status);
  slot.status = std::move(status);
  slot.state = RequestState::kDone;
  if (slot.kind == RequestKind::kSend) --outstanding_sends_;
  if (!slot.handle_alive) requests_.free(index);
}

void Engine::send_or_queue(int peer_rank, Pending&& pending) {
  Peer& peer = peers_[static_cast<std::size_t>(peer_rank)];
  if (peer.failed) {
    std::uint32_t index = pending.stream != UINT32_MAX ? pending.stream : pending.request;
    if (index != UINT32_MAX) complete(index, Status(Code::kPeerFailed, peer.why));
    return;
  }
  if (peer.pending.empty()) {
    if (try_send(peer, pending)) return;
    pending_peers_.push_back(peer_rank);
  }
  peer.pending.push_back(std::move(pending));
}

bool Engine::try_send(Peer& peer, Pending& pending) {
  if (pending.stream != UINT32_MAX) {
    const RequestSlot& slot = requests_[pending.stream];
    const bool put = pending.am == kAmPut;  // else a rendezvous or get answer's fragments
    const std::size_t room =
        put ? peer.frag_size - (sizeof(PutHeader) - sizeof(FragHeader)) : peer.frag_size;
    while (pending.offset < pending.length) {
      std::size_t chunk = std::min(room, pending.length - pending.offset);
      const auto data = std::span<const std::byte>(slot.send_buffer + pending.offset, chunk);
      Status status =
          put ? peer.endpoint->am_send(
                    kAmPut,
                    as_bytes(PutHeader{pending.rreq, pending.region, pending.secret,
                                       pending.region_offset + pending.offset}),
                    data, transport::AmHint::kBulk)
              : peer.endpoint->am_send(kAmFrag, as_bytes(FragHeader{pending.rreq, pending.offset}),
                                       data, transport::AmHint::kBulk);
      if (status.code() == Code::kWouldBlock) return false;
      if (!status) {
        complete(pending.stream, std::move(status));
        return true;
      }
      pending.offset += chunk;
      if (crash_mid_pipeline_) util::crash_point(config_, rank_, util::CrashPoint::kMidPipeline);
    }
    if (!put) complete(pending.stream, Status::ok());  // a put completes when acknowledged
    return true;
  }
  Status status = peer.endpoint->am_send(
      pending.am, std::span<const std::byte>(pending.header.data(), pending.header_size),
      std::span<const std::byte>(pending.payload, pending.payload_size), transport::AmHint::kNone);
  if (status.code() == Code::kWouldBlock) return false;
  if (pending.request != UINT32_MAX && (!status || pending.complete_on_send)) {
    complete(pending.request, std::move(status));
  } else if (!status && status.code() != Code::kPeerFailed) {
    // (To a dead peer it does not matter: its failure is handled as such.)
    FERRY_LOG(kError, "%s: control message %u lost: %s", peer.transport.c_str(), pending.am,
              status.to_string().c_str());
  }
  return true;
}

int Engine::drain_pending() {
  int sent = 0;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < pending_peers_.size(); ++i) {
    int rank = pending_peers_[i];
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    while (!peer.pending.empty() && try_send(peer, peer.pending.front())) {
      peer.pending.pop_front();
      ++sent;
    }
    if (!peer.pending.empty()) pending_peers_[keep++] = rank;
  }
  pending_peers_.resize(keep);
  return sent;
}

Pending Engine::stream(std::uint8_t am, std::uint32_t index, std::uint64_t id, std::size_t length) {
  Pending pending;
  pending.am = am;
  pending.stream = index;
  pending.rreq = id;
  pending.length = length;
  return pending;
}

void Engine::send_control(int peer_rank, std::uint8_t am, std::span<const std::byte> header) {
  Pending pending;
  pending.am = am;
  pending.header_size = static_cast<std::uint8_t>(header.size());
  std::memcpy(pending.header.data(), header.data(), header.size());
  send_or_queue(peer_rank, std::move(pending));
}

void Engine::protocol_error(int source, const char* what) {
  // Bounded logging: a hostile peer must not flood stderr.
  static int logged = 0;
  if (logged < 10) {
    ++logged;
    FERRY_LOG(kError, "protocol error from rank %d: %s; message dropped", source, what);
  }
}

void Engine::on_am(std::uint8_t id, int source, std::span<const std::byte> data) {
  switch (id) {
    case kAmEager:
      return handle_eager(source, data);
    case kAmRts:
      return handle_rts(source, data);
    case kAmRtsRead:
      return handle_rts_read(source, data);
    case kAmCts:
      return handle_cts(source, data);
    case kAmCtsDirect:
      return handle_cts_direct(source, data);
    case kAmCtsChunked:
      return chunked_->on_cts(source, data);
    case kAmFrag:
      return handle_frag(source, data);
    case kAmFin:
      return handle_fin(source, data);
    case kAmCancel:
      return handle_cancel(source, data);
    case kAmNack:
      return handle_nack(source, data);
    default:
      if (!device_->on_am(id, source, data) && !rma_->on_am(id, source, data)) {
        protocol_error(source, "unknown active message id");
      }
      return;
  }
}

void Engine::deliver_eager(std::uint32_t index, int source, Tag tag,
                           std::span<const std::byte> payload) {
  RequestSlot& slot = requests_[index];
  std::size_t copied = std::min(payload.size(), slot.size);
  slot.info = {source, tag, copied};
  if (slot.device >= 0 && copied > 0) {
    // Into device memory: a synchronous copy (eager messages are small).
    Status status = cuda_->copy(slot.recv_buffer, payload.data(), copied);
    if (!status) return complete(index, std::move(status));
  } else if (copied > 0) {
    util::copy(slot.recv_buffer, payload.data(), copied);
  }
  complete(index, payload.size() > slot.size ? truncation(source, payload.size(), slot.size)
                                             : Status::ok());
}

void Engine::handle_eager(int source, std::span<const std::byte> data) {
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

void Engine::handle_rts(int source, std::span<const std::byte> data) {
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

void Engine::handle_rts_read(int source, std::span<const std::byte> data) {
  RtsReadHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RTS_READ header");
  if (header.size > util::kAddressSpaceEnd) {
    return protocol_error(source, "RTS_READ for a message larger than any buffer can be");
  }
  const Peer& peer = peers_[static_cast<std::size_t>(source)];
  if (peer.endpoint == nullptr || !peer.endpoint->has_read()) {
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

void Engine::refuse_unmatched(int source, std::uint64_t sreq) {
  ++refused_unmatched_;
  send_control(source, kAmFin, as_bytes(FinHeader{sreq, kFinNeverMatched, 0}));
}

Unexpected Engine::unexpected_rendezvous(int source, Tag tag, std::uint64_t size,
                                         std::uint64_t sreq) {
  Unexpected message;
  message.source = source;
  message.tag = tag;
  message.size = size;
  message.rendezvous = true;
  message.sreq = sreq;
  return message;
}

void Engine::start_rendezvous(std::uint32_t index, int source, Tag tag, std::size_t size,
                              std::uint64_t sreq, std::uint64_t address,
                              const transport::Endpoint::RemoteRegion* remote) {
  RequestSlot& slot = requests_[index];
  const std::size_t length = std::min(size, slot.size);
  slot.info = {source, tag, length};
  slot.message_size = size;
  Peer& peer = peers_[static_cast<std::size_t>(source)];
  if (!peer.shares_memory && length > 0 &&
      (slot.device >= 0 || address == kRtsFromDevice || chunked_->forced())) {
    // Device memory on either side, no shared memory (ofi): in chunks through pinned bounces.
    return chunked_->start_receive(index, source, sreq);
  }
  if (address == kRtsFromDevice && length > 0) {
    send_control(source, kAmFin, as_bytes(FinHeader{sreq, kFinFailed, 0}));  // the send fails too
    return complete(index,
                    Status(Code::kProtocolError,
                           "rank " + std::to_string(source) +
                               " announced device data over a transport that shares memory"));
  }
  if ((slot.device >= 0 || test_host_staging_) && length > 0) {
    // A host sender, a device receiver: through the staging ring, copied in asynchronously.
    return device_->start_staged_receive(index, source, sreq, 0);
  }
  if (remote == nullptr && length > 0 && length >= peer.get_from && peer.endpoint->has_get() &&
      !peer.get_failed) {
    if (test_get_delay_ > 0) ::usleep(static_cast<useconds_t>(test_get_delay_ * 1e6));
    Status status = peer.endpoint->get(slot.recv_buffer, address, length);
    if (status && peer.endpoint->was_withdrawn(sreq)) {
      // The sender gave up on the send (its timeout, or its collective failed) while we read:
      // its buffer may have been reused.
      return complete(index, Status(Code::kCanceled, "rank " + std::to_string(source) +
                                                         " withdrew this message while it was "
                                                         "being read (it gave up on the send)"));
    }
    if (!status && status.code() == Code::kPeerFailed) {
      check_peers();  // the sender is gone: fail what involves it, this receive included
      if (done(index)) return;
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
    if (status) {
      complete(index, size > slot.size ? truncation(source, size, slot.size) : Status::ok());
      send_control(source, kAmFin, as_bytes(FinHeader{sreq, 0, 0}));
      return;
    }
  }
  if (length == 0) {
    complete(index, size > slot.size ? truncation(source, size, slot.size) : Status::ok());
    send_control(source, kAmFin, as_bytes(FinHeader{sreq, 0, 0}));
    return;
  }
  slot.state = RequestState::kActive;
  if (remote != nullptr && slot.device < 0 && peer.endpoint->has_read() && !peer.read_failed) {
    // One-sided: read the sender's buffer, then tell it (FIN).
    if (test_get_delay_ > 0) ::usleep(static_cast<useconds_t>(test_get_delay_ * 1e6));
    Status status =
        peer.endpoint->read_direct(slot.recv_buffer, length, *remote, requests_.wire_id(index));
    if (status) {
      slot.direct = true;
      slot.reading = true;
      slot.read_sreq = sreq;
      ++slot.device_ops;  // the buffer is the transport's until on_direct
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

void Engine::request_data(std::uint32_t index, int source, std::uint64_t sreq, std::size_t length) {
  RequestSlot& slot = requests_[index];
  Peer& peer = peers_[static_cast<std::size_t>(source)];
  const std::uint64_t rreq = requests_.wire_id(index);
  if (peer.endpoint->has_direct() && !peer.direct_failed) {
    // The transport moves the whole message into the receive buffer (its own rendezvous).
    Status status = peer.endpoint->recv_direct(slot.recv_buffer, length, -1, rreq, rreq);
    if (status) {
      slot.direct = true;
      ++slot.device_ops;  // the buffer is the transport's until on_direct
      send_control(source, kAmCtsDirect, as_bytes(CtsHeader{sreq, rreq, length}));
      return;
    }
    peer.direct_failed = true;
    FERRY_LOG(kWarn, "%s: a direct receive from rank %d failed (%s); pipelined from now on",
              peer.transport.c_str(), source, status.to_string().c_str());
  }
  slot.expected = length;
  slot.received = 0;
  send_control(source, kAmCts, as_bytes(CtsHeader{sreq, rreq, length}));
}

RequestSlot* Engine::cts_target(int source, const CtsHeader& header, std::uint32_t* index) {
  RequestSlot* slot = requests_.lookup(header.sreq, index);
  if (slot == nullptr) {
    // A send that is gone (withdrawn after FERRY_TIMEOUT): the receive must not wait for it.
    send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    FERRY_LOG(kDebug, "CTS from rank %d for a send that is gone: answered with NACK", source);
    return nullptr;
  }
  if (slot->kind != RequestKind::kSend || !slot->rendezvous ||
      slot->state != RequestState::kActive || slot->peer != source || header.length == 0 ||
      header.length > slot->size) {
    // Also what a send abandoned after FERRY_TIMEOUT sees: the receiver must not wait for
    // fragments that will never come.
    send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    protocol_error(source, "CTS for no rendezvous send of that size (answered with NACK)");
    return nullptr;
  }
  slot->rendezvous = false;  // a second CTS or FIN for it is an error
  return slot;
}

void Engine::handle_cts(int source, std::span<const std::byte> data) {
  CtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short CTS header");
  std::uint32_t index = 0;
  if (cts_target(source, header, &index) == nullptr) return;
  send_or_queue(source, stream(kAmFrag, index, header.rreq, header.length));
}

void Engine::handle_cts_direct(int source, std::span<const std::byte> data) {
  CtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short CTS header");
  std::uint32_t index = 0;
  RequestSlot* slot = cts_target(source, header, &index);
  if (slot == nullptr) return;
  Peer& peer = peers_[static_cast<std::size_t>(source)];
  if (!peer.endpoint->has_direct()) {
    send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    complete(index, Status(Code::kProtocolError, "rank " + std::to_string(source) +
                                                     " asked for a direct transfer over " +
                                                     peer.transport + ", which has none"));
    return;
  }
  // FERRY_TEST_CRASH_AT=mid-pipeline: die with the receiver's direct receive posted.
  if (crash_mid_pipeline_) util::crash_point(config_, rank_, util::CrashPoint::kMidPipeline);
  Status status = peer.endpoint->send_direct(slot->send_buffer, header.length, -1, header.rreq,
                                             requests_.wire_id(index));
  if (!status) {
    send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    complete(index, std::move(status));
    return;
  }
  slot->direct = true;
  ++slot->device_ops;
}

void Engine::on_direct(std::uint64_t cookie, Status status) {
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(cookie, &index);
  if (slot == nullptr || !slot->direct || slot->device_ops == 0) return;
  --slot->device_ops;
  if (slot->rma_native) {
    slot->rma_native = false;
    rma_->native_ended(slot->peer, slot->rma_region);
  }
  if (slot->state == RequestState::kDone) return;
  const int peer_rank = slot->kind == RequestKind::kSend ? slot->peer : slot->info.source;
  if (!status && status.code() != Code::kPeerFailed && !slot->deferred && peer_rank >= 0 &&
      peer_rank < size_ && peer_rank != rank_) {
    // A provider reports a peer's death on the transfers in flight with it as their own failure
    // (tcp: canceled), often before the death itself can be seen (the dying process's sockets
    // close before its pidfd says so): if the peer turns out dead, that is what failed them.
    check_peers();
    if (peers_[static_cast<std::size_t>(peer_rank)].failed) {
      status = Status(Code::kPeerFailed, peers_[static_cast<std::size_t>(peer_rank)].why);
    } else {
      const double keepalive = config_.get_seconds(util::Var::kKeepalive);
      suspects_.push_back({cookie, peer_rank, std::move(status),
                           util::deadline_after(std::min(5.0, 0.2 + 2 * keepalive))});
      return;
    }
    if (requests_[index].state == RequestState::kDone) return;
  }
  direct_outcome(index, std::move(status));
}

int Engine::settle_suspects() {
  check_peers();
  const auto now = util::Clock::now();
  int settled = 0;
  for (std::size_t i = 0; i < suspects_.size();) {
    Suspect& suspect = suspects_[i];
    std::uint32_t index = 0;
    RequestSlot* slot = requests_.lookup(suspect.cookie, &index);
    const bool dead = peers_[static_cast<std::size_t>(suspect.peer)].failed;
    if (slot != nullptr && slot->state != RequestState::kDone && !dead && now < suspect.until) {
      ++i;
      continue;
    }
    Suspect done = std::move(suspect);
    suspect = std::move(suspects_.back());
    suspects_.pop_back();
    ++settled;
    // Gone or ended (a dead peer's requests end in peer_failed): nothing left to do.
    if (slot == nullptr || slot->state == RequestState::kDone) continue;
    direct_outcome(index, std::move(done.status));
  }
  return settled;
}

void Engine::direct_outcome(std::uint32_t index, Status status) {
  RequestSlot* slot = &requests_[index];
  if (slot->chunk > 0 && !slot->deferred) return chunked_->chunk_done(index, std::move(status));
  if (slot->deferred) {  // a failure (peer death, NACK, timeout) waited for the buffer
    if (slot->device_ops == 0) {
      slot->deferred = false;
      complete(index, slot->status);
    }
    return;
  }
  if (slot->reading) {
    slot->reading = false;
    slot->direct = false;
    const int source = slot->info.source;
    if (status) {
      send_control(source, kAmFin, as_bytes(FinHeader{slot->read_sreq, 0, 0}));
    } else if (status.code() != Code::kPeerFailed) {
      // The sender still waits, exposed: ask for the data the other way. (Providers report a
      // refused key differently: tcp as canceled. A read we canceled ourselves was deferred.)
      Peer& peer = peers_[static_cast<std::size_t>(source)];
      peer.read_failed = true;
      FERRY_LOG(kWarn, "%s: reading a message of rank %d failed (%s); clear-to-send from now on",
                peer.transport.c_str(), source, status.to_string().c_str());
      return request_data(index, source, slot->read_sreq, slot->info.bytes);
    }
  }
  if (!status && slot->rma != RequestSlot::Rma::kNone && status.code() != Code::kPeerFailed) {
    // A native put or get, granted by the owner for this key and range: the network lost it.
    status = Status(status.code(), status.message() +
                                       " (a native one-sided access the owner "
                                       "had granted: the network failed it)");
  }
  if (!status || slot->kind == RequestKind::kSend) return complete(index, std::move(status));
  complete(index, slot->message_size > slot->size
                      ? truncation(slot->info.source, slot->message_size, slot->size)
                      : Status::ok());
}

void Engine::handle_frag(int source, std::span<const std::byte> data) {
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
    complete(index, slot->message_size > slot->size
                        ? truncation(source, slot->message_size, slot->size)
                        : Status::ok());
  }
}

void Engine::handle_fin(int source, std::span<const std::byte> data) {
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
      slot->state == RequestState::kActive && slot->peer == source && !slot->deferred) {
    return receiver_failed(index, source, header.code);  // the receiver failed or finalized
  }
  if (slot->kind != RequestKind::kSend || !slot->rendezvous ||
      slot->state != RequestState::kActive || slot->peer != source) {
    return protocol_error(source, "FIN for no rendezvous send");
  }
  slot->rendezvous = false;
  complete(index, Status::ok());
}

bool Engine::test(std::uint32_t index) {
  if (done(index)) return true;
  progress();
  return done(index);
}

Status Engine::wait(std::uint32_t index) {
  if (timeout_ > 0) return wait_for(index, timeout_);
  int idle = 0;
  while (!done(index)) wait_step(&idle);
  return requests_[index].status;
}

Status Engine::wait_for(std::uint32_t index, double seconds) {
  if (std::isnan(seconds)) {
    return Status(Code::kInvalidArgument, "wait_for: NaN seconds (INFINITY waits without a limit)");
  }
  const auto deadline = util::deadline_after(seconds);
  int idle = 0;
  for (std::uint32_t polls = 0; !done(index); ++polls) {
    wait_step(&idle);
    // A request that completed in this very step (however late) is not a timeout.
    if ((polls & 255) == 0 && !done(index) && util::Clock::now() >= deadline) {
      char text[64];
      std::snprintf(text, sizeof(text), "request not complete after %g s", seconds);
      return Status(Code::kTimeout, text);
    }
  }
  return requests_[index].status;
}

void Engine::handle_cancel(int source, std::span<const std::byte> data) {
  CancelHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short cancel header");
  // Not found: the announcement was already matched; the receive then gets a FIN or a NACK.
  matcher_.drop_rendezvous(source, header.sreq);
}

void Engine::handle_nack(int source, std::span<const std::byte> data) {
  NackHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NACK header");
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(header.rreq, &index);
  if (slot == nullptr || slot->kind != RequestKind::kRecv || slot->state != RequestState::kActive ||
      slot->info.source != source) {
    return;  // a receive that already ended: nothing waits
  }
  if (slot->direct && slot->device_ops > 0) {
    peers_[static_cast<std::size_t>(source)].endpoint->cancel_direct(header.rreq);
  }
  complete_when_idle(index, Status(Code::kCanceled, "rank " + std::to_string(source) +
                                                        " gave up sending this message"));
}

Status Engine::abandon_send(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  if (slot.state == RequestState::kDone) return slot.status;
  Peer& peer = peers_[static_cast<std::size_t>(slot.peer)];
  const Status timeout(Code::kTimeout, "send to rank " + std::to_string(slot.peer) +
                                           " not complete after FERRY_TIMEOUT (" +
                                           std::to_string(timeout_) + " s); withdrawn");
  for (auto it = peer.pending.begin(); it != peer.pending.end(); ++it) {
    if (it->request == index && it->am != kAmFrag) {
      // Never reached the transport: withdraw it.
      peer.pending.erase(it);
      complete(index, timeout);
      return timeout;
    }
    if (it->stream == index) {
      // Mid-stream: the receive waiting for the rest is told.
      const std::uint64_t rreq = it->rreq;
      peer.pending.erase(it);
      send_control(slot.peer, kAmNack, as_bytes(NackHeader{rreq}));
      complete(index, timeout);
      return timeout;
    }
  }
  if (device_->withdraw_staged(index, slot.peer, slot.stage_rreq)) {
    complete_when_idle(index, timeout);
    int idle = 0;
    while (!done(index)) wait_step(&idle);
    return timeout;
  }
  if (slot.direct && slot.device_ops > 0) {
    // The transport is sending the buffer: ask for it back, and wait until it lets go.
    peer.endpoint->cancel_direct(requests_.wire_id(index));
    int idle = 0;
    while (!done(index)) wait_step(&idle);
    return slot.status;
  }
  if (slot.rendezvous) {
    // Announced: withdraw the announcement; a CTS that still comes is answered with a NACK, and
    // a receiver reading the buffer by zero-copy get sees the mark afterwards and drops the data.
    slot.rendezvous = false;
    peer.endpoint->mark_withdrawn(requests_.wire_id(index));
    send_control(slot.peer, kAmCancel, as_bytes(CancelHeader{requests_.wire_id(index)}));
    complete(index, timeout);
    return timeout;
  }
  int idle = 0;  // nothing else can keep a send pending; finish it
  while (!done(index)) wait_step(&idle);
  return slot.status;
}

bool Engine::cancel(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  if (slot.kind != RequestKind::kRecv || slot.state != RequestState::kPosted) return false;
  if (!matcher_.remove_posted(index)) return false;
  complete(index, Status(Code::kCanceled, "receive canceled before it matched"));
  return true;
}

bool Engine::release(std::uint32_t index) {
  RequestSlot& slot = requests_[index];
  if (slot.state == RequestState::kDone) {  // retire() ended every slot a handle names
    requests_.free(index);
  } else {
    slot.handle_alive = false;
  }
  return retired_ && --held_after_ == 0;
}

bool Engine::retire() {
  retired_ = true;
  held_after_ = 0;
  for (std::uint32_t i = 0; i < requests_.capacity(); ++i) {
    RequestSlot& slot = requests_[i];
    if (slot.state == RequestState::kFree || !slot.handle_alive) continue;
    ++held_after_;
    if (slot.state != RequestState::kDone) {
      slot.state = RequestState::kDone;
      slot.status = Status(Code::kInvalidArgument,
                           "its Context was finalized (destroyed) before it completed");
    }
  }
  return held_after_ > 0;
}

}  // namespace ferry::proto

namespace ferry::proto {

void Engine::receiver_failed(std::uint32_t index, int source, std::uint32_t code) {
  device_->forget_staged(index, source);
  if (code == kFinNeverMatched) {
    ++never_matched_;
    return complete_when_idle(
        index, Status(Code::kCanceled, "rank " + std::to_string(source) +
                                           " finalized without a receive for this message"));
  }
  complete_when_idle(index, Status(Code::kIoError, "rank " + std::to_string(source) +
                                                       " reported that it could not receive "
                                                       "this message"));
}

void Engine::complete_when_idle(std::uint32_t index, Status status) {
  RequestSlot& slot = requests_[index];
  if (slot.device_ops == 0) return complete(index, std::move(status));
  slot.deferred = true;
  slot.status = std::move(status);
}

void Engine::add_device_op(const DeviceOp& op) { device_->add(op); }

}  // namespace ferry::proto
