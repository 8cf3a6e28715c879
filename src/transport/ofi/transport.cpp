// The ofi transport (see transport.hpp): provider choice, endpoint set-up, bounce buffers, the
// completion queue and peer failure.
#include "transport/ofi/transport.hpp"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transport/ofi/fabric.hpp"
#include "transport/ofi/nic.hpp"
#include "transport/ofi/op.hpp"
#include "transport/ofi/wire.hpp"
#include "util/config.hpp"
#include "util/log.hpp"

namespace ferry::transport::ofi {

std::string OfiTransport::error_text(int code) const {
  const int positive = code < 0 ? -code : code;
  return std::string(fi_ != nullptr ? fi_->strerror(positive) : std::strerror(positive)) + " (" +
         std::to_string(code) + ")";
}

std::byte* OfiTransport::buffer(std::uint32_t index) const {
  return buffers_.get() + static_cast<std::size_t>(index) * kBufferSize;
}

void OfiTransport::post_receive(std::uint32_t index) {
  Op& op = ops_[index];
  op.send = false;
  op.buffer = index;
  const ssize_t ret = fi_recv(ep_, buffer(index), kBufferSize, desc_, FI_ADDR_UNSPEC, &op.context);
  if (ret == -FI_EAGAIN) {
    reposts_.push_back(index);  // retried at the next progress
  } else if (ret != 0) {
    FERRY_LOG(kWarn, "ofi: posting a receive failed: %s",
              error_text(static_cast<int>(ret)).c_str());
  }
}

std::string OfiTransport::rma() const {
  if (!rma_) return "tagged rendezvous (" + rma_why_ + ")";
  return std::string("fi_read rendezvous; ") +
         (native_ ? "puts and gets by fi_write/fi_read" : "puts and gets by messages") + "; " +
         cache_->describe();
}

void OfiTransport::release_region(void* handle) {
  if (handle != nullptr) fi_close(&static_cast<fid_mr*>(handle)->fid);
}

Reachability OfiTransport::reach(const PeerInfo& peer) const {
  if (peer.address.empty())
    return {false, "rank " + std::to_string(peer.rank) + " has no ofi address"};
  AddressHeader header{};
  std::span<const std::byte> name;
  if (parse_address(peer.address, &header, &name) && header.protocol != protocol_) {
    // Another provider (net and tcp), or tcp;ofi_rxm with and without pass-through: their
    // connections would carry garbage.
    return {false, "rank " + std::to_string(peer.rank) + "'s endpoint speaks wire protocol " +
                       std::to_string(header.protocol) + ", this rank's " +
                       std::to_string(protocol_) + " (" + provider_ +
                       "): the ranks chose different providers or protocols; set "
                       "FERRY_OFI_PROVIDER and FERRY_OFI_PASSTHRU alike on every rank"};
  }
  return {true, provider_};
}

namespace {

class OfiEndpoint final : public Endpoint,
                          public DirectTransfers,
                          public OneSidedReads,
                          public OneSidedWrites {
 public:
  OfiEndpoint(OfiTransport* transport, int peer, fi_addr_t address)
      : transport_(transport), peer_(peer), address_(address) {}
  Status am_send(std::uint8_t id, std::span<const std::byte> header,
                 std::span<const std::byte> payload, AmHint /*hint*/) override {
    return transport_->send(peer_, address_, id, header, payload);
  }
  // Tagged transfers always; reads where the provider grants FI_RMA; writes where native
  // one-sided access is on (the provider checks keys).
  DirectTransfers* direct() override { return this; }
  OneSidedReads* reads() override { return transport_->has_read() ? this : nullptr; }
  OneSidedWrites* writes() override { return transport_->has_native_rma() ? this : nullptr; }

  Status send_direct(const void* buffer, std::size_t length, int device, std::uint64_t key,
                     std::uint64_t cookie) override {
    return transport_->directs().start(true, peer_, const_cast<void*>(buffer), length, device, key,
                                       cookie);
  }
  Status recv_direct(void* buffer, std::size_t length, int device, std::uint64_t key,
                     std::uint64_t cookie) override {
    return transport_->directs().start(false, peer_, buffer, length, device, key, cookie);
  }
  void cancel_direct(std::uint64_t cookie) override { transport_->directs().cancel(cookie); }
  bool device_direct(int device, const void* buffer, std::size_t length) override {
    return transport_->directs().device_direct(device, buffer, length);
  }
  [[nodiscard]] std::string device_route() const override {
    return transport_->directs().device_route();
  }

  Status expose(const void* buffer, std::size_t length, std::uint64_t cookie,
                RemoteRegion* region) override {
    return transport_->directs().expose(buffer, length, cookie, region);
  }
  void unexpose(std::uint64_t cookie, bool revoke) override {
    transport_->directs().unexpose(cookie, revoke);
  }
  Status read_direct(void* buffer, std::size_t length, RemoteRegion region,
                     std::uint64_t cookie) override {
    return transport_->directs().start_read(peer_, buffer, length, region, cookie);
  }
  Status write_direct(const void* buffer, std::size_t length, RemoteRegion region,
                      std::uint64_t cookie) override {
    return transport_->directs().start_write(peer_, buffer, length, region, cookie);
  }

  [[nodiscard]] std::string describe() const override {
    return "ofi (" + transport_->provider() + "; " + transport_->rma() + "; " + transport_->hmem() +
           ")";
  }

 private:
  OfiTransport* transport_;
  int peer_;
  fi_addr_t address_;
};

}  // namespace

std::unique_ptr<Endpoint> OfiTransport::connect(const PeerInfo& peer) {
  if (peer.rank < 0 || peer.rank >= size_) {
    throw Error(Code::kInvalidArgument, "ofi: no rank " + std::to_string(peer.rank));
  }
  AddressHeader header{};
  std::span<const std::byte> name;
  if (!parse_address(peer.address, &header, &name)) {
    throw Error(Code::kProtocolError, "ofi: rank " + std::to_string(peer.rank) +
                                          " published a malformed address of " +
                                          std::to_string(peer.address.size()) + " bytes");
  }
  PeerState& state = peers_[static_cast<std::size_t>(peer.rank)];
  const int ret =
      fi_av_insert(av_, peer.address.data() + sizeof header, 1, &state.address, 0, nullptr);
  if (ret != 1) {
    throw Error(Code::kIoError, "ofi: fi_av_insert of rank " + std::to_string(peer.rank) +
                                    "'s address failed: " + error_text(ret < 0 ? ret : -FI_EINVAL));
  }
  state.connected = true;
  if (header.node == node_ && header.pid > 0 && !test_remote_) {
    // On this node: its death is seen by its process, not only by the next failed send.
    state.pid = header.pid;
    state.pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, header.pid, 0)));
  }
  return std::make_unique<OfiEndpoint>(this, peer.rank, state.address);
}

