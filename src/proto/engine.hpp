// The protocol engine behind a Context: it makes its parts (links to peers, tag-matched
// messages, device paths, one-sided, operations), runs progress, completes requests, dispatches
// what arrives and tells the parts of a peer's death.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "proto/direct_ends.hpp"
#include "proto/link.hpp"
#include "proto/links.hpp"
#include "proto/liveness.hpp"
#include "proto/matching.hpp"
#include "proto/operation.hpp"
#include "proto/request_pool.hpp"
#include "proto/revocations.hpp"
#include "proto/rma/one_sided.hpp"
#include "proto/waiting.hpp"
#include "proto/wire.hpp"
#include "transport/transport.hpp"
#include "util/clock.hpp"
#include "util/config.hpp"
#include "util/faults.hpp"

namespace ferry::proto {

struct CtsHeader;   // proto/wire.hpp
class DevicePath;   // proto/device_path.hpp
class ChunkedPath;  // proto/chunked.hpp
class Messages;     // proto/messages.hpp
class StreamOps;    // proto/stream_ops.hpp

class Engine final : public transport::AmHandler {
 public:
  // Throws ferry::Error naming what failed (configuration, bootstrap, a transport).
  static std::unique_ptr<Engine> create(const Options& options);
  ~Engine() override;  // finalize (and frees the pinned bounces)

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  // The job as the bootstrap sees it: its id, the ranks on this node.
  [[nodiscard]] const bootstrap::Bootstrap& job() const { return *bootstrap_; }
  [[nodiscard]] const util::Config& config() const { return config_; }

  // Held by the API layer around each call into the engine when the Context may be called from
  // several threads (FERRY_THREADS=multi); nothing in single mode. A blocking wait lets go of it
  // between polls (Waiting::step), so the other threads' calls get in while it waits.
  class [[nodiscard]] Entry {
   public:
    // A call made from inside another (same thread) does not lock again.
    explicit Entry(Engine* engine)
        : waiting_(engine->waiting_.threaded() && !engine->waiting_.held_here() ? &engine->waiting_
                                                                                : nullptr) {
      if (waiting_ != nullptr) waiting_->lock();
    }
    ~Entry() {
      if (waiting_ != nullptr) waiting_->unlock();
    }
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

   private:
    Waiting* waiting_;
  };
  Entry enter() { return Entry(this); }
  // How calls wait and share the engine between threads (proto/waiting.hpp).
  [[nodiscard]] Waiting& waiting() { return waiting_; }

  // Tag-matched point-to-point (proto/messages.hpp): isend, irecv, iprobe, cancel.
  [[nodiscard]] Messages& messages() { return *messages_; }
  // Operations behind requests (a collective's schedule; proto/operation.hpp).
  [[nodiscard]] Operations& operations() { return operations_; }
  // Which peers died, in which order, and whether anyone is left (proto/liveness.hpp).
  [[nodiscard]] const Liveness& liveness() const { return liveness_; }
  // The communicators revoked in the job as far as this rank knows (proto/revocations.hpp).
  [[nodiscard]] Revocations& revocations() { return revocations_; }
  // Asks the transports now which peers died (as progress does every few thousand calls), and
  // fails what involves them.
  void look_for_failures();
  // The slot behind a request of this engine (for operations built on requests).
  static std::uint32_t index_of(const Request& request) { return request.index_; }
  Status barrier();
  [[noreturn]] void abort(int code, const std::string& reason);
  int progress();

  // The destructor's work (finalize, regions, mappings), done once: a Context's end. The object
  // stays usable for the Request handles still held (retire).
  void shutdown();
  // Whether nothing but a message can end a wait now, so it may sleep on the transports'
  // wake-ups: no device copies, queued sends (the receiver frees room without ringing), direct
  // transfers under suspicion or collectives with GPU work in flight.
  [[nodiscard]] bool only_a_message_can_end_a_wait() const;
  // A blocking collective waits for its own GPU work (Immediate): for as long as it does, no
  // wait sleeps on the wake-ups (the kernel's end rings none; FERRY_WAIT_MODE=block slept 32 ms
  // a poll).
  void awaiting_gpu(int delta) { gpu_waits_ += delta; }

  // One-sided communication (proto/rma/; the rules are ferry::MemoryRegion's).
  [[nodiscard]] rma::OneSided& rma() { return *rma_; }
  // Null once this engine is finalized (MemoryRegions outlive their Context harmlessly).
  [[nodiscard]] const std::shared_ptr<Engine*>& handle() const { return handle_; }
  // Work to run when the Engine goes, after finalize and before CUDA goes (the device state of
  // a Communicator that outlives its Context), keyed by its owner, which withdraws it if it
  // goes first.
  void at_teardown(const void* owner, std::function<void()> work) {
    teardown_[owner] = std::move(work);
  }
  void cancel_teardown(const void* owner) { teardown_.erase(owner); }

