// The protocol engine behind a Context: picks a transport per peer, chooses eager or rendezvous
// by size, matches tags, queues what a transport cannot take now, and completes requests.
#pragma once

#include <algorithm>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "proto/link.hpp"
#include "proto/liveness.hpp"
#include "proto/matching.hpp"
#include "proto/operation.hpp"
#include "proto/request_pool.hpp"
#include "proto/rma/one_sided.hpp"
#include "proto/waiting.hpp"
#include "proto/wire.hpp"
#include "transport/transport.hpp"
#include "util/clock.hpp"
#include "util/config.hpp"
#include "util/faults.hpp"

namespace ferry::transport::self {
class SelfTransport;
}
namespace ferry::transport::shm {
class ShmTransport;
}

namespace ferry::proto {

struct CtsHeader;   // proto/wire.hpp
class DevicePath;   // proto/device_path.hpp
class ChunkedPath;  // proto/chunked.hpp
class Messages;     // proto/messages.hpp

class Engine final : public transport::AmHandler {
 public:
  // Throws ferry::Error naming what failed (configuration, bootstrap, a transport).
  static std::unique_ptr<Engine> create(const Options& options);
  ~Engine() override;  // finalize (and frees the pinned bounces)

  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] int size() const { return size_; }
  [[nodiscard]] int local_rank() const { return bootstrap_->local_rank(); }
  [[nodiscard]] int local_size() const { return bootstrap_->local_size(); }
  [[nodiscard]] std::vector<int> local_ranks() const { return bootstrap_->local_ranks(); }
  [[nodiscard]] std::string job_id() const { return bootstrap_->job_id(); }
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
  // Whether calls lock (FERRY_THREADS=multi); fixed for the engine's life.
  [[nodiscard]] bool threaded() const { return waiting_.threaded(); }
  // How calls wait and share the engine between threads (proto/waiting.hpp).
  [[nodiscard]] Waiting& waiting() { return waiting_; }

  // Tag-matched point-to-point (proto/messages.hpp): isend, irecv, iprobe, cancel.
  [[nodiscard]] Messages& messages() { return *messages_; }
  // A request that has already failed with `status` (bad arguments found above the engine).
  Request failed(Status status);
  // Runs `operation` behind a request; it moves forward in every progress call.
  Request start(std::unique_ptr<Operation> operation);
  // Which peers died, in which order, and whether anyone is left (proto/liveness.hpp).
  [[nodiscard]] const Liveness& liveness() const { return liveness_; }
  // Asks the transports now which peers died (as progress does every few thousand calls).
  void look_for_failures() { check_peers(); }
  // Whether `rank` is reached through memory shared with it (self, shm): its death is seen in
  // milliseconds, not keepalives.
  [[nodiscard]] bool shares_memory(int rank) const {
    return peers_[static_cast<std::size_t>(rank)].shares_memory;
  }
  // The GPU holding `buffer` where only a CUDA device can read it, else -1.
  [[nodiscard]] int device_of(const void* buffer) {
    if (!cuda_) return -1;
    const mem::MemoryInfo info = cuda_->classify(buffer);
    return info.device_only() ? info.device : -1;
  }
  [[nodiscard]] bool device_memory(const void* buffer) { return device_of(buffer) >= 0; }
  // The GPU that page-locked host memory is staged through: the caller's current one (the GPU
  // its process works with; a portable allocation names device 0 for every process), else the
  // one the memory names.
  [[nodiscard]] int bounce_device(const mem::MemoryInfo& memory) const {
    const int current = cuda_->current_device();
    return current >= 0 ? current : memory.device;
  }
  // The slot behind a request of this engine (for operations built on requests).
  static std::uint32_t index_of(const Request& request) { return request.index_; }
  Status barrier();
  [[noreturn]] void abort(int code, const std::string& reason);
  int progress();

