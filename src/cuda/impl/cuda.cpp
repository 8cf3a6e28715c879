// The CUDA module behind cuda.hpp, composed of its parts: the devices and their lanes
// (devices.hpp), the IPC cache (ipc_cache.hpp), the kernels' launches (launches.hpp) and the
// resident kernel (resident.hpp). Here: memory classification, the copies, and the device memory
// the collectives borrow. Driver calls go through the dlopen'd table (driver.hpp), each in the
// primary context of the device it concerns, so an application's own CUDA state never changes.
#include "cuda/cuda.hpp"

#include <algorithm>
#include <cstring>

#include "cuda/impl/devices.hpp"
#include "cuda/impl/ipc_cache.hpp"
#include "cuda/impl/launches.hpp"
#include "cuda/impl/resident.hpp"
#include "cuda/impl/streams.hpp"

namespace ferry::cuda {
namespace {

class CudaImpl final : public Cuda {
 public:
  CudaImpl(const Driver* d, const util::Config& config)
      : d_(d),
        devices_(d, config.get_bool(util::Var::kTestCudaEvents)),
        ipc_(devices_, config),
        launches_(devices_, config),
        residents_(devices_),
        scratch_cache_(config.get_size(util::Var::kCudaScratchCache)) {}

  mem::MemoryInfo classify(const void* pointer) override;

  Status export_ipc(const void* pointer, const mem::MemoryInfo& info, IpcKey* key,
                    util::Fd* fd) override {
    return ipc_.export_ipc(pointer, info, key, fd);
  }
  std::string ipc_refusal(const std::array<std::byte, 16>& uuid, int local) override {
    return ipc_.refusal(uuid, local);
  }
  [[nodiscard]] int current_device() const override { return devices_.current(); }
  [[nodiscard]] int ordinal(const std::array<std::byte, 16>& uuid) const override {
    return devices_.ordinal(uuid);
  }
  Status import_ipc(int peer, const IpcKey& key, int local, util::Fd* fd, void** mapped) override {
    return ipc_.import(peer, key, local, fd, mapped);
  }
  void unpin(int peer, int local, const IpcKey& key) override { ipc_.unpin(peer, local, key); }
  void set_rank(int rank) override { ipc_.set_rank(rank); }
  [[nodiscard]] bool ipc_cached(int peer, const IpcKey& key, int local) const override {
    return ipc_.cached(peer, key, local);
  }
  void forget_peer(int peer) override { ipc_.forget_peer(peer); }

  Status copy_async(int ordinal, int lane, void* dst, const void* src, std::size_t bytes,
                    Ticket* ticket) override {
    return devices_.copy_on_lane(ordinal, static_cast<std::size_t>(lane) % kLanesPerDevice, dst,
                                 src, bytes, ticket);
  }
  Status copy_device_async(int ordinal, int lane, void* dst, const void* src, std::size_t bytes,
                           bool streaming, Ticket* ticket) override {
    return launches_.copy_device(ordinal, lane, dst, src, bytes, streaming, ticket);
  }
  Status copy_staged_async(int ordinal, bool to_device, void* dst, const void* src,
                           std::size_t bytes, Ticket* ticket) override {
    return devices_.copy_on_lane(ordinal, to_device ? kStageToDevice : kStageToHost, dst, src,
                                 bytes, ticket);
  }
  Status copy_through_device_async(int ordinal, void* dst, const void* src, std::size_t bytes,
                                   Ticket* ticket) override;
  bool done(const Ticket& ticket) override {
    return (ticket.stream & Residents::kTicket) != 0 ? residents_.done(ticket)
                                                     : devices_.done(ticket);
  }
  Status copy(void* dst, const void* src, std::size_t bytes) override {
    mem::MemoryInfo info = classify(dst);
    if (info.device < 0) info = classify(src);
    return copy_on(info.device < 0 ? 0 : info.device, dst, src, bytes);
  }
  Status copy_on(int ordinal, void* dst, const void* src, std::size_t bytes) override;

