#include "cuda/impl/ipc_cache.hpp"

#include <cstring>
#include <random>

namespace ferry::cuda {
namespace {

// Names this process in the keys it exports (IpcKey::process): a peer that is this process too
// (several ranks in one process, as NCCL's API allows) uses the pointer itself, since the driver
// opens no IPC handle in the process that made it.
const std::array<std::uint8_t, 7>& process_token() {
  static const std::array<std::uint8_t, 7> token = [] {
    std::random_device random;
    std::array<std::uint8_t, 7> t{};
    for (auto& byte : t) byte = static_cast<std::uint8_t>(random());
    t[0] |= 1;  // never all zero, which older keys carry
    return t;
  }();
  return token;
}

}  // namespace

IpcCache::IpcCache(Devices& devices, const util::Config& config)
    : devices_(devices),
      d_(devices.driver()),
      entries_(static_cast<std::size_t>(config.get_int(util::Var::kCudaIpcCacheEntries))),
      limit_(config.get_size(util::Var::kCudaIpcCacheSize)),
      inject_failure_(config.get_bool(util::Var::kTestCudaIpcFail)) {}

IpcCache::~IpcCache() {
  close_deferred();
  for (auto& entry : mappings_) close_now(entry);
}

void IpcCache::close_deferred() {
  for (const Mapping& mapping : deferred_) close_now(mapping);
  deferred_.clear();
  deferred_count_.store(0, std::memory_order_relaxed);
}

Status IpcCache::export_ipc(const void* pointer, const mem::MemoryInfo& info, IpcKey* key,
                            util::Fd* fd) {
  if (info.kind != mem::MemoryKind::kCudaDevice || info.device < 0 ||
      info.device >= d_->device_count || info.ipc == mem::IpcKind::kNone) {
    return Status(Code::kInvalidArgument, "export_ipc: not IPC-capable device memory");
  }
  if (info.buffer_id == 0 || info.extent == 0) {
    // Without a buffer id a peer could not tell this allocation from a freed one at the same
    // address: its cached mapping would deliver stale data.
    return Status(Code::kUnsupported, "the driver gave no buffer id for the allocation");
  }
  Device& dev = devices_.get(info.device);
  if (info.ipc == mem::IpcKind::kPosixFd) {
    ScopedContext scope(d_, dev.context);
    CUmemGenericAllocationHandle handle = 0;
    CUresult result = d_->cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(info.base));
    if (result != CUDA_SUCCESS) return driver_error("cuMemRetainAllocationHandle", result);
    int exported = -1;
    result = d_->cuMemExportToShareableHandle(&exported, handle,
                                              CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
    d_->cuMemRelease(handle);  // the mapping keeps the allocation
    if (result != CUDA_SUCCESS) return driver_error("cuMemExportToShareableHandle", result);
    fd->reset(exported);
    key->handle = {};
  } else {
    auto it = exported_.find(info.buffer_id);
    if (it == exported_.end()) {
      ScopedContext scope(d_, dev.context);
      CUipcMemHandle handle;
      CUresult result = d_->cuIpcGetMemHandle(&handle, static_cast<CUdeviceptr>(info.base));
      if (result != CUDA_SUCCESS) return driver_error("cuIpcGetMemHandle", result);
      // Bounded: ids of freed allocations are never looked up again; start over when full.
      if (exported_.size() >= 4 * entries_) exported_.clear();
      it = exported_.emplace(info.buffer_id, handle).first;
    }
    std::memcpy(key->handle.data(), &it->second, sizeof(CUipcMemHandle));
  }
  key->kind = info.ipc;
  key->process = process_token();
  key->uuid = devices_.uuid(info.device);
  key->base = info.base;
  key->extent = info.extent;
  key->buffer_id = info.buffer_id;
  key->offset = reinterpret_cast<std::uint64_t>(pointer) - info.base;
  return Status::ok();
}

std::string IpcCache::refusal(const std::array<std::byte, 16>& uuid, int local) {
  const int source = devices_.ordinal(uuid);
  if (source < 0) return "the peer's " + uuid_string(uuid) + " is not visible to this process";
  if (source == local) return {};
  int can = 0;
  d_->cuDeviceCanAccessPeer(&can, devices_.get(local).handle, devices_.get(source).handle);
  if (can == 0) {
    return "no peer access from cuda:" + std::to_string(local) +
           " to cuda:" + std::to_string(source);
  }
  return {};
}

bool IpcCache::cached(int peer, const IpcKey& key, int local) const {
  return index_.count(Key{peer, local, key.base, key.kind, key.buffer_id}) != 0;
}

Status IpcCache::import(int peer, const IpcKey& key, int local, util::Fd* fd, void** mapped) {
  if (key.extent == 0 || key.offset >= key.extent || local < 0 || local >= d_->device_count ||
      (key.kind != mem::IpcKind::kLegacy && key.kind != mem::IpcKind::kPosixFd)) {
    return Status(Code::kProtocolError, "malformed IPC key");
  }
  const Key k{peer, local, key.base, key.kind, key.buffer_id};
  auto found = index_.find(k);
  if (found != index_.end()) {
    mappings_.splice(mappings_.begin(), mappings_, found->second);  // most recent first
    ++found->second->pins;
    *mapped = reinterpret_cast<std::byte*>(found->second->mapped) + key.offset;
    return Status::ok();
  }
  if (inject_failure_) {
    return Status(Code::kUnsupported,
                  std::string(key.kind == mem::IpcKind::kPosixFd ? "cuMemImportFromShareableHandle"
                                                                 : "cuIpcOpenMemHandle") +
                      " refused (injected by FERRY_TEST_CUDA_IPC_FAIL)");
  }
  // The peer freed the allocation at this address and made another: close the old mapping so
  // its memory can really be released (the freed buffer lives on while a peer maps it).
  for (auto it = index_.lower_bound(Key{peer, local, key.base, mem::IpcKind::kNone, 0});
       it != index_.end() && it->first.peer == peer && it->first.device == local &&
       it->first.base == key.base;) {
    it = it->second->pins == 0 ? drop(it) : std::next(it);
  }
  ScopedContext scope(d_, devices_.get(local).context);
  CUdeviceptr pointer = 0;
  const bool own = key.process == process_token() && peer != rank_;
  Status status = own                                  ? share_own(key, local, fd, &pointer)
                  : key.kind == mem::IpcKind::kPosixFd ? map_descriptor(key, local, fd, &pointer)
                                                       : open_handle(peer, key, local, &pointer);
  if (!status) return status;
  mappings_.push_front(Mapping{k, pointer, key.extent, 1, key.kind, own});
  index_[k] = mappings_.begin();
  bytes_ += key.extent;
  evict();
  *mapped = reinterpret_cast<std::byte*>(pointer) + key.offset;
  return Status::ok();
}

Status IpcCache::open_handle(int peer, const IpcKey& key, int local, CUdeviceptr* mapped) {
  CUipcMemHandle handle;
  std::memcpy(&handle, key.handle.data(), sizeof handle);
  CUdeviceptr pointer = 0;
  CUresult result = d_->cuIpcOpenMemHandle(&pointer, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
  if (result == CUDA_ERROR_ALREADY_MAPPED) {
    // The driver packs allocations together, and a handle opens all of what it shares with
    // them: this one shares memory with one of the peer's allocations mapped here already.
    // Close those not in use and try again; if one in use holds it, this transfer is staged
    // (a passing conflict, not a refusal of the peer).
    for (auto it = index_.lower_bound(Key{peer, local, 0, mem::IpcKind::kNone, 0});
         it != index_.end() && it->first.peer == peer;) {
      it = it->first.device == local && it->second->pins == 0 ? drop(it) : std::next(it);
    }
    result = d_->cuIpcOpenMemHandle(&pointer, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
    if (result == CUDA_ERROR_ALREADY_MAPPED) {
      return Status(Code::kWouldBlock,
                    "cuIpcOpenMemHandle: the allocation shares memory with one of the peer's "
                    "allocations mapped here and in use (CUDA_ERROR_ALREADY_MAPPED)");
    }
  }
  if (result != CUDA_SUCCESS) return driver_error("cuIpcOpenMemHandle", result);
  CUdeviceptr range_base = 0;
  std::size_t range_size = 0;
  d_->cuMemGetAddressRange(&range_base, &range_size, pointer);
  if (range_size < key.extent) {
    d_->cuIpcCloseMemHandle(pointer);
    return Status(Code::kProtocolError, "IPC handle maps " + std::to_string(range_size) +
                                            " bytes, the peer announced " +
                                            std::to_string(key.extent));
  }
  *mapped = pointer;
  return Status::ok();
}

Status IpcCache::share_own(const IpcKey& key, int local, util::Fd* fd, CUdeviceptr* mapped) {
  if (fd != nullptr) fd->reset();  // a cuMem allocation's descriptor: not needed here
  const int source = devices_.ordinal(key.uuid);
  if (source < 0) return Status(Code::kProtocolError, "IPC key of this process names no GPU of it");
  if (source != local) {
    // Kernels of `local`'s context reach the other GPU's memory once peer access is on (the
    // current context is `local`'s: import's scope).
    const CUresult result = d_->cuCtxEnablePeerAccess(devices_.get(source).context, 0);
    if (result != CUDA_SUCCESS && result != CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED) {
      return driver_error("cuCtxEnablePeerAccess", result);
    }
  }
  *mapped = static_cast<CUdeviceptr>(key.base);
  return Status::ok();
}

Status IpcCache::map_descriptor(const IpcKey& key, int local, util::Fd* fd, CUdeviceptr* mapped) {
  if (fd == nullptr || !fd->valid()) {
    return Status(Code::kProtocolError,
                  "no file descriptor arrived with the peer's cuMem allocation");
  }
  CUmemGenericAllocationHandle handle = 0;
  CUresult result = d_->cuMemImportFromShareableHandle(
      &handle, reinterpret_cast<void*>(static_cast<std::intptr_t>(fd->get())),
      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  fd->reset();
  if (result != CUDA_SUCCESS) return driver_error("cuMemImportFromShareableHandle", result);
  CUdeviceptr pointer = 0;
  result = d_->cuMemAddressReserve(&pointer, key.extent, 0, 0, 0);
  if (result != CUDA_SUCCESS) {
    d_->cuMemRelease(handle);
    return driver_error("cuMemAddressReserve", result);
  }
  result = d_->cuMemMap(pointer, key.extent, 0, handle, 0);
  d_->cuMemRelease(handle);  // the mapping holds the allocation from here on
  if (result != CUDA_SUCCESS) {
    d_->cuMemAddressFree(pointer, key.extent);
    return driver_error("cuMemMap of " + std::to_string(key.extent) + " bytes", result);
  }
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = local;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  result = d_->cuMemSetAccess(pointer, key.extent, &access, 1);
  if (result != CUDA_SUCCESS) {
    d_->cuMemUnmap(pointer, key.extent);
    d_->cuMemAddressFree(pointer, key.extent);
    return driver_error("cuMemSetAccess", result);
  }
  *mapped = pointer;
  return Status::ok();
}

void IpcCache::unpin(int peer, int local, const IpcKey& key) {
  auto found = index_.find(Key{peer, local, key.base, key.kind, key.buffer_id});
  if (found != index_.end() && found->second->pins > 0) --found->second->pins;
  evict();
}

void IpcCache::forget_peer(int peer) {
  for (auto it = index_.begin(); it != index_.end();) {
    it = it->first.peer == peer && it->second->pins == 0 ? drop(it) : std::next(it);
  }
}

IpcCache::Index::iterator IpcCache::drop(Index::iterator it) {
  close_mapping(*it->second);
  bytes_ -= it->second->extent;
  mappings_.erase(it->second);
  return index_.erase(it);
}

void IpcCache::close_mapping(const Mapping& mapping) {
  if (defer_) {
    deferred_.push_back(mapping);
    deferred_count_.store(deferred_.size(), std::memory_order_relaxed);
    return;
  }
  close_now(mapping);
}

void IpcCache::close_now(const Mapping& mapping) {
  if (mapping.own) return;
  ScopedContext scope(d_, devices_.made(mapping.key.device).context);
  if (mapping.kind == mem::IpcKind::kPosixFd) {
    d_->cuMemUnmap(mapping.mapped, mapping.extent);  // releases the imported allocation
    d_->cuMemAddressFree(mapping.mapped, mapping.extent);
  } else {
    d_->cuIpcCloseMemHandle(mapping.mapped);
  }
}

void IpcCache::evict() {
  auto it = mappings_.end();
  while ((mappings_.size() > entries_ || bytes_ > limit_) && it != mappings_.begin()) {
    --it;
    if (it->pins > 0) continue;
    close_mapping(*it);
    bytes_ -= it->extent;
    index_.erase(it->key);
    it = mappings_.erase(it);
  }
}

}  // namespace ferry::cuda
