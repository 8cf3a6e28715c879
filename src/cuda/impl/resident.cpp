#include "cuda/impl/resident.hpp"

#include <thread>

#include "util/clock.hpp"
#include "util/log.hpp"

namespace ferry::cuda {

Status Residents::open(int ordinal, const Cuda::OneShot& shape, std::uint64_t idle_us, int* id) {
  Device& dev = devices_.get(ordinal);
  if (dev.resident == nullptr) {
    return Status(Code::kUnsupported, "the module has no resident kernel");
  }
  auto r = std::make_unique<Resident>();
  r->device = ordinal;
  r->shape = shape;
  r->idle_ns = idle_us * 1000;
  void* box = nullptr;
  void* box_device = nullptr;
  Status status = devices_.map_host(ordinal, sizeof(Box), &box, &box_device);
  if (!status.is_ok()) return status;
  r->box = static_cast<Box*>(box);
  r->box_device = box_device;
  ScopedContext scope(d_, dev.context);
  // A stream of its own: a kernel that stays would hold up whatever came after it on a lane.
  if (CUresult result = d_->cuStreamCreate(&r->stream, CU_STREAM_NON_BLOCKING);
      result != CUDA_SUCCESS) {
    devices_.unmap_host(ordinal, box);
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

Status Residents::post(int id, const Cuda::OneShot& call, Ticket* ticket) {
  Resident& r = *residents_[static_cast<std::size_t>(id)];
  Box* box = r.box;
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
  // Not running: launch it. If it is just leaving, done() sees it left with the call untaken
  // and launches it again.
  if (r.epoch == 0 || __atomic_load_n(&box->exited, __ATOMIC_ACQUIRE) == r.epoch) {
    if (Status s = launch(r); !s.is_ok()) {
      // Nothing runs to take it; the next launch expects the number again.
      --r.posted;
      return s;
    }
  }
  ticket->stream = kTicket | static_cast<std::uint32_t>(id);
  ticket->sequence = static_cast<std::uint32_t>(r.posted);
  return Status::ok();
}

Status Residents::outcome(int id) {
  Resident& r = *residents_[static_cast<std::size_t>(id)];
  Status failure = std::move(r.failure);
  r.failure = Status::ok();
  return failure;
}

void Residents::close(int id) {
  std::unique_ptr<Resident> r = std::move(residents_[static_cast<std::size_t>(id)]);
  if (r == nullptr) return;
  Device& dev = devices_.get(r->device);
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
  devices_.unmap_host(r->device, r->box);
}

bool Residents::done(const Ticket& ticket) {
  Resident& r = *residents_[ticket.stream & ~kTicket];
  const std::uint32_t sequence = ticket.sequence;
  auto finished = [&] {
    const auto seen = static_cast<std::uint32_t>(__atomic_load_n(&r.box->done, __ATOMIC_ACQUIRE));
    return static_cast<std::int32_t>(seen - sequence) >= 0;
  };
  if (finished()) return true;
  // It stores `done` before `exited`: gone without the call means it left as the call came.
  if (__atomic_load_n(&r.box->exited, __ATOMIC_ACQUIRE) != r.epoch) return false;
  if (finished()) return true;
  if (Status s = launch(r); !s.is_ok()) {
    r.failure = s;
    return true;
  }
  return false;
}

Status Residents::launch(Resident& r) {
  Device& dev = devices_.get(r.device);
  ScopedContext scope(d_, dev.context);
  void* box = r.box_device;
  unsigned long long taken = __atomic_load_n(&r.box->done, __ATOMIC_ACQUIRE);
  unsigned long long epoch = r.epoch + 1;
  unsigned long long idle_ns = r.idle_ns;
  int members = r.shape.members;
  int me = r.shape.me;
  unsigned long long slot_bytes = r.shape.slot_bytes;
  std::array<void*, Cuda::kOneShotMembers> areas = r.shape.areas;
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

}  // namespace ferry::cuda