Status OfiTransport::send(int peer, fi_addr_t address, std::uint8_t id,
                          std::span<const std::byte> header, std::span<const std::byte> payload,
                          bool confirm) {
  PeerState& state = peers_[static_cast<std::size_t>(peer)];
  if (state.failed) return Status(Code::kPeerFailed, state.why);
  const std::size_t length = header.size() + payload.size();
  const std::size_t total = sizeof(Wire) + length;
  if (length > capabilities_.max_am) {
    return Status(Code::kInvalidArgument, "ofi: active message of " + std::to_string(length) +
                                              " bytes exceeds the largest one, " +
                                              std::to_string(capabilities_.max_am));
  }
  Wire wire{id, 0, kWireMagic, rank_, static_cast<std::uint32_t>(length), 0, 0, 0};
  state.order.stamp(&wire);
  auto fill = [&](std::byte* out) {
    std::memcpy(out, &wire, sizeof wire);
    if (!header.empty()) std::memcpy(out + sizeof wire, header.data(), header.size());
    if (!payload.empty())
      std::memcpy(out + sizeof wire + header.size(), payload.data(), payload.size());
  };
  ssize_t ret;
  if (state.outstanding >= kSendsPerPeer || !state.order.can_send(total)) {
    return Status(Code::kWouldBlock);
  }
  std::byte* message = nullptr;
  if (total <= inject_size_ && !confirm) {
    message = inject_scratch_.data();
    fill(message);
    ret = test_drop_ == wire.seq ? 0 : fi_inject(ep_, message, total, address);
  } else {
    // No progress from here: a send may be made from inside a delivered message's handler.
    if (free_sends_.empty()) return Status(Code::kWouldBlock);
    const std::uint32_t index = free_sends_.back();
    message = buffer(index);
    fill(message);
    Op& op = ops_[index];
    op.send = true;
    op.drain = confirm;
    op.seq = wire.seq;
    op.peer = peer;
    op.buffer = index;
    const bool dropped = test_drop_ == wire.seq && !confirm;
    if (dropped) {
      ret = 0;  // FERRY_TEST_OFI_DROP: lost as a provider may lose it (no completion either)
    } else if (!confirm) {
      ret = fi_send(ep_, message, total, desc_, address, &op.context);
    } else {
      iovec iov{message, total};
      void* desc = desc_;
      fi_msg msg{};
      msg.msg_iov = &iov;
      msg.desc = &desc;
      msg.iov_count = 1;
      msg.addr = address;
      msg.context = &op.context;
      ret = -FI_EINVAL;
      if (delivery_complete_) {
        ret = fi_sendmsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
        if (ret != 0 && ret != -FI_EAGAIN) {
          // Then a transmit completion, which follows the earlier messages' (they are ordered).
          FERRY_LOG(kInfo,
                    "ofi: a send with delivery completion was refused (%s): finalize waits "
                    "for transmit completion",
                    error_text(static_cast<int>(ret)).c_str());
          delivery_complete_ = false;
        }
      }
      if (!delivery_complete_) ret = fi_sendmsg(ep_, &msg, FI_COMPLETION);
    }
    if (ret == 0 && !dropped) {  // the dropped one is still kept, its buffer not taken
      free_sends_.pop_back();
      ++state.outstanding;
      if (confirm) state.drain_sent = true;
    }
  }
  if (ret == 0) {
    state.order.sent({message, total});
    state.refused_since = {};
    state.refused_rounds = 0;
    return Status::ok();
  }
  if (ret == -FI_EAGAIN) {
    // Normal back-pressure, retried by the engine after progress, unless it never ends: a
    // provider keeps answering -FI_EAGAIN for a peer that died (check_peers decides).
    if (state.refused_since == std::chrono::steady_clock::time_point{}) {
      state.refused_since = std::chrono::steady_clock::now();
    }
    return Status(Code::kWouldBlock);
  }
  const std::string why = "ofi: sending to rank " + std::to_string(peer) +
                          " failed: " + error_text(static_cast<int>(ret));
  peer_failed(peer, why);
  return Status(Code::kPeerFailed, why);
}

