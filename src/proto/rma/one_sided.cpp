// One-sided operations: requests, their answers, flush (see one_sided.hpp); the owner's side is
// in owner.cpp.
#include "proto/rma/one_sided.hpp"

#include <algorithm>
#include <cstring>

#include "mem/fault_guard.hpp"
#include "proto/engine.hpp"
#include "util/copy.hpp"
#include "util/extent.hpp"
#include "util/log.hpp"

namespace ferry::proto::rma {

Status OneSided::register_memory(void* address, std::size_t bytes, std::uint64_t* id,
                                 std::uint64_t* secret, RegionAccess* access) {
  Status status = regions_.add(address, bytes, id, secret, access);
  if (status && access != nullptr)
    access->native = native_.offered(regions_.find(*id)->device >= 0);
  return status;
}

Status OneSided::allocate(std::size_t bytes, void** address, std::uint64_t* id,
                          std::uint64_t* secret, int* fd, RegionAccess* access) {
  Status status = regions_.allocate(bytes, address, id, secret, fd);
  if (status) {
    *access = RegionAccess{};
    access->native = native_.offered(false);  // peers on this node map it: no guard slot
  }
  return status;
}

Status OneSided::deregister(std::uint64_t id) {
  if (regions_.find(id) == nullptr) {
    return Status(Code::kInvalidArgument, "deregister: no memory region " + std::to_string(id));
  }
  // The ranks granted native access stop first; then the registration closes, then the guard
  // slot (waiting for direct accesses begun), then the memory.
  Status waited = native_.revoke(id);
  Status removed = regions_.remove(id);
  if (waited.is_ok()) waited = std::move(removed);
  // Answers to gets still queued from it would read memory the caller is about to release: cut
  // them short, and tell their initiators (after the fragments already sent, so in order).
  std::vector<std::pair<int, std::uint64_t>> cut;
  for (int rank = 0; rank < engine_.size(); ++rank) {
    std::erase_if(engine_.links().link(rank).pending, [&](const Pending& pending) {
      if (pending.stream == UINT32_MAX) return false;
      RequestSlot& slot = engine_.requests()[pending.stream];
      if (slot.rma.kind != Rma::kGetReply || slot.rma.region != id) return false;
      cut.emplace_back(rank, pending.rreq);
      engine_.complete(pending.stream, Status(Code::kCanceled, "region deregistered"));
      return true;
    });
  }
  for (const auto& [rank, rreq] : cut) {
    engine_.links().send_control(rank, kAmRmaAck, as_bytes(RmaAckHeader{rreq, 0, kRmaCutShort, 0}));
  }
  return waited;
}

bool OneSided::atomic_again(AtomicOp op, std::size_t width, int rank, std::uint64_t region,
                            std::uint64_t secret, std::size_t key_size, std::uint64_t offset,
                            std::uint64_t operand, void* result, std::uint64_t compare) {
  if ((width != 4 && width != 8) || offset % width != 0 || static_cast<std::uint8_t>(op) > 5 ||
      (result != nullptr && (cuda::Cuda::device_of(engine_.cuda(), result) >= 0))) {
    return false;
  }
  std::byte* word =
      peers_direct_.again(rank, region, secret, key_size, offset, &operand, width,
                          [](const void*) { return false; });  // the operand is on our stack
  if (word == nullptr || reinterpret_cast<std::uintptr_t>(word) % width != 0) return false;
  apply_atomic_at(word, op, width, operand, compare, result);
  return true;
}

bool OneSided::on_am(std::uint8_t id, int source, std::span<const std::byte> data) {
  switch (id) {
    case kAmPut:
      on_put(source, data);
      return true;
    case kAmGet:
      on_get(source, data);
      return true;
    case kAmAtomic:
      on_atomic(source, data);
      return true;
    case kAmRmaAck:
      on_ack(source, data);
      return true;
    case kAmRmaAcks:
      on_acks(source, data);
      return true;
    case kAmNativeAsk:
      native_.on_ask(source, data);
      return true;
    case kAmNativeGrant:
      native_.on_grant(source, data);
      return true;
    case kAmNativeRevoke:
      native_.on_revoke(source, data);
      return true;
    case kAmNativeRevoked:
      native_.on_revoked(source, data);
      return true;
    default:
      return false;
  }
}

void OneSided::peer_failed(int rank) {
  peers_direct_.unmap(rank);
  native_.peer_failed(rank);
}

std::string OneSided::describe(int rank, bool native) const {
  std::string out;
  if (native) out += "; " + native_.describe(rank);
  const PeerState& peer = peers_[static_cast<std::size_t>(rank)];
  if (peer.acks_sent > 0) {
    out += "; answers to its one-sided operations: " + std::to_string(peer.acks_sent) + " in " +
           std::to_string(peer.ack_messages) + " messages";
  }
  if (std::string refused = peers_direct_.refusals(rank); !refused.empty()) out += "; " + refused;
  return out;
}

void OneSided::clear() {
  native_.clear();
  regions_.clear();
  peers_direct_.unmap(-1);
}

std::uint32_t OneSided::request(RequestKind kind, Rma rma, const RmaTarget& target,
                                const void* local, std::size_t bytes, Status* early) {
  std::uint32_t index = engine_.requests().allocate(kind);
  RequestSlot& slot = engine_.requests()[index];
  slot.rma.kind = rma;
  slot.peer = target.rank;
  slot.size = bytes;
  const char* what = rma == Rma::kPut ? "put" : rma == Rma::kGet ? "get" : "atomic";
  if (target.rank < 0 || target.rank >= engine_.size()) {
    *early = Status(Code::kInvalidArgument, std::string(what) + ": the key names rank " +
                                                std::to_string(target.rank) + ", not in [0, " +
                                                std::to_string(engine_.size()) + ")");
  } else if (local == nullptr && bytes > 0) {
    *early = Status(Code::kInvalidArgument, std::string(what) + ": null local buffer");
  } else if (Status bad = util::check_extent(what, "local buffer", local, bytes); !bad) {
    *early = std::move(bad);
  } else if (rma != Rma::kGet && target.read_only) {
    *early = Status(Code::kInvalidArgument,
                    std::string(what) + ": " + refusal_text(kRmaReadOnly, target.rank));
  } else if (target.offset > target.size || bytes > target.size - target.offset) {
    *early = Status(Code::kInvalidArgument,
                    std::string(what) + ": " + std::to_string(bytes) + " bytes at offset " +
                        std::to_string(target.offset) + " reach outside the " +
                        std::to_string(target.size) + "-byte region");
  } else {
    const Link& link = engine_.links().link(target.rank);
    if (link.endpoint == nullptr || link.failed) {
      *early = Status(link.failed ? Code::kPeerFailed : Code::kUnsupported, link.why);
    } else {
      ++peers_[static_cast<std::size_t>(target.rank)].outstanding;
      slot.rma.region = target.region;
      return index;
    }
  }
  slot.rma.kind = Rma::kNone;  // never counted
  return index;
}

void OneSided::request_done(const RequestSlot& slot, const Status& status) {
  if (slot.rma.kind == Rma::kGetReply) return;
  PeerState& peer = peers_[static_cast<std::size_t>(slot.peer)];
  --peer.outstanding;
  if (!status && peer.error.is_ok()) peer.error = status;
}

template <typename Apply>
bool OneSided::settled(std::uint32_t index, const RmaTarget& target, std::size_t length, bool write,
                       Status early, Apply apply) {
  if (!early.is_ok() || length == 0) {
    engine_.complete(index, std::move(early));
    return true;
  }
  std::uint32_t refusal = kRmaOk;
  bool device = false;
  if (std::byte* bytes = peers_direct_.target(target, length, write, &refusal, &device)) {
    engine_.complete(index, apply(bytes, device));
    return true;
  }
  if (refusal != kRmaOk) {
    engine_.complete(index, Status(Code::kInvalidArgument, refusal_text(refusal, target.rank)));
    return true;
  }
  return false;
}

Status OneSided::move(void* destination, const void* source, std::size_t bytes, bool device) {
  if (!device) {
    util::copy(destination, source, bytes);
    return Status::ok();
  }
  return engine_.cuda()->copy(destination, source, bytes);
}

Status OneSided::atomic(std::byte* word, bool device, AtomicOp op, std::size_t width,
                        std::uint64_t operand, std::uint64_t compare, std::uint64_t* previous) {
  if (!device) {
    *previous = atomic_at(word, op, width, operand, compare);
    return Status::ok();
  }
  alignas(8) std::byte copy[8];
  Status status = engine_.cuda()->copy(copy, word, width);
  if (!status) return status;
  *previous = atomic_at(copy, op, width, operand, compare);
  return engine_.cuda()->copy(word, copy, width);
}

Status OneSided::bounce(RequestSlot& slot, const void* local, std::size_t bytes, bool put) {
  slot.gpu.host_copy.resize(bytes);
  if (!put) {
    slot.rma.device = static_cast<std::byte*>(const_cast<void*>(local));
    return Status::ok();
  }
  return engine_.cuda()->copy(slot.gpu.host_copy.data(), local, bytes);
}

Request OneSided::iput(const void* local, std::size_t bytes, const RmaTarget& target) {
  const int local_gpu = bytes > 0 ? cuda::Cuda::device_of(engine_.cuda(), local) : -1;
  const bool local_device = local_gpu >= 0;
  if (std::byte* destination = peers_direct_.now(target, local, bytes, local_device, true)) {
    util::copy_large(destination, local, bytes);
    return engine_.completed_request();
  }
  Status early;
  std::uint32_t index = request(RequestKind::kSend, Rma::kPut, target, local, bytes, &early);
  Request request = engine_.request(index);
  if (settled(index, target, bytes, true, std::move(early),
              [&](std::byte* destination, bool device) {
                return move(destination, local, bytes, device || local_device);
              })) {
    return request;
  }
  if (peers_direct_.guarded(index, target, const_cast<void*>(local), bytes, true, local_gpu)) {
    return request;
  }
  if (native_.start(index, target, const_cast<void*>(local), bytes, true, local_device)) {
    return request;
  }
  RequestSlot& slot = engine_.requests()[index];
  slot.send_buffer = static_cast<const std::byte*>(local);
  if (local_device) {
    if (Status status = bounce(slot, local, bytes, true); !status) {
      engine_.complete(index,
                       Status(status.code(), "put: from device memory: " + status.message()));
      return request;
    }
    slot.send_buffer = slot.gpu.host_copy.data();
  }
  Pending pending = Links::stream(kAmPut, index, engine_.requests().wire_id(index), bytes);
  pending.region = target.region;
  pending.secret = target.secret;
  pending.region_offset = target.offset;
  engine_.links().send_or_queue(target.rank, std::move(pending));
  return request;
}

Request OneSided::iget(void* local, std::size_t bytes, const RmaTarget& target) {
  const int local_gpu = bytes > 0 ? cuda::Cuda::device_of(engine_.cuda(), local) : -1;
  const bool local_device = local_gpu >= 0;
  if (const std::byte* source = peers_direct_.now(target, local, bytes, local_device, false)) {
    util::copy(local, source, bytes);
    return engine_.completed_request();
  }
  Status early;
  std::uint32_t index = request(RequestKind::kRecv, Rma::kGet, target, local, bytes, &early);
  Request request = engine_.request(index);
  if (settled(index, target, bytes, false, std::move(early),
              [&](const std::byte* source, bool device) {
                return move(local, source, bytes, device || local_device);
              })) {
    return request;
  }
  if (peers_direct_.guarded(index, target, local, bytes, false, local_gpu)) return request;
  if (native_.start(index, target, local, bytes, false, local_device)) return request;
  RequestSlot& slot = engine_.requests()[index];
  slot.recv_buffer = static_cast<std::byte*>(local);
  if (local_device) {
    (void)bounce(slot, local, bytes, false);  // the copy to `local` runs at completion
    slot.recv_buffer = slot.gpu.host_copy.data();
  }
  slot.expected = slot.message_size = bytes;
  slot.info = {target.rank, 0, bytes};
  const GetHeader header{engine_.requests().wire_id(index), target.region, target.secret,
                         target.offset, bytes};
  engine_.links().send_control(target.rank, kAmGet, as_bytes(header));
  return request;
}

Request OneSided::iatomic(AtomicOp op, std::size_t width, const RmaTarget& target,
                          std::uint64_t operand, void* result, std::uint64_t compare) {
  // The result is stored by the CPU: it must be host memory (checked where CUDA is loaded).
  const bool result_device =
      result != nullptr && (cuda::Cuda::device_of(engine_.cuda(), result) >= 0);
  if ((width == 4 || width == 8) && target.offset % width == 0 &&
      static_cast<std::uint8_t>(op) <= 5 && !result_device) {
    std::byte* word = peers_direct_.now(target, &operand, width, false, true);
    if (word != nullptr && reinterpret_cast<std::uintptr_t>(word) % width == 0) {
      apply_atomic_at(word, op, width, operand, compare, result);
      return engine_.completed_request();
    }
  }
  Status early;
  const bool valid_width = width == 4 || width == 8;
  std::uint32_t index =
      request(RequestKind::kSend, Rma::kAtomic, target, &operand, valid_width ? width : 0, &early);
  Request request = engine_.request(index);
  if (early.is_ok() && !valid_width) {
    early = Status(Code::kInvalidArgument,
                   "atomic: width " + std::to_string(width) + " is not 4 or 8 bytes");
  } else if (early.is_ok() && target.offset % width != 0) {
    early = Status(Code::kInvalidArgument, "atomic: offset " + std::to_string(target.offset) +
                                               " is not aligned to " + std::to_string(width));
  } else if (early.is_ok() && static_cast<std::uint8_t>(op) > 5) {
    early = Status(Code::kInvalidArgument, "atomic: unknown operation");
  } else if (early.is_ok() && result_device) {
    early =
        Status(Code::kInvalidArgument, "atomic: the result must be in host memory (it is " +
                                           mem::to_string(engine_.cuda()->classify(result)) + ")");
  }
  const bool finished =
      settled(index, target, width, true, std::move(early), [&](std::byte* word, bool device) {
        if (reinterpret_cast<std::uintptr_t>(word) % width != 0) {
          return Status(Code::kInvalidArgument, refusal_text(kRmaBadAtomic, target.rank));
        }
        std::uint64_t previous = 0;
        Status status = atomic(word, device, op, width, operand, compare, &previous);
        if (status) store_result(result, width, previous);
        return status;
      });
  if (finished) return request;
  RequestSlot& slot = engine_.requests()[index];
  slot.rma.width = static_cast<std::uint8_t>(width);
  slot.rma.result = result;
  slot.rma.operands[0] = operand;  // the payload, kept in the slot (it never moves) until sent
  slot.rma.operands[1] = compare;
  AtomicHeader header{engine_.requests().wire_id(index),
                      target.region,
                      target.secret,
                      target.offset,
                      static_cast<std::uint8_t>(op),
                      static_cast<std::uint8_t>(width),
                      {}};
  Pending pending;
  pending.am = kAmAtomic;
  pending.header_size = sizeof(header);
  static_assert(sizeof(header) <= sizeof(pending.header));
  std::memcpy(pending.header.data(), &header, sizeof(header));
  pending.payload = reinterpret_cast<const std::byte*>(slot.rma.operands);
  pending.payload_size = 16;
  pending.request = index;  // failed if sending fails; completed by the target's answer
  engine_.links().send_or_queue(target.rank, std::move(pending));
  return request;
}

Status OneSided::flush(int rank) {
  if (rank < -1 || rank >= engine_.size()) {
    return Status(Code::kInvalidArgument,
                  "flush: rank " + std::to_string(rank) + " is not in the job");
  }
  auto outstanding = [&] {
    if (rank >= 0) return peers_[static_cast<std::size_t>(rank)].outstanding > 0;
    for (const PeerState& peer : peers_) {
      if (peer.outstanding > 0) return true;
    }
    return false;
  };
  if (!engine_.waiting().wait_until([&] { return !outstanding(); })) {
    return Status(Code::kTimeout, "flush: one-sided operations still incomplete after " +
                                      std::to_string(engine_.waiting().timeout()) +
                                      " s (FERRY_TIMEOUT)");
  }
  Status first;
  for (int r = 0; r < engine_.size(); ++r) {
    if (rank >= 0 && r != rank) continue;
    PeerState& peer = peers_[static_cast<std::size_t>(r)];
    if (!peer.error.is_ok() && first.is_ok()) first = peer.error;
    peer.error = Status();
  }
  if (first.is_ok() && rank >= 0 && engine_.links().link(rank).failed) {
    return Status(Code::kPeerFailed, engine_.links().link(rank).why);
  }
  return first;
}

void OneSided::on_acks(int source, std::span<const std::byte> data) {
  RmaAcksHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RMA_ACKS header");
  const auto acks = data.subspan(sizeof(header));
  if (header.count == 0 || header.count > kMaxAcksPerMessage ||
      acks.size() != std::size_t{header.count} * sizeof(RmaAckHeader)) {
    return protocol_error(source, "RMA_ACKS whose count does not match its length");
  }
  for (std::size_t i = 0; i < header.count && !engine_.links().link(source).failed; ++i) {
    on_ack(source, acks.subspan(i * sizeof(RmaAckHeader), sizeof(RmaAckHeader)));
  }
}

void OneSided::on_ack(int source, std::span<const std::byte> data) {
  RmaAckHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RMA_ACK header");
  std::uint32_t index = 0;
  RequestSlot* slot = engine_.requests().lookup(header.id, &index);
  if (slot == nullptr || slot->state != RequestState::kActive || slot->peer != source ||
      (slot->rma.kind != Rma::kPut && slot->rma.kind != Rma::kGet &&
       slot->rma.kind != Rma::kAtomic)) {
    // Also the later acknowledgements of a put that failed on an earlier fragment.
    FERRY_LOG(kDebug, "RMA_ACK from rank %d for no one-sided operation in progress", source);
    return;
  }
  if (header.code != kRmaOk) {
    if (header.code == kRmaNoRegion) native_.region_gone(source, slot->rma.region);
    return engine_.complete(index,
                            Status(Code::kInvalidArgument, refusal_text(header.code, source)));
  }
  switch (slot->rma.kind) {
    case Rma::kPut:
      if (header.value > slot->size - slot->received) {
        return protocol_error(source, "RMA_ACK for more bytes than the put has");
      }
      slot->received += header.value;
      if (slot->received == slot->size) engine_.complete(index, Status::ok());
      return;
    case Rma::kAtomic:
      store_result(slot->rma.result, slot->rma.width, header.value);
      return engine_.complete(index, Status::ok());
    default:  // a get is answered by fragments; an acknowledgement with code 0 is not expected
      return protocol_error(source, "RMA_ACK without a refusal for a get");
  }
}

}  // namespace ferry::proto::rma
