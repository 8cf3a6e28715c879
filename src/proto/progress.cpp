// The engine's core (see engine.hpp): progress, completion of requests, the per-peer queues of
// active messages, dispatch of what arrives to the parts, the ends of direct transfers, and what
// a peer's death fails.
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
#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "transport/self/transport.hpp"
#include "transport/shm/transport.hpp"
#include "util/clock.hpp"
#include "util/copy.hpp"
#include "util/extent.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"

namespace ferry::proto {

// A dead peer is noticed within a few thousand calls (well under a millisecond while waiting):
// one system call per check, amortised to nothing per message.
constexpr std::uint32_t kCheckPeersEvery = 4096;

int Engine::progress() {
  // The idle poll of a job whose peers are all on this node, without calls: nothing armed,
  // queued or in flight, nothing in the shm FIFO. A loop waiting on memory a peer stores into
  // (a put's flag) sees the store sooner the shorter this is (docs/PERFORMANCE.md, "One-sided").
  if (polled_.size() == 1 && polled_.front() == shm_ && !waiting_.armed() && shm_->quiet() &&
      (self_ == nullptr || !self_->has_work()) && !rma_->acks_waiting() && pending_peers_.empty() &&
      !device_->busy() && operations_.empty() && suspects_.empty() &&
      progress_calls_ + 1 < kCheckPeersEvery) {
    ++progress_calls_;
    return 0;
  }
  return progress_all();  // a tail call: the idle poll above saves no registers
}

int Engine::progress_all() {
  if (waiting_.armed()) [[unlikely]]
    waiting_.disarm();  // the application's arm() ends at its next progress
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
  if (!liveness_.record_failure(&peer, rank, why)) return;
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
  messages_->peer_failed(rank, status);
  for (std::uint32_t i = 0; i < requests_.capacity(); ++i) {
    const RequestSlot& slot = requests_[i];
    if (slot.state == RequestState::kActive && !slot.transfer.deferred &&
        ((slot.kind == RequestKind::kSend && slot.peer == rank) ||
         (slot.kind == RequestKind::kRecv && slot.info.source == rank))) {
      complete_when_idle(i, status);  // a copy still using the buffer finishes first
    }
  }
}

void Engine::complete(std::uint32_t index, Status status) {
  RequestSlot& slot = requests_[index];
  if (slot.gpu.bounce != nullptr) chunked_->return_bounce(&slot);
  if (slot.transfer.exposed) {
    // A send that did not end well must not stay readable (its buffer is the caller's again).
    slot.transfer.exposed = false;
    peers_[static_cast<std::size_t>(slot.peer)].reads->unexpose(requests_.wire_id(index), !status);
  }
  if (slot.rma.device != nullptr) {
    // A get into device memory by messages: the fragments came to the host copy.
    if (status) status = cuda_->copy(slot.rma.device, slot.gpu.host_copy.data(), slot.size);
    slot.rma.device = nullptr;
  }
  if (slot.rma.kind != RequestSlot::Rma::kNone) rma_->request_done(slot, status);
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
  if (messages_->on_am(id, source, data)) return;
  if (id == kAmCtsChunked) return chunked_->on_cts(source, data);
  if (!device_->on_am(id, source, data) && !rma_->on_am(id, source, data)) {
    protocol_error(source, "unknown active message id");
  }
}

void Engine::on_direct(std::uint64_t cookie, Status status) {
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(cookie, &index);
  if (slot == nullptr || !slot->transfer.direct || slot->transfer.device_ops == 0) return;
  --slot->transfer.device_ops;
  if (slot->rma.native) {
    slot->rma.native = false;
    rma_->native_ended(slot->peer, slot->rma.region);
  }
  if (slot->state == RequestState::kDone) return;
  const int peer_rank = slot->kind == RequestKind::kSend ? slot->peer : slot->info.source;
  if (!status && status.code() != Code::kPeerFailed && !slot->transfer.deferred && peer_rank >= 0 &&
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
  if (slot->gpu.chunk > 0 && !slot->transfer.deferred)
    return chunked_->chunk_done(index, std::move(status));
  if (slot->transfer.deferred) {  // a failure (peer death, NACK, timeout) waited for the buffer
    if (slot->transfer.device_ops == 0) {
      slot->transfer.deferred = false;
      complete(index, slot->status);
    }
    return;
  }
  if (slot->transfer.reading && messages_->read_ended(index, status)) return;
  if (!status && slot->rma.kind != RequestSlot::Rma::kNone && status.code() != Code::kPeerFailed) {
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

bool Engine::test(std::uint32_t index) {
  if (done(index)) return true;
  progress();
  return done(index);
}

Status Engine::wait(std::uint32_t index) {
  if (timeout_ > 0) return wait_for(index, timeout_);
  int idle = 0;
  while (!done(index)) waiting_.step(&idle);
  return requests_[index].status;
}

Status Engine::wait_for(std::uint32_t index, double seconds) {
  if (std::isnan(seconds)) {
    return Status(Code::kInvalidArgument, "wait_for: NaN seconds (INFINITY waits without a limit)");
  }
  const auto deadline = util::deadline_after(seconds);
  int idle = 0;
  for (std::uint32_t polls = 0; !done(index); ++polls) {
    waiting_.step(&idle);
    // A request that completed in this very step (however late) is not a timeout.
    if ((polls & 255) == 0 && !done(index) && util::Clock::now() >= deadline) {
      char text[64];
      std::snprintf(text, sizeof(text), "request not complete after %g s", seconds);
      return Status(Code::kTimeout, text);
    }
  }
  return requests_[index].status;
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

void Engine::complete_when_idle(std::uint32_t index, Status status) {
  RequestSlot& slot = requests_[index];
  if (slot.transfer.device_ops == 0) return complete(index, std::move(status));
  slot.transfer.deferred = true;
  slot.status = std::move(status);
}

void Engine::add_device_op(const DeviceOp& op) { device_->add(op); }

}  // namespace ferry::proto
