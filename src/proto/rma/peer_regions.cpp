// Direct one-sided access to peers' memory on this node (see peer_regions.hpp).
#include "proto/rma/peer_regions.hpp"

#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include "proto/device_path.hpp"
#include "proto/engine.hpp"
#include "proto/rma/regions.hpp"
#include "util/cma.hpp"
#include "util/log.hpp"

namespace ferry::proto::rma {

std::byte* PeerRegions::target(const RmaTarget& target, std::size_t length, bool write,
                               std::uint32_t* refusal, bool* device) {
  *device = false;
  if (target.rank == engine_.rank()) {
    std::byte* base =
        own_.check(target.region, target.secret, target.offset, length, write, refusal, device);
    return base == nullptr ? nullptr : base + target.offset;
  }
  if (target.fd < 0) return nullptr;
  const Link& link = engine_.links().link(target.rank);
  if (!link.shares_memory || !peers_[static_cast<std::size_t>(target.rank)].map.empty()) {
    return nullptr;
  }
  const Mapping* mapped = map(target);
  if (mapped == nullptr) return nullptr;
  auto* header = reinterpret_cast<SharedHeader*>(mapped->mapping);
  if (load_live(header) == 0) {
    // Deregistered since: forget the mapping, and let the owner answer (it knows best why).
    ::munmap(mapped->mapping, mapped->mapping_length);
    mappings_.erase({target.rank, target.region});
    forget_last();
    return nullptr;
  }
  if (header->secret != target.secret) {  // mapped under this id by another key
    *refusal = kRmaBadKey;
    return nullptr;
  }
  // The size checked at map time, not the header's now: the owner could change that.
  if (target.offset > mapped->size || length > mapped->size - target.offset) {
    *refusal = kRmaOutOfRange;
    return nullptr;
  }
  last_direct_ = LastDirect{
      target.rank,  target.region, target.secret, mapped->size, mapped->mapping + kHeaderBytes,
      &header->live};
  return mapped->mapping + kHeaderBytes + target.offset;
}

std::byte* PeerRegions::now(const RmaTarget& target, const void* local, std::size_t bytes,
                            bool local_device, bool write) {
  if (bytes == 0 || local == nullptr || local_device || target.rank < 0 ||
      target.rank >= engine_.size() || target.offset > target.size ||
      bytes > target.size - target.offset) {
    return nullptr;
  }
  const Link& link = engine_.links().link(target.rank);
  if (link.endpoint == nullptr || link.failed) return nullptr;
  std::uint32_t refusal = kRmaOk;  // a refusal is reported by the request that follows
  bool device = false;
  std::byte* bytes_there = this->target(target, bytes, write, &refusal, &device);
  return device ? nullptr : bytes_there;
}

util::Fd PeerRegions::descriptor(int rank, int fd) {
  const Link& link = engine_.links().link(rank);
  std::string& refused = peers_[static_cast<std::size_t>(rank)].map;
  const int pid = link.endpoint != nullptr ? link.endpoint->peer_pid() : 0;
  if (pid <= 0) {
    refused = "its process id is unknown";
    return {};
  }
  util::Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) {
    refused = errno_text("pidfd_open");
    FERRY_LOG(kInfo, "rank %d's one-sided memory is reached by messages: %s", rank,
              refused.c_str());
    return {};
  }
  util::Fd taken(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), fd, 0)));
  if (!taken.valid() && errno != EBADF) {  // EBADF: closed, a stale key (the owner says so)
    refused = errno_text("pidfd_getfd");
    FERRY_LOG(kInfo, "rank %d's one-sided memory is reached by messages: %s", rank,
              refused.c_str());
  }
  return taken;
}

