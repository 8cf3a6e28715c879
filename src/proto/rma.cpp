// One-sided operations by active messages: the owner of a region applies every put, get and
// atomic in its own progress, after checking the key and the range against its table of regions.
// Works over every transport (self, shm, ofi) and needs nothing from them but ordered messages.
//
//   put:    PUT(id, region, secret, offset) + bytes, per fragment  ->  RMA_ACK(id, bytes)
//   get:    GET(id, region, secret, offset, length)  ->  FRAG(id, ...) stream, or RMA_ACK(refusal)
//   atomic: ATOMIC(id, region, secret, offset, op, width) + operand, compare  ->  RMA_ACK(old)
//
// A request completes when the target says the operation is done (puts count the acknowledged
// bytes); the per-peer count of incomplete operations is what flush waits for.
//
// Memory from allocate_memory is a memfd: a header page (SharedHeader), then the caller's bytes.
// A rank on the same node takes the descriptor with pidfd_getfd (the permission CMA needs),
// maps it, checks the header against the key, and from then on accesses it directly: copies and
// CPU atomics, complete at once. The owner clears `live` before it unmaps, and every direct access
// looks at it first, so a deregistered region is refused; a store racing with the
// deregistration lands in memory nobody else uses any more (the mapping keeps it), never in the
// owner's.
//
// Registered memory (the caller's own) is reached by peers on the node through the owner's guard
// table, a memfd they map like allocated memory: a slot per region says where it is (an address
// for CMA, or a CUDA IPC handle) and whether it is live, and each accessing rank has two counters.
// An access adds one to its `begun`, checks the slot, copies once (process_vm_writev/readv, or a
// CUDA copy waited for), then adds one to its `ended`. Deregistration clears `live`, then waits
// until every rank's `ended` reaches the `begun` it read afterwards. Both sides order their write
// before their read (sequentially consistent), so an access either sees `live` cleared or is
// waited for: none lands after deregister returns, and the slot is reused only then.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>

#include "mem/fault_guard.hpp"
#include "mem/host_access.hpp"
#include "proto/engine.hpp"
#include "proto/wire.hpp"
#include "util/clock.hpp"
#include "util/cma.hpp"
#include "util/copy.hpp"
#include "util/extent.hpp"
#include "util/log.hpp"

