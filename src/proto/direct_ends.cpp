// How direct transfers end (see direct_ends.hpp).
#include "proto/direct_ends.hpp"

#include <algorithm>

#include "proto/chunked.hpp"
#include "proto/engine.hpp"
#include "proto/messages.hpp"

namespace ferry::proto {

void DirectEnds::on_end(std::uint64_t cookie, Status status) {
  std::uint32_t index = 0;
  RequestSlot* slot = engine_.requests().lookup(cookie, &index);
  if (slot == nullptr || !slot->transfer.direct || slot->transfer.device_ops == 0) return;
  --slot->transfer.device_ops;
  if (slot->rma.native) {
    slot->rma.native = false;
    engine_.rma().native_ended(slot->peer, slot->rma.region);
  }
  if (slot->state == RequestState::kDone) return;
  const int peer_rank = slot->kind == RequestKind::kSend ? slot->peer : slot->info.source;
  if (!status && status.code() != Code::kPeerFailed && !slot->transfer.deferred &&
      !slot->transfer.withdrawn && peer_rank >= 0 && peer_rank < engine_.size() &&
      peer_rank != engine_.rank()) {
    // A provider reports a peer's death on the transfers in flight with it as their own failure
    // (tcp: canceled), often before the death itself can be seen (the dying process's sockets
    // close before its pidfd says so): if the peer turns out dead, that is what failed them.
    engine_.look_for_failures();
    if (const Link& peer = engine_.links().link(peer_rank); peer.failed) {
      status = Status(Code::kPeerFailed, peer.why);
    } else {
      const double keepalive = engine_.config().get_seconds(util::Var::kKeepalive);
      suspects_.push_back({cookie, peer_rank, std::move(status),
                           util::deadline_after(std::min(5.0, 0.2 + 2 * keepalive))});
      return;
    }
    if (engine_.requests().done(index)) return;
  }
  outcome(index, std::move(status));
}

int DirectEnds::settle() {
  engine_.look_for_failures();
  const auto now = util::Clock::now();
  int settled = 0;
  for (std::size_t i = 0; i < suspects_.size();) {
    Suspect& suspect = suspects_[i];
    std::uint32_t index = 0;
    RequestSlot* slot = engine_.requests().lookup(suspect.cookie, &index);
    const bool dead = engine_.links().link(suspect.peer).failed;
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
    outcome(index, std::move(done.status));
  }
  return settled;
}

void DirectEnds::outcome(std::uint32_t index, Status status) {
  RequestSlot* slot = &engine_.requests()[index];
  if (slot->gpu.chunk > 0 && !slot->transfer.deferred)
    return engine_.chunked().chunk_done(index, std::move(status));
  if (slot->transfer.deferred) {  // a failure (peer death, NACK, timeout) waited for the buffer
    if (slot->transfer.device_ops == 0) {
      slot->transfer.deferred = false;
      engine_.complete(index, slot->status);
    }
    return;
  }
  if (slot->transfer.reading && engine_.messages().read_ended(index, status)) return;
  if (!status && slot->rma.kind != RequestSlot::Rma::kNone && status.code() != Code::kPeerFailed) {
    // A native put or get, granted by the owner for this key and range: the network lost it.
    status = Status(status.code(), status.message() +
                                       " (a native one-sided access the owner "
                                       "had granted: the network failed it)");
  }
  if (!status || slot->kind == RequestKind::kSend) {
    return engine_.complete(index, std::move(status));
  }
  engine_.complete(index, slot->message_size > slot->size
                              ? truncation(slot->info.source, slot->message_size, slot->size)
                              : Status::ok());
}

}  // namespace ferry::proto