ssize_t OfiTransport::post_copy(int peer, std::span<const std::byte> message) {
  PeerState& state = peers_[static_cast<std::size_t>(peer)];
  if (free_sends_.empty() || state.outstanding >= kSendsPerPeer) return -FI_EAGAIN;
  const std::uint32_t index = free_sends_.back();
  std::memcpy(buffer(index), message.data(), message.size());
  Op& op = ops_[index];
  op.send = true;
  op.drain = false;
  op.seq = 0;
  op.peer = peer;
  op.buffer = index;
  const ssize_t ret =
      fi_send(ep_, buffer(index), message.size(), desc_, state.address, &op.context);
  if (ret == 0) {
    free_sends_.pop_back();
    ++state.outstanding;
  }
  return ret;
}

void OfiTransport::post_control(int peer, std::uint8_t id, std::uint8_t flag, std::uint32_t ack,
                                std::uint32_t until) {
  const Wire wire{id, flag, kWireMagic, rank_, 0, 0, ack, until};
  (void)post_copy(peer, std::as_bytes(std::span(&wire, 1)));  // refused: asked again later
}

void OfiTransport::resend(int peer, std::uint32_t from, std::uint32_t until) {
  PeerState& state = peers_[static_cast<std::size_t>(peer)];
  if (state.failed) return;
  const auto copies = state.order.resend(from, until);
  std::size_t posted = 0;
  for (std::span<const std::byte> copy : copies) {
    Wire wire{};
    std::memcpy(&wire, copy.data(), sizeof wire);
    if (test_drop_copies_ && test_drop_ == wire.seq) continue;
    if (post_copy(peer, copy) != 0) break;  // the receiver asks again after an interval
    ++posted;
  }
  FERRY_LOG(kInfo, "ofi: rank %d asked for our messages %u to %u again: %zu of %zu kept sent", peer,
            from, until - 1, posted, copies.size());
}