  [[nodiscard]] std::string describe_peer(int rank) const;
  // What every rank of the job waits for now, a line each (Context::wait_report).
  std::string wait_report();
  [[nodiscard]] cuda::Cuda* cuda() const { return cuda_.get(); }

  void on_am(std::uint8_t id, int source, std::span<const std::byte> data) override;
  void on_direct(std::uint64_t cookie, Status status) override {
    direct_ends_.on_end(cookie, status);
  }
  void on_batch_end() override { rma_->on_batch_end(); }

  // ---- What the engine's parts (proto/rma/ ...) use: links, requests, sending ----
  // The transports, each peer's link, and sending through the links' queues (proto/links.hpp).
  [[nodiscard]] Links& links() { return links_; }
  [[nodiscard]] const Links& links() const { return links_; }
  [[nodiscard]] RequestPool& requests() { return requests_; }
  // The handle of request slot `index` (or Request::kDone: an operation that completed at once).
  Request request(std::uint32_t index) { return Request(this, index); }
  // The handle of an operation that completed where it started (no slot).
  Request completed_request() { return Request(this, Request::kDone); }
  void complete(std::uint32_t index, Status status);
  // Completes the request once no copy uses its buffer any more.
  void complete_when_idle(std::uint32_t index, Status status);
  [[nodiscard]] DevicePath& device() { return *device_; }
  // Operations ordered on applications' CUDA streams (proto/stream_ops.hpp), made on first use.
  StreamOps& streams();
  // The stream operations if streams() made them, else null: without the engine's lock (what
  // polls their errors, such as PyTorch's watchdog through ncclCommGetAsyncError, must not wait
  // behind a thread that holds it).
  [[nodiscard]] StreamOps* streams_made() const {
    return streams_made_.load(std::memory_order_acquire);
  }
  [[nodiscard]] ChunkedPath& chunked() { return *chunked_; }
  // FERRY_TEST_CRASH_AT: where this rank dies, if the test names it.
  [[nodiscard]] const util::CrashPoints& crashes() const { return crashes_; }
  // Whether device buffers may move by CUDA IPC (FERRY_CUDA_IPC).
  [[nodiscard]] bool cuda_ipc() const { return cuda_ipc_; }

 private:
  Engine(util::Config config, std::unique_ptr<bootstrap::Bootstrap> bootstrap);
  // The transports and a link per peer (notes for ferry-info first: bootstrap, waiting, CUDA).
  void open_links();
  void finalize();

  using Peer = Link;
  void peer_failed(int rank, const std::string& why);
  // Tells the ranks of other nodes that `dead`, of this node, exited (kAmPeerDead).
  void tell_other_nodes(int dead);
  void on_peer_dead(int source, std::span<const std::byte> data);
  // kAmBye: the sender finalized; receives that wait for it end (Messages::peer_departed).
  void on_bye(int source, std::span<const std::byte> data);
  std::vector<std::pair<int, int>> reported_dead_;  // (rank, by whom), for look_for_failures

  std::shared_ptr<Engine*> handle_;
  bool shut_down_ = false;                                 // shutdown() ran
  std::map<const void*, std::function<void()>> teardown_;  // at_teardown's, by owner

  util::Config config_;
  std::unique_ptr<bootstrap::Bootstrap> bootstrap_;
  std::unique_ptr<cuda::Cuda> cuda_;  // null: every buffer is host memory (cuda_why_ says why)
  std::string cuda_why_;
  bool cuda_ipc_ = true;
  std::unique_ptr<DevicePath> device_;    // device buffers with peers that share memory
  std::unique_ptr<ChunkedPath> chunked_;  // device buffers over ofi
  int rank_ = 0;
  int size_ = 1;
  std::size_t rndv_threshold_ = 0;
  Links links_{*this, config_};
  util::WaitBoard board_;  // before waiting_, which writes to it
  Waiting waiting_{*this, links_.polled()};
  Liveness liveness_{links_.all()};
  Revocations revocations_{*this};
  std::unique_ptr<rma::OneSided> rma_;  // made once the transports are set up
  DirectEnds direct_ends_{*this};
  RequestPool requests_;
  std::unique_ptr<Messages> messages_;  // after requests_: its requests go with the pool
  int gpu_waits_ = 0;                   // awaiting_gpu
  Operations operations_{*this};      // after requests_: they (and the requests they hold) go first
  int progress_all();                 // progress() past its idle poll
  util::CrashPoints crashes_;         // FERRY_TEST_CRASH_AT, FERRY_TEST_CRASH_RANK
  std::uint32_t progress_calls_ = 0;  // peers are checked every kCheckPeersEvery calls
  std::unique_ptr<StreamOps> streams_;             // last: its requests go first
  std::atomic<StreamOps*> streams_made_{nullptr};  // streams_, once made
};

}  // namespace ferry::proto