namespace ferry::proto {
namespace {

using Rma = RequestSlot::Rma;

struct SharedHeader {
  std::uint64_t magic;
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t size;
  std::uint32_t live;  // 1 while registered (read and written through std::atomic_ref)
};
constexpr std::uint64_t kSharedMagic = 0x46455252594d4d31;  // "FERRYMM1"
constexpr std::size_t kHeaderBytes = 4096;

constexpr std::uint64_t kGuardMagic = 0x3154475952524546;  // "FERRYGT1"
constexpr int kGuardSlots = 1024;
constexpr int kGuardRanks = 256;  // accessing ranks of the node, by their place in local_ranks()

struct alignas(64) GuardCounters {
  std::uint64_t begun;
  std::uint64_t ended;
};

struct GuardSlot {
  std::uint32_t live;   // 1 while registered (std::atomic_ref)
  std::int32_t device;  // -1: host memory, at `address` in the owner (CMA); else device memory
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t size;
  std::uint64_t address;
  std::int32_t ipc_fd;      // device memory exported as a descriptor: the owner's number; else -1
  std::uint32_t read_only;  // 1: registered from read-only memory (gets only)
  cuda::IpcKey ipc;         // device memory: the allocation, offset at the region's start
};

template <typename T>
std::atomic_ref<T> shared(T& word) {
  return std::atomic_ref<T>(word);
}

std::size_t page_round(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

std::uint32_t load_live(SharedHeader* header) {
  return std::atomic_ref<std::uint32_t>(header->live).load(std::memory_order_acquire);
}

// An atomic's previous value, as the caller's uint32_t or uint64_t.
void store_result(void* result, std::size_t width, std::uint64_t previous) {
  if (result == nullptr) return;
  if (width == 4) {
    const auto value = static_cast<std::uint32_t>(previous);
    std::memcpy(result, &value, 4);
  } else {
    std::memcpy(result, &previous, 8);
  }
}

std::string errno_text(const char* call) { return std::string(call) + ": " + std::strerror(errno); }

std::string refusal_text(std::uint32_t code, int target) {
  const std::string who = "rank " + std::to_string(target);
  switch (code) {
    case kRmaNoRegion:
      return who + " has no such memory region (deregistered, or the key is not one of its own)";
    case kRmaBadKey:
      return who + " refused the key: it does not match the region (stale or corrupt key)";
    case kRmaOutOfRange:
      return who + " refused the access: it reaches outside the region";
    case kRmaBadAtomic:
      return who + " refused the atomic: unknown operation, width not 4 or 8, or misaligned";
    case kRmaCutShort:
      return who + " deregistered the region while answering the get";
    case kRmaDeviceCopy:
      return who + " could not copy to or from the region's device memory (its log says why)";
    case kRmaNotNative:
      return who + " has not registered the region with the network transport";
    case kRmaReadOnly:
      return who + " registered the region from memory it cannot write: only gets may use it";
    case kRmaUnmapped:
      return who +
             "'s memory behind the region is no longer mapped (it was freed or unmapped "
             "without being deregistered)";
    default:
      return who + " refused the operation with unknown code " + std::to_string(code);
  }
}

template <typename T>
T apply_atomic(std::byte* word, AtomicOp op, T operand, T compare) {
  std::atomic_ref<T> ref(*reinterpret_cast<T*>(word));
  switch (op) {
    case AtomicOp::kAdd:
      return ref.fetch_add(operand);
    case AtomicOp::kSwap:
      return ref.exchange(operand);
    case AtomicOp::kCompareSwap:
      ref.compare_exchange_strong(compare, operand);
      return compare;  // the previous value either way
    case AtomicOp::kAnd:
      return ref.fetch_and(operand);
    case AtomicOp::kOr:
      return ref.fetch_or(operand);
    case AtomicOp::kXor:
      return ref.fetch_xor(operand);
  }
  return 0;
}

// The atomic on a 4- or 8-byte word; returns the word's previous value.
std::uint64_t atomic_at(std::byte* word, AtomicOp op, std::size_t width, std::uint64_t operand,
                        std::uint64_t compare) {
  return width == 4 ? apply_atomic<std::uint32_t>(word, op, static_cast<std::uint32_t>(operand),
                                                  static_cast<std::uint32_t>(compare))
                    : apply_atomic<std::uint64_t>(word, op, operand, compare);
}

// The same, its previous value stored where the caller asked.
void apply_atomic_at(std::byte* word, AtomicOp op, std::size_t width, std::uint64_t operand,
                     std::uint64_t compare, void* result) {
  store_result(result, width, atomic_at(word, op, width, operand, compare));
}

}  // namespace

struct Engine::GuardTable {
  std::uint64_t magic;
  std::int32_t pid;
  std::uint32_t reserved;
  GuardCounters counters[kGuardRanks];
  GuardSlot slots[kGuardSlots];
};

Status Engine::make_guard() {
  if (guard_ != nullptr) return Status::ok();
  util::Fd memfd(::memfd_create("ferry-rma-guard", MFD_CLOEXEC));
  if (!memfd.valid()) return Status(Code::kNoResources, errno_text("memfd_create"));
  if (::ftruncate(memfd.get(), sizeof(GuardTable)) != 0 ||
      ::posix_fallocate(memfd.get(), 0, sizeof(GuardTable)) != 0) {
    return Status(Code::kNoResources, "cannot reserve the guard table's " +
                                          std::to_string(sizeof(GuardTable)) + " bytes");
  }
  void* mapping =
      ::mmap(nullptr, sizeof(GuardTable), PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (mapping == MAP_FAILED) return Status(Code::kNoResources, errno_text("mmap"));
  guard_ = static_cast<GuardTable*>(mapping);  // zeroed: no slot live, every counter 0
  guard_->pid = static_cast<std::int32_t>(::getpid());
  shared(guard_->magic).store(kGuardMagic, std::memory_order_release);
  guard_fd_ = memfd.release();
  for (int slot = kGuardSlots - 1; slot >= 0; --slot) guard_free_.push_back(slot);
  return Status::ok();
}

void Engine::release_guard() {
  if (guard_ == nullptr) return;
  ::munmap(guard_, sizeof(GuardTable));
  ::close(guard_fd_);
  guard_ = nullptr;
  guard_fd_ = -1;
  guard_free_.clear();
}

void Engine::guard_region(Region* region, std::uint64_t id, const mem::MemoryInfo& info) {
  if (local_ranks().size() < 2) return;  // no peer on this node
  cuda::IpcKey ipc;
  util::Fd exported;
  if (region->device >= 0) {
    if (!cuda_ipc_) return;
    if (Status status = cuda_->export_ipc(region->base, info, &ipc, &exported); !status) {
      FERRY_LOG(kDebug, "device region %llu is reached through its owner: %s",
                static_cast<unsigned long long>(id), status.message().c_str());
      return;
    }
  }
  if (Status status = make_guard(); !status) {
    FERRY_LOG(kInfo, "registered memory is reached through its owner: guard table: %s",
              status.message().c_str());
    return;
  }
  if (guard_free_.empty()) return;  // kGuardSlots regions at once: the rest by messages
  region->slot = guard_free_.back();
  guard_free_.pop_back();
  GuardSlot& slot = guard_->slots[region->slot];
  slot.device = region->device;
  slot.region = id;
  slot.secret = region->secret;
  slot.size = region->size;
  slot.address = reinterpret_cast<std::uint64_t>(region->base);
  slot.ipc = ipc;
  slot.ipc_fd = exported.valid() ? exported.get() : -1;
  slot.read_only = region->read_only ? 1 : 0;
  region->ipc_fd = exported.release();
  shared(slot.live).store(1, std::memory_order_release);
}

Status Engine::release_guard_slot(int index, int ipc_fd) {
  GuardSlot& slot = guard_->slots[index];
  shared(slot.live).store(0, std::memory_order_seq_cst);
  const std::vector<int> local = local_ranks();
  const std::size_t ranks = std::min<std::size_t>(local.size(), kGuardRanks);
  // The accesses begun before the slot was cleared (later ones see it cleared and give up).
  std::vector<std::uint64_t> begun(ranks);
  for (std::size_t i = 0; i < ranks; ++i) {
    begun[i] = shared(guard_->counters[i].begun).load(std::memory_order_seq_cst);
  }
  std::size_t inside = 0;  // the first rank that may still be inside one
  const bool reusable = wait_until([&] {
    for (; inside < ranks; ++inside) {
      const int rank = local[inside];
      if (rank == rank_ || peers_[static_cast<std::size_t>(rank)].failed) continue;
      if (shared(guard_->counters[inside].ended).load(std::memory_order_acquire) < begun[inside]) {
        return false;
      }
    }
    return true;
  });
  if (!reusable) {
    FERRY_LOG(kWarn,
              "deregister: rank %d has been inside an access to region %llu for %g s "
              "(FERRY_TIMEOUT); it may still write to the memory",
              local[inside], static_cast<unsigned long long>(slot.region), timeout_);
  }
  if (ipc_fd >= 0) ::close(ipc_fd);
  if (reusable) guard_free_.push_back(index);  // else lost: that rank may still use it
  return reusable ? Status::ok()
                  : Status(Code::kTimeout,
                           "deregister: a rank on this node was still inside an access to the "
                           "region after FERRY_TIMEOUT; it may still write to the memory");
}

Status Engine::register_region(void* address, std::size_t bytes, std::uint64_t* id,
                               std::uint64_t* secret, RegionAccess* access) {
  if (address == nullptr || bytes == 0) {
    return Status(Code::kInvalidArgument, "register_memory: null address or zero bytes");
  }
  if (Status bad = util::check_extent("register_memory", "range", address, bytes); !bad) {
    return bad;
  }
  int device = -1;
  mem::MemoryInfo info;
  if (cuda_) {
    info = cuda_->classify(address);
    if (info.device_only()) {
      // Reached by CUDA copies, which stay inside one allocation.
      const auto start = reinterpret_cast<std::uint64_t>(address);
      if (info.extent != 0 && (start < info.base || bytes > info.base + info.extent - start)) {
        return Status(Code::kInvalidArgument, "register_memory: " + std::to_string(bytes) +
                                                  " bytes at " + mem::to_string(info) +
                                                  " address " + std::to_string(start) +
                                                  " reach past the end of its allocation (" +
                                                  std::to_string(info.extent) + " bytes)");
      }
      device = info.device < 0 ? 0 : info.device;
    }
  }
  // The application's host memory: peers' puts and gets must find it there, and only puts into
  // memory the owner can write (read-only memory exposes data for gets).
  bool read_only = false;
  if (device < 0 && access != nullptr) {
    if (!mem::install_fault_handler()) {
      return Status(Code::kInternal,
                    "register_memory: the fault handler that keeps peers' "
                    "accesses from ending this process could not be installed");
    }
    std::string why;
    switch (mem::host_access(address, bytes, &why)) {
      case mem::HostAccess::kUnmapped:
        return Status(Code::kInvalidArgument, "register_memory: " + why);
      case mem::HostAccess::kReadOnly:
        read_only = true;
        break;
      case mem::HostAccess::kReadWrite:
        break;
    }
  }
  std::uint64_t key = 0;
  while (key == 0) key = secrets_();
  *id = next_region_++;
  *secret = key;
  Region region{static_cast<std::byte*>(address), bytes, key};
  region.device = device;
  region.user_host = device < 0 && access != nullptr;
  region.read_only = read_only;
  if (access != nullptr) {
    *access = RegionAccess{};
    guard_region(&region, *id, info);
    if (region.slot >= 0) {
      access->guard_fd = guard_fd_;
      access->slot = region.slot;
    }
    access->native = native_rma_ != nullptr && device < 0;
    access->read_only = read_only;
  }
  regions_.emplace(*id, region);
  return Status::ok();
}

bool Engine::register_native(Region* region, std::uint64_t id) {
  if (region->native != nullptr) return true;
  if (native_rma_ == nullptr || region->device >= 0 || region->native_failed) return false;
  // The secret is the key asked for where the provider takes one: a key forged or gone stale is
  // then also the provider's to refuse.
  Status status =
      native_rma_->register_region(region->base, region->size, region->secret, !region->read_only,
                                   &region->native_remote, &region->native);
  if (!status) {
    region->native_failed = true;
    FERRY_LOG(kInfo, "region %llu is reached by other nodes through its owner: %s",
              static_cast<unsigned long long>(id), status.message().c_str());
    return false;
  }
  return true;
}

Status Engine::allocate_region(std::size_t bytes, void** address, std::uint64_t* id,
                               std::uint64_t* secret, int* fd, RegionAccess* access) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "allocate_memory: zero bytes");
  if (bytes > (std::size_t{1} << 46)) {
    return Status(Code::kInvalidArgument, "allocate_memory: " + std::to_string(bytes) +
                                              " bytes is more than this machine can map");
  }
  const std::size_t length = kHeaderBytes + page_round(bytes);
  util::Fd memfd(::memfd_create("ferry-rma", MFD_CLOEXEC));
  if (!memfd.valid())
    return Status(Code::kNoResources, errno_text("allocate_memory: memfd_create"));
  // Reserved now, so a full memory or tmpfs limit is this error, not a SIGBUS on first touch.
  if (::ftruncate(memfd.get(), static_cast<off_t>(length)) != 0 ||
      ::posix_fallocate(memfd.get(), 0, static_cast<off_t>(length)) != 0) {
    return Status(Code::kNoResources, "allocate_memory: cannot reserve " + std::to_string(length) +
                                          " bytes of shared memory");
  }
  void* mapping = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (mapping == MAP_FAILED) return Status(Code::kNoResources, errno_text("allocate_memory: mmap"));
  // Peers on this node map it whole (no guard slot); other nodes may reach it natively.
  Status status =
      register_region(static_cast<std::byte*>(mapping) + kHeaderBytes, bytes, id, secret);
  if (!status) {
    ::munmap(mapping, length);
    return status;
  }
  auto* header = static_cast<SharedHeader*>(mapping);
  header->magic = kSharedMagic;
  header->region = *id;
  header->secret = *secret;
  header->size = bytes;
  std::atomic_ref<std::uint32_t>(header->live).store(1, std::memory_order_release);
  Region& region = regions_.at(*id);
  *access = RegionAccess{};
  access->native = native_rma_ != nullptr;
  region.fd = memfd.release();
  region.mapping = static_cast<std::byte*>(mapping);
  region.mapping_length = length;
  *address = region.base;
  *fd = region.fd;
  return Status::ok();
}

Status Engine::deregister_region(std::uint64_t id) {
  auto found = regions_.find(id);
  if (found == regions_.end()) {
    return Status(Code::kInvalidArgument, "deregister: no memory region " + std::to_string(id));
  }
  Status waited;
  if (found->second.native != nullptr) {
    // The ranks granted native access stop first; then the registration closes.
    waited = revoke_native(id);
    found = regions_.find(id);
    if (found == regions_.end()) return waited;
    native_rma_->release_region(std::exchange(found->second.native, nullptr));
  }
  if (found->second.slot >= 0) {
    // Waiting lets other threads in (and their registrations move the table): look it up again.
    const int slot = std::exchange(found->second.slot, -1);
    Status released = release_guard_slot(slot, std::exchange(found->second.ipc_fd, -1));
    if (waited.is_ok()) waited = std::move(released);
    found = regions_.find(id);
    if (found == regions_.end()) return waited;
  }
  if (found->second.fd >= 0) {
    // Peers that mapped it see `live` cleared before their next access; the memory itself goes
    // when the last mapping does.
    const Region& r = found->second;
    std::atomic_ref<std::uint32_t>(reinterpret_cast<SharedHeader*>(r.mapping)->live)
        .store(0, std::memory_order_release);
    ::munmap(r.mapping, r.mapping_length);
    ::close(r.fd);
  }
  regions_.erase(found);
  // Answers to gets still queued from it would read memory the caller is about to release: cut
  // them short, and tell their initiators (after the fragments already sent, so in order).
  std::vector<std::pair<int, std::uint64_t>> cut;
  for (int rank = 0; rank < size_; ++rank) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    std::erase_if(peer.pending, [&](const Pending& pending) {
      if (pending.stream == UINT32_MAX) return false;
      RequestSlot& slot = requests_[pending.stream];
      if (slot.rma != Rma::kGetReply || slot.rma_region != id) return false;
      cut.emplace_back(rank, pending.rreq);
      complete(pending.stream, Status(Code::kCanceled, "region deregistered"));
      return true;
    });
  }
  for (const auto& [rank, rreq] : cut) {
    send_control(rank, kAmRmaAck, as_bytes(RmaAckHeader{rreq, 0, kRmaCutShort, 0}));
  }
  return waited;
}