void OfiTransport::handle_receive(std::uint32_t index, std::size_t length) {
  const std::byte* data = buffer(index);
  Wire wire{};
  if (!parse_message({data, length}, size_, rank_, &wire)) {
    if (malformed_++ == 0) {
      FERRY_LOG(kWarn, "ofi: dropped a malformed message (%zu bytes, claims rank %d, length %u)",
                length, wire.source, wire.length);
    }
    return;
  }
  PeerState& peer = peers_[static_cast<std::size_t>(wire.source)];
  if (peer.failed) return;
  if ((wire.flags & kWireResend) != 0) {
    if (wire.id == kWireResendId) resend(wire.source, wire.ack, wire.until);
    return;
  }
  if ((wire.flags & kWireBroken) != 0) {
    if (wire.id == kWireBrokenId) {
      peer_failed(wire.source, "rank " + std::to_string(wire.source) + " lost our message " +
                                   std::to_string(wire.ack) +
                                   " (the provider dropped it) and gave up on the link");
    }
    return;
  }
  switch (peer.order.arrive(wire, {data, length}, std::chrono::steady_clock::now())) {
    case PeerOrder::Arrival::kDuplicate:
      FERRY_LOG(kDebug, "ofi: message %u from rank %d arrived again: dropped", wire.seq,
                wire.source);
      return;
    case PeerOrder::Arrival::kRefused:
      if (malformed_++ == 0) {
        FERRY_LOG(kWarn,
                  "ofi: dropped a message from rank %d numbered %u while expecting %u (no "
                  "sender runs that far ahead)",
                  wire.source, wire.seq, peer.order.expected());
      }
      return;
    case PeerOrder::Arrival::kHeld:
      // Overtook an earlier one still completing, or one the provider lost: kept, and the
      // sender asked for its copies where it keeps them (order_work).
      FERRY_LOG(kDebug, "ofi: message %u from rank %d arrived before %u: held", wire.seq,
                wire.source, peer.order.expected());
      order_work_ = true;
      return;
    case PeerOrder::Arrival::kNext:
      break;
  }
  deliver(wire, data + sizeof wire);
  // Messages that had overtaken this one follow it now, in order.
  for (std::vector<std::byte> message = peer.order.take_ready(); !message.empty() && !peer.failed;
       message = peer.order.take_ready()) {
    Wire held;
    std::memcpy(&held, message.data(), sizeof held);
    deliver(held, message.data() + sizeof held);
  }
  if (peer.order.ack_due() || peer.order.held() != 0) order_work_ = true;
}

void OfiTransport::deliver(const Wire& wire, const std::byte* body) {
  PeerState& peer = peers_[static_cast<std::size_t>(wire.source)];
  peer.order.delivered();
  peer.last_heard = std::chrono::steady_clock::now();
  if (wire.id == kKeepaliveId || wire.id == kWireAckId) return;
  handler_->on_am(wire.id, wire.source, {body, wire.length});
}

void OfiTransport::order_work() {
  order_work_ = false;
  const auto now = std::chrono::steady_clock::now();
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    if (state.failed || static_cast<int>(i) == rank_) continue;
    PeerOrder& order = state.order;
    if (order.ack_due()) {
      // A keepalive carries the acknowledgement; refused now, it is tried at the next call.
      if (send(static_cast<int>(i), state.address, kWireAckId, {}, {})) order.ack_sent();
    }
    if (order.lost()) {
      // Told first (best effort), so that the peer does not wait for our answers either.
      post_control(static_cast<int>(i), kWireBrokenId, kWireBroken, order.expected(), 0);
      peer_failed(static_cast<int>(i),
                  "ofi: message " + std::to_string(order.expected()) + " of rank " +
                      std::to_string(i) + " never arrived while " + std::to_string(order.held()) +
                      " later ones did (the provider lost it, and copies sent again did not "
                      "arrive either)");
      continue;
    }
    if (order.resend_due(now)) {
      post_control(static_cast<int>(i), kWireResendId, kWireResend, order.expected(),
                   order.first_held());
      FERRY_LOG(kInfo,
                "ofi: message %u of rank %d is missing (%zu later ones arrived): asked "
                "for it again",
                order.expected(), static_cast<int>(i), order.held());
    }
    if (order.ack_due() || order.held() != 0) order_work_ = true;
  }
}

