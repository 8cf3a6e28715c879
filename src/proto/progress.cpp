// The engine's core (see engine.hpp): progress, operations and the completion of requests,
// dispatch of what arrives to the parts, and what a peer's death fails.
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
  const std::vector<transport::Transport*>& polled = links_.polled();
  transport::shm::ShmTransport* shm = links_.shm();
  transport::self::SelfTransport* self = links_.self();
  if (polled.size() == 1 && polled.front() == shm && !waiting_.armed() && shm->quiet() &&
      (self == nullptr || !self->has_work()) && !rma_->acks_waiting() && !links_.queued() &&
      !device_->busy() && operations_.empty() && !direct_ends_.suspects() &&
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
  transport::shm::ShmTransport* shm = links_.shm();
  if (transport::self::SelfTransport* self = links_.self(); self != nullptr && self->has_work()) {
    events += self->progress();
  }
  for (transport::Transport* t : links_.polled()) {
    if (t != shm || !shm->quiet()) events += t->progress();
  }
  if (rma_->acks_waiting()) events += rma_->send_acks();
  if (direct_ends_.suspects()) events += direct_ends_.settle();
  if (links_.queued()) events += links_.drain();
  if (device_->busy()) events += device_->poll();
  if (!operations_.empty()) events += operations_.advance();
  if (++progress_calls_ >= kCheckPeersEvery) {
    progress_calls_ = 0;
    look_for_failures();
    rma_->sweep();
  }
  return events;
}

void Engine::look_for_failures() {
  std::vector<std::pair<int, std::string>> failed;
  links_.check(&failed);
  for (const auto& [rank, why] : failed) {
    const bool seen_here = links_.link(rank).shares_memory && !links_.link(rank).failed;
    peer_failed(rank, why);
    // A death on this node is certain (its pid is gone): the ranks of other nodes, which would
    // see it only when their sends fail or their keepalives run out (FERRY_KEEPALIVE, seconds),
    // are told now.
    if (seen_here) tell_other_nodes(rank);
  }
  // Deaths that ranks of other nodes told us of (kAmPeerDead, kept by on_am). The notice may
  // overtake what the dead rank sent before it died (another connection): read what has come
  // first, as ofi does before it takes a peer its pidfd saw go for dead.
  if (reported_dead_.empty()) return;
  transport::drain_until_quiet([this] {
    int events = 0;
    for (transport::Transport* t : links_.polled()) events += t->progress();
    return events;
  });
  std::vector<std::pair<int, int>> reported;
  reported.swap(reported_dead_);
  // A notice is believed even when its sender has died since: it saw the pid go.
  for (const auto& [rank, by] : reported) {
    if (links_.link(rank).failed) continue;
    peer_failed(rank, "rank " + std::to_string(rank) + " exited (seen by rank " +
                          std::to_string(by) + ", on its node)");
  }
}

void Engine::tell_other_nodes(int dead) {
  for (int r = 0; r < size_; ++r) {
    const Link& link = links_.link(r);
    if (r == rank_ || r == dead || link.shares_memory || link.failed || link.endpoint == nullptr) {
      continue;
    }
    links_.send_control(r, kAmPeerDead, as_bytes(PeerDeadHeader{dead, 0}));
  }
}

void Engine::on_peer_dead(int source, std::span<const std::byte> data) {
  PeerDeadHeader header{};
  if (data.size() != sizeof(header) || !decode(data, &header)) {
    return protocol_error(source, "death notice of the wrong size");
  }
  if (header.rank < 0 || header.rank >= size_ || header.rank == rank_ || header.rank == source) {
    return protocol_error(source, "death notice naming itself, this rank or no rank");
  }
  if (links_.link(header.rank).failed || reported_dead_.size() >= static_cast<std::size_t>(size_)) {
    return;
  }
  // Failed at the next look (not here, inside a transport's poll); asked for at once.
  reported_dead_.emplace_back(header.rank, source);
  progress_calls_ = kCheckPeersEvery;
}

void Engine::on_bye(int source, std::span<const std::byte> data) {
  ByeHeader header{};
  if (data.size() != sizeof(header) || !decode(data, &header)) {
    return protocol_error(source, "finalize notice of the wrong size");
  }
  if (!liveness_.record_departure(&links_.link(source), source)) return;
  FERRY_LOG(kDebug, "rank %d finalized: receives from it that nothing matched end", source);
  messages_->peer_departed(source);
}

void Engine::peer_failed(int rank, const std::string& why) {
  if (!liveness_.record_failure(&links_.link(rank), rank, why)) return;
  FERRY_LOG(kWarn, "%s: failing the operations that involve it", why.c_str());
  const Status status(Code::kPeerFailed, why);
  // What waited in its queue, then what waits on it: rendezvous sends, fragment streams into us,
  // receives that name it. Receives from any source stay posted while another rank may still
  // match them; with none left they fail (a message this rank sends itself after that is
  // received by naming this rank).
  links_.drop_queue(rank, [&](std::uint32_t index) {
    if (requests_[index].state != RequestState::kDone) complete_when_idle(index, status);
  });
  device_->peer_failed(rank, status);
  rma_->peer_failed(rank);
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
    links_.link(slot.peer).reads->unexpose(requests_.wire_id(index), !status);
  }
  if (slot.rma.device != nullptr) {
    // A get into device memory by messages: the fragments came to the host copy.
    if (status) status = cuda_->copy(slot.rma.device, slot.gpu.host_copy.data(), slot.size);
    slot.rma.device = nullptr;
  }
  if (slot.rma.kind != RequestSlot::Rma::kNone) rma_->request_done(slot, status);
  slot.status = std::move(status);
  slot.state = RequestState::kDone;
  if (slot.kind == RequestKind::kSend) requests_.send_ended();
  if (!slot.handle_alive) requests_.free(index);
}

void protocol_error(int source, const char* what) {
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
  if (id == kAmRevoke) return revocations_.on_am(source, data);
  if (id == kAmPeerDead) return on_peer_dead(source, data);
  if (id == kAmBye) return on_bye(source, data);
  if (!device_->on_am(id, source, data) && !rma_->on_am(id, source, data)) {
    protocol_error(source, "unknown active message id");
  }
}

}  // namespace ferry::proto

namespace ferry::proto {

void Engine::complete_when_idle(std::uint32_t index, Status status) {
  RequestSlot& slot = requests_[index];
  if (slot.transfer.device_ops == 0) return complete(index, std::move(status));
  slot.transfer.deferred = true;
  slot.status = std::move(status);
}

}  // namespace ferry::proto