std::byte* Engine::rma_check(std::uint64_t region, std::uint64_t secret, std::uint64_t offset,
                             std::uint64_t length, bool write, std::uint32_t* refusal,
                             bool* device) {
  auto it = regions_.find(region);
  if (it == regions_.end()) {
    *refusal = kRmaNoRegion;
    return nullptr;
  }
  const Region& r = it->second;
  if (r.secret != secret) {
    *refusal = kRmaBadKey;
    return nullptr;
  }
  if (offset > r.size || length > r.size - offset) {
    *refusal = kRmaOutOfRange;
    return nullptr;
  }
  if (write && r.read_only) {
    *refusal = kRmaReadOnly;
    return nullptr;
  }
  *device = r.device >= 0;
  return r.base;
}

Status Engine::rma_move(void* destination, const void* source, std::size_t bytes, bool device) {
  if (!device) {
    util::copy(destination, source, bytes);
    return Status::ok();
  }
  return cuda_->copy(destination, source, bytes);
}

Status Engine::rma_atomic(std::byte* word, bool device, AtomicOp op, std::size_t width,
                          std::uint64_t operand, std::uint64_t compare, std::uint64_t* previous) {
  if (!device) {
    *previous = atomic_at(word, op, width, operand, compare);
    return Status::ok();
  }
  alignas(8) std::byte copy[8];
  Status status = cuda_->copy(copy, word, width);
  if (!status) return status;
  *previous = atomic_at(copy, op, width, operand, compare);
  return cuda_->copy(word, copy, width);
}

Status Engine::rma_bounce(RequestSlot& slot, const void* local, std::size_t bytes, bool put) {
  slot.host_copy.resize(bytes);
  if (!put) {
    slot.rma_device = static_cast<std::byte*>(const_cast<void*>(local));
    return Status::ok();
  }
  return cuda_->copy(slot.host_copy.data(), local, bytes);
}