const PeerRegions::Mapping* PeerRegions::map(const RmaTarget& target) {
  if (last_mapping_ != nullptr && last_mapped_.first == target.rank &&
      last_mapped_.second == target.region) {
    return last_mapping_;  // the common case: the same region again
  }
  auto it = mappings_.find({target.rank, target.region});
  if (it != mappings_.end()) {
    last_mapped_ = it->first;
    return last_mapping_ = &it->second;
  }
  // Each mapping holds its region's memory: let go of those deregistered before taking more.
  sweep();
  util::Fd fd = descriptor(target.rank, target.fd);
  if (!fd.valid()) return nullptr;
  // The descriptor may now be anything the owner opened under that number: check it is the
  // region the key names before mapping all of it.
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::size_t>(st.st_size) < kHeaderBytes) {
    return nullptr;
  }
  void* head = ::mmap(nullptr, kHeaderBytes, PROT_READ, MAP_SHARED, fd.get(), 0);
  if (head == MAP_FAILED) return nullptr;
  const SharedHeader header = *static_cast<const SharedHeader*>(head);
  ::munmap(head, kHeaderBytes);
  if (header.magic != kSharedMagic || header.region != target.region ||
      header.secret != target.secret || header.size == 0 ||
      header.size > static_cast<std::size_t>(st.st_size) - kHeaderBytes) {
    return nullptr;
  }
  const std::size_t length = kHeaderBytes + page_round(header.size);
  if (length > static_cast<std::size_t>(st.st_size)) return nullptr;
  void* mapping = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapping == MAP_FAILED) return nullptr;
  return &(mappings_[{target.rank, target.region}] = {static_cast<std::byte*>(mapping), length,
                                                      header.size});
}

GuardTable* PeerRegions::guard_table(const RmaTarget& target) {
  auto it = guard_tables_.find(target.rank);
  if (it != guard_tables_.end()) return it->second;
  util::Fd fd = descriptor(target.rank, target.guard_fd);
  if (!fd.valid()) return nullptr;
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<std::size_t>(st.st_size) != sizeof(GuardTable)) {
    return nullptr;  // not the table: a stale or forged key
  }
  void* mapping =
      ::mmap(nullptr, sizeof(GuardTable), PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (mapping == MAP_FAILED) return nullptr;
  auto* table = static_cast<GuardTable*>(mapping);
  if (shared(table->magic).load(std::memory_order_acquire) != kGuardMagic ||
      table->pid != engine_.links().link(target.rank).endpoint->peer_pid()) {
    ::munmap(mapping, sizeof(GuardTable));
    return nullptr;
  }
  return guard_tables_[target.rank] = table;
}