  // Request operations (through ferry::Request).
  bool test(std::uint32_t index);
  Status wait(std::uint32_t index);
  Status wait_for(std::uint32_t index, double seconds);
  // FERRY_TIMEOUT in seconds (0: none).
  [[nodiscard]] double timeout() const { return timeout_; }
  [[nodiscard]] Status status(std::uint32_t index) { return requests_[index].status; }
  [[nodiscard]] MessageInfo info(std::uint32_t index) { return requests_[index].info; }
  [[nodiscard]] bool done(std::uint32_t index) {
    return requests_[index].state == RequestState::kDone;
  }
  // A Request handle lets its slot go; true when it was the last handle of a retired engine
  // (the caller then deletes it).
  bool release(std::uint32_t index);
  // The destructor's work (finalize, regions, mappings), done once: a Context's end. The object
  // stays usable for the Request handles still held (retire).
  void shutdown();
  // After shutdown: every slot a Request handle still names ends (those not complete with
  // kInvalidArgument); true when there are such handles, and the last one's release says so.
  bool retire();
  // Waits with Waiting::step until done() holds (asked before each step, with the lock held); false
  // if FERRY_TIMEOUT ran out first.
  template <typename Done>
  bool wait_until(Done done) {
    const auto deadline = util::deadline_after(timeout_);
    int idle = 0;
    while (!done()) {
      if (timeout_ > 0 && util::Clock::now() >= deadline) return false;
      waiting_.step(&idle);
    }
    return true;
  }
  // Whether nothing but a message can end a wait now, so it may sleep on the transports'
  // wake-ups: no device copies, queued sends (the receiver frees room without ringing), direct
  // transfers under suspicion or collectives with GPU work in flight.
  [[nodiscard]] bool only_a_message_can_end_a_wait() const;

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
  [[nodiscard]] std::vector<std::string> describe_transports() const;
  [[nodiscard]] cuda::Cuda* cuda() const { return cuda_.get(); }

  void on_am(std::uint8_t id, int source, std::span<const std::byte> data) override;
  void on_direct(std::uint64_t cookie, Status status) override;
  // What a direct transfer's end means for its request (on_direct, or settle_suspects later).
  void direct_outcome(std::uint32_t index, Status status);
  void on_batch_end() override { rma_->on_batch_end(); }

  // ---- What the engine's parts (proto/rma/ ...) use: links, requests, sending ----
  [[nodiscard]] Link& link(int rank) { return peers_[static_cast<std::size_t>(rank)]; }
  [[nodiscard]] const Link& link(int rank) const { return peers_[static_cast<std::size_t>(rank)]; }
  [[nodiscard]] RequestPool& requests() { return requests_; }
  // The handle of request slot `index` (or Request::kDone: an operation that completed at once).
  Request request(std::uint32_t index) { return Request(this, index); }
  // The handle of an operation that completed where it started (no slot).
  Request completed_request() { return Request(this, Request::kDone); }
  void complete(std::uint32_t index, Status status);
  // Completes the request once no copy uses its buffer any more.
  void complete_when_idle(std::uint32_t index, Status status);
  // A send-like request was made (finalize waits for them to complete).
  void count_send() { ++outstanding_sends_; }
  // Sends an active message now or queues it behind what is already queued for that peer.
  void send_or_queue(int peer, Pending&& pending);
  void send_control(int peer, std::uint8_t am, std::span<const std::byte> header);
  // Sends `length` bytes of request `index`'s send buffer to `peer` as a fragment stream: kAmFrag
  // into its request `id`, or kAmPut (a Pending the caller completes with the region fields).
  Pending stream(std::uint8_t am, std::uint32_t index, std::uint64_t id, std::size_t length);
  void protocol_error(int source, const char* what);
  // A copy in flight on a CUDA stream, completed in progress.
  void add_device_op(const DeviceOp& op);
  // Sends what waits in the peers' queues, as far as the transports take it.
  int drain_pending();
  [[nodiscard]] DevicePath& device() { return *device_; }
  [[nodiscard]] ChunkedPath& chunked() { return *chunked_; }
  // FERRY_TEST_CRASH_AT: this rank dies here if the test names it and this point.
  [[nodiscard]] bool crashes_at(util::CrashPoint point) const {
    return (point == util::CrashPoint::kMidPipeline && crash_mid_pipeline_) ||
           (point == util::CrashPoint::kFirstSend && crash_on_send_);
  }
  void crash_point(util::CrashPoint point) const {
    if (crashes_at(point)) util::crash_point(config_, rank_, point);
  }
  // Whether device buffers may move by CUDA IPC (FERRY_CUDA_IPC).
  [[nodiscard]] bool cuda_ipc() const { return cuda_ipc_; }

