#include "cuda/impl/devices.hpp"

#include <cstring>

#include "util/log.hpp"

namespace ferry::cuda {

Status driver_error(const std::string& call, CUresult result) {
  return Status(Code::kIoError, call + " failed: " + error_string(result));
}

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

Devices::Devices(const Driver* d, bool force_events) : d_(d), force_events_(force_events) {
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

Devices::~Devices() {
  for (Device& dev : devices_) {
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

Device& Devices::get(int ordinal) {
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
  d_->cuStreamCreate(&dev.sync_stream, CU_STREAM_NON_BLOCKING);
  make_flags(dev, ordinal);
  for (int i = 0; i < kLaneSlots; ++i) {
    Lane& lane = dev.lanes[static_cast<std::size_t>(i)];
    d_->cuStreamCreate(&lane.stream, CU_STREAM_NON_BLOCKING);
    // Host-staged copies complete by events: after a copy between host and device memory the
    // flag's stream write held each copy's completion until copies on the device's other
    // streams ended too, so the sender's fills and the receiver's drains ran by turns (staged
    // device -> device 52.7 GB/s by events, 26.1 by flags, H100 pair, 2026-11-26).
    if (dev.flags != nullptr && i < kLanesPerDevice) lane.flag = dev.flags + 16 * i;
    // Events made here, not at a copy: cuEventCreate waits for a driver lock that a thread
    // launching onto a full stream or graph holds, and the copies of a stream operation run on
    // ferry's thread while that stream waits for them (one H200 shared by two ranks: graph
    // replays of a staged allreduce stopped at the first). A lane needs more only with more
    // than kSpareEvents copies in flight on it.
    if (lane.flag == nullptr) {
      for (int e = 0; e < kSpareEvents; ++e) {
        CUevent event = nullptr;
        if (d_->cuEventCreate(&event, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) break;
        lane.spare_events.push_back(event);
      }
    }
  }
  return dev;
}

void Devices::make_flags(Device& dev, int ordinal) {
  // Copies report completion by a stream write of their sequence number to a host flag. The
  // attribute describes the first memory-operation entry points, which CUDA 12 removed: from
  // there it reads 0 (on the H100 and H200 machines too), so a trial write decides.
  int mem_ops = 0;
  d_->cuDeviceGetAttribute(&mem_ops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev.handle);
  void* flags = nullptr;
  if ((mem_ops == 0 && d_->version < 12000) || force_events_ ||
      d_->cuMemHostAlloc(&flags, 64 * kLanesPerDevice,
                         CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE) != CUDA_SUCCESS) {
    return;
  }
  std::memset(flags, 0, 64 * kLanesPerDevice);
  auto* first = static_cast<std::uint32_t*>(flags);
  if (d_->cuStreamWriteValue32(dev.sync_stream, reinterpret_cast<CUdeviceptr>(first), 1,
                               CU_STREAM_WRITE_VALUE_DEFAULT) != CUDA_SUCCESS ||
      d_->cuStreamSynchronize(dev.sync_stream) != CUDA_SUCCESS ||
      __atomic_load_n(first, __ATOMIC_ACQUIRE) != 1) {
    FERRY_LOG(kDebug, "cuda:%d: no stream writes to host memory; copies complete by events",
              ordinal);
    d_->cuMemFreeHost(flags);
    return;
  }
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

int Devices::current() const {
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

int Devices::ordinal(const std::array<std::byte, 16>& uuid) const {
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i].uuid == uuid) return static_cast<int>(i);
  }
  return -1;
}

Status Devices::copy_on_lane(int ordinal, std::size_t lane_number, void* dst, const void* src,
                             std::size_t bytes, Ticket* ticket) {
  Device& dev = get(ordinal);
  Lane& lane = dev.lanes[lane_number];
  ScopedContext scope(d_, dev.context);
  CUresult result = d_->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst),
                                      reinterpret_cast<CUdeviceptr>(src), bytes, lane.stream);
  if (result != CUDA_SUCCESS) return driver_error("cuMemcpyAsync", result);
  return mark(ordinal, lane_number, ticket);
}

Status Devices::mark(int ordinal, std::size_t lane_number, Ticket* ticket) {
  Lane& lane = made(ordinal).lanes[lane_number];
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
  ticket->stream =
      static_cast<std::uint32_t>(ordinal * kLaneSlots) + static_cast<std::uint32_t>(lane_number);
  ticket->sequence = sequence;
  return Status::ok();
}

bool Devices::done(const Ticket& ticket) {
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

Status Devices::map_host(int ordinal, std::size_t bytes, void** host, void** device_view) {
  ScopedContext scope(d_, get(ordinal).context);
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

void Devices::unmap_host(int ordinal, void* host) {
  if (host == nullptr) return;
  ScopedContext scope(d_, get(ordinal).context);
  d_->cuMemFreeHost(host);
}

std::string Devices::describe() const {
  std::string out = std::to_string(devices_.size()) + " device(s)";
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    out += (i == 0 ? " (" : ", ") + devices_[i].name;
  }
  return out + ")";
}

std::string Devices::completion() const {
  std::string out;
  for (std::size_t i = 0; i < devices_.size(); ++i) {
    if (devices_[i].context == nullptr) continue;
    out += (out.empty() ? "" : ", ") + std::string("cuda:") + std::to_string(i) +
           (devices_[i].flags != nullptr ? " by a flag the GPU writes" : " by events");
  }
  return out;
}

}  // namespace ferry::cuda