std::byte* Engine::direct_target(const RmaTarget& target, std::size_t length, bool write,
                                 std::uint32_t* refusal, bool* device) {
  *device = false;
  if (target.rank == rank_) {
    std::byte* base =
        rma_check(target.region, target.secret, target.offset, length, write, refusal, device);
    return base == nullptr ? nullptr : base + target.offset;
  }
  if (target.fd < 0) return nullptr;
  Peer& peer = peers_[static_cast<std::size_t>(target.rank)];
  if (!peer.shares_memory || !peer.map_refused.empty()) return nullptr;
  const Mapping* mapped = map_peer_region(target, peer);
  if (mapped == nullptr) return nullptr;
  auto* header = reinterpret_cast<SharedHeader*>(mapped->mapping);
  if (load_live(header) == 0) {
    // Deregistered since: forget the mapping, and let the owner answer (it knows best why).
    ::munmap(mapped->mapping, mapped->mapping_length);
    mappings_.erase({target.rank, target.region});
    forget_last_mapping();
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

util::Fd Engine::peer_descriptor(int rank, Peer& peer, int fd) {
  const int pid = peer.endpoint != nullptr ? peer.endpoint->peer_pid() : 0;
  if (pid <= 0) {
    peer.map_refused = "its process id is unknown";
    return {};
  }
  util::Fd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd.valid()) {
    peer.map_refused = errno_text("pidfd_open");
    FERRY_LOG(kInfo, "rank %d's one-sided memory is reached by messages: %s", rank,
              peer.map_refused.c_str());
    return {};
  }
  util::Fd taken(static_cast<int>(::syscall(SYS_pidfd_getfd, pidfd.get(), fd, 0)));
  if (!taken.valid() && errno != EBADF) {  // EBADF: closed, a stale key (the owner says so)
    peer.map_refused = errno_text("pidfd_getfd");
    FERRY_LOG(kInfo, "rank %d's one-sided memory is reached by messages: %s", rank,
              peer.map_refused.c_str());
  }
  return taken;
}

const Engine::Mapping* Engine::map_peer_region(const RmaTarget& target, Peer& peer) {
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
  sweep_mappings();
  util::Fd fd = peer_descriptor(target.rank, peer, target.fd);
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

Engine::GuardTable* Engine::peer_guard(const RmaTarget& target, Peer& peer) {
  auto it = peer_guards_.find(target.rank);
  if (it != peer_guards_.end()) return it->second;
  util::Fd fd = peer_descriptor(target.rank, peer, target.guard_fd);
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
      table->pid != peer.endpoint->peer_pid()) {
    ::munmap(mapping, sizeof(GuardTable));
    return nullptr;
  }
  return peer_guards_[target.rank] = table;
}

bool Engine::guarded_access(std::uint32_t index, const RmaTarget& target, void* local,
                            std::size_t bytes, bool put, int local_gpu) {
  const bool local_device = local_gpu >= 0;
  if (target.slot < 0 || target.slot >= kGuardSlots || target.guard_fd < 0 ||
      target.rank == rank_) {
    return false;
  }
  Peer& peer = peers_[static_cast<std::size_t>(target.rank)];
  if (!peer.shares_memory || !peer.map_refused.empty() || peer.endpoint == nullptr || peer.failed) {
    return false;
  }
  if (guard_index_ == -2) {
    const std::vector<int> local_list = local_ranks();
    auto me = std::find(local_list.begin(), local_list.end(), rank_);
    guard_index_ =
        me - local_list.begin() < kGuardRanks ? static_cast<int>(me - local_list.begin()) : -1;
  }
  if (guard_index_ < 0) return false;
  GuardTable* table = peer_guard(target, peer);
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
      complete(index,
               Status(Code::kInvalidArgument, "put: " + refusal_text(kRmaReadOnly, target.rank)));
      return true;
    }
    if (slot.device < 0) {
      // Host memory by CMA, where the transport's probe found it allowed.
      if (!local_device && peer.endpoint->has_get() && peer.cma_rma_refused.empty()) {
        const int pid = peer.endpoint->peer_pid();
        const std::uint64_t remote = slot.address + target.offset;
        Status moved = put ? util::cma_write(pid, remote, local, bytes)
                           : util::cma_read(pid, local, remote, bytes);
        if (moved) {
          done = true;
        } else if (moved.code() == Code::kUnsupported) {
          peer.cma_rma_refused = moved.message();
          FERRY_LOG(kInfo, "rank %d's registered memory is reached by messages: %s", target.rank,
                    peer.cma_rma_refused.c_str());
        } else {
          // This copy only (memory not mapped on either side, the owner gone, a transient
          // error): this access goes by messages, where the owner says what is wrong.
          FERRY_LOG(kDebug, "a direct %s to rank %d failed (%s); by messages this once",
                    put ? "put" : "get", target.rank, moved.message().c_str());
        }
      }
    } else if (cuda_ && cuda_ipc_ && peer.device_rma_refused.empty()) {
      // Device memory mapped by CUDA IPC, moved by a CUDA copy on the local buffer's GPU (for
      // host memory, on the region's own GPU where this process sees it: its copy engine moves
      // the data between the host and its memory; else the first), on its stream for this
      // peer: the request completes, and the access ends (`ended`), when poll_device_ops sees
      // the copy done.
      cuda::IpcKey key = slot.ipc;
      key.offset += target.offset;
      const int device = local_device ? local_gpu : std::max(cuda_->ordinal(key.uuid), 0);
      std::string refused = cuda_->ipc_refusal(key.uuid, device);
      util::Fd descriptor;
      // The owner's descriptor of a cuMem allocation only for a first mapping (the cache knows
      // the allocation by its id, which a freed and remade one does not share).
      if (refused.empty() && key.kind == mem::IpcKind::kPosixFd &&
          !cuda_->ipc_cached(target.rank, key, device)) {
        descriptor = peer_descriptor(target.rank, peer, slot.ipc_fd);
        if (!descriptor.valid()) refused = "its allocation's descriptor could not be taken";
      }
      void* mapped = nullptr;
      Status moved = refused.empty()
                         ? cuda_->import_ipc(target.rank, key, device, &descriptor, &mapped)
                         : Status(Code::kUnsupported, refused);
      if (moved) {
        // By the GPU the mapping was made for: a cuMem import is mapped for that one only.
        DeviceOp op{DeviceOp::kRmaCopy, {}, index, target.rank};
        moved = put ? cuda_->copy_async(device, target.rank, mapped, local, bytes, &op.ticket)
                    : cuda_->copy_async(device, target.rank, local, mapped, bytes, &op.ticket);
        if (moved) {
          op.key = key;
          op.device = device;
          device_ops_.push_back(op);
          RequestSlot& request = requests_[index];
          ++request.device_ops;
          if (!put) request.info = {target.rank, 0, bytes};  // found by a peer's failure
          return true;  // still inside the access: `ended` follows the copy
        }
        cuda_->unpin(target.rank, device, key);
      }
      peer.device_rma_refused = moved.message();
      FERRY_LOG(kInfo, "rank %d's registered device memory is reached by messages: %s", target.rank,
                peer.device_rma_refused.c_str());
    }
  }
  shared(mine.ended).fetch_add(1, std::memory_order_release);
  if (done) complete(index, Status::ok());
  return done;
}

void Engine::end_guarded_access(int rank) {
  auto table = peer_guards_.find(rank);
  if (table == peer_guards_.end() || guard_index_ < 0) return;  // unmapped: the peer is gone
  shared(table->second->counters[guard_index_].ended).fetch_add(1, std::memory_order_release);
}

