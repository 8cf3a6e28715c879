// The CUDA module behind cuda.hpp: driver calls through the dlopen'd table (driver.hpp), each made
// in the primary context of the device it concerns and the caller's context restored after, so
// that an application's own CUDA state is never changed under it.
#include "cuda/cuda.hpp"

#include <algorithm>
#include <cstring>
#include <deque>
#include <list>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>

#include "cuda/driver.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

#ifdef FERRY_HAVE_KERNELS
// kernels.cu as a fatbin, embedded by the build (cmake/embed.cmake).
extern const unsigned char ferry_kernels_fatbin[];
#endif

namespace ferry::cuda {
namespace {

constexpr int kLanesPerDevice = 4;
// Two more streams per device for the host-staged copies (Cuda::copy_staged_async): one from the
// device to host memory, one to the device; tickets number every device's kLaneSlots streams.
constexpr int kStageToHost = kLanesPerDevice;
constexpr int kStageToDevice = kLanesPerDevice + 1;
constexpr int kLaneSlots = kLanesPerDevice + 2;

std::string uuid_string(const std::array<std::byte, 16>& uuid) {
  static const char* hex = "0123456789abcdef";
  std::string out = "GPU-";
  for (std::size_t i = 0; i < uuid.size(); ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    auto b = static_cast<unsigned>(uuid[i]);
    out += hex[b >> 4];
    out += hex[b & 15];
  }
  return out;
}

class ScopedContext {
 public:
  ScopedContext(const Driver* d, CUcontext context) : d_(d) {
    d_->cuCtxGetCurrent(&saved_);
    if (saved_ != context) changed_ = d_->cuCtxSetCurrent(context) == CUDA_SUCCESS;
  }
  ~ScopedContext() {
    if (changed_) d_->cuCtxSetCurrent(saved_);
  }
  ScopedContext(const ScopedContext&) = delete;
  ScopedContext& operator=(const ScopedContext&) = delete;

 private:
  const Driver* d_;
  CUcontext saved_ = nullptr;
  bool changed_ = false;
};

Status driver_error(const std::string& call, CUresult result) {
  return Status(Code::kIoError, call + " failed: " + error_string(result));
}

class CudaImpl final : public Cuda {
 public:
  CudaImpl(const Driver* d, const util::Config& config)
      : d_(d),
        cache_entries_(static_cast<std::size_t>(config.get_int(util::Var::kCudaIpcCacheEntries))),
        cache_bytes_(config.get_size(util::Var::kCudaIpcCacheSize)),
        scratch_cache_(config.get_size(util::Var::kCudaScratchCache)),
        kernel_copy_from_(config.get_size(util::Var::kCudaIpcKernelCopy)),
        kernel_copy_max_(config.get_size(util::Var::kCudaIpcKernelCopyMax)),
        inject_ipc_failure_(config.get_bool(util::Var::kTestCudaIpcFail)),
        force_events_(config.get_bool(util::Var::kTestCudaEvents)) {
    devices_.resize(static_cast<std::size_t>(d_->device_count));
    for (int i = 0; i < d_->device_count; ++i) {
      Device& dev = devices_[static_cast<std::size_t>(i)];
      d_->cuDeviceGet(&dev.handle, i);
      CUuuid uuid;
      d_->cuDeviceGetUuid(&uuid, dev.handle);
      std::memcpy(dev.uuid.data(), uuid.bytes, 16);
      char name[128] = {};
      d_->cuDeviceGetName(name, sizeof name, dev.handle);
      dev.name = name;
    }
  }

  ~CudaImpl() override {
    for (auto& entry : mappings_) close_mapping(entry);
    mappings_.clear();
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      Device& dev = devices_[i];
      if (dev.context == nullptr) continue;
      {
        ScopedContext scope(d_, dev.context);
        for (Lane& lane : dev.lanes) {
          d_->cuStreamSynchronize(lane.stream);
          for (auto& [sequence, event] : lane.events) d_->cuEventDestroy(event);
          for (CUevent event : lane.spare_events) d_->cuEventDestroy(event);
          d_->cuStreamDestroy(lane.stream);
        }
        for (Bounce& bounce : dev.bounces) {
          d_->cuMemFree(bounce.memory);
          d_->cuEventDestroy(bounce.filled);
        }
        if (dev.flags != nullptr) d_->cuMemFreeHost(dev.flags);
        if (dev.counters != 0) d_->cuMemFree(dev.counters);
        if (dev.sync_stream != nullptr) d_->cuStreamDestroy(dev.sync_stream);
        if (dev.module != nullptr) d_->cuModuleUnload(dev.module);
        for (auto& [size, memory] : dev.spare) d_->cuMemFree(reinterpret_cast<CUdeviceptr>(memory));
        for (auto& [memory, size] : dev.sizes) d_->cuMemFree(reinterpret_cast<CUdeviceptr>(memory));
      }
      d_->cuDevicePrimaryCtxRelease(dev.handle);
    }
  }

