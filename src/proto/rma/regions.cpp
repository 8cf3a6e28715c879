// This process's regions and its guard table (see regions.hpp).
#include "proto/rma/regions.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <utility>

#include "mem/fault_guard.hpp"
#include "mem/host_access.hpp"
#include "proto/engine.hpp"
#include "util/extent.hpp"
#include "util/fd.hpp"
#include "util/log.hpp"

namespace ferry::proto::rma {

Regions::~Regions() { clear(); }

void Regions::clear() {
  for (auto& [id, region] : regions_) {
    if (region.fd >= 0) {
      ::munmap(region.mapping, region.mapping_length);
      ::close(region.fd);
    }
    if (region.ipc_fd >= 0) ::close(region.ipc_fd);
  }
  regions_.clear();
  release_guard();
}

Status Regions::add(void* address, std::size_t bytes, std::uint64_t* id, std::uint64_t* secret,
                    RegionAccess* access) {
  if (address == nullptr || bytes == 0) {
    return Status(Code::kInvalidArgument, "register_memory: null address or zero bytes");
  }
  if (Status bad = util::check_extent("register_memory", "range", address, bytes); !bad) {
    return bad;
  }
  int device = -1;
  mem::MemoryInfo info;
  if (cuda::Cuda* cuda = engine_.cuda()) {
    info = cuda->classify(address);
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
    access->read_only = read_only;
  }
  regions_.emplace(*id, region);
  return Status::ok();
}

Status Regions::allocate(std::size_t bytes, void** address, std::uint64_t* id,
                         std::uint64_t* secret, int* fd) {
  if (bytes == 0) return Status(Code::kInvalidArgument, "allocate_memory: zero bytes");
  if (bytes > (std::size_t{1} << 46)) {
    return Status(Code::kInvalidArgument, "allocate_memory: " + std::to_string(bytes) +
                                              " bytes is more than this machine can map");
  }
  const std::size_t length = kHeaderBytes + page_round(bytes);
  util::Fd memfd(::memfd_create("ferry-rma", MFD_CLOEXEC));
  if (!memfd.valid()) {
    return Status(Code::kNoResources, errno_text("allocate_memory: memfd_create"));
  }
  // Reserved now, so a full memory or tmpfs limit is this error, not a SIGBUS on first touch.
  if (::ftruncate(memfd.get(), static_cast<off_t>(length)) != 0 ||
      ::posix_fallocate(memfd.get(), 0, static_cast<off_t>(length)) != 0) {
    return Status(Code::kNoResources, "allocate_memory: cannot reserve " + std::to_string(length) +
                                          " bytes of shared memory");
  }
  void* mapping = ::mmap(nullptr, length, PROT_READ | PROT_WRITE, MAP_SHARED, memfd.get(), 0);
  if (mapping == MAP_FAILED) return Status(Code::kNoResources, errno_text("allocate_memory: mmap"));
  // Peers on this node map it whole (no guard slot).
  Status status = add(static_cast<std::byte*>(mapping) + kHeaderBytes, bytes, id, secret, nullptr);
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
  region.fd = memfd.release();
  region.mapping = static_cast<std::byte*>(mapping);
  region.mapping_length = length;
  *address = region.base;
  *fd = region.fd;
  return Status::ok();
}

Status Regions::remove(std::uint64_t id) {
  auto found = regions_.find(id);
  if (found == regions_.end()) {
    return Status(Code::kInvalidArgument, "deregister: no memory region " + std::to_string(id));
  }
  Status waited;
  if (found->second.slot >= 0) {
    // Waiting lets other threads in (and their registrations move the table): look it up again.
    const int slot = std::exchange(found->second.slot, -1);
    waited = release_guard_slot(slot, std::exchange(found->second.ipc_fd, -1));
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
  return waited;
}

std::byte* Regions::check(std::uint64_t region, std::uint64_t secret, std::uint64_t offset,
                          std::uint64_t length, bool write, std::uint32_t* refusal,
                          bool* device) const {
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

Status Regions::make_guard() {
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

void Regions::release_guard() {
  if (guard_ == nullptr) return;
  ::munmap(guard_, sizeof(GuardTable));
  ::close(guard_fd_);
  guard_ = nullptr;
  guard_fd_ = -1;
  guard_free_.clear();
}

void Regions::guard_region(Region* region, std::uint64_t id, const mem::MemoryInfo& info) {
  if (engine_.job().local_ranks().size() < 2) return;  // no peer on this node
  cuda::IpcKey ipc;
  util::Fd exported;
  if (region->device >= 0) {
    if (!engine_.cuda_ipc()) return;
    if (Status status = engine_.cuda()->export_ipc(region->base, info, &ipc, &exported); !status) {
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

Status Regions::release_guard_slot(int index, int ipc_fd) {
  GuardSlot& slot = guard_->slots[index];
  shared(slot.live).store(0, std::memory_order_seq_cst);
  const std::vector<int> local = engine_.job().local_ranks();
  const std::size_t ranks = std::min<std::size_t>(local.size(), kGuardRanks);
  // The accesses begun before the slot was cleared (later ones see it cleared and give up).
  std::vector<std::uint64_t> begun(ranks);
  for (std::size_t i = 0; i < ranks; ++i) {
    begun[i] = shared(guard_->counters[i].begun).load(std::memory_order_seq_cst);
  }
  std::size_t inside = 0;  // the first rank that may still be inside one
  const bool reusable = engine_.waiting().wait_until([&] {
    for (; inside < ranks; ++inside) {
      const int rank = local[inside];
      if (rank == engine_.rank() || engine_.links().link(rank).failed) continue;
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
              local[inside], static_cast<unsigned long long>(slot.region),
              engine_.waiting().timeout());
  }
  if (ipc_fd >= 0) ::close(ipc_fd);
  if (reusable) guard_free_.push_back(index);  // else lost: that rank may still use it
  return reusable ? Status::ok()
                  : Status(Code::kTimeout,
                           "deregister: a rank on this node was still inside an access to the "
                           "region after FERRY_TIMEOUT; it may still write to the memory");
}

}  // namespace ferry::proto::rma