  std::string kernels_missing(int ordinal) override { return launches_.missing(ordinal); }
  Status allocate(int ordinal, std::size_t bytes, void** pointer) override;
  void release(int ordinal, void* pointer) override;
  Status reduce_async(int ordinal, int lane, void* out, const void* a, const void* b,
                      std::size_t count, DataType type, ReduceOp op, Ticket* ticket) override {
    return launches_.reduce(ordinal, lane, out, a, b, count, type, op, ticket);
  }
  Status allreduce_oneshot_async(int ordinal, int lane, const OneShot& call,
                                 Ticket* ticket) override {
    return launches_.allreduce_oneshot(ordinal, lane, call, ticket);
  }
  Status collective_on_stream(void* stream, int ordinal, const OneShot& call) override {
    return launches_.collective_on_stream(stream, ordinal, call);
  }
  Status p2p_on_stream(void* stream, int ordinal, std::span<const P2pOp> ops, const P2pRing& ring,
                       void* words, std::uint64_t timeout_ns, void* scratch,
                       const P2pRelease* release) override {
    return launches_.p2p_on_stream(stream, ordinal, ops, ring, words, timeout_ns, scratch, release);
  }
  Status resident_open(int ordinal, const OneShot& shape, std::uint64_t idle_us, int* id) override {
    return residents_.open(ordinal, shape, idle_us, id);
  }
  Status resident_post(int id, const OneShot& call, Ticket* ticket) override {
    return residents_.post(id, call, ticket);
  }
  Status resident_outcome(int id) override { return residents_.outcome(id); }
  void resident_close(int id) override { residents_.close(id); }
  Status map_host(int ordinal, std::size_t bytes, void** host, void** device_view) override {
    return devices_.map_host(ordinal, bytes, host, device_view);
  }
  void unmap_host(int ordinal, void* host) override { devices_.unmap_host(ordinal, host); }
  Status zero(int ordinal, void* pointer, std::size_t bytes) override;
  Status stream_info(void* stream, StreamInfo* info) override {
    return streams::info(d_, static_cast<CUstream>(stream), info);
  }
  Status enqueue_handoff(void* stream, void* start, void* done, std::uint32_t value,
                         bool reset) override {
    return streams::handoff(d_, static_cast<CUstream>(stream), start, done, value, reset);
  }
  Status enqueue_wait(void* stream, void* done, std::uint32_t value) override {
    return streams::wait(d_, static_cast<CUstream>(stream), done, value);
  }
  Status copy_on_stream(void* stream, int ordinal, void* dst, const void* src,
                        std::size_t bytes) override {
    ScopedContext scope(d_, devices_.get(ordinal).context);
    return streams::copy(d_, static_cast<CUstream>(stream), dst, src, bytes);
  }
  Status scale_on_stream(void* stream, int ordinal, void* out, const void* in, std::size_t count,
                         DataType type, const Scale& scale) override {
    return launches_.scale_on_stream(stream, ordinal, out, in, count, type, scale);
  }
  Status retain_with_graph(void* graph, void (*release)(void*), void* arg) override {
    return streams::retain(d_, static_cast<CUgraph>(graph), release, arg);
  }
  void defer_unmaps(bool defer) override { ipc_.defer_unmaps(defer); }
  Status prepare_bounces(int ordinal, std::size_t bytes) override;
  void close_deferred() override { ipc_.close_deferred(); }
  [[nodiscard]] std::size_t deferred_unmaps() const override { return ipc_.deferred(); }
  int relax_capture() override { return streams::exchange_capture_mode(d_, -1); }
  void restore_capture(int mode) override { streams::exchange_capture_mode(d_, mode); }
  Status register_host(void* pointer, std::size_t bytes) override;
  void unregister_host(void* pointer) override;

  [[nodiscard]] bool inject_ipc_failure() const override { return ipc_.inject_failure(); }
  [[nodiscard]] std::string describe() const override {
    return "CUDA " + std::to_string(d_->version / 1000) + "." +
           std::to_string(d_->version % 1000 / 10) + ": " + devices_.describe() + "; IPC cache " +
           std::to_string(ipc_.size()) + " mapping(s), " + std::to_string(ipc_.bytes() >> 20) +
           " MiB";
  }
  [[nodiscard]] std::string completion() const override { return devices_.completion(); }
  [[nodiscard]] std::size_t cached_mappings() const override { return ipc_.size(); }

 private:
  // A cuMem allocation: device memory not made by cudaMalloc. Its mapping (not the reserved range
  // around it) is what a peer maps, and its memory block id tells reuses of an address apart.
  void classify_vmm(CUdeviceptr address, mem::MemoryInfo* info);
  // A device bounce whose last copy out has ended, else a new one (at most kBounces, none
  // while unmaps are deferred where one exists), or kWouldBlock.
  Status free_bounce(Device& dev, std::size_t bytes, Bounce** bounce);
  Status make_bounce(Device& dev, std::size_t bytes, Bounce** bounce);