bool PeerRegions::guarded(std::uint32_t index, const RmaTarget& target, void* local,
                          std::size_t bytes, bool put, int local_gpu) {
  const bool local_device = local_gpu >= 0;
  if (target.slot < 0 || target.slot >= kGuardSlots || target.guard_fd < 0 ||
      target.rank == engine_.rank()) {
    return false;
  }
  const Link& link = engine_.links().link(target.rank);
  Refused& refused = peers_[static_cast<std::size_t>(target.rank)];
  if (!link.shares_memory || !refused.map.empty() || link.endpoint == nullptr || link.failed) {
    return false;
  }
  if (guard_index_ == -2) {
    const std::vector<int> local_list = engine_.job().local_ranks();
    auto me = std::find(local_list.begin(), local_list.end(), engine_.rank());
    guard_index_ =
        me - local_list.begin() < kGuardRanks ? static_cast<int>(me - local_list.begin()) : -1;
  }
  if (guard_index_ < 0) return false;
  GuardTable* table = guard_table(target);
  if (table == nullptr) return false;
  GuardSlot& slot = table->slots[target.slot];
  GuardCounters& mine = table->counters[guard_index_];
  shared(mine.begun).fetch_add(1, std::memory_order_seq_cst);
  bool done = false;
  // The slot's fields stay as they are until the owner has waited for this access.
  if (shared(slot.live).load(std::memory_order_seq_cst) == 1 && slot.region == target.region &&
      slot.secret == target.secret && target.offset <= slot.size &&
      bytes <= slot.size - target.offset) {
    if (put && slot.read_only != 0) {
      // A key that hid the region's read-only mark: the owner's slot says so.
      shared(mine.ended).fetch_add(1, std::memory_order_release);
      engine_.complete(
          index, Status(Code::kInvalidArgument, "put: " + refusal_text(kRmaReadOnly, target.rank)));
      return true;
    }
    cuda::Cuda* cuda = engine_.cuda();
    if (slot.device < 0) {
      // Host memory by CMA, where the transport's probe found it allowed.
      if (!local_device && (link.zero_copy != nullptr) && refused.cma.empty()) {
        const int pid = link.endpoint->peer_pid();
        const std::uint64_t remote = slot.address + target.offset;
        Status moved = put ? util::cma_write(pid, remote, local, bytes)
                           : util::cma_read(pid, local, remote, bytes);
        if (moved) {
          done = true;
        } else if (moved.code() == Code::kUnsupported) {
          refused.cma = moved.message();
          FERRY_LOG(kInfo, "rank %d's registered memory is reached by messages: %s", target.rank,
                    refused.cma.c_str());
        } else {
          // This copy only (memory not mapped on either side, the owner gone, a transient
          // error): this access goes by messages, where the owner says what is wrong.
          FERRY_LOG(kDebug, "a direct %s to rank %d failed (%s); by messages this once",
                    put ? "put" : "get", target.rank, moved.message().c_str());
        }
      }
    } else if (cuda != nullptr && engine_.cuda_ipc() && refused.device.empty()) {
      // Device memory mapped by CUDA IPC, moved by a CUDA copy on the local buffer's GPU (for
      // host memory, on the region's own GPU where this process sees it: its copy engine moves
      // the data between the host and its memory; else the first), on its stream for this
      // peer: the request completes, and the access ends (`ended`), when the copy is seen done.
      cuda::IpcKey key = slot.ipc;
      key.offset += target.offset;
      const int device = local_device ? local_gpu : std::max(cuda->ordinal(key.uuid), 0);
      std::string why = cuda->ipc_refusal(key.uuid, device);
      util::Fd descriptor;
      // The owner's descriptor of a cuMem allocation only for a first mapping (the cache knows
      // the allocation by its id, which a freed and remade one does not share).
      if (why.empty() && key.kind == mem::IpcKind::kPosixFd &&
          !cuda->ipc_cached(target.rank, key, device)) {
        descriptor = this->descriptor(target.rank, slot.ipc_fd);
        if (!descriptor.valid()) why = "its allocation's descriptor could not be taken";
      }
      void* mapped = nullptr;
      Status moved = why.empty() ? cuda->import_ipc(target.rank, key, device, &descriptor, &mapped)
                                 : Status(Code::kUnsupported, why);
      if (moved) {
        // By the GPU the mapping was made for: a cuMem import is mapped for that one only.
        DeviceOp op{DeviceOp::kRmaCopy, {}, index, target.rank};
        moved = put ? cuda->copy_async(device, target.rank, mapped, local, bytes, &op.ticket)
                    : cuda->copy_async(device, target.rank, local, mapped, bytes, &op.ticket);
        if (moved) {
          op.key = key;
          op.device = device;
          engine_.device().add(op);
          RequestSlot& request = engine_.requests()[index];
          ++request.transfer.device_ops;
          if (!put) request.info = {target.rank, 0, bytes};  // found by a peer's failure
          return true;  // still inside the access: `ended` follows the copy
        }
        cuda->unpin(target.rank, device, key);
      }
      refused.device = moved.message();
      FERRY_LOG(kInfo, "rank %d's registered device memory is reached by messages: %s", target.rank,
                refused.device.c_str());
    }
  }
  shared(mine.ended).fetch_add(1, std::memory_order_release);
  if (done) engine_.complete(index, Status::ok());
  return done;
}

void PeerRegions::access_ended(int rank) {
  auto table = guard_tables_.find(rank);
  if (table == guard_tables_.end() || guard_index_ < 0) return;  // unmapped: the peer is gone
  shared(table->second->counters[guard_index_].ended).fetch_add(1, std::memory_order_release);
}

void PeerRegions::sweep() {
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    if (load_live(reinterpret_cast<SharedHeader*>(it->second.mapping)) != 0) {
      ++it;
      continue;
    }
    forget_last();  // it may be the one accessed last
    ::munmap(it->second.mapping, it->second.mapping_length);
    it = mappings_.erase(it);
  }
}

void PeerRegions::unmap(int rank) {
  forget_last();
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    if (rank >= 0 && it->first.first != rank) {
      ++it;
      continue;
    }
    ::munmap(it->second.mapping, it->second.mapping_length);
    it = mappings_.erase(it);
  }
  for (auto it = guard_tables_.begin(); it != guard_tables_.end();) {
    if (rank >= 0 && it->first != rank) {
      ++it;
      continue;
    }
    ::munmap(it->second, sizeof(GuardTable));
    it = guard_tables_.erase(it);
  }
}

std::string PeerRegions::refusals(int rank) const {
  const Refused& refused = peers_[static_cast<std::size_t>(rank)];
  std::string out;
  if (!refused.map.empty()) out += "allocated regions by messages (" + refused.map + ")";
  if (!refused.cma.empty()) {
    out += std::string(out.empty() ? "" : "; ") + "registered memory by messages (" + refused.cma +
           ")";
  }
  if (!refused.device.empty()) {
    out += std::string(out.empty() ? "" : "; ") + "registered device memory by messages (" +
           refused.device + ")";
  }
  return out;
}

}  // namespace ferry::proto::rma
