// The stand-in for CUDA of the tests without a GPU (see fake_cuda.hpp).
#include "fake_cuda.hpp"

#include <sched.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "coll/reduce.hpp"

namespace ferry::test {
namespace {

std::atomic<FakeCuda*> g_last{nullptr};

Status unsupported(const char* what) {
  return Status(Code::kUnsupported, std::string(what) + ": the tests' stand-in CUDA has no GPU");
}

// Until the 64 bits at `done` are at least `value` (cuStreamWaitValue64, GEQ).
void wait_for(const void* done, std::uint32_t value) {
  const auto* word = static_cast<const std::uint64_t*>(done);
  while (__atomic_load_n(word, __ATOMIC_ACQUIRE) < value) ::sched_yield();
}

}  // namespace

FakeStream::FakeStream() : thread_([this] { run(); }) {}

FakeStream::~FakeStream() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void FakeStream::enqueue(std::function<void()> op) {
  {
    std::lock_guard lock(mutex_);
    if (capturing_ != nullptr) {
      capturing_->ops_.push_back(std::move(op));
      return;
    }
    queue_.push_back(std::move(op));
    ++enqueued_;
  }
  changed_.notify_all();
}

void FakeStream::synchronize() {
  std::unique_lock lock(mutex_);
  const std::size_t target = enqueued_;
  changed_.wait(lock, [&] { return ran_ >= target; });
}

void FakeStream::begin_capture() {
  std::lock_guard lock(mutex_);
  capturing_ = std::unique_ptr<FakeGraph>(new FakeGraph);
}

std::unique_ptr<FakeGraph> FakeStream::end_capture() {
  std::lock_guard lock(mutex_);
  return std::move(capturing_);
}

void FakeStream::run() {
  std::unique_lock lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything ran
    std::function<void()> op = std::move(queue_.front());
    queue_.pop_front();
    lock.unlock();
    op();
    lock.lock();
    ++ran_;
    changed_.notify_all();
  }
}

FakeGraph::~FakeGraph() {
  for (auto& [release, arg] : retained_) release(arg);
}

void FakeGraph::launch(FakeStream& stream) const {
  for (const auto& op : ops_) stream.enqueue(op);
}

std::unique_ptr<cuda::Cuda> FakeCuda::make() { return std::make_unique<FakeCuda>(); }

FakeCuda* FakeCuda::last() { return g_last.load(); }

FakeCuda::FakeCuda() { g_last.store(this); }

FakeCuda::~FakeCuda() {
  FakeCuda* self = this;
  g_last.compare_exchange_strong(self, nullptr);
}

FakeStream& FakeCuda::stream_of(void* stream) {
  const auto value = reinterpret_cast<std::uintptr_t>(stream);
  if (value <= 2) return default_stream_;  // nullptr, CU_STREAM_LEGACY, CU_STREAM_PER_THREAD
  return *static_cast<FakeStream*>(stream);
}

mem::MemoryInfo FakeCuda::classify(const void* /*pointer*/) { return mem::MemoryInfo{}; }

Status FakeCuda::export_ipc(const void* /*pointer*/, const mem::MemoryInfo& /*info*/,
                            cuda::IpcKey* /*key*/, util::Fd* /*fd*/) {
  return unsupported("export_ipc");
}

std::string FakeCuda::ipc_refusal(const std::array<std::byte, 16>& /*uuid*/, int /*device*/) {
  return "the tests' stand-in CUDA has no GPU";
}

Status FakeCuda::import_ipc(int /*peer*/, const cuda::IpcKey& /*key*/, int /*device*/,
                            util::Fd* /*fd*/, void** /*mapped*/) {
  return unsupported("import_ipc");
}

Status FakeCuda::copy_async(int /*device*/, int /*lane*/, void* dst, const void* src,
                            std::size_t bytes, cuda::Ticket* /*ticket*/) {
  std::memcpy(dst, src, bytes);
  return Status();
}

Status FakeCuda::copy_device_async(int device, int lane, void* dst, const void* src,
                                   std::size_t bytes, bool /*streaming*/, cuda::Ticket* ticket) {
  return copy_async(device, lane, dst, src, bytes, ticket);
}

Status FakeCuda::copy_staged_async(int /*device*/, bool /*to_device*/, void* dst, const void* src,
                                   std::size_t bytes, cuda::Ticket* /*ticket*/) {
  std::memcpy(dst, src, bytes);
  return Status();
}

Status FakeCuda::copy_through_device_async(int /*device*/, void* dst, const void* src,
                                           std::size_t bytes, cuda::Ticket* /*ticket*/) {
  std::memcpy(dst, src, bytes);
  return Status();
}

Status FakeCuda::prepare_bounces(int /*device*/, std::size_t /*bytes*/) { return Status(); }

Status FakeCuda::copy(void* dst, const void* src, std::size_t bytes) {
  std::memcpy(dst, src, bytes);
  return Status();
}

Status FakeCuda::copy_on(int /*device*/, void* dst, const void* src, std::size_t bytes) {
  return copy(dst, src, bytes);
}