  int current_device() const override {
    CUcontext context = nullptr;
    CUdevice device = 0;
    if (d_->cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr ||
        d_->cuCtxGetDevice(&device) != CUDA_SUCCESS) {
      return -1;
    }
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i].handle == device) return static_cast<int>(i);
    }
    return -1;
  }

  mem::MemoryInfo classify(const void* pointer) override {
    CUpointer_attribute attributes[] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                        CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                                        CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                                        CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                                        CU_POINTER_ATTRIBUTE_BUFFER_ID,
                                        CU_POINTER_ATTRIBUTE_IS_MANAGED,
                                        CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE};
    unsigned type = 0;
    int ordinal = -1;
    void* start = nullptr;
    std::size_t size = 0;
    unsigned long long buffer_id = 0;
    int managed = 0;
    int legacy_ipc = 0;
    void* values[] = {&type, &ordinal, &start, &size, &buffer_id, &managed, &legacy_ipc};
    mem::MemoryInfo info;
    const auto address = reinterpret_cast<CUdeviceptr>(pointer);
    if (d_->cuPointerGetAttributes(7, attributes, values, address) != CUDA_SUCCESS) {
      // Not every layer between us and the driver answers the batched query (compute-sanitizer's
      // memcheck does not): ask for the memory type alone before calling it host memory, or a
      // device buffer would be read by the CPU. Without a buffer id it never goes by IPC.
      if (d_->cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, address) !=
              CUDA_SUCCESS ||
          type != CU_MEMORYTYPE_DEVICE) {
        return info;
      }
      info.kind = mem::MemoryKind::kCudaDevice;
      d_->cuPointerGetAttribute(&info.device, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address);
      CUdeviceptr base = 0;
      std::size_t extent = 0;
      if (d_->cuMemGetAddressRange(&base, &extent, address) == CUDA_SUCCESS) {
        info.base = base;
        info.extent = extent;
      }
      if (info.device < 0 || info.device >= d_->device_count) info.device = 0;
      return info;  // buffer_id 0: unknown
    }
    if (managed != 0) {
      info.kind = mem::MemoryKind::kCudaManaged;
    } else if (type == CU_MEMORYTYPE_DEVICE) {
      info.kind = mem::MemoryKind::kCudaDevice;
    } else if (type == CU_MEMORYTYPE_HOST) {
      info.pinned = true;
    } else {
      return info;
    }
    if (ordinal < 0 || ordinal >= d_->device_count) {
      // Managed memory may live on the host (CU_DEVICE_CPU); copies of it run on device 0.
      ordinal = -1;
      d_->cuPointerGetAttribute(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, address);
      if (ordinal < 0 || ordinal >= d_->device_count) ordinal = 0;  // reachable by UVA
    }
    info.device = ordinal;
    info.base = reinterpret_cast<std::uint64_t>(start);
    info.extent = size;
    info.buffer_id = buffer_id;
    if (info.kind == mem::MemoryKind::kCudaDevice) {
      if (legacy_ipc != 0) {
        info.ipc = mem::IpcKind::kLegacy;
      } else {
        classify_vmm(address, &info);
      }
    }
    return info;
  }

  Status export_ipc(const void* pointer, const mem::MemoryInfo& info, IpcKey* key,
                    util::Fd* fd) override {
    if (info.kind != mem::MemoryKind::kCudaDevice || info.device < 0 ||
        info.device >= d_->device_count || info.ipc == mem::IpcKind::kNone) {
      return Status(Code::kInvalidArgument, "export_ipc: not IPC-capable device memory");
    }
    if (info.buffer_id == 0 || info.extent == 0) {
      // Without a buffer id a peer could not tell this allocation from a freed one at the same
      // address: its cached mapping would deliver stale data.
      return Status(Code::kUnsupported, "the driver gave no buffer id for the allocation");
    }
    Device& dev = device(info.device);
    if (info.ipc == mem::IpcKind::kPosixFd) {
      ScopedContext scope(d_, dev.context);
      CUmemGenericAllocationHandle handle = 0;
      CUresult result =
          d_->cuMemRetainAllocationHandle(&handle, reinterpret_cast<void*>(info.base));
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
        if (exported_.size() >= 4 * cache_entries_) exported_.clear();
        it = exported_.emplace(info.buffer_id, handle).first;
      }
      std::memcpy(key->handle.data(), &it->second, sizeof(CUipcMemHandle));
    }
    key->kind = info.ipc;
    key->uuid = devices_[static_cast<std::size_t>(info.device)].uuid;
    key->base = info.base;
    key->extent = info.extent;
    key->buffer_id = info.buffer_id;
    key->offset = reinterpret_cast<std::uint64_t>(pointer) - info.base;
    return Status::ok();
  }

  [[nodiscard]] int ordinal(const std::array<std::byte, 16>& uuid) const override {
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i].uuid == uuid) return static_cast<int>(i);
    }
    return -1;
  }

  std::string ipc_refusal(const std::array<std::byte, 16>& uuid, int local) override {
    const int source = ordinal(uuid);
    if (source < 0) return "the peer's " + uuid_string(uuid) + " is not visible to this process";
    if (source == local) return {};
    int can = 0;
    d_->cuDeviceCanAccessPeer(&can, device(local).handle, device(source).handle);
    if (can == 0) {
      return "no peer access from cuda:" + std::to_string(local) +
             " to cuda:" + std::to_string(source);
    }
    return {};
  }

  [[nodiscard]] bool ipc_cached(int peer, const IpcKey& key, int local) const override {
    return index_.count(Key{peer, local, key.base, key.kind, key.buffer_id}) != 0;
  }

  Status import_ipc(int peer, const IpcKey& key, int local, util::Fd* fd, void** mapped) override {
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
    if (inject_ipc_failure_) {
      return Status(Code::kUnsupported, std::string(key.kind == mem::IpcKind::kPosixFd
                                                        ? "cuMemImportFromShareableHandle"
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
    Device& dev = device(local);
    ScopedContext scope(d_, dev.context);
    CUdeviceptr pointer = 0;
    if (key.kind == mem::IpcKind::kPosixFd) {
      Status status = map_descriptor(key, local, fd, &pointer);
      if (!status) return status;
    } else {
      CUipcMemHandle handle;
      std::memcpy(&handle, key.handle.data(), sizeof handle);
      CUresult result =
          d_->cuIpcOpenMemHandle(&pointer, handle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS);
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
    }
    mappings_.push_front(Mapping{k, pointer, key.extent, 1, key.kind});
    index_[k] = mappings_.begin();
    bytes_ += key.extent;
    evict();
    *mapped = reinterpret_cast<std::byte*>(pointer) + key.offset;
    return Status::ok();
  }

  void unpin(int peer, int local, const IpcKey& key) override {
    auto found = index_.find(Key{peer, local, key.base, key.kind, key.buffer_id});
    if (found != index_.end() && found->second->pins > 0) --found->second->pins;
    evict();
  }

  void forget_peer(int peer) override {
    for (auto it = index_.begin(); it != index_.end();) {
      it = it->first.peer == peer && it->second->pins == 0 ? drop(it) : std::next(it);
    }
  }

  Status copy_async(int device_ordinal, int lane_index, void* dst, const void* src,
                    std::size_t bytes, Ticket* ticket) override {
    return copy_on_lane(device_ordinal, static_cast<std::size_t>(lane_index) % kLanesPerDevice, dst,
                        src, bytes, ticket);
  }

  // One copy on a lane of the device, marked for its completion.
  Status copy_on_lane(int device_ordinal, std::size_t lane_number, void* dst, const void* src,
                      std::size_t bytes, Ticket* ticket) {
    Device& dev = device(device_ordinal);
    Lane& lane = dev.lanes[lane_number];
    ScopedContext scope(d_, dev.context);
    CUresult result = d_->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                        reinterpret_cast<CUdeviceptr>(src), bytes, lane.stream);
    if (result != CUDA_SUCCESS) return driver_error("cuMemcpyAsync", result);
    return mark(device_ordinal, lane_number, ticket);
  }

  Status copy_device_async(int device_ordinal, int lane_index, void* dst, const void* src,
                           std::size_t bytes, bool streaming, Ticket* ticket) override {
    // A lone copy goes faster by the engine (no launch); a stream of mid-sized ones by the SMs
    // (the engine's start-up per copy shows: 4 MiB 283 against 316-334 GB/s on H200 NVLink).
    if (!streaming || kernel_copy_from_ == 0 || bytes < kernel_copy_from_ ||
        bytes > kernel_copy_max_ || !kernels_missing(device_ordinal).empty() ||
        device(device_ordinal).copy == nullptr) {
      return copy_async(device_ordinal, lane_index, dst, src, bytes, ticket);
    }
    Device& dev = device(device_ordinal);
    const auto lane_number = static_cast<std::size_t>(lane_index) % kLanesPerDevice;
    Lane& lane = dev.lanes[lane_number];
    ScopedContext scope(d_, dev.context);
    // One thread per 64 bytes (four 16-byte units), at most 2 blocks per multiprocessor.
    constexpr unsigned kThreads = 512;
    const std::size_t most = static_cast<std::size_t>(std::max(dev.multiprocessors, 1)) * 2;
    const auto blocks = static_cast<unsigned>(
        std::clamp<std::size_t>((bytes / 64 + kThreads - 1) / kThreads, 1, most));
    unsigned long long length = bytes;
    void* params[] = {&dst, &src, &length};
    CUresult result =
        d_->cuLaunchKernel(dev.copy, blocks, 1, 1, kThreads, 1, 1, 0, lane.stream, params, nullptr);
    if (result != CUDA_SUCCESS) return driver_error("cuLaunchKernel(ferry_copy)", result);
    return mark(device_ordinal, lane_number, ticket);
  }

  // The ticket of what was queued on a lane so far.
  Status mark(int device_ordinal, std::size_t lane_number, Ticket* ticket) {
    Device& dev = devices_[static_cast<std::size_t>(device_ordinal)];
    Lane& lane = dev.lanes[lane_number];
    CUresult result = CUDA_SUCCESS;
    const std::uint32_t sequence = ++lane.issued;
    if (lane.flag != nullptr) {
      // Completion is a store of the sequence number to host memory, polled without a driver
      // call (cuEventQuery costs 1.6 us on the measured VM).
      result = d_->cuStreamWriteValue32(lane.stream, reinterpret_cast<CUdeviceptr>(lane.flag),
                                        sequence, CU_STREAM_WRITE_VALUE_DEFAULT);
      if (result != CUDA_SUCCESS) return driver_error("cuStreamWriteValue32", result);
    } else {
      CUevent event = nullptr;
      if (!lane.spare_events.empty()) {
        event = lane.spare_events.back();
        lane.spare_events.pop_back();
      } else if ((result = d_->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING)) != CUDA_SUCCESS) {
        return driver_error("cuEventCreate", result);
      }
      d_->cuEventRecord(event, lane.stream);
      lane.events.emplace_back(sequence, event);
    }
    ticket->stream = static_cast<std::uint32_t>(device_ordinal * kLaneSlots) +
                     static_cast<std::uint32_t>(lane_number);
    ticket->sequence = sequence;
    return Status::ok();
  }

  Status copy_through_device_async(int device_ordinal, void* dst, const void* src,
                                   std::size_t bytes, Ticket* ticket) override {
    Device& dev = device(device_ordinal);
    ScopedContext scope(d_, dev.context);
    // A bounce of the device's whose last copy out has ended, else a new one (at most kBounces).
    Bounce* bounce = nullptr;
    for (Bounce& b : dev.bounces) {
      if (b.bytes >= bytes && (!b.used || done(b.ticket))) {
        bounce = &b;
        break;
      }
    }
    if (bounce == nullptr) {
      if (dev.bounces.size() >= kBounces) {
        return Status(Code::kWouldBlock, "every device bounce is in use");
      }
      Bounce fresh;
      fresh.bytes = std::max<std::size_t>(bytes, std::size_t{4} << 20);
      CUresult result = d_->cuMemAlloc(&fresh.memory, fresh.bytes);
      if (result != CUDA_SUCCESS) return driver_error("cuMemAlloc (device bounce)", result);
      result = d_->cuEventCreate(&fresh.filled, CU_EVENT_DISABLE_TIMING);
      if (result != CUDA_SUCCESS) {
        d_->cuMemFree(fresh.memory);
        return driver_error("cuEventCreate", result);
      }
      dev.bounces.push_back(fresh);
      bounce = &dev.bounces.back();
    }
    // Host to the bounce on the to-device stream, the bounce to host on the to-host stream after
    // it: chunk k's copy out overlaps chunk k + 1's copy in, each direction of the link busy.
    Lane& in = dev.lanes[kStageToDevice];
    Lane& out = dev.lanes[kStageToHost];
    CUresult result =
        d_->cuMemcpyAsync(bounce->memory, reinterpret_cast<CUdeviceptr>(src), bytes, in.stream);
    if (result == CUDA_SUCCESS) result = d_->cuEventRecord(bounce->filled, in.stream);
    if (result == CUDA_SUCCESS) result = d_->cuStreamWaitEvent(out.stream, bounce->filled, 0);
    if (result == CUDA_SUCCESS) {
      result =
          d_->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), bounce->memory, bytes, out.stream);
    }
    if (result != CUDA_SUCCESS) return driver_error("a copy through the device", result);
    Status marked = mark(device_ordinal, kStageToHost, ticket);
    if (marked) {
      bounce->ticket = *ticket;
      bounce->used = true;
    }
    return marked;
  }

  Status copy_staged_async(int device_ordinal, bool to_device, void* dst, const void* src,
                           std::size_t bytes, Ticket* ticket) override {
    return copy_on_lane(device_ordinal, to_device ? kStageToDevice : kStageToHost, dst, src, bytes,
                        ticket);
  }

  bool done(const Ticket& ticket) override {
    if ((ticket.stream & kResidentTicket) != 0) {
      return resident_done(*residents_[ticket.stream & ~kResidentTicket], ticket.sequence);
    }
    Device& dev = devices_[ticket.stream / kLaneSlots];
    Lane& lane = dev.lanes[ticket.stream % kLaneSlots];
    if (lane.flag != nullptr) {
      // The flag is host memory the GPU writes: a load of it costs 1.4 us on the H100 VM, so
      // what it said last answers every ticket it covers.
      if (static_cast<std::int32_t>(lane.completed - ticket.sequence) >= 0) return true;
      lane.completed = __atomic_load_n(lane.flag, __ATOMIC_ACQUIRE);
      return static_cast<std::int32_t>(lane.completed - ticket.sequence) >= 0;
    }
    while (!lane.events.empty() && d_->cuEventQuery(lane.events.front().second) == CUDA_SUCCESS) {
      lane.completed = lane.events.front().first;
      lane.spare_events.push_back(lane.events.front().second);
      lane.events.pop_front();
    }
    return static_cast<std::int32_t>(lane.completed - ticket.sequence) >= 0;
  }

  std::string kernels_missing(int device_ordinal) override {
#ifdef FERRY_HAVE_KERNELS
    Device& dev = device(device_ordinal);
    if (dev.reduce != nullptr || !dev.kernels_error.empty()) return dev.kernels_error;
    ScopedContext scope(d_, dev.context);
    CUresult result = d_->cuModuleLoadData(&dev.module, ferry_kernels_fatbin);
    if (result != CUDA_SUCCESS) {
      dev.module = nullptr;
      dev.kernels_error = "loading ferry's device kernels (sm_90 code and PTX) on cuda:" +
                          std::to_string(device_ordinal) + ": " +
                          driver_error("cuModuleLoadData", result).message();
    } else if ((result = d_->cuModuleGetFunction(&dev.reduce, dev.module, "ferry_reduce")) !=
                   CUDA_SUCCESS ||
               (result = d_->cuModuleGetFunction(&dev.oneshot, dev.module,
                                                 "ferry_allreduce_oneshot")) != CUDA_SUCCESS ||
               (result = d_->cuModuleGetFunction(&dev.twoshot, dev.module,
                                                 "ferry_allreduce_twoshot")) != CUDA_SUCCESS) {
      dev.reduce = nullptr;
      dev.oneshot = nullptr;
      dev.twoshot = nullptr;
      dev.kernels_error = driver_error("cuModuleGetFunction", result).message();
    } else {
      if (d_->cuModuleGetFunction(&dev.copy, dev.module, "ferry_copy") != CUDA_SUCCESS) {
        dev.copy = nullptr;  // copies stay with the copy engine
      }
      if (d_->cuModuleGetFunction(&dev.resident, dev.module, "ferry_allreduce_resident") !=
          CUDA_SUCCESS) {
        dev.resident = nullptr;  // small one-shot calls are launched
      }
      d_->cuDeviceGetAttribute(&dev.multiprocessors, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
                               dev.handle);
    }
    return dev.kernels_error;
#else
    (void)device_ordinal;
    return "ferry was built without nvcc, so it has no device kernels (rebuild with the CUDA "
           "toolkit's nvcc on the PATH or under CUDA_HOME)";
#endif
  }

  Status allocate(int device_ordinal, std::size_t bytes, void** pointer) override {
    Device& dev = device(device_ordinal);
    // Whole 2 MiB pages: the driver packs smaller allocations together, and an IPC handle of one
    // opens its neighbours too (a peer mapping a scratch buffer could not then map an
    // application buffer that shares its page).
    bytes = (std::max<std::size_t>(bytes, 1) + (2 << 20) - 1) & ~((std::size_t{2} << 20) - 1);
    // The smallest kept buffer that fits, unless it is more than twice the size.
    if (auto it = dev.spare.lower_bound(bytes); it != dev.spare.end() && it->first / 2 <= bytes) {
      *pointer = it->second;
      dev.spare_bytes -= it->first;
      dev.sizes[it->second] = it->first;
      dev.spare.erase(it);
      return Status::ok();
    }
    ScopedContext scope(d_, dev.context);
    CUdeviceptr memory = 0;
    CUresult result = d_->cuMemAlloc(&memory, bytes);
    if (result != CUDA_SUCCESS) {
      return driver_error("cuMemAlloc of " + std::to_string(bytes) +
                              " bytes on cuda:" + std::to_string(device_ordinal),
                          result);
    }
    *pointer = reinterpret_cast<void*>(memory);
    dev.sizes[*pointer] = bytes;
    return Status::ok();
  }

  // Kept for the next allocate() up to FERRY_CUDA_SCRATCH_CACHE bytes, largest freed first: a
  // reused buffer keeps its buffer id, so the peers' mappings of it stay in their caches.
  void release(int device_ordinal, void* pointer) override {
    if (pointer == nullptr) return;
    Device& dev = device(device_ordinal);
    auto known = dev.sizes.find(pointer);
    if (known == dev.sizes.end()) return;
    dev.spare.emplace(known->second, pointer);
    dev.spare_bytes += known->second;
    dev.sizes.erase(known);
    if (dev.spare_bytes <= scratch_cache_) return;
    ScopedContext scope(d_, dev.context);
    while (dev.spare_bytes > scratch_cache_) {
      auto largest = std::prev(dev.spare.end());
      d_->cuMemFree(reinterpret_cast<CUdeviceptr>(largest->second));
      dev.spare_bytes -= largest->first;
      dev.spare.erase(largest);
    }
  }

  Status reduce_async(int device_ordinal, int lane_index, void* out, const void* a, const void* b,
                      std::size_t count, DataType type, ReduceOp op, Ticket* ticket) override {
    static_assert(
        static_cast<int>(DataType::kFloat64) == 11 && static_cast<int>(ReduceOp::kBitXor) == 6,
        "kernels.cu numbers the types and ops as ferry.hpp does");
    Device& dev = device(device_ordinal);
    if (dev.reduce == nullptr) {
      return Status(Code::kUnsupported, kernels_missing(device_ordinal));
    }
    const auto lane_number = static_cast<std::size_t>(lane_index) % kLanesPerDevice;
    Lane& lane = dev.lanes[lane_number];
    ScopedContext scope(d_, dev.context);
    // One thread per 16 bytes, at most 4 blocks per multiprocessor (the loop strides over more).
    constexpr unsigned kThreads = 512;
    const std::size_t work = (count * size_of(type) + 15) / 16;
    const std::size_t most = static_cast<std::size_t>(std::max(dev.multiprocessors, 1)) * 4;
    const auto blocks =
        static_cast<unsigned>(std::clamp<std::size_t>((work + kThreads - 1) / kThreads, 1, most));
    unsigned long long elements = count;
    int type_number = static_cast<int>(type);
    int op_number = static_cast<int>(op);
    void* params[] = {&out, &a, &b, &elements, &type_number, &op_number};
    CUresult result = d_->cuLaunchKernel(dev.reduce, blocks, 1, 1, kThreads, 1, 1, 0, lane.stream,
                                         params, nullptr);
    if (result != CUDA_SUCCESS) return driver_error("cuLaunchKernel(ferry_reduce)", result);
    return mark(device_ordinal, lane_number, ticket);
  }

  Status allreduce_oneshot_async(int device_ordinal, int lane_index, const OneShot& call,
                                 Ticket* ticket) override {
    Device& dev = device(device_ordinal);
    if (dev.oneshot == nullptr) {
      return Status(Code::kUnsupported, kernels_missing(device_ordinal));
    }
    const auto lane_number = static_cast<std::size_t>(lane_index) % kLanesPerDevice;
    Lane& lane = dev.lanes[lane_number];
    ScopedContext scope(d_, dev.context);
    // A block per call.block_bytes, up to kOneShotBlocks: a small call is one block with one
    // flag per peer. Block b waits for block b of each peer.
    const std::size_t data = call.count * size_of(call.type);
    const std::size_t most = std::clamp<std::size_t>(call.max_blocks, 1, kOneShotBlocks);
    const auto blocks = static_cast<unsigned>(
        call.block_bytes == 0
            ? most
            : std::clamp<std::size_t>((data + call.block_bytes - 1) / call.block_bytes, 1, most));
    void* out = call.out;
    const void* in = call.in;
    unsigned long long count = call.count;
    int type = static_cast<int>(call.type);
    int op = static_cast<int>(call.op);
    int members = call.members;
    int me = call.me;
    int ring = call.ring ? 1 : 0;
    unsigned long long sequence = call.sequence;
    unsigned long long slot_bytes = call.slot_bytes;
    std::array<void*, kOneShotMembers> areas = call.areas;
    void* words = call.words;
    // The kernel reports its own completion where it can (one GPU command and one driver call
    // fewer than a stream write after it).
    void* blocks_done = nullptr;
    void* lane_flag = nullptr;
    unsigned done = 0;
    if (dev.flags_device != nullptr && dev.counters != 0) {
      blocks_done = reinterpret_cast<unsigned*>(dev.counters) + 16 * lane_number;
      lane_flag = static_cast<std::uint32_t*>(dev.flags_device) + 16 * lane_number;
      done = lane.issued + 1;
    }
    void* params[] = {&out,         &in,    &count,       &type,      &op,
                      &members,     &me,    &ring,        &sequence,  &slot_bytes,
                      areas.data(), &words, &blocks_done, &lane_flag, &done};
    const bool two_shot = call.two_shot && call.members == 2;
    CUresult result = d_->cuLaunchKernel(two_shot ? dev.twoshot : dev.oneshot, blocks, 1, 1, 512, 1,
                                         1, 0, lane.stream, params, nullptr);
    if (result != CUDA_SUCCESS) {
      return driver_error(two_shot ? "cuLaunchKernel(ferry_allreduce_twoshot)"
                                   : "cuLaunchKernel(ferry_allreduce_oneshot)",
                          result);
    }
    if (lane_flag == nullptr) return mark(device_ordinal, lane_number, ticket);
    ticket->stream = static_cast<std::uint32_t>(device_ordinal * kLaneSlots) +
                     static_cast<std::uint32_t>(lane_number);
    ticket->sequence = ++lane.issued;
    return Status::ok();
  }

  Status resident_open(int device_ordinal, const OneShot& shape, std::uint64_t idle_us,
                       int* id) override {
    Device& dev = device(device_ordinal);
    if (dev.resident == nullptr) {
      return Status(Code::kUnsupported, "the module has no resident kernel");
    }
    auto r = std::make_unique<Resident>();
    r->device = device_ordinal;
    r->shape = shape;
    r->idle_ns = idle_us * 1000;
    void* box = nullptr;
    void* box_device = nullptr;
    Status status = map_host(device_ordinal, sizeof(ResidentBox), &box, &box_device);
    if (!status.is_ok()) return status;
    r->box = static_cast<ResidentBox*>(box);
    r->box_device = box_device;
    ScopedContext scope(d_, dev.context);
    // A stream of its own: a kernel that stays would hold up whatever came after it on a lane.
    if (CUresult result = d_->cuStreamCreate(&r->stream, CU_STREAM_NON_BLOCKING);
        result != CUDA_SUCCESS) {
      unmap_host(device_ordinal, box);
      return driver_error("cuStreamCreate", result);
    }
    for (std::size_t i = 0; i < residents_.size(); ++i) {
      if (residents_[i] == nullptr) {
        residents_[i] = std::move(r);
        *id = static_cast<int>(i);
        return Status::ok();
      }
    }
    residents_.push_back(std::move(r));
    *id = static_cast<int>(residents_.size() - 1);
    return Status::ok();
  }

  Status resident_post(int id, const OneShot& call, Ticket* ticket) override {
    Resident& r = *residents_[static_cast<std::size_t>(id)];
    ResidentBox* box = r.box;
    // Each field carries the call's number in its top byte (kernels.cu): the kernel takes the
    // call once every field has the next one. Addresses and counts stay below 2^56.
    const std::uint64_t tag = (++r.posted & 0xff) << 56;
    const std::uint64_t fields[] = {reinterpret_cast<std::uintptr_t>(call.out),
                                    reinterpret_cast<std::uintptr_t>(call.in), call.count,
                                    static_cast<std::uint64_t>(call.type) |
                                        static_cast<std::uint64_t>(call.op) << 8 |
                                        static_cast<std::uint64_t>(call.ring ? 1 : 0) << 16,
                                    call.sequence & kFieldMask};
    for (std::size_t i = 0; i < std::size(fields); ++i) {
      __atomic_store_n(&box->field[i], (fields[i] & kFieldMask) | tag, __ATOMIC_RELEASE);
    }
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    // Not running: launch it. If it is just leaving, resident_done() sees it left with the call
    // untaken and launches it again.
    if (r.epoch == 0 || __atomic_load_n(&box->exited, __ATOMIC_ACQUIRE) == r.epoch) {
      if (Status s = resident_launch(r); !s.is_ok()) {
        // Nothing runs to take it; the next launch expects the number again.
        --r.posted;
        return s;
      }
    }
    ticket->stream = kResidentTicket | static_cast<std::uint32_t>(id);
    ticket->sequence = static_cast<std::uint32_t>(r.posted);
    return Status::ok();
  }

  Status resident_outcome(int id) override {
    Resident& r = *residents_[static_cast<std::size_t>(id)];
    Status failure = std::move(r.failure);
    r.failure = Status::ok();
    return failure;
  }

  void resident_close(int id) override {
    std::unique_ptr<Resident> r = std::move(residents_[static_cast<std::size_t>(id)]);
    if (r == nullptr) return;
    Device& dev = device(r->device);
    ScopedContext scope(d_, dev.context);
    // It leaves within a few thousand polls of its stop word (raised by the caller), or when idle.
    const auto deadline = util::deadline_after(10.0 + static_cast<double>(r->idle_ns) * 1e-9);
    while (r->epoch != 0 && __atomic_load_n(&r->box->exited, __ATOMIC_ACQUIRE) != r->epoch) {
      if (util::Clock::now() >= deadline) {
        // Still running after that: its mailbox stays (it may write there), the rest goes.
        FERRY_LOG(kWarn,
                  "cuda: the resident one-shot kernel on cuda:%d did not leave; its "
                  "mailbox is not freed",
                  r->device);
        d_->cuStreamDestroy(r->stream);
        return;
      }
      std::this_thread::yield();
    }
    d_->cuStreamSynchronize(r->stream);
    d_->cuStreamDestroy(r->stream);
    unmap_host(r->device, r->box);
  }

  Status map_host(int device_ordinal, std::size_t bytes, void** host, void** device_view) override {
    Device& dev = device(device_ordinal);
    ScopedContext scope(d_, dev.context);
    CUresult result =
        d_->cuMemHostAlloc(host, bytes, CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE);
    if (result != CUDA_SUCCESS) return driver_error("cuMemHostAlloc", result);
    std::memset(*host, 0, bytes);
    CUdeviceptr view = 0;
    result = d_->cuMemHostGetDevicePointer(&view, *host, 0);
    if (result != CUDA_SUCCESS) {
      d_->cuMemFreeHost(*host);
      *host = nullptr;
      return driver_error("cuMemHostGetDevicePointer", result);
    }
    *device_view = reinterpret_cast<void*>(view);
    return Status::ok();
  }

  void unmap_host(int device_ordinal, void* host) override {
    if (host == nullptr) return;
    Device& dev = device(device_ordinal);
    ScopedContext scope(d_, dev.context);
    d_->cuMemFreeHost(host);
  }

  Status zero(int device_ordinal, void* pointer, std::size_t bytes) override {
    Device& dev = device(device_ordinal);
    ScopedContext scope(d_, dev.context);
    // On the module's own stream: waiting for the whole context would also wait for the
    // application's kernels.
    CUresult result =
        d_->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(pointer), 0, bytes, dev.sync_stream);
    if (result == CUDA_SUCCESS) result = d_->cuStreamSynchronize(dev.sync_stream);
    return result == CUDA_SUCCESS ? Status::ok() : driver_error("cuMemsetD8Async", result);
  }

  Status copy(void* dst, const void* src, std::size_t bytes) override {
    mem::MemoryInfo info = classify(dst);
    if (info.device < 0) info = classify(src);
    return copy_on(info.device < 0 ? 0 : info.device, dst, src, bytes);
  }

  Status copy_on(int device_ordinal, void* dst, const void* src, std::size_t bytes) override {
    Device& dev = device(device_ordinal);
    ScopedContext scope(d_, dev.context);
    // Not cuMemcpy: from pageable host memory it returns before the data reaches the device, and
    // work on other streams (the application's, or a collective's kernels) could then read the
    // old contents. A stream of its own, waited for, also waits for nothing else.
    CUresult result = d_->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                        reinterpret_cast<CUdeviceptr>(src), bytes, dev.sync_stream);
    if (result != CUDA_SUCCESS) return driver_error("cuMemcpyAsync", result);
    result = d_->cuStreamSynchronize(dev.sync_stream);
    return result == CUDA_SUCCESS ? Status::ok() : driver_error("cuStreamSynchronize", result);
  }

  Status register_host(void* pointer, std::size_t bytes) override {
    Device& dev = device(0);
    ScopedContext scope(d_, dev.context);
    CUresult result = d_->cuMemHostRegister(pointer, bytes, CU_MEMHOSTREGISTER_PORTABLE);
    return result == CUDA_SUCCESS ? Status::ok() : driver_error("cuMemHostRegister", result);
  }

  void unregister_host(void* pointer) override {
    Device& dev = device(0);
    ScopedContext scope(d_, dev.context);
    d_->cuMemHostUnregister(pointer);
  }

  [[nodiscard]] bool inject_ipc_failure() const override { return inject_ipc_failure_; }

  [[nodiscard]] std::string describe() const override {
    std::string out = "CUDA " + std::to_string(d_->version / 1000) + "." +
                      std::to_string(d_->version % 1000 / 10) + ": " +
                      std::to_string(devices_.size()) + " device(s)";
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      out += (i == 0 ? " (" : ", ") + devices_[i].name;
    }
    out += "); IPC cache " + std::to_string(mappings_.size()) + " mapping(s), " +
           std::to_string(bytes_ >> 20) + " MiB";
    return out;
  }

  [[nodiscard]] std::size_t cached_mappings() const override { return mappings_.size(); }

  [[nodiscard]] std::string completion() const override {
    std::string out;
    for (std::size_t i = 0; i < devices_.size(); ++i) {
      if (devices_[i].context == nullptr) continue;
      out += (out.empty() ? "" : ", ") + std::string("cuda:") + std::to_string(i) +
             (devices_[i].flags != nullptr ? " by a flag the GPU writes" : " by events");
    }
    return out;
  }

 private:
  struct Bounce {
    CUdeviceptr memory = 0;
    std::size_t bytes = 0;
    CUevent filled = nullptr;  // recorded once the copy in has ended
    Ticket ticket;             // of the copy out: free again once done
    bool used = false;
  };
  static constexpr std::size_t kBounces = 16;
  struct Lane {
    CUstream stream = nullptr;
    std::uint32_t issued = 0;
    std::uint32_t completed = 0;  // the last sequence seen done (by the flag or an event)
    std::uint32_t* flag = nullptr;
    std::deque<std::pair<std::uint32_t, CUevent>> events;
    std::vector<CUevent> spare_events;
  };
  struct Device {
    CUdevice handle = 0;
    CUcontext context = nullptr;
    std::array<std::byte, 16> uuid{};
    std::string name;
    std::uint32_t* flags = nullptr;  // host-mapped, one cache line per lane
    // kLanesPerDevice lanes by the flag where the GPU can write one, then the two staging lanes,
    // always by events.
    std::array<Lane, kLaneSlots> lanes;
    // Device memory that host-to-host copies pass through (copy_through_device_async).
    std::vector<Bounce> bounces;
    CUstream sync_stream = nullptr;  // copy()'s
    void* flags_device = nullptr;    // flags as kernels see them
    CUdeviceptr counters = 0;        // a kernel's finished blocks, one per lane (zeroed)
    CUmodule module = nullptr;       // kernels.cu, loaded by kernels_missing()
    CUfunction reduce = nullptr;
    CUfunction copy = nullptr;
    CUfunction oneshot = nullptr;
    CUfunction twoshot = nullptr;
    CUfunction resident = nullptr;
    std::string kernels_error;  // why the module could not be loaded
    int multiprocessors = 0;
    std::unordered_map<void*, std::size_t> sizes;  // allocate()'d, in use
    std::multimap<std::size_t, void*> spare;       // released, kept by size
    std::size_t spare_bytes = 0;
  };
  // Buffer ids (cudaMalloc) and memory block ids (cuMem) are separate counters: the kind is part
  // of the key, or one allocation could be taken for another at a reused address.
  struct Key {
    int peer;
    int device;
    std::uint64_t base;
    mem::IpcKind kind;
    std::uint64_t buffer_id;
    bool operator<(const Key& o) const {
      return std::tie(peer, device, base, kind, buffer_id) <
             std::tie(o.peer, o.device, o.base, o.kind, o.buffer_id);
    }
  };
  struct Mapping {
    Key key;
    CUdeviceptr mapped;
    std::uint64_t extent;
    int pins;
    mem::IpcKind kind;
  };

  // The resident kernel's mailbox in host memory (kernels.cu, Mailbox): the first line written by
  // the host, the second by the kernel.
  struct alignas(64) ResidentBox {
    std::uint64_t field[8];  // out, in, count, shape, sequence; the call's number in the top byte
    std::uint64_t done;
    std::uint64_t exited;
    std::uint64_t spare[6];
  };
  static_assert(sizeof(ResidentBox) == 128);
  struct Resident {
    int device = 0;
    OneShot shape;
    std::uint64_t idle_ns = 0;
    ResidentBox* box = nullptr;
    void* box_device = nullptr;
    CUstream stream = nullptr;
    std::uint64_t epoch = 0;   // launches so far
    std::uint64_t posted = 0;  // calls posted so far
    Status failure;            // a relaunch that failed, for resident_outcome
  };
  static constexpr std::uint32_t kResidentTicket = 0x80000000u;
  static constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << 56) - 1;

  Status resident_launch(Resident& r) {
    Device& dev = device(r.device);
    ScopedContext scope(d_, dev.context);
    void* box = r.box_device;
    unsigned long long taken = __atomic_load_n(&r.box->done, __ATOMIC_ACQUIRE);
    unsigned long long epoch = r.epoch + 1;
    unsigned long long idle_ns = r.idle_ns;
    int members = r.shape.members;
    int me = r.shape.me;
    unsigned long long slot_bytes = r.shape.slot_bytes;
    std::array<void*, kOneShotMembers> areas = r.shape.areas;
    void* words = r.shape.words;
    void* params[] = {&box, &taken,      &epoch,       &idle_ns, &members,
                      &me,  &slot_bytes, areas.data(), &words};
    CUresult result =
        d_->cuLaunchKernel(dev.resident, 1, 1, 1, 512, 1, 1, 0, r.stream, params, nullptr);
    if (result != CUDA_SUCCESS) {
      return driver_error("cuLaunchKernel(ferry_allreduce_resident)", result);
    }
    r.epoch = epoch;
    return Status::ok();
  }

  bool resident_done(Resident& r, std::uint32_t sequence) {
    auto finished = [&] {
      const auto seen = static_cast<std::uint32_t>(__atomic_load_n(&r.box->done, __ATOMIC_ACQUIRE));
      return static_cast<std::int32_t>(seen - sequence) >= 0;
    };
    if (finished()) return true;
    // It stores `done` before `exited`: gone without the call means it left as the call came.
    if (__atomic_load_n(&r.box->exited, __ATOMIC_ACQUIRE) != r.epoch) return false;
    if (finished()) return true;
    if (Status s = resident_launch(r); !s.is_ok()) {
      r.failure = s;
      return true;
    }
    return false;
  }

  // The device's primary context and streams, made on first use.
  Device& device(int ordinal) {
    if (ordinal < 0 || ordinal >= d_->device_count) {
      throw Error(Code::kInternal, "no CUDA device " + std::to_string(ordinal));
    }
    Device& dev = devices_[static_cast<std::size_t>(ordinal)];
    if (dev.context != nullptr) return dev;
    if (d_->cuDevicePrimaryCtxRetain(&dev.context, dev.handle) != CUDA_SUCCESS) {
      dev.context = nullptr;
      throw Error(Status(Code::kIoError,
                         "cuDevicePrimaryCtxRetain failed for cuda:" + std::to_string(ordinal)));
    }
    ScopedContext scope(d_, dev.context);
    // Copies report completion by a stream write of their sequence number to a host flag. The
    // attribute describes the first memory-operation entry points, which CUDA 12 removed: from
    // there it reads 0 (on the H100 and H200 machines too), so a trial write decides.
    int mem_ops = 0;
    d_->cuDeviceGetAttribute(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev.handle);
    d_->cuStreamCreate(&dev.sync_stream, CU_STREAM_NON_BLOCKING);
    void* flags = nullptr;
    if ((mem_ops != 0 || d_->version >= 12000) && !force_events_ &&
        d_->cuMemHostAlloc(&flags, 64 * kLanesPerDevice,
                           CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) == CUDA_SUCCESS) {
      std::memset(flags, 0, 64 * kLanesPerDevice);
      auto* first = static_cast<std::uint32_t*>(flags);
      if (d_->cuStreamWriteValue32(dev.sync_stream, reinterpret_cast<CUdeviceptr>(first), 1,
                                   CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS ||
          d_->cuStreamSynchronize(dev.sync_stream) != CUDA_SUCCESS ||
          __atomic_load_n(first, __ATOMIC_ACQUIRE) != 1) {
        FERRY_LOG(kDebug, "cuda:%d: no stream writes to host memory; copies complete by events",
                  ordinal);
        d_->cuMemFreeHost(flags);
        flags = nullptr;
      }
    }
    if (flags != nullptr) {
      dev.flags = static_cast<std::uint32_t*>(flags);
      // Zero again: the trial's 1 would mark lane 0's first copy finished before it ran.
      std::memset(flags, 0, 64 * kLanesPerDevice);
      CUdeviceptr view = 0;
      if (d_->cuMemHostGetDevicePointer(&view, flags, 0) == CUDA_SUCCESS &&
          d_->cuMemAlloc(&dev.counters, 64 * kLanesPerDevice) == CUDA_SUCCESS) {
        d_->cuMemsetD8Async(dev.counters, 0, 64 * kLanesPerDevice, dev.sync_stream);
        d_->cuStreamSynchronize(dev.sync_stream);
        dev.flags_device = reinterpret_cast<void*>(view);
      }
    }
    for (int i = 0; i < kLaneSlots; ++i) {
      Lane& lane = dev.lanes[static_cast<std::size_t>(i)];
      d_->cuStreamCreate(&lane.stream, CU_STREAM_NON_BLOCKING);
      // Host-staged copies complete by events: after a copy between host and device memory the
      // flag's stream write held each copy's completion until copies on the device's other
      // streams ended too, so the sender's fills and the receiver's drains ran by turns (staged
      // device -> device 52.7 GB/s by events, 26.1 by flags, H100 pair, 2026-11-26).
      if (dev.flags != nullptr && i < kLanesPerDevice) lane.flag = dev.flags + 16 * i;
    }
    return dev;
  }

  // Closes an unpinned mapping and forgets it; returns the next index entry.
  std::map<Key, std::list<Mapping>::iterator>::iterator drop(
      std::map<Key, std::list<Mapping>::iterator>::iterator it) {
    close_mapping(*it->second);
    bytes_ -= it->second->extent;
    mappings_.erase(it->second);
    return index_.erase(it);
  }

  void close_mapping(const Mapping& mapping) {
    Device& dev = devices_[static_cast<std::size_t>(mapping.key.device)];
    ScopedContext scope(d_, dev.context);
    if (mapping.kind == mem::IpcKind::kPosixFd) {
      d_->cuMemUnmap(mapping.mapped, mapping.extent);  // releases the imported allocation
      d_->cuMemAddressFree(mapping.mapped, mapping.extent);
    } else {
      d_->cuIpcCloseMemHandle(mapping.mapped);
    }
  }

  // A cuMem allocation: device memory not made by cudaMalloc. Its mapping (not the reserved range
  // around it) is what a peer maps, and its memory block id tells reuses of an address apart.
  void classify_vmm(CUdeviceptr address, mem::MemoryInfo* info) {
    CUpointer_attribute attributes[] = {
        CU_POINTER_ATTRIBUTE_ALLOWED_HANDLE_TYPES, CU_POINTER_ATTRIBUTE_MAPPING_BASE_ADDR,
        CU_POINTER_ATTRIBUTE_MAPPING_SIZE, CU_POINTER_ATTRIBUTE_MEMORY_BLOCK_ID};
    unsigned long long handle_types = 0;
    void* base = nullptr;
    std::size_t size = 0;
    unsigned long long block = 0;
    void* values[] = {&handle_types, &base, &size, &block};
    if (d_->cuPointerGetAttributes(4, attributes, values, address) != CUDA_SUCCESS) return;
    if ((handle_types & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR) == 0 || size == 0 || block == 0) {
      return;
    }
    info->ipc = mem::IpcKind::kPosixFd;
    info->base = reinterpret_cast<std::uint64_t>(base);
    info->extent = size;
    info->buffer_id = block;
  }

  // Imports a peer's cuMem allocation from its descriptor and maps it for `local`.
  Status map_descriptor(const IpcKey& key, int local, util::Fd* fd, CUdeviceptr* mapped) {
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

  void evict() {
    auto it = mappings_.end();
    while ((mappings_.size() > cache_entries_ || bytes_ > cache_bytes_) &&
           it != mappings_.begin()) {
      --it;
      if (it->pins > 0) continue;
      close_mapping(*it);
      bytes_ -= it->extent;
      index_.erase(it->key);
      it = mappings_.erase(it);
    }
  }

  const Driver* d_;
  std::size_t cache_entries_;
  std::size_t cache_bytes_;
  std::size_t scratch_cache_;
  std::size_t kernel_copy_from_;  // FERRY_CUDA_IPC_KERNEL_COPY (0: never)
  std::size_t kernel_copy_max_;   // FERRY_CUDA_IPC_KERNEL_COPY_MAX
  bool inject_ipc_failure_;
  bool force_events_;  // FERRY_TEST_CUDA_EVENTS
  std::vector<Device> devices_;
  std::unordered_map<std::uint64_t, CUipcMemHandle> exported_;  // by buffer id
  std::vector<std::unique_ptr<Resident>> residents_;  // by resident_open's id; null: closed
  std::list<Mapping> mappings_;                       // most recently used first
  std::map<Key, std::list<Mapping>::iterator> index_;
  std::uint64_t bytes_ = 0;
};

}  // namespace

std::unique_ptr<Cuda> Cuda::create(const util::Config& config, std::string* why) {
  const std::string mode = config.get_string(util::Var::kCuda);
  if (mode == "off") {
    *why = "FERRY_CUDA=off";
    return nullptr;
  }
  const Driver* d = driver(why);
  if (d == nullptr) return nullptr;
  return std::make_unique<CudaImpl>(d, config);
}

}  // namespace ferry::cuda
