// A stand-in for CUDA on machines without a GPU, so that CI runs the stream-ordered paths of
// proto/stream_ops.cpp (hand-offs to ferry's thread, graphs, the proxy's waits, errors and
// timeouts) that otherwise run only on a lent GPU. Every buffer is host memory; a stream is a
// thread of the stand-in's that runs what is enqueued on it in order (a hand-off writes its
// "ready" word and waits for "done" as cuStreamWriteValue32/cuStreamWaitValue64 do); a graph is
// the list of what a capturing stream was given, replayed onto a stream. It has no kernels, so
// every collective and send/recv goes through ferry's thread.
//
// Install it before the first Context: cuda::Cuda::set_factory_for_tests(&FakeCuda::make).
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "cuda/cuda.hpp"

namespace ferry::test {

class FakeGraph;

// An in-order queue of work run by its own thread.
class FakeStream {
 public:
  FakeStream();
  ~FakeStream();
  FakeStream(const FakeStream&) = delete;
  FakeStream& operator=(const FakeStream&) = delete;

  // `op` runs after everything enqueued before it (or, while capturing, joins the graph).
  void enqueue(std::function<void()> op);
  // Waits until everything enqueued so far has run.
  void synchronize();
  // Capture: until end_capture, what is enqueued goes into a new graph instead of running.
  void begin_capture();
  std::unique_ptr<FakeGraph> end_capture();
  [[nodiscard]] FakeGraph* capturing() const { return capturing_.get(); }
  CudaStream handle() { return reinterpret_cast<CudaStream>(this); }

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> queue_;
  std::size_t enqueued_ = 0;
  std::size_t ran_ = 0;
  bool stopping_ = false;
  std::unique_ptr<FakeGraph> capturing_;
  std::thread thread_;
};

// What a stream captured; launch enqueues it all again. Destroying it calls what
// retain_with_graph attached, as the driver does when a graph goes.
class FakeGraph {
 public:
  ~FakeGraph();
  void launch(FakeStream& stream) const;

 private:
  friend class FakeStream;
  friend class FakeCuda;
  std::vector<std::function<void()>> ops_;
  std::vector<std::pair<void (*)(void*), void*>> retained_;
};

class FakeCuda final : public cuda::Cuda {
 public:
  static std::unique_ptr<cuda::Cuda> make();
  // The stand-in of the Context last made (tests reach it to inject faults).
  static FakeCuda* last();
  FakeCuda();
  ~FakeCuda() override;

  // Faults: retain_with_graph refuses; a hand-off waits for ever unless released by its words.
  std::atomic<bool> refuse_graph_retain{false};
  // Hand-offs enqueued and host pages mapped, for the tests' checks.
  std::atomic<int> handoffs{0};
  std::atomic<int> mapped_pages{0};
  // The stream nullptr, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD name.
  FakeStream& default_stream() { return default_stream_; }

  mem::MemoryInfo classify(const void* pointer) override;
  Status export_ipc(const void* pointer, const mem::MemoryInfo& info, cuda::IpcKey* key,
                    util::Fd* fd) override;
  std::string ipc_refusal(const std::array<std::byte, 16>& uuid, int device) override;
  [[nodiscard]] int current_device() const override { return 0; }
  [[nodiscard]] int ordinal(const std::array<std::byte, 16>& /*uuid*/) const override { return -1; }
  Status import_ipc(int peer, const cuda::IpcKey& key, int device, util::Fd* fd,
                    void** mapped) override;
  void unpin(int /*peer*/, int /*device*/, const cuda::IpcKey& /*key*/) override {}
  void set_rank(int /*rank*/) override {}
  [[nodiscard]] bool ipc_cached(int /*peer*/, const cuda::IpcKey& /*key*/,
                                int /*device*/) const override {
    return false;
  }
  void forget_peer(int /*peer*/) override {}
  Status copy_async(int device, int lane, void* dst, const void* src, std::size_t bytes,
                    cuda::Ticket* ticket) override;
  Status copy_device_async(int device, int lane, void* dst, const void* src, std::size_t bytes,
                           bool streaming, cuda::Ticket* ticket) override;
  Status copy_staged_async(int device, bool to_device, void* dst, const void* src,
                           std::size_t bytes, cuda::Ticket* ticket) override;
  Status copy_through_device_async(int device, void* dst, const void* src, std::size_t bytes,
                                   cuda::Ticket* ticket) override;
  Status prepare_bounces(int device, std::size_t bytes) override;
  [[nodiscard]] bool done(const cuda::Ticket& /*ticket*/) override { return true; }
  Status copy(void* dst, const void* src, std::size_t bytes) override;
  Status copy_on(int device, void* dst, const void* src, std::size_t bytes) override;
  std::string kernels_missing(int device) override;
  Status allocate(int device, std::size_t bytes, void** pointer) override;
  void release(int device, void* pointer) override;
  Status reduce_async(int device, int lane, void* out, const void* a, const void* b,
                      std::size_t count, DataType type, ReduceOp op, cuda::Ticket* ticket) override;
  Status allreduce_oneshot_async(int device, int lane, const OneShot& call,
                                 cuda::Ticket* ticket) override;
  Status collective_on_stream(void* stream, int device, const OneShot& call) override;
  Status p2p_on_stream(void* stream, int device, std::span<const P2pOp> ops, const P2pRing& ring,
                       void* words, std::uint64_t timeout_ns, void* scratch,
                       const P2pRelease* release) override;
  Status resident_open(int device, const OneShot& shape, std::uint64_t idle_us, int* id) override;
  Status resident_post(int id, const OneShot& call, cuda::Ticket* ticket) override;
  Status resident_outcome(int id) override;
  void resident_close(int /*id*/) override {}
  Status map_host(int device, std::size_t bytes, void** host, void** device_view) override;
  void unmap_host(int device, void* host) override;
  Status zero(int device, void* pointer, std::size_t bytes) override;
  Status stream_info(void* stream, StreamInfo* info) override;
  Status enqueue_handoff(void* stream, void* start, void* done, std::uint32_t value,
                         bool reset) override;
  Status enqueue_wait(void* stream, void* done, std::uint32_t value) override;
  Status copy_on_stream(void* stream, int device, void* dst, const void* src,
                        std::size_t bytes) override;
  Status scale_on_stream(void* stream, int device, void* out, const void* in, std::size_t count,
                         DataType type, const Scale& scale) override;
  Status retain_with_graph(void* graph, void (*release)(void*), void* arg) override;
  void defer_unmaps(bool /*defer*/) override {}
  void close_deferred() override {}
  [[nodiscard]] std::size_t deferred_unmaps() const override { return 0; }
  int relax_capture() override { return 0; }
  void restore_capture(int /*mode*/) override {}
  Status register_host(void* /*pointer*/, std::size_t /*bytes*/) override { return Status(); }
  void unregister_host(void* /*pointer*/) override {}
  [[nodiscard]] bool inject_ipc_failure() const override { return false; }
  [[nodiscard]] std::string describe() const override;
  [[nodiscard]] std::string completion() const override { return {}; }
  [[nodiscard]] std::size_t cached_mappings() const override { return 0; }

 private:
  FakeStream& stream_of(void* stream);

  FakeStream default_stream_;
};

}  // namespace ferry::test