std::string FakeCuda::kernels_missing(int /*device*/) {
  return "the tests' stand-in CUDA has no kernels";
}

Status FakeCuda::allocate(int /*device*/, std::size_t bytes, void** pointer) {
  *pointer = std::calloc(1, bytes == 0 ? 1 : bytes);
  return *pointer != nullptr ? Status() : Status(Code::kNoResources, "calloc");
}

void FakeCuda::release(int /*device*/, void* pointer) { std::free(pointer); }

Status FakeCuda::reduce_async(int /*device*/, int /*lane*/, void* /*out*/, const void* /*a*/,
                              const void* /*b*/, std::size_t /*count*/, DataType /*type*/,
                              ReduceOp /*op*/, cuda::Ticket* /*ticket*/) {
  return unsupported("reduce_async");
}

Status FakeCuda::allreduce_oneshot_async(int /*device*/, int /*lane*/, const OneShot& /*call*/,
                                         cuda::Ticket* /*ticket*/) {
  return unsupported("allreduce_oneshot_async");
}

Status FakeCuda::collective_on_stream(void* /*stream*/, int /*device*/, const OneShot& /*call*/) {
  return unsupported("collective_on_stream");
}

Status FakeCuda::p2p_on_stream(void* /*stream*/, int /*device*/, std::span<const P2pOp> /*ops*/,
                               const P2pRing& /*ring*/, void* /*words*/,
                               std::uint64_t /*timeout_ns*/, void* /*scratch*/,
                               const P2pRelease* /*release*/) {
  return unsupported("p2p_on_stream");
}

Status FakeCuda::resident_open(int /*device*/, const OneShot& /*shape*/, std::uint64_t /*idle_us*/,
                               int* /*id*/) {
  return unsupported("resident_open");
}

Status FakeCuda::resident_post(int /*id*/, const OneShot& /*call*/, cuda::Ticket* /*ticket*/) {
  return unsupported("resident_post");
}

Status FakeCuda::resident_outcome(int /*id*/) { return unsupported("resident_outcome"); }

Status FakeCuda::map_host(int /*device*/, std::size_t bytes, void** host, void** device_view) {
  void* memory = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (memory == nullptr) return Status(Code::kNoResources, "aligned_alloc");
  std::memset(memory, 0, bytes);
  *host = memory;
  *device_view = memory;
  mapped_pages.fetch_add(1);
  return Status();
}

void FakeCuda::unmap_host(int /*device*/, void* host) {
  mapped_pages.fetch_sub(1);
  std::free(host);
}

Status FakeCuda::zero(int /*device*/, void* pointer, std::size_t bytes) {
  std::memset(pointer, 0, bytes);
  return Status();
}

Status FakeCuda::stream_info(void* stream, StreamInfo* info) {
  FakeStream& s = stream_of(stream);
  info->device = 0;
  info->graph = s.capturing();
  return Status();
}

Status FakeCuda::enqueue_handoff(void* stream, void* start, void* done, std::uint32_t value,
                                 bool reset) {
  handoffs.fetch_add(1);
  stream_of(stream).enqueue([start, done, value, reset] {
    if (reset) __atomic_store_n(static_cast<std::uint32_t*>(done), 0u, __ATOMIC_RELEASE);
    __atomic_store_n(static_cast<std::uint32_t*>(start), value, __ATOMIC_RELEASE);
    wait_for(done, value);
  });
  return Status();
}

Status FakeCuda::enqueue_wait(void* stream, void* done, std::uint32_t value) {
  stream_of(stream).enqueue([done, value] { wait_for(done, value); });
  return Status();
}

Status FakeCuda::copy_on_stream(void* stream, int /*device*/, void* dst, const void* src,
                                std::size_t bytes) {
  stream_of(stream).enqueue([dst, src, bytes] { std::memcpy(dst, src, bytes); });
  return Status();
}

Status FakeCuda::scale_on_stream(void* stream, int /*device*/, void* out, const void* in,
                                 std::size_t count, DataType type, const Scale& scale) {
  stream_of(stream).enqueue([=] {
    std::uint64_t bits = scale.factor_bits;
    if (scale.device_factor != nullptr) std::memcpy(&bits, scale.device_factor, size_of(type));
    if (scale.divisor != 0 && coll::is_integer(type)) {
      coll::divide_to(out, in, count, type, scale.divisor);
    } else {
      coll::multiply_to(out, in, count, type, &bits);
    }
  });
  return Status();
}

Status FakeCuda::retain_with_graph(void* graph, void (*release)(void*), void* arg) {
  if (refuse_graph_retain.load()) {
    release(arg);  // as the driver's user object does where the graph refuses it
    return Status(Code::kUnsupported, "cuGraphRetainUserObject refused (the tests' fault)");
  }
  static_cast<FakeGraph*>(graph)->retained_.emplace_back(release, arg);
  return Status();
}

std::string FakeCuda::describe() const { return "the tests' stand-in CUDA (host memory only)"; }

}  // namespace ferry::test