bool Engine::native_access(std::uint32_t index, const RmaTarget& target, void* local,
                           std::size_t bytes, bool put, bool local_device) {
  if (!target.native || local_device) return false;
  Peer& peer = peers_[static_cast<std::size_t>(target.rank)];
  if (!peer.endpoint->has_native_rma() || !peer.native_rma_refused.empty()) return false;
  auto [entry, first] = native_grants_.try_emplace({target.rank, target.region});
  NativeGrant& grant = entry->second;
  if (!first && grant.state == NativeGrant::State::kRefused && grant.secret != target.secret) {
    grant = NativeGrant{};  // another key after a refused one (forged first, then the real one)
    first = true;
  }
  if (first) {
    // This access goes by messages; the owner's answer decides the next ones.
    grant.secret = target.secret;
    send_control(target.rank, kAmNativeAsk,
                 as_bytes(NativeAskHeader{target.region, target.secret}));
    return false;
  }
  // Another key for the region (forged, or the region's slot came back) goes by messages, as
  // does an access outside what the owner granted.
  if (grant.state != NativeGrant::State::kGranted || grant.secret != target.secret ||
      target.offset > grant.size || bytes > grant.size - target.offset) {
    return false;
  }
  const transport::Endpoint::RemoteRegion remote{grant.region.address + target.offset,
                                                 grant.region.key};
  const std::uint64_t cookie = requests_.wire_id(index);
  Status started = put ? peer.endpoint->write_direct(local, bytes, remote, cookie)
                       : peer.endpoint->read_direct(local, bytes, remote, cookie);
  if (!started) {
    if (started.code() == Code::kPeerFailed) {
      complete(index, std::move(started));
      return true;
    }
    peer.native_rma_refused = started.message();
    FERRY_LOG(kWarn, "%s: a one-sided %s to rank %d failed to start (%s); by messages from now on",
              peer.transport.c_str(), put ? "write" : "read", target.rank,
              started.to_string().c_str());
    return false;
  }
  ++grant.in_flight;
  RequestSlot& slot = requests_[index];
  slot.direct = true;
  slot.rma_native = true;
  slot.rma_region = target.region;
  slot.message_size = bytes;
  if (!put) slot.info = {target.rank, 0, bytes};  // (a peer's failure finds gets by their source)
  ++slot.device_ops;                              // the buffer is the transport's until on_direct
  return true;
}

void Engine::native_done(int rank, std::uint64_t region) {
  auto entry = native_grants_.find({rank, region});
  if (entry == native_grants_.end() || entry->second.in_flight == 0) return;
  if (--entry->second.in_flight > 0 || entry->second.state != NativeGrant::State::kRevoked) return;
  native_grants_.erase(entry);
  send_control(rank, kAmNativeRevoked, as_bytes(NativeRevokeHeader{region}));
}

Status Engine::revoke_native(std::uint64_t id) {
  std::vector<int> ranks = std::move(regions_.at(id).native_ranks);
  std::erase_if(ranks, [&](int rank) { return peers_[static_cast<std::size_t>(rank)].failed; });
  if (ranks.empty()) return Status::ok();
  for (int rank : ranks) send_control(rank, kAmNativeRevoke, as_bytes(NativeRevokeHeader{id}));
  revoking_[id] = std::move(ranks);
  const bool answered = wait_until([&] {
    // Waiting lets other threads in: look the entry up again.
    std::vector<int>& waiting = revoking_[id];
    std::erase_if(waiting, [&](int rank) { return peers_[static_cast<std::size_t>(rank)].failed; });
    return waiting.empty();
  });
  Status status;
  if (!answered) {
    status = Status(Code::kTimeout,
                    "deregister: rank " + std::to_string(revoking_[id].front()) +
                        " has not confirmed after FERRY_TIMEOUT that its network accesses to the "
                        "region ended (it has not called ferry since); the registration is "
                        "closed anyway, and an access still arriving is refused by the provider");
  }
  revoking_.erase(id);
  return status;
}

void Engine::handle_native_ask(int source, std::span<const std::byte> data) {
  NativeAskHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_ASK header");
  NativeGrantHeader grant{header.region, header.secret, 0, 0, 0, kRmaOk, 0};
  auto it = regions_.find(header.region);
  // A region whose grants are being revoked (deregister) gives no more.
  if (it == regions_.end() || revoking_.contains(header.region)) {
    grant.code = kRmaNoRegion;
  } else if (it->second.secret != header.secret) {
    grant.code = kRmaBadKey;
  } else if (it->second.user_host && !mem::still_mapped(it->second.base, it->second.size)) {
    grant.code = kRmaUnmapped;  // the provider would write into whatever comes there next
  } else if (!register_native(&it->second, header.region)) {
    grant.code = kRmaNotNative;
  } else {
    Region& region = it->second;
    grant.address = region.native_remote.address;
    grant.key = region.native_remote.key;
    grant.size = region.size;
    if (std::find(region.native_ranks.begin(), region.native_ranks.end(), source) ==
        region.native_ranks.end()) {
      region.native_ranks.push_back(source);
    }
  }
  send_control(source, kAmNativeGrant, as_bytes(grant));
}

void Engine::handle_native_grant(int source, std::span<const std::byte> data) {
  NativeGrantHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_GRANT header");
  auto entry = native_grants_.find({source, header.region});
  if (entry == native_grants_.end() || entry->second.state != NativeGrant::State::kAsked ||
      entry->second.secret != header.secret) {
    return protocol_error(source, "NATIVE_GRANT for no region asked about");
  }
  NativeGrant& grant = entry->second;
  if (header.code != kRmaOk) {
    // Accesses through this key keep going by messages, which report what is wrong.
    grant.state = NativeGrant::State::kRefused;
    FERRY_LOG(kDebug, "native access to region %llu of rank %d refused: %s",
              static_cast<unsigned long long>(header.region), source,
              refusal_text(header.code, source).c_str());
    return;
  }
  grant.state = NativeGrant::State::kGranted;
  grant.region = {header.address, header.key};
  grant.size = header.size;
}

void Engine::handle_native_revoke(int source, std::span<const std::byte> data) {
  NativeRevokeHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_REVOKE header");
  auto entry = native_grants_.find({source, header.region});
  if (entry != native_grants_.end()) {
    entry->second.state = NativeGrant::State::kRevoked;
    if (entry->second.in_flight > 0) return;  // answered by native_done
    native_grants_.erase(entry);
  }
  send_control(source, kAmNativeRevoked, as_bytes(header));
}

void Engine::handle_native_revoked(int source, std::span<const std::byte> data) {
  NativeRevokeHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short NATIVE_REVOKED header");
  auto waiting = revoking_.find(header.region);
  if (waiting == revoking_.end()) {
    return protocol_error(source, "NATIVE_REVOKED for no region being deregistered");
  }
  std::erase(waiting->second, source);
}

void Engine::sweep_mappings() {
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    if (load_live(reinterpret_cast<SharedHeader*>(it->second.mapping)) != 0) {
      ++it;
      continue;
    }
    forget_last_mapping();  // it may be the one accessed last
    ::munmap(it->second.mapping, it->second.mapping_length);
    it = mappings_.erase(it);
  }
}

