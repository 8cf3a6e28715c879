// Device buffers between processes that share memory (see device_path.hpp).
#include "proto/device_path.hpp"

#include <algorithm>
#include <array>
#include <cstring>

#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "util/copy.hpp"
#include "util/extent.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"

namespace ferry::proto {
namespace {

Status truncation_status(int source, std::size_t size, std::size_t capacity) {
  if (size <= capacity) return Status::ok();
  return Status(Code::kTruncated, "message of " + std::to_string(size) + " bytes from rank " +
                                      std::to_string(source) + " truncated to the " +
                                      std::to_string(capacity) + "-byte receive buffer");
}

}  // namespace

DevicePath::DevicePath(Engine& engine, const util::Config& config,
                       std::unique_ptr<util::FdMailbox> mailbox, std::string mailbox_why, int ranks)
    : engine_(engine),
      peers_(static_cast<std::size_t>(ranks)),
      ipc_split_(config.get_size(util::Var::kCudaIpcSplit)),
      stage_chunk_(config.get_size(util::Var::kCudaStageChunk)),
      stage_slots_(static_cast<std::size_t>(config.get_int(util::Var::kCudaStageSlots))),
      stage_cpu_part_(config.get_int(util::Var::kCudaStageCpuPart)),
      test_stage_open_fail_(config.get_bool(util::Var::kTestStageOpenFail)),
      mailbox_(std::move(mailbox)),
      mailbox_why_(std::move(mailbox_why)) {}

DevicePath::~DevicePath() = default;

bool DevicePath::on_am(std::uint8_t id, int source, std::span<const std::byte> data) {
  switch (id) {
    case kAmRtsDev:
      on_rts(source, data);
      return true;
    case kAmStageCts:
      on_stage_cts(source, data);
      return true;
    case kAmStageFrag:
      on_stage_frag(source, data);
      return true;
    case kAmStageAck:
      on_stage_ack(source, data);
      return true;
    case kAmStageWritten:
      on_stage_written(source, data);
      return true;
    default:
      return false;
  }
}

void DevicePath::forget_staged(std::uint32_t index, int peer) {
  std::erase(peers_[static_cast<std::size_t>(peer)].stage_streams, index);
}

bool DevicePath::withdraw_staged(std::uint32_t index, int peer, std::uint64_t stage_rreq) {
  std::deque<std::uint32_t>& streams = peers_[static_cast<std::size_t>(peer)].stage_streams;
  auto staged = std::find(streams.begin(), streams.end(), index);
  if (staged == streams.end()) return false;
  // Mid-staging: the receive is told; copies already issued finish before the buffer is free.
  streams.erase(staged);
  engine_.links().send_control(peer, kAmNack, as_bytes(NackHeader{stage_rreq}));
  return true;
}

void DevicePath::peer_failed(int rank, const Status& status) {
  PeerState& peer = peers_[static_cast<std::size_t>(rank)];
  for (std::uint32_t index : peer.stage_streams) engine_.complete_when_idle(index, status);
  peer.stage_streams.clear();
  if (cuda::Cuda* cuda = engine_.cuda()) cuda->forget_peer(rank);
  std::erase_if(descriptors_, [rank](const auto& entry) { return entry.first.first == rank; });
}

void DevicePath::close_rings() {
  for (PeerState& peer : peers_) {
    peer.ring_tx.reset();
    peer.ring_rx.reset();
  }
  std::lock_guard lock(rings_mutex_);
  ahead_.clear();
}

std::string DevicePath::describe(int rank) const {
  const PeerState& peer = peers_[static_cast<std::size_t>(rank)];
  std::string out = peer.ipc_legacy.refused
                        ? "host-staged (CUDA IPC refused: " + peer.ipc_legacy.why + ")"
                        : std::string("CUDA IPC (host-staged if refused)");
  out += peer.ipc_fd.refused
             ? "; cuMem allocations host-staged (" + peer.ipc_fd.why + ")"
             : std::string(mailbox_ ? "; cuMem allocations by descriptor passing"
                                    : "; cuMem allocations host-staged (" + mailbox_why_ + ")");
  if (peer.writes > 0) {
    out += "; page-locked host memory written into its device buffers by this GPU (" +
           std::to_string(peer.writes) + " messages)";
  }
  return out;
}

void DevicePath::send(std::uint32_t index, int destination, const mem::MemoryInfo& memory) {
  RequestSlot& slot = engine_.requests()[index];
  PeerState& peer = peers_[static_cast<std::size_t>(destination)];
  FERRY_LOG(kDebug, "send of %zu B to rank %d from %s (allocation %zu B, buffer id %llu)",
            slot.size, destination, mem::to_string(memory).c_str(),
            static_cast<std::size_t>(memory.extent),
            static_cast<unsigned long long>(memory.buffer_id));
  slot.gpu.device = memory.device;
  slot.rendezvous = true;
  RtsDevHeader header{slot.tag, slot.size, engine_.requests().wire_id(index), 0, 0};
  // Managed memory, allocations without a buffer id and cuMem allocations that cannot be shared
  // have no usable IPC handle: they go by host staging without changing the verdict for the peer.
  const bool exportable = memory.kind == mem::MemoryKind::kCudaDevice && memory.buffer_id != 0 &&
                          memory.ipc != mem::IpcKind::kNone;
  if (engine_.cuda_ipc() && exportable && !peer.verdict(memory.ipc).refused &&
      destination != engine_.rank()) {
    util::Fd descriptor;
    Status status =
        engine_.cuda()->export_ipc(slot.send_buffer, memory, &slot.gpu.key, &descriptor);
    if (status && memory.ipc == mem::IpcKind::kPosixFd) {
      // The descriptor goes first: it waits in the peer's mailbox when RTS_DEV arrives.
      status = mailbox_ ? mailbox_->send(destination, slot.gpu.key.buffer_id, descriptor.get())
                        : Status(Code::kUnsupported, mailbox_why_);
    }
    if (status) {
      header.flags |= kRtsHasKey;
    } else {
      refuse_ipc(destination, memory.ipc, "exporting the allocation failed: " + status.message());
    }
  }
  Pending pending;
  pending.request = index;
  pending.am = kAmRtsDev;
  pending.header_size = sizeof(RtsDevHeader);
  std::memcpy(pending.header.data(), &header, sizeof header);
  if ((header.flags & kRtsHasKey) != 0) {
    pending.payload = reinterpret_cast<const std::byte*>(&slot.gpu.key);  // a deque slot: stable
    pending.payload_size = sizeof(cuda::IpcKey);
  }
  engine_.links().send_or_queue(destination, std::move(pending));
}

void DevicePath::on_rts(int source, std::span<const std::byte> data) {
  RtsDevHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RTS_DEV header");
  if (header.size > util::kAddressSpaceEnd) {
    return protocol_error(source, "RTS_DEV for a message larger than any buffer can be");
  }
  cuda::IpcKey key;
  const bool has_key = (header.flags & kRtsHasKey) != 0;
  if (has_key) {
    if (data.size() != sizeof(header) + sizeof(key)) {
      return protocol_error(source, "RTS_DEV with a key of the wrong size");
    }
    std::memcpy(&key, data.data() + sizeof(header), sizeof(key));
  }
  if (std::optional<std::uint32_t> index = engine_.messages().match_posted(source, header.tag)) {
    start_receive(*index, source, header.tag, header.size, header.sreq, has_key ? &key : nullptr);
    return;
  }
  if (engine_.messages().finalizing())
    return engine_.messages().refuse_unmatched(source, header.sreq);
  Unexpected message =
      Messages::unexpected_rendezvous(source, header.tag, header.size, header.sreq);
  message.device = true;
  if (has_key) {
    message.data.resize(sizeof(key));
    std::memcpy(message.data.data(), &key, sizeof(key));
  }
  engine_.messages().add_unexpected(std::move(message));
}

void DevicePath::start_receive(std::uint32_t index, int source, Tag tag, std::size_t size,
                               std::uint64_t sreq, const cuda::IpcKey* key) {
  RequestSlot& slot = engine_.requests()[index];
  const std::size_t length = std::min(size, slot.size);
  slot.info = {source, tag, length};
  slot.message_size = size;
  if (length == 0) {
    engine_.complete(index, truncation_status(source, size, slot.size));
    engine_.links().send_control(source, kAmFin, as_bytes(FinHeader{sreq, 0, 0}));
    return;
  }
  PeerState& peer = peers_[static_cast<std::size_t>(source)];
  std::uint32_t flags = 0;
  // The GPU that copies from the sender's buffer: the receive buffer's, or for page-locked host
  // memory the one it is staged through. A pageable host buffer skips rung 1 (the sender fills
  // the ring, the CPU empties it).
  const int copier = slot.gpu.device >= 0 ? slot.gpu.device : slot.gpu.pinned_device;
  if (key != nullptr && copier >= 0) {
    // Rung 1.
    std::string refusal;
    if (key->kind != mem::IpcKind::kLegacy && key->kind != mem::IpcKind::kPosixFd) {
      protocol_error(source, "RTS_DEV key of an unknown kind (staged instead)");
      refusal = "the peer sent an IPC key of an unknown kind";
    } else if (peer.verdict(key->kind).refused) {
      refusal = peer.verdict(key->kind).why;
    } else if (key->offset + length > key->extent) {
      protocol_error(source, "RTS_DEV key does not cover the message (staged instead)");
      refusal = "the peer sent an IPC key that does not cover its message";
    }
    if (refusal.empty()) refusal = engine_.cuda()->ipc_refusal(key->uuid, copier);
    bool passing = false;  // this transfer only: IPC stays on for the peer
    if (refusal.empty()) {
      Status status = start_ipc_get(index, source, sreq, *key, copier);
      if (status || slot.transfer.device_ops > 0)
        return;  // copying (or failing once pieces are done)
      refusal = status.message();
      passing = status.code() == Code::kWouldBlock;
    }
    if (passing) {
      FERRY_LOG(kDebug, "receive from rank %d staged: %s", source, refusal.c_str());
    } else {
      refuse_ipc(source, key->kind, refusal);
      flags |= kStageIpcRefused;
    }
  } else if (key != nullptr && key->kind == mem::IpcKind::kPosixFd) {
    take_descriptor(source, key->buffer_id);  // not needed: a host receive buffer
  }
  start_staged_receive(index, source, sreq, flags);
}

Status DevicePath::start_ipc_get(std::uint32_t index, int source, std::uint64_t sreq,
                                 const cuda::IpcKey& key, int copier) {
  RequestSlot& slot = engine_.requests()[index];
  const std::size_t length = slot.info.bytes;
  void* mapped = nullptr;
  util::Fd descriptor;
  if (key.kind == mem::IpcKind::kPosixFd) descriptor = take_descriptor(source, key.buffer_id);
  Status status = engine_.cuda()->import_ipc(source, key, copier, &descriptor, &mapped);
  if (!status) return status;
  // FERRY_CUDA_IPC_SPLIT: large copies as up to 4 pieces on separate streams. Off by default:
  // on H200s over NVLink it lowered 4 MiB bandwidth from 288 to 177 GB/s.
  std::size_t pieces = 1;
  if (ipc_split_ > 0 && length >= ipc_split_) pieces = std::clamp<std::size_t>(length >> 20, 1, 4);
  const std::size_t piece = (length / pieces + 4095) & ~std::size_t{4095};
  slot.state = RequestState::kActive;
  const bool streaming = !ops_.empty();  // other copies in flight
  for (std::size_t offset = 0; offset < length && status; offset += piece) {
    const std::size_t bytes = std::min(piece, length - offset);
    DeviceOp op{DeviceOp::kIpcGet, {}, index, source, sreq, offset, 0, bytes, key, copier};
    std::byte* from = static_cast<std::byte*>(mapped) + offset;
    // Into page-locked host memory by the copy engine (device to host over the GPU's link); the
    // copy kernel writes only device memory.
    status =
        slot.gpu.device >= 0
            ? engine_.cuda()->copy_device_async(copier, next_lane_++, slot.recv_buffer + offset,
                                                from, bytes, streaming, &op.ticket)
            : engine_.cuda()->copy_async(copier, next_lane_++, slot.recv_buffer + offset, from,
                                         bytes, &op.ticket);
    if (status) {
      ++slot.transfer.device_ops;
      ops_.push_back(op);
    }
  }
  if (!status && slot.transfer.device_ops > 0) {
    // Some pieces are in flight: the receive ends with the error once they are done.
    engine_.complete_when_idle(index, status);
  } else if (!status) {
    engine_.cuda()->unpin(source, copier, key);
  }
  return status;
}

void DevicePath::start_staged_receive(std::uint32_t index, int source, std::uint64_t sreq,
                                      std::uint32_t flags) {
  RequestSlot& slot = engine_.requests()[index];
  slot.state = RequestState::kActive;
  slot.expected = slot.info.bytes;
  slot.received = 0;
  slot.gpu.stage_rreq = sreq;  // on a receive: the sender's request, for a FIN that fails it
  if (slot.gpu.offered) flags |= kStageHasKey;
  const StageCtsHeader header{sreq, engine_.requests().wire_id(index), slot.expected, flags, 0};
  Pending pending;
  pending.request = index;
  pending.am = kAmStageCts;
  pending.header_size = sizeof(header);
  std::memcpy(pending.header.data(), &header, sizeof header);
  if (slot.gpu.offered) {
    pending.payload = reinterpret_cast<const std::byte*>(&slot.gpu.key);  // a deque slot: stable
    pending.payload_size = sizeof(cuda::IpcKey);
  }
  engine_.links().send_or_queue(source, std::move(pending));
}

void DevicePath::start_host_receive(std::uint32_t index, int source, std::uint64_t sreq) {
  RequestSlot& slot = engine_.requests()[index];
  if (slot.gpu.device >= 0 && engine_.cuda_ipc() && source != engine_.rank() &&
      !peers_[static_cast<std::size_t>(source)].ipc_legacy.refused) {
    // Offered to a page-locked sender, which writes into it in one pass (the handle is cached
    // per allocation). cuMem allocations would need their descriptor passed: not offered.
    const mem::MemoryInfo memory = engine_.cuda()->classify(slot.recv_buffer);
    util::Fd none;
    slot.gpu.offered =
        memory.kind == mem::MemoryKind::kCudaDevice && memory.ipc == mem::IpcKind::kLegacy &&
        memory.buffer_id != 0 &&
        engine_.cuda()->export_ipc(slot.recv_buffer, memory, &slot.gpu.key, &none).is_ok();
  }
  start_staged_receive(index, source, sreq, 0);
}

bool DevicePath::start_ipc_put(std::uint32_t index, int source, std::uint64_t rreq,
                               std::size_t length, const cuda::IpcKey& key) {
  RequestSlot& slot = engine_.requests()[index];
  PeerState& peer = peers_[static_cast<std::size_t>(source)];
  const int copier = slot.gpu.pinned_device;
  if (copier < 0 || !engine_.cuda_ipc() || peer.ipc_legacy.refused) return false;
  if (key.kind != mem::IpcKind::kLegacy || key.offset > key.extent ||
      length > key.extent - key.offset) {
    protocol_error(source, "STAGE_CTS key does not cover the message (staged instead)");
    return false;
  }
  std::string refusal = engine_.cuda()->ipc_refusal(key.uuid, copier);
  void* mapped = nullptr;
  if (refusal.empty()) {
    util::Fd none;
    Status status = engine_.cuda()->import_ipc(source, key, copier, &none, &mapped);
    if (!status && status.code() == Code::kWouldBlock) return false;  // this message only
    if (!status) refusal = status.message();
  }
  if (!refusal.empty()) {
    refuse_ipc(source, mem::IpcKind::kLegacy, refusal);
    return false;
  }
  // Host to the peer's device in one copy-engine pass: PCIe in, NVLink out.
  DeviceOp op{DeviceOp::kIpcPut, {}, index, source, rreq, 0, 0, length, key, copier};
  Status status = engine_.cuda()->copy_async(copier, next_lane_++, mapped, slot.send_buffer, length,
                                             &op.ticket);
  if (!status) {
    engine_.cuda()->unpin(source, copier, key);
    FERRY_LOG(kDebug, "send to rank %d staged: %s", source, status.message().c_str());
    return false;
  }
  slot.rendezvous = false;
  slot.gpu.stage_rreq = rreq;
  ++slot.transfer.device_ops;
  ops_.push_back(op);
  ++peer.writes;
  return true;
}

void DevicePath::on_stage_cts(int source, std::span<const std::byte> data) {
  StageCtsHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short STAGE_CTS header");
  std::uint32_t index = 0;
  RequestSlot* slot = engine_.requests().lookup(header.sreq, &index);
  if (slot == nullptr || slot->kind != RequestKind::kSend || !slot->rendezvous ||
      slot->state != RequestState::kActive || slot->peer != source || header.length == 0 ||
      header.length > slot->size) {
    engine_.links().send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
    if (slot == nullptr) return;  // withdrawn after FERRY_TIMEOUT
    return protocol_error(source, "STAGE_CTS for no rendezvous send of that size");
  }
  PeerState& peer = peers_[static_cast<std::size_t>(source)];
  if ((header.flags & kStageHasKey) != 0) {
    cuda::IpcKey key;
    if (data.size() != sizeof(header) + sizeof(key)) {
      protocol_error(source, "STAGE_CTS with a key of the wrong size (staged instead)");
    } else {
      std::memcpy(&key, data.data() + sizeof(header), sizeof(key));
      if (start_ipc_put(index, source, header.rreq, header.length, key)) return;
    }
  }
  if ((header.flags & kStageIpcRefused) != 0) {
    refuse_ipc(
        source, slot->gpu.key.kind,
        "rank " + std::to_string(source) +
            (slot->gpu.key.kind == mem::IpcKind::kPosixFd ? " could not map our cuMem allocations"
                                                          : " could not open our IPC handles"));
  }
  if (!peer.ring_tx) {
    try {
      make_ring_tx(source);
    } catch (const Error& e) {
      slot->rendezvous = false;
      engine_.links().send_control(source, kAmNack, as_bytes(NackHeader{header.rreq}));
      engine_.complete(
          index, Status(e.code(), std::string("host staging to rank ") + std::to_string(source) +
                                      " impossible: " + e.what()));
      return;
    }
  }
  slot->rendezvous = false;
  slot->gpu.stage_rreq = header.rreq;
  slot->expected = header.length;  // bytes to stage
  slot->gpu.staged = 0;
  peer.stage_streams.push_back(index);
  pump_stage(source);
}

std::unique_ptr<cuda::StageRing> DevicePath::create_ring_tx(int peer_rank) const {
  return cuda::StageRing::create(
      engine_.cuda(), cuda::StageRing::name(engine_.job().job_id(), engine_.rank(), peer_rank),
      stage_chunk_ * stage_slots_);
}

std::unique_ptr<cuda::StageRing> DevicePath::open_ring_rx_now(int peer_rank) const {
  if (test_stage_open_fail_) {
    throw Error(Code::kIoError, "mapping refused (FERRY_TEST_STAGE_OPEN_FAIL)");
  }
  // At most what the largest allowed configuration makes (64 slots of 1 GiB).
  std::unique_ptr<cuda::StageRing> ring = cuda::StageRing::open(
      engine_.cuda(), cuda::StageRing::name(engine_.job().job_id(), peer_rank, engine_.rank()),
      std::size_t{64} << 30);
  ring->unlink();  // both sides have it now
  return ring;
}

// Under rings_mutex_ too, so that prepare_staging never makes a second ring of the same name (the
// receiver would map the one the sender does not write).
std::unique_ptr<cuda::StageRing> DevicePath::take_ring(int peer_rank, bool theirs) {
  std::lock_guard lock(rings_mutex_);
  Ahead& ahead = ahead_[peer_rank];
  (theirs ? ahead.rx_taken : ahead.tx_taken) = true;
  if (std::unique_ptr<cuda::StageRing>& made = theirs ? ahead.rx : ahead.tx; made) {
    return std::move(made);
  }
  return theirs ? open_ring_rx_now(peer_rank) : create_ring_tx(peer_rank);
}

void DevicePath::make_ring_tx(int peer_rank) {
  PeerState& peer = peers_[static_cast<std::size_t>(peer_rank)];
  peer.ring_tx = take_ring(peer_rank, false);
  peer.free_slots.clear();
  for (std::size_t i = stage_slots_; i-- > 0;) peer.free_slots.push_back(i * stage_chunk_);
}

void DevicePath::open_ring_rx(int peer_rank) {
  peers_[static_cast<std::size_t>(peer_rank)].ring_rx = take_ring(peer_rank, true);
}

void DevicePath::prepare_staging(int peer_rank, bool theirs) {
  if (peer_rank == engine_.rank()) return;
  std::lock_guard lock(rings_mutex_);
  Ahead& ahead = ahead_[peer_rank];
  try {
    if (!theirs && !ahead.tx_taken && !ahead.tx) ahead.tx = create_ring_tx(peer_rank);
    if (theirs && !ahead.rx_taken && !ahead.rx) ahead.rx = open_ring_rx_now(peer_rank);
  } catch (const Error& e) {
    // The first staged message tries again, and fails where this did.
    FERRY_LOG(kDebug, "staging ring with rank %d not made ahead: %s", peer_rank, e.what());
  }
}

void DevicePath::prepare_copies(int device) {
  cuda::Cuda* cuda = engine_.cuda();
  if (cuda == nullptr || device < 0) return;
  if (Status s = cuda->prepare_bounces(device, stage_chunk_); !s) {
    FERRY_LOG(kDebug, "device bounces on cuda:%d not made ahead: %s", device, s.message().c_str());
  }
}

void DevicePath::refuse_ipc(int peer_rank, mem::IpcKind kind, const std::string& why) {
  IpcVerdict& verdict = peers_[static_cast<std::size_t>(peer_rank)].verdict(kind);
  if (verdict.refused) return;
  verdict.refused = true;
  verdict.why = why;
  FERRY_LOG(kWarn, "%s with rank %d not possible (%s); such device data goes by host staging",
            kind == mem::IpcKind::kPosixFd ? "mapping cuMem allocations" : "CUDA IPC", peer_rank,
            why.c_str());
}

util::Fd DevicePath::take_descriptor(int source, std::uint64_t buffer_id) {
  constexpr std::size_t kMaxWaiting = 256;  // descriptors of messages not yet matched
  if (mailbox_) {
    std::vector<util::FdMailbox::Letter> letters;
    std::size_t rejected = 0;
    mailbox_->receive(&letters, &rejected);
    if (rejected > 0) FERRY_LOG(kWarn, "dropped %zu malformed descriptor message(s)", rejected);
    for (util::FdMailbox::Letter& letter : letters) {
      // Only from a rank of this job whose process the kernel vouches for.
      const bool known =
          letter.sender_rank >= 0 && letter.sender_rank < engine_.size() &&
          engine_.links().link(letter.sender_rank).endpoint != nullptr && letter.sender_pid != 0 &&
          engine_.links().link(letter.sender_rank).endpoint->peer_pid() == letter.sender_pid;
      if (!known) {
        FERRY_LOG(kWarn, "dropped a descriptor from pid %d claiming to be rank %d",
                  static_cast<int>(letter.sender_pid), letter.sender_rank);
        continue;
      }
      descriptors_.emplace_back(std::make_pair(letter.sender_rank, letter.tag),
                                std::move(letter.fd));
    }
    while (descriptors_.size() > kMaxWaiting) descriptors_.pop_front();
  }
  for (auto it = descriptors_.begin(); it != descriptors_.end(); ++it) {
    if (it->first == std::make_pair(source, buffer_id)) {
      util::Fd fd = std::move(it->second);
      descriptors_.erase(it);
      return fd;
    }
  }
  return {};
}

void DevicePath::pump_stage(int peer_rank) {
  PeerState& peer = peers_[static_cast<std::size_t>(peer_rank)];
  while (!peer.stage_streams.empty() && !peer.free_slots.empty()) {
    const std::uint32_t index = peer.stage_streams.front();
    RequestSlot& slot = engine_.requests()[index];
    const std::size_t offset = slot.gpu.staged;
    const std::size_t chunk = std::min(stage_chunk_, slot.expected - offset);
    const std::uint64_t ring_offset = peer.free_slots.back();
    std::byte* target = peer.ring_tx->data() + ring_offset;
    if (slot.gpu.device >= 0) {
      DeviceOp op{DeviceOp::kStageFill, {},    index, peer_rank, slot.gpu.stage_rreq, offset,
                  ring_offset,          chunk, {}};
      Status status = engine_.cuda()->copy_staged_async(
          slot.gpu.device, false, target, slot.send_buffer + offset, chunk, &op.ticket);
      if (!status) {
        peer.stage_streams.pop_front();
        engine_.links().send_control(peer_rank, kAmNack, as_bytes(NackHeader{slot.gpu.stage_rreq}));
        engine_.complete_when_idle(index, std::move(status));
        continue;
      }
      ++slot.transfer.device_ops;
      ops_.push_back(op);
    } else if (DeviceOp op{DeviceOp::kStageFill,
                           {},
                           index,
                           peer_rank,
                           slot.gpu.stage_rreq,
                           offset,
                           ring_offset,
                           chunk,
                           {}};
               slot.gpu.pinned_device >= 0 &&
               copy_pinned(slot.gpu.pinned_device, target, slot.send_buffer + offset, chunk,
                           &op.ticket)) {
      // Page-locked host memory: through this GPU at its copy engines' rate, not the CPU's.
      ++slot.transfer.device_ops;
      ops_.push_back(op);
    } else {
      util::copy(target, slot.send_buffer + offset, chunk);
      engine_.links().send_control(
          peer_rank, kAmStageFrag,
          as_bytes(StageFragHeader{slot.gpu.stage_rreq, offset, ring_offset, chunk}));
    }
    peer.free_slots.pop_back();
    slot.gpu.staged += chunk;
    engine_.crashes().here(util::CrashPoint::kMidPipeline);
    if (slot.gpu.staged == slot.expected) {
      peer.stage_streams.pop_front();
      engine_.complete_when_idle(index, Status::ok());
    }
  }
}

Status DevicePath::copy_pinned(int device, std::byte* dst, const std::byte* src, std::size_t bytes,
                               cuda::Ticket* ticket) {
  // Whole pages to the CPU, and only of slots large enough for the GPU's part to take as long.
  const std::size_t by_cpu =
      bytes >= (std::size_t{1} << 20)
          ? bytes / 100 * static_cast<std::size_t>(stage_cpu_part_) & ~std::size_t{4095}
          : 0;
  Status status =
      engine_.cuda()->copy_through_device_async(device, dst, src, bytes - by_cpu, ticket);
  if (status && by_cpu > 0) util::copy(dst + bytes - by_cpu, src + bytes - by_cpu, by_cpu);
  return status;
}

void DevicePath::on_stage_frag(int source, std::span<const std::byte> data) {
  StageFragHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short STAGE_FRAG header");
  std::uint32_t index = 0;
  RequestSlot* slot = engine_.requests().lookup(header.rreq, &index);
  if (slot == nullptr || slot->kind != RequestKind::kRecv || slot->state != RequestState::kActive ||
      slot->info.source != source || header.offset > slot->expected ||
      header.length > slot->expected - header.offset ||
      header.length > slot->expected - slot->received) {
    // Give the slot back all the same (the sender checks it lent it): a receive that already
    // failed must not leave the sender's ring short of slots.
    engine_.links().send_control(source, kAmStageAck, as_bytes(StageAckHeader{header.ring_offset}));
    return protocol_error(source, "staged fragment outside any receive in progress");
  }
  PeerState& peer = peers_[static_cast<std::size_t>(source)];
  if (!peer.ring_rx) {
    try {
      open_ring_rx(source);
    } catch (const Error& e) {
      // FIN first: the sender must learn of the failure before more slots come back to it.
      fail_staged_receive(index, Status(e.code(), std::string("host staging from rank ") +
                                                      std::to_string(source) + ": " + e.what()));
      engine_.links().send_control(source, kAmStageAck,
                                   as_bytes(StageAckHeader{header.ring_offset}));
      return;
    }
  }
  if (header.ring_offset > peer.ring_rx->size() ||
      header.length > peer.ring_rx->size() - header.ring_offset) {
    return protocol_error(source, "staged fragment outside the sender's ring");
  }
  const std::byte* from = peer.ring_rx->data() + header.ring_offset;
  if (slot->gpu.device >= 0) {
    DeviceOp op{DeviceOp::kStageDrain, {}, index, source, 0, header.offset, header.ring_offset,
                header.length,         {}};
    Status status = engine_.cuda()->copy_staged_async(
        slot->gpu.device, true, slot->recv_buffer + header.offset, from, header.length, &op.ticket);
    if (!status) {
      fail_staged_receive(index, std::move(status));
      engine_.links().send_control(source, kAmStageAck,
                                   as_bytes(StageAckHeader{header.ring_offset}));
      return;
    }
    ++slot->transfer.device_ops;
    ops_.push_back(op);
    return;
  }
  if (slot->gpu.pinned_device >= 0) {
    // Page-locked host memory: through this GPU (else, all bounces busy, by the CPU below).
    DeviceOp op{DeviceOp::kStageDrain, {}, index, source, 0, header.offset, header.ring_offset,
                header.length,         {}};
    if (copy_pinned(slot->gpu.pinned_device, slot->recv_buffer + header.offset, from, header.length,
                    &op.ticket)) {
      ++slot->transfer.device_ops;
      ops_.push_back(op);
      return;
    }
  }
  util::copy(slot->recv_buffer + header.offset, from, header.length);
  slot->received += header.length;
  engine_.links().send_control(source, kAmStageAck, as_bytes(StageAckHeader{header.ring_offset}));
  if (slot->received == slot->expected) {
    engine_.complete(index, truncation_status(source, slot->message_size, slot->size));
  }
}

void DevicePath::on_stage_written(int source, std::span<const std::byte> data) {
  StageWrittenHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short STAGE_WRITTEN header");
  std::uint32_t index = 0;
  RequestSlot* slot = engine_.requests().lookup(header.rreq, &index);
  if (slot == nullptr) return;  // the receive already ended (its failure told the sender)
  if (slot->kind != RequestKind::kRecv || slot->state != RequestState::kActive ||
      slot->info.source != source || !slot->gpu.offered || slot->received != 0 ||
      slot->transfer.device_ops != 0 || header.length != slot->expected) {
    return protocol_error(source, "STAGE_WRITTEN for no receive that offered its buffer");
  }
  slot->received = slot->expected;
  engine_.complete(index, truncation_status(source, slot->message_size, slot->size));
}

void DevicePath::fail_staged_receive(std::uint32_t index, Status status) {
  RequestSlot& slot = engine_.requests()[index];
  // The sender learns of it (FIN with a code) and stops: neither side waits for the other.
  engine_.links().send_control(slot.info.source, kAmFin,
                               as_bytes(FinHeader{slot.gpu.stage_rreq, kFinFailed, 0}));
  engine_.complete_when_idle(index, std::move(status));
}

void DevicePath::on_stage_ack(int source, std::span<const std::byte> data) {
  StageAckHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short STAGE_ACK header");
  PeerState& peer = peers_[static_cast<std::size_t>(source)];
  if (!peer.ring_tx || stage_chunk_ == 0 || header.ring_offset % stage_chunk_ != 0 ||
      header.ring_offset >= peer.ring_tx->size() ||
      std::find(peer.free_slots.begin(), peer.free_slots.end(), header.ring_offset) !=
          peer.free_slots.end() ||
      peer.free_slots.size() >= stage_slots_) {
    return protocol_error(source, "STAGE_ACK for a slot that is not in use");
  }
  peer.free_slots.push_back(header.ring_offset);
  pump_stage(source);
}

int DevicePath::poll() {
  int finished = 0;
  std::size_t keep = 0;
  // Streams seen busy in this pass, with the first sequence not done: a later one on the same
  // stream is not done either, and asking would read the stream's flag again.
  std::array<cuda::Ticket, 8> busy{};
  std::size_t busy_count = 0;
  auto known_busy = [&](const cuda::Ticket& ticket) {
    for (std::size_t b = 0; b < busy_count; ++b) {
      if (busy[b].stream == ticket.stream &&
          static_cast<std::int32_t>(ticket.sequence - busy[b].sequence) >= 0) {
        return true;
      }
    }
    return false;
  };
  for (std::size_t i = 0; i < ops_.size(); ++i) {
    DeviceOp& op = ops_[i];
    const bool skip = known_busy(op.ticket);
    if (skip || !engine_.cuda()->done(op.ticket)) {
      if (!skip && busy_count < busy.size()) busy[busy_count++] = op.ticket;
      ops_[keep++] = op;
      continue;
    }
    ++finished;
    RequestSlot& slot = engine_.requests()[op.request];
    --slot.transfer.device_ops;
    switch (op.kind) {
      case DeviceOp::kIpcGet:
        if (slot.transfer.device_ops > 0) continue;  // other pieces of the message still copying
        engine_.cuda()->unpin(op.peer, op.device, op.key);
        // A code tells the sender the receive failed (slot.transfer.deferred: an error waits).
        engine_.links().send_control(
            op.peer, kAmFin,
            as_bytes(FinHeader{op.wire, slot.transfer.deferred ? kFinFailed : kFinDone, 0}));
        if (!slot.transfer.deferred) {
          engine_.complete(op.request, truncation_status(op.peer, slot.message_size, slot.size));
          continue;
        }
        break;
      case DeviceOp::kStageFill:
        engine_.links().send_control(
            op.peer, kAmStageFrag,
            as_bytes(StageFragHeader{op.wire, op.offset, op.ring_offset, op.length}));
        break;
      case DeviceOp::kRmaCopy:
        engine_.cuda()->unpin(op.peer, op.device, op.key);
        engine_.rma().access_ended(op.peer);  // the owner may deregister now
        if (!slot.transfer.deferred) {
          engine_.complete(op.request, Status::ok());
          continue;
        }
        break;
      case DeviceOp::kIpcPut:
        engine_.cuda()->unpin(op.peer, op.device, op.key);
        if (!slot.transfer.deferred) {
          engine_.links().send_control(op.peer, kAmStageWritten,
                                       as_bytes(StageWrittenHeader{op.wire, op.length}));
          engine_.complete(op.request, Status::ok());
          continue;
        }
        break;
      case DeviceOp::kStageDrain:
        engine_.links().send_control(op.peer, kAmStageAck,
                                     as_bytes(StageAckHeader{op.ring_offset}));
        slot.received += op.length;
        if (!slot.transfer.deferred && slot.received == slot.expected &&
            slot.transfer.device_ops == 0) {
          engine_.complete(op.request, truncation_status(op.peer, slot.message_size, slot.size));
          continue;
        }
        break;
    }
    // A completion that waited for this buffer's copies (a failure, or a staged send).
    if (slot.transfer.deferred && slot.transfer.device_ops == 0 &&
        slot.state != RequestState::kDone) {
      slot.transfer.deferred = false;
      engine_.complete(op.request, slot.status);
    }
  }
  ops_.resize(keep);
  return finished;
}

void DevicePath::drain() {
  // Copies always finish: a GPU copy does not wait on a peer.
  while (!ops_.empty()) {
    poll();
    engine_.links().drain();
  }
}

}  // namespace ferry::proto