 private:
  Engine(util::Config config, std::unique_ptr<bootstrap::Bootstrap> bootstrap);
  void setup_transports();
  void setup_ofi(std::size_t local_count);  // local_count: ranks on this node
  void connect_peers();
  void finalize();

  using Peer = Link;
  bool try_send(Peer& peer, Pending& pending);  // true when fully sent
  // Asks the transports which peers died, and fails what involves them.
  void check_peers();
  void peer_failed(int rank, const std::string& why);

  std::shared_ptr<Engine*> handle_;
  bool shut_down_ = false;      // shutdown() ran
  std::size_t held_after_ = 0;  // after retire(): Request handles still held
  bool retired_ = false;
  std::map<const void*, std::function<void()>> teardown_;  // at_teardown's, by owner
  // Buffers' memory kinds (host for every buffer without CUDA).
  mem::MemoryInfo classify(const void* buffer) {
    return cuda_ ? cuda_->classify(buffer) : mem::MemoryInfo{};
  }

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
  double timeout_ = 0;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  transport::self::SelfTransport* self_ = nullptr;  // polled only when it has work
  std::vector<transport::Transport*> polled_;       // the other transports, polled every time
  Waiting waiting_{*this, polled_};
  // The shm transport among them, if any: progress asks it inline whether it has anything to do
  // (an idle poll is then a few loads; a waiting loop that calls progress() sees a peer's store
  // sooner, docs/PERFORMANCE.md, "One-sided").
  transport::shm::ShmTransport* shm_ = nullptr;
  std::vector<std::string> transport_notes_;  // why each transport is or is not here
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;
  std::vector<Link> peers_;
  Liveness liveness_{peers_};
  std::unique_ptr<rma::OneSided> rma_;  // made once the transports are set up
  // The transport that registers regions for native one-sided access (ofi, FERRY_OFI_RMA=auto or
  // native, where the provider has FI_RMA writes and checks keys), or null.
  transport::Transport* native_rma_ = nullptr;
  std::vector<int> pending_peers_;  // peers whose pending queue is not empty
  // Direct transfers that failed while their peer was not (yet) seen dead: held until it is
  // (then kPeerFailed, through peer_failed) or until `until` (then their own failure).
  struct Suspect {
    std::uint64_t cookie;  // the request's wire id
    int peer;
    Status status;
    util::Clock::time_point until;
  };
  std::vector<Suspect> suspects_;
  int settle_suspects();
  RequestPool requests_;
  std::unique_ptr<Messages> messages_;  // after requests_: its requests go with the pool
  // Operations in flight, by request slot; after requests_ so that they (and the requests they
  // hold) go first.
  std::vector<std::pair<std::uint32_t, std::unique_ptr<Operation>>> operations_;
  bool advancing_ = false;  // an operation's own calls must not advance operations again
  int advance_operations();
  int progress_all();                  // progress() past its idle poll
  bool crash_on_send_ = false;         // FERRY_TEST_CRASH_AT=first-send names this rank
  bool crash_mid_pipeline_ = false;    // FERRY_TEST_CRASH_AT=mid-pipeline names this rank
  std::size_t outstanding_sends_ = 0;  // send requests not yet complete
  std::uint32_t progress_calls_ = 0;   // peers are checked every kCheckPeersEvery calls
};

}  // namespace ferry::proto