void Engine::unmap_peer_regions(int rank) {
  forget_last_mapping();
  for (auto it = mappings_.begin(); it != mappings_.end();) {
    if (rank >= 0 && it->first.first != rank) {
      ++it;
      continue;
    }
    ::munmap(it->second.mapping, it->second.mapping_length);
    it = mappings_.erase(it);
  }
  for (auto it = peer_guards_.begin(); it != peer_guards_.end();) {
    if (rank >= 0 && it->first != rank) {
      ++it;
      continue;
    }
    ::munmap(it->second, sizeof(GuardTable));
    it = peer_guards_.erase(it);
  }
}

std::uint32_t Engine::rma_request(RequestKind kind, Rma rma, const RmaTarget& target,
                                  const void* local, std::size_t bytes, Status* early) {
  std::uint32_t index = requests_.allocate(kind);
  RequestSlot& slot = requests_[index];
  slot.rma = rma;
  slot.peer = target.rank;
  slot.size = bytes;
  if (kind == RequestKind::kSend) ++outstanding_sends_;
  const char* what = rma == Rma::kPut ? "put" : rma == Rma::kGet ? "get" : "atomic";
  if (target.rank < 0 || target.rank >= size_) {
    *early = Status(Code::kInvalidArgument, std::string(what) + ": the key names rank " +
                                                std::to_string(target.rank) + ", not in [0, " +
                                                std::to_string(size_) + ")");
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
    Peer& peer = peers_[static_cast<std::size_t>(target.rank)];
    if (peer.endpoint == nullptr || peer.failed) {
      *early = Status(peer.failed ? Code::kPeerFailed : Code::kUnsupported, peer.why);
    } else {
      ++peer.rma_outstanding;
      slot.rma_region = target.region;
      return index;
    }
  }
  slot.rma = Rma::kNone;  // never counted
  return index;
}

void Engine::rma_done(const RequestSlot& slot, const Status& status) {
  if (slot.rma == Rma::kGetReply) return;
  Peer& peer = peers_[static_cast<std::size_t>(slot.peer)];
  --peer.rma_outstanding;
  if (!status && peer.rma_error.is_ok()) peer.rma_error = status;
}

template <typename Apply>
bool Engine::rma_settled(std::uint32_t index, const RmaTarget& target, std::size_t length,
                         bool write, Status early, Apply apply) {
  if (!early.is_ok() || length == 0) {
    complete(index, std::move(early));
    return true;
  }
  std::uint32_t refusal = kRmaOk;
  bool device = false;
  if (std::byte* bytes = direct_target(target, length, write, &refusal, &device)) {
    complete(index, apply(bytes, device));
    return true;
  }
  if (refusal != kRmaOk) {
    complete(index, Status(Code::kInvalidArgument, refusal_text(refusal, target.rank)));
    return true;
  }
  return false;
}

std::byte* Engine::direct_now(const RmaTarget& target, const void* local, std::size_t bytes,
                              bool local_device, bool write) {
  if (bytes == 0 || local == nullptr || local_device || target.rank < 0 || target.rank >= size_ ||
      target.offset > target.size || bytes > target.size - target.offset) {
    return nullptr;
  }
  const Peer& peer = peers_[static_cast<std::size_t>(target.rank)];
  if (peer.endpoint == nullptr || peer.failed) return nullptr;
  std::uint32_t refusal = kRmaOk;  // a refusal is reported by the request that follows
  bool device = false;
  std::byte* bytes_there = direct_target(target, bytes, write, &refusal, &device);
  return device ? nullptr : bytes_there;
}

Request Engine::iput(const void* local, std::size_t bytes, const RmaTarget& target) {
  const int local_gpu = bytes > 0 ? device_of(local) : -1;
  const bool local_device = local_gpu >= 0;
  if (std::byte* destination = direct_now(target, local, bytes, local_device, true)) {
    util::copy_large(destination, local, bytes);
    return Request(this, Request::kDone);
  }
  Status early;
  std::uint32_t index = rma_request(RequestKind::kSend, Rma::kPut, target, local, bytes, &early);
  Request request(this, index);
  if (rma_settled(index, target, bytes, true, std::move(early),
                  [&](std::byte* destination, bool device) {
                    return rma_move(destination, local, bytes, device || local_device);
                  })) {
    return request;
  }
  if (guarded_access(index, target, const_cast<void*>(local), bytes, true, local_gpu)) {
    return request;
  }
  if (native_access(index, target, const_cast<void*>(local), bytes, true, local_device)) {
    return request;
  }
  RequestSlot& slot = requests_[index];
  slot.send_buffer = static_cast<const std::byte*>(local);
  if (local_device) {
    if (Status status = rma_bounce(slot, local, bytes, true); !status) {
      complete(index, Status(status.code(), "put: from device memory: " + status.message()));
      return request;
    }
    slot.send_buffer = slot.host_copy.data();
  }
  Pending pending = stream(kAmPut, index, requests_.wire_id(index), bytes);
  pending.region = target.region;
  pending.secret = target.secret;
  pending.region_offset = target.offset;
  send_or_queue(target.rank, std::move(pending));
  return request;
}

Request Engine::iget(void* local, std::size_t bytes, const RmaTarget& target) {
  const int local_gpu = bytes > 0 ? device_of(local) : -1;
  const bool local_device = local_gpu >= 0;
  if (const std::byte* source = direct_now(target, local, bytes, local_device, false)) {
    util::copy(local, source, bytes);
    return Request(this, Request::kDone);
  }
  Status early;
  std::uint32_t index = rma_request(RequestKind::kRecv, Rma::kGet, target, local, bytes, &early);
  Request request(this, index);
  if (rma_settled(index, target, bytes, false, std::move(early),
                  [&](const std::byte* source, bool device) {
                    return rma_move(local, source, bytes, device || local_device);
                  })) {
    return request;
  }
  if (guarded_access(index, target, local, bytes, false, local_gpu)) return request;
  if (native_access(index, target, local, bytes, false, local_device)) return request;
  RequestSlot& slot = requests_[index];
  slot.recv_buffer = static_cast<std::byte*>(local);
  if (local_device) {
    (void)rma_bounce(slot, local, bytes, false);  // the copy to `local` runs at completion
    slot.recv_buffer = slot.host_copy.data();
  }
  slot.expected = slot.message_size = bytes;
  slot.info = {target.rank, 0, bytes};
  const GetHeader header{requests_.wire_id(index), target.region, target.secret, target.offset,
                         bytes};
  send_control(target.rank, kAmGet, as_bytes(header));
  return request;
}

bool Engine::atomic_again(AtomicOp op, std::size_t width, int rank, std::uint64_t region,
                          std::uint64_t secret, std::size_t key_size, std::uint64_t offset,
                          std::uint64_t operand, void* result, std::uint64_t compare) {
  if ((width != 4 && width != 8) || offset % width != 0 || static_cast<std::uint8_t>(op) > 5 ||
      (result != nullptr && device_memory(result))) {
    return false;
  }
  std::byte* word = direct_again(rank, region, secret, key_size, offset, &operand, width);
  if (word == nullptr || reinterpret_cast<std::uintptr_t>(word) % width != 0) return false;
  apply_atomic_at(word, op, width, operand, compare, result);
  return true;
}