void OfiTransport::peer_failed(int peer, const std::string& why) {
  PeerState& state = peers_[static_cast<std::size_t>(peer)];
  if (state.failed) return;
  state.failed = true;
  state.why = why;
  // Let the provider drop what it holds for the peer (sends stuck on it complete in error).
  // Not shm's: its removal unmaps the peer's region, which a send still in flight to the peer
  // reads when the next fi_cq_read progresses it (a SIGSEGV in libfabric 1.17). Its sends to a
  // dead peer stay pending; nothing waits for them (delivered() passes over failed peers).
  if (state.connected && protocol_ != FI_PROTO_SHM) fi_av_remove(av_, &state.address, 1, 0);
  // Nothing is called back from here (this may run inside an engine's send): check_peers ends
  // the peer's direct transfers when it reports the failure.
}

void OfiTransport::check_peers(std::vector<std::pair<int, std::string>>* failed) {
  std::vector<pollfd> fds;
  std::vector<int> watched;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].pidfd.valid() && !peers_[i].failed) {
      fds.push_back({peers_[i].pidfd.get(), POLLIN, 0});
      watched.push_back(static_cast<int>(i));
    }
  }
  if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
    // What an exited process sent before it went is in this process already (its provider
    // confirmed delivery, or the bytes wait in the socket).
    drain_until_quiet([this] { return progress(); });
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const int rank = watched[i];
      peer_failed(rank, "rank " + std::to_string(rank) + " (pid " +
                            std::to_string(peers_[static_cast<std::size_t>(rank)].pid) +
                            ") exited or was killed (seen by ofi's pidfd)");
    }
  }
  const auto now = std::chrono::steady_clock::now();
  // The first keepalive to a dead peer is refused within an interval of its death; two more
  // intervals of refusals, and it is failed: at most 3 intervals from death to failure.
  const auto refused_limit = std::chrono::duration<double>(2 * keepalive_s_);
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    // Refusals count only while this process tries: three keepalive rounds refused in a row
    // (one refusal followed by a long wait elsewhere is no evidence).
    if (keepalive_s_ > 0 && !state.failed &&
        state.refused_since != std::chrono::steady_clock::time_point{} &&
        now - state.refused_since > refused_limit && state.refused_rounds >= 3) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.3g s", 2 * keepalive_s_);
      peer_failed(static_cast<int>(i),
                  "rank " + std::to_string(i) + " refused every send for " + seconds +
                      " (2 keepalive intervals; the provider answers -FI_EAGAIN): unreachable");
    }
    if (silence_s_ > 0 && state.connected && !state.failed && static_cast<int>(i) != rank_ &&
        now - state.last_heard > std::chrono::duration<double>(silence_s_)) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.3g s", silence_s_);
      peer_failed(static_cast<int>(i), "rank " + std::to_string(i) + " sent nothing for " +
                                           seconds + " (FERRY_KEEPALIVE_TIMEOUT)");
    }
  }
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    if (state.failed && !state.reported) {
      state.reported = true;
      failed->emplace_back(static_cast<int>(i), state.why);
      directs_.orphan(static_cast<int>(i), state.why);
    }
  }
}

void OfiTransport::keepalive() {
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    if (!state.connected || state.failed || static_cast<int>(i) == rank_) continue;
    // Lost to back-pressure is fine: the next interval tries again.
    Status status = send(static_cast<int>(i), state.address, kKeepaliveId, {}, {});
    if (status.code() == Code::kWouldBlock &&
        state.refused_since != std::chrono::steady_clock::time_point{}) {
      ++state.refused_rounds;
    }
    FERRY_LOG(kDebug, "ofi: keepalive to rank %zu: %s", i, status.to_string().c_str());
  }
}