  const Driver* d_;
  // Declared in the order they are made; they go in reverse, the devices (and their contexts)
  // last.
  Devices devices_;
  IpcCache ipc_;
  Launches launches_;
  Residents residents_;
  std::size_t scratch_cache_;  // FERRY_CUDA_SCRATCH_CACHE
};

mem::MemoryInfo CudaImpl::classify(const void* pointer) {
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

void CudaImpl::classify_vmm(CUdeviceptr address, mem::MemoryInfo* info) {
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

Status CudaImpl::free_bounce(Device& dev, std::size_t bytes, Bounce** bounce) {
  for (Bounce& b : dev.bounces) {
    if (b.bytes >= bytes && (!b.used || devices_.done(b.ticket))) {
      *bounce = &b;
      return Status::ok();
    }
  }
  if (dev.bounces.size() >= kBounces || (!dev.bounces.empty() && ipc_.deferring_unmaps())) {
    return Status(Code::kWouldBlock, "every device bounce is in use");
  }
  return make_bounce(dev, bytes, bounce);
}

Status CudaImpl::prepare_bounces(int ordinal, std::size_t bytes) {
  Device& dev = devices_.get(ordinal);
  ScopedContext scope(d_, dev.context);
  while (dev.bounces.size() < static_cast<std::size_t>(kPreparedBounces)) {
    Bounce* made = nullptr;
    if (Status s = make_bounce(dev, bytes, &made); !s) return s;
  }
  return Status::ok();
}

Status CudaImpl::make_bounce(Device& dev, std::size_t bytes, Bounce** bounce) {
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
  *bounce = &dev.bounces.back();
  return Status::ok();
}

Status CudaImpl::copy_through_device_async(int ordinal, void* dst, const void* src,
                                           std::size_t bytes, Ticket* ticket) {
  Device& dev = devices_.get(ordinal);
  ScopedContext scope(d_, dev.context);
  Bounce* bounce = nullptr;
  if (Status s = free_bounce(dev, bytes, &bounce); !s) return s;
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
  Status marked = devices_.mark(ordinal, kStageToHost, ticket);
  if (marked) {
    bounce->ticket = *ticket;
    bounce->used = true;
  }
  return marked;
}

Status CudaImpl::copy_on(int ordinal, void* dst, const void* src, std::size_t bytes) {
  Device& dev = devices_.get(ordinal);
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

Status CudaImpl::allocate(int ordinal, std::size_t bytes, void** pointer) {
  Device& dev = devices_.get(ordinal);
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
    return driver_error(
        "cuMemAlloc of " + std::to_string(bytes) + " bytes on cuda:" + std::to_string(ordinal),
        result);
  }
  *pointer = reinterpret_cast<void*>(memory);
  dev.sizes[*pointer] = bytes;
  return Status::ok();
}

// Kept for the next allocate() up to FERRY_CUDA_SCRATCH_CACHE bytes, largest freed first: a
// reused buffer keeps its buffer id, so the peers' mappings of it stay in their caches.
void CudaImpl::release(int ordinal, void* pointer) {
  if (pointer == nullptr) return;
  Device& dev = devices_.get(ordinal);
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

Status CudaImpl::zero(int ordinal, void* pointer, std::size_t bytes) {
  Device& dev = devices_.get(ordinal);
  ScopedContext scope(d_, dev.context);
  // On the module's own stream: waiting for the whole context would also wait for the
  // application's kernels.
  CUresult result =
      d_->cuMemsetD8Async(reinterpret_cast<CUdeviceptr>(pointer), 0, bytes, dev.sync_stream);
  if (result == CUDA_SUCCESS) result = d_->cuStreamSynchronize(dev.sync_stream);
  return result == CUDA_SUCCESS ? Status::ok() : driver_error("cuMemsetD8Async", result);
}

Status CudaImpl::register_host(void* pointer, std::size_t bytes) {
  ScopedContext scope(d_, devices_.get(0).context);
  CUresult result = d_->cuMemHostRegister(pointer, bytes, CU_MEMHOSTREGISTER_PORTABLE);
  return result == CUDA_SUCCESS ? Status::ok() : driver_error("cuMemHostRegister", result);
}

void CudaImpl::unregister_host(void* pointer) {
  ScopedContext scope(d_, devices_.get(0).context);
  d_->cuMemHostUnregister(pointer);
}

}  // namespace

std::unique_ptr<Cuda> Cuda::create_driver(const util::Config& config, std::string* why) {
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