Request Engine::iatomic(AtomicOp op, std::size_t width, const RmaTarget& target,
                        std::uint64_t operand, void* result, std::uint64_t compare) {
  // The result is stored by the CPU: it must be host memory (checked where CUDA is loaded).
  const bool result_device = result != nullptr && device_memory(result);
  if ((width == 4 || width == 8) && target.offset % width == 0 &&
      static_cast<std::uint8_t>(op) <= 5 && !result_device) {
    std::byte* word = direct_now(target, &operand, width, false, true);
    if (word != nullptr && reinterpret_cast<std::uintptr_t>(word) % width == 0) {
      apply_atomic_at(word, op, width, operand, compare, result);
      return Request(this, Request::kDone);
    }
  }
  Status early;
  const bool valid_width = width == 4 || width == 8;
  std::uint32_t index = rma_request(RequestKind::kSend, Rma::kAtomic, target, &operand,
                                    valid_width ? width : 0, &early);
  Request request(this, index);
  if (early.is_ok() && !valid_width) {
    early = Status(Code::kInvalidArgument,
                   "atomic: width " + std::to_string(width) + " is not 4 or 8 bytes");
  } else if (early.is_ok() && target.offset % width != 0) {
    early = Status(Code::kInvalidArgument, "atomic: offset " + std::to_string(target.offset) +
                                               " is not aligned to " + std::to_string(width));
  } else if (early.is_ok() && static_cast<std::uint8_t>(op) > 5) {
    early = Status(Code::kInvalidArgument, "atomic: unknown operation");
  } else if (early.is_ok() && result_device) {
    early = Status(Code::kInvalidArgument, "atomic: the result must be in host memory (it is " +
                                               mem::to_string(cuda_->classify(result)) + ")");
  }
  const bool settled =
      rma_settled(index, target, width, true, std::move(early), [&](std::byte* word, bool device) {
        if (reinterpret_cast<std::uintptr_t>(word) % width != 0) {
          return Status(Code::kInvalidArgument, refusal_text(kRmaBadAtomic, target.rank));
        }
        std::uint64_t previous = 0;
        Status status = rma_atomic(word, device, op, width, operand, compare, &previous);
        if (status) store_result(result, width, previous);
        return status;
      });
  if (settled) return request;
  RequestSlot& slot = requests_[index];
  slot.rma_width = static_cast<std::uint8_t>(width);
  slot.rma_result = result;
  slot.rma_operands[0] = operand;  // the payload, kept in the slot (it never moves) until sent
  slot.rma_operands[1] = compare;
  AtomicHeader header{requests_.wire_id(index),
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
  pending.payload = reinterpret_cast<const std::byte*>(slot.rma_operands);
  pending.payload_size = 16;
  pending.request = index;  // failed if sending fails; completed by the target's answer
  send_or_queue(target.rank, std::move(pending));
  return request;
}

Status Engine::flush(int rank) {
  if (rank < -1 || rank >= size_) {
    return Status(Code::kInvalidArgument,
                  "flush: rank " + std::to_string(rank) + " is not in the job");
  }
  auto outstanding = [&] {
    if (rank >= 0) return peers_[static_cast<std::size_t>(rank)].rma_outstanding > 0;
    for (const Peer& peer : peers_) {
      if (peer.rma_outstanding > 0) return true;
    }
    return false;
  };
  if (!wait_until([&] { return !outstanding(); })) {
    return Status(Code::kTimeout, "flush: one-sided operations still incomplete after " +
                                      std::to_string(timeout_) + " s (FERRY_TIMEOUT)");
  }
  Status first;
  for (int r = 0; r < size_; ++r) {
    if (rank >= 0 && r != rank) continue;
    Peer& peer = peers_[static_cast<std::size_t>(r)];
    if (!peer.rma_error.is_ok() && first.is_ok()) first = peer.rma_error;
    peer.rma_error = Status();
  }
  if (first.is_ok() && rank >= 0 && peers_[static_cast<std::size_t>(rank)].failed) {
    return Status(Code::kPeerFailed, peers_[static_cast<std::size_t>(rank)].why);
  }
  return first;
}

void Engine::rma_ack(int peer, std::uint64_t id, std::uint64_t value, std::uint32_t code) {
  std::vector<RmaAckHeader>& acks = peers_[static_cast<std::size_t>(peer)].acks;
  if (acks.empty()) ack_peers_.push_back(peer);
  acks.push_back(RmaAckHeader{id, value, code, 0});
}

// A window of atomics or put fragments from one peer is mostly handled in one pass; answering
// it with one message instead of one each halves the messages of a window over the network
// (docs/PERFORMANCE.md, "Atomics over tcp"). A lone answer keeps its own message, and answers
// that cannot go at once are queued one by one, in order.
int Engine::send_acks() {
  int sent = 0;
  for (int rank : ack_peers_) {
    Peer& peer = peers_[static_cast<std::size_t>(rank)];
    std::span<const RmaAckHeader> acks = peer.acks;
    const std::size_t room = peer.frag_size > sizeof(RmaAcksHeader)
                                 ? (peer.frag_size - sizeof(RmaAcksHeader)) / sizeof(RmaAckHeader)
                                 : 1;
    const std::size_t most = std::clamp<std::size_t>(room, 1, kMaxAcksPerMessage);
    while (!acks.empty() && !peer.failed) {
      const std::size_t count = std::min(acks.size(), most);
      const auto batch = acks.first(count);
      acks = acks.subspan(count);
      // Together where there are several and nothing is queued before them; otherwise (or
      // when the transport has no room now) each goes as its own kAmRmaAck, queued in order.
      Status status(Code::kWouldBlock);
      if (count > 1 && peer.pending.empty()) {
        const RmaAcksHeader header{static_cast<std::uint32_t>(count), 0};
        status = peer.endpoint->am_send(kAmRmaAcks, as_bytes(header), std::as_bytes(batch),
                                        transport::AmHint::kNone);
      }
      if (status.code() == Code::kWouldBlock) {
        for (const RmaAckHeader& ack : batch) send_control(rank, kAmRmaAck, as_bytes(ack));
        peer.ack_messages += count;
      } else if (status) {
        ++peer.ack_messages;
      } else if (status.code() != Code::kPeerFailed) {
        FERRY_LOG(kError, "%s: %zu one-sided answers lost: %s", peer.transport.c_str(), count,
                  status.to_string().c_str());
      }
      peer.acks_sent += count;
      ++sent;
    }
    peer.acks.clear();
  }
  ack_peers_.clear();
  return sent;
}

void Engine::handle_put(int source, std::span<const std::byte> data) {
  PutHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short PUT header");
  auto payload = data.subspan(sizeof(header));
  std::uint32_t refusal = kRmaOk;
  bool device = false;
  std::byte* base = rma_check(header.region, header.secret, header.offset, payload.size(), true,
                              &refusal, &device);
  if (base != nullptr && rma_region(header.region)->user_host) {
    // The application's memory, which it may have unmapped or made read-only since: a write
    // that cannot land is the initiator's error, not a fault here.
    std::byte* destination = base + header.offset;
    if (!mem::guarded(destination, payload.size(),
                      [&] { util::copy(destination, payload.data(), payload.size()); })) {
      FERRY_LOG(kWarn,
                "a put from rank %d into region %llu faulted: its memory is no longer "
                "mapped writable",
                source, static_cast<unsigned long long>(header.region));
      refusal = kRmaUnmapped;
    }
  } else if (base != nullptr) {
    Status status = rma_move(base + header.offset, payload.data(), payload.size(), device);
    if (!status) {
      FERRY_LOG(kWarn, "a put from rank %d into device memory failed: %s", source,
                status.message().c_str());
      refusal = kRmaDeviceCopy;
    }
  }
  rma_ack(source, header.id, payload.size(), refusal);
}

void Engine::handle_get(int source, std::span<const std::byte> data) {
  GetHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short GET header");
  std::uint32_t refusal = kRmaOk;
  bool device = false;
  std::byte* base = rma_check(header.region, header.secret, header.offset, header.length, false,
                              &refusal, &device);
  if (base == nullptr || header.length == 0) {
    return rma_ack(source, header.id, 0, base == nullptr ? refusal : kRmaOutOfRange);
  }
  if (rma_region(header.region)->user_host && !mem::readable(base + header.offset, header.length)) {
    return rma_ack(source, header.id, 0, kRmaUnmapped);  // streaming it would fault here
  }
  // Device memory is sent from a host copy, taken now.
  std::vector<std::byte> copy;
  if (device) {
    copy.resize(header.length);
    if (Status status = cuda_->copy(copy.data(), base + header.offset, header.length); !status) {
      FERRY_LOG(kWarn, "a get by rank %d from device memory failed: %s", source,
                status.message().c_str());
      return rma_ack(source, header.id, 0, kRmaDeviceCopy);
    }
  }
  // The answer is a stream of fragments into the initiator's request, from the region itself.
  std::uint32_t index = requests_.allocate(RequestKind::kSend);
  RequestSlot& slot = requests_[index];
  slot.handle_alive = false;  // freed when sent
  slot.rma = Rma::kGetReply;
  slot.rma_region = header.region;
  slot.peer = source;
  slot.send_buffer = base + header.offset;
  if (device) {
    slot.host_copy = std::move(copy);
    slot.send_buffer = slot.host_copy.data();
  }
  slot.size = header.length;
  ++outstanding_sends_;
  send_or_queue(source, stream(kAmFrag, index, header.id, header.length));
}

void Engine::handle_atomic(int source, std::span<const std::byte> data) {
  AtomicHeader header;
  if (!decode(data, &header) || data.size() != sizeof(header) + 16) {
    return protocol_error(source, "ATOMIC of the wrong size");
  }
  std::uint64_t operand = 0;
  std::uint64_t compare = 0;
  std::memcpy(&operand, data.data() + sizeof(header), 8);
  std::memcpy(&compare, data.data() + sizeof(header) + 8, 8);
  std::uint32_t refusal = kRmaOk;
  std::byte* base = nullptr;
  bool device = false;
  std::uint64_t previous = 0;
  if ((header.width != 4 && header.width != 8) || header.op > 5 ||
      header.offset % header.width != 0) {
    refusal = kRmaBadAtomic;
  } else {
    base = rma_check(header.region, header.secret, header.offset, header.width, true, &refusal,
                     &device);
    if (base != nullptr &&
        reinterpret_cast<std::uintptr_t>(base + header.offset) % header.width != 0) {
      base = nullptr;  // a region at an unaligned address
      refusal = kRmaBadAtomic;
    } else if (base != nullptr && rma_region(header.region)->user_host) {
      // Unmapped or made read-only since, the atomic faults: ended here, refused there.
      std::byte* word = base + header.offset;
      base = nullptr;
      if (!mem::guarded(word, header.width, [&] {
            previous =
                atomic_at(word, static_cast<AtomicOp>(header.op), header.width, operand, compare);
          })) {
        refusal = kRmaUnmapped;
      }
    }
  }
  if (base != nullptr) {
    Status status = rma_atomic(base + header.offset, device, static_cast<AtomicOp>(header.op),
                               header.width, operand, compare, &previous);
    if (!status) {
      FERRY_LOG(kWarn, "an atomic by rank %d on device memory failed: %s", source,
                status.message().c_str());
      refusal = kRmaDeviceCopy;
    }
  }
  rma_ack(source, header.id, previous, refusal);
}

void Engine::handle_rma_acks(int source, std::span<const std::byte> data) {
  RmaAcksHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RMA_ACKS header");
  const auto acks = data.subspan(sizeof(header));
  if (header.count == 0 || header.count > kMaxAcksPerMessage ||
      acks.size() != std::size_t{header.count} * sizeof(RmaAckHeader)) {
    return protocol_error(source, "RMA_ACKS whose count does not match its length");
  }
  for (std::size_t i = 0; i < header.count && !peers_[static_cast<std::size_t>(source)].failed;
       ++i) {
    handle_rma_ack(source, acks.subspan(i * sizeof(RmaAckHeader), sizeof(RmaAckHeader)));
  }
}

void Engine::handle_rma_ack(int source, std::span<const std::byte> data) {
  RmaAckHeader header;
  if (!decode(data, &header)) return protocol_error(source, "short RMA_ACK header");
  std::uint32_t index = 0;
  RequestSlot* slot = requests_.lookup(header.id, &index);
  if (slot == nullptr || slot->state != RequestState::kActive || slot->peer != source ||
      (slot->rma != Rma::kPut && slot->rma != Rma::kGet && slot->rma != Rma::kAtomic)) {
    // Also the later acknowledgements of a put that failed on an earlier fragment.
    FERRY_LOG(kDebug, "RMA_ACK from rank %d for no one-sided operation in progress", source);
    return;
  }
  if (header.code != kRmaOk) {
    if (header.code == kRmaNoRegion) {
      // The region is gone: a refusal of native access to it, kept so that accesses through
      // the refused key do not ask again, is no longer needed (so such entries do not pile up
      // as regions come and go).
      auto entry = native_grants_.find({source, slot->rma_region});
      if (entry != native_grants_.end() && entry->second.state == NativeGrant::State::kRefused) {
        native_grants_.erase(entry);
      }
    }
    return complete(index, Status(Code::kInvalidArgument, refusal_text(header.code, source)));
  }
  switch (slot->rma) {
    case Rma::kPut:
      if (header.value > slot->size - slot->received) {
        return protocol_error(source, "RMA_ACK for more bytes than the put has");
      }
      slot->received += header.value;
      if (slot->received == slot->size) complete(index, Status::ok());
      return;
    case Rma::kAtomic:
      store_result(slot->rma_result, slot->rma_width, header.value);
      return complete(index, Status::ok());
    default:  // a get is answered by fragments; an acknowledgement with code 0 is not expected
      return protocol_error(source, "RMA_ACK without a refusal for a get");
  }
}

}  // namespace ferry::proto