bool OfiTransport::delivered() {
  bool done = true;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    if (static_cast<int>(i) == rank_ || !state.connected || state.failed) continue;
    // A bounce-buffer send above the provider's eager size may complete after later ones (it
    // waits for the peer to fetch it): it is delivered at its own completion.
    if (state.confirmed == state.order.next_seq() && state.outstanding == 0) continue;
    if (!state.drain_sent && state.confirmed != state.order.next_seq()) {
      // Refused for now (back-pressure) or failed (the peer with it): the next call sees which.
      (void)send(static_cast<int>(i), state.address, kKeepaliveId, {}, {}, true);
    }
    if (!state.failed) done = false;
  }
  return done;
}

void OfiTransport::retry_deferred() {
  if (!reposts_.empty()) {
    std::vector<std::uint32_t> again;
    again.swap(reposts_);
    for (std::uint32_t index : again) post_receive(index);
  }
  directs_.retry();
}

void OfiTransport::on_completion_error(const fi_cq_err_entry& error) {
  auto* op = static_cast<Op*>(error.op_context);
  if (op == nullptr) return;
  if (op->direct) {
    const bool canceled = error.err == FI_ECANCELED;
    directs_.finish(
        op, Status(canceled ? Code::kCanceled : Code::kIoError,
                   std::string("ofi: direct ") +
                       (op->read    ? "read from"
                        : op->write ? "write to"
                        : op->send  ? "send to"
                                    : "receive from") +
                       " rank " + std::to_string(op->peer) + " failed: " + error_text(-error.err)));
    return;
  }
  FERRY_LOG(kDebug, "ofi: completion error %d (%s) for a %s", error.err,
            error_text(-error.err).c_str(), op->send ? "send" : "receive");
  if (op->send) {
    free_sends_.push_back(op->buffer);
    --peers_[static_cast<std::size_t>(op->peer)].outstanding;
    const char* detail = fi_cq_strerror(cq_, error.prov_errno, error.err_data, nullptr, 0);
    peer_failed(op->peer, "ofi: a send to rank " + std::to_string(op->peer) +
                              " failed: " + error_text(-error.err) +
                              (detail != nullptr ? std::string(": ") + detail : ""));
  } else if (error.err != FI_ECANCELED) {
    FERRY_LOG(kWarn, "ofi: a receive failed: %s", error_text(-error.err).c_str());
    post_receive(op->buffer);
  }
}

int OfiTransport::progress() {
  if (keepalive_s_ > 0 && (++polls_ & 255) == 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_keepalive_) {
      next_keepalive_ = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(keepalive_s_));
      keepalive();
    }
  }
  retry_deferred();
  if (order_work_) order_work();
  int delivered = 0;
  for (;;) {
    fi_cq_msg_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (fi_cq_readerr(cq_, &error, 0) < 0) break;
      on_completion_error(error);
      continue;
    }
    if (n < 0) {
      FERRY_LOG(kWarn, "ofi: fi_cq_read failed: %s", error_text(static_cast<int>(n)).c_str());
      break;
    }
    for (ssize_t i = 0; i < n; ++i) {
      auto* op = static_cast<Op*>(entries[i].op_context);
      if (op->direct) {
        directs_.finish(
            op, op->send || op->read || op->write || entries[i].len == op->length
                    ? Status::ok()
                    : Status(Code::kProtocolError, "ofi: direct receive from rank " +
                                                       std::to_string(op->peer) + " got " +
                                                       std::to_string(entries[i].len) + " of " +
                                                       std::to_string(op->length) + " bytes"));
        continue;
      }
      if (op->send) {
        PeerState& state = peers_[static_cast<std::size_t>(op->peer)];
        free_sends_.push_back(op->buffer);
        --state.outstanding;
        if (op->drain) {  // what was sent after it needs another
          state.drain_sent = false;
          state.confirmed = op->seq + 1;
        }
      } else {
        handle_receive(op->buffer, entries[i].len);
        post_receive(op->buffer);
        ++delivered;
      }
    }
    handler_->on_batch_end();  // before the next fi_cq_read, whose progress polls the sockets
    if (n < 16) break;
  }
  return delivered;
}

}  // namespace ferry::transport::ofi
