// The protocol engine behind a Context: picks a transport per peer, chooses eager or rendezvous
// by size, matches tags, queues what a transport cannot take now, and completes requests.
#pragma once

#include <sched.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "cuda/cuda.hpp"
#include "cuda/stage_ring.hpp"
#include "ferry/ferry.hpp"
#include "proto/matching.hpp"
#include "proto/operation.hpp"
#include "proto/request_pool.hpp"
#include "proto/wire.hpp"
#include "transport/transport.hpp"
#include "util/clock.hpp"
#include "util/config.hpp"
#include "util/fd_mailbox.hpp"

namespace ferry::transport::self {
class SelfTransport;
}
namespace ferry::transport::shm {
class ShmTransport;
}

namespace ferry::proto {

struct CtsHeader;  // proto/wire.hpp

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
  // between polls (wait_step), so the other threads' calls get in while it waits.
  class [[nodiscard]] Entry {
   public:
    // A call made from inside another (same thread) does not lock again.
    explicit Entry(Engine* engine)
        : engine_(engine->threaded_ && engine->owner_.load(std::memory_order_relaxed) !=
                                           std::this_thread::get_id()
                      ? engine
                      : nullptr) {
      if (engine_ != nullptr) engine_->lock();
    }
    ~Entry() {
      if (engine_ != nullptr) engine_->unlock();
    }
    Entry(const Entry&) = delete;
    Entry& operator=(const Entry&) = delete;

   private:
    Engine* engine_;
  };
  Entry enter() { return Entry(this); }
  // Whether calls lock (FERRY_THREADS=multi); fixed for the engine's life.
  [[nodiscard]] bool threaded() const { return threaded_; }

  Request isend(const void* buffer, std::size_t bytes, int destination, Tag tag);
  Request irecv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask);
  // A request that has already failed with `status` (bad arguments found above the engine).
  Request failed(Status status);
  // Runs `operation` behind a request; it moves forward in every progress call.
  Request start(std::unique_ptr<Operation> operation);
  // Why `rank` can no longer be reached (it died), or empty.
  [[nodiscard]] const std::string* peer_failure(int rank) const {
    const Peer& peer = peers_[static_cast<std::size_t>(rank)];
    return peer.failed ? &peer.why : nullptr;
  }
  // When `rank`'s death was seen, as an order among the deaths seen here (1 the first); 0 while
  // it is alive. Whoever died first is the cause of what failed after.
  [[nodiscard]] std::uint64_t failure_order(int rank) const {
    return peers_[static_cast<std::size_t>(rank)].failure_order;
  }
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
  std::optional<MessageInfo> iprobe(int source, Tag tag, Tag mask);
  // No message not already here can come from `source` any more: it failed, cannot be reached
  // or is no rank (kAnySource: no other rank is left). Never this rank itself.
  [[nodiscard]] bool none_can_come(int source) const;
  Status barrier();
  [[noreturn]] void abort(int code, const std::string& reason);
  int progress();

  // Request operations (through ferry::Request).
  bool test(std::uint32_t index);
  Status wait(std::uint32_t index);
  Status wait_for(std::uint32_t index, double seconds);
  // FERRY_TIMEOUT in seconds (0: none).
  [[nodiscard]] double timeout() const { return timeout_; }
  // A blocking send ran out of time and its caller is about to release the buffer: withdraw what
  // is still queued, tell the receiver of an announced message, and complete it with kTimeout.
  Status abandon_send(std::uint32_t index);
  bool cancel(std::uint32_t index);
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
  // One step of a blocking wait: progress, and yield the CPU after FERRY_SPIN_COUNT empty polls.
  // With several threads, the lock is let go and taken again (yielding to a waiting thread).
  void wait_step(int* idle_polls);
  // Waits with wait_step until done() holds (asked before each step, with the lock held); false
  // if FERRY_TIMEOUT ran out first.
  template <typename Done>
  bool wait_until(Done done) {
    const auto deadline = util::deadline_after(timeout_);
    int idle = 0;
    while (!done()) {
      if (timeout_ > 0 && util::Clock::now() >= deadline) return false;
      wait_step(&idle);
    }
    return true;
  }
  // One step of a wait that only another process's store into shared memory can end, which rings
  // no doorbell: progress, yield after FERRY_SPIN_COUNT empty polls, and after a few thousand more
  // nap (growing to 2 ms) instead of sleeping on the doorbell, so a long wait costs little CPU.
  void spin_step(int* idle_polls);
  // Event-driven waiting for the application's own loop (Context::event_fd / arm).
  [[nodiscard]] int event_fd() const;
  bool arm();

  // One-sided operations (rma.cpp; the rules are ferry::MemoryRegion's).
  struct RmaTarget {
    int rank = -1;
    std::uint64_t region = 0;
    std::uint64_t secret = 0;
    std::size_t size = 0;  // of the region, as its key says
    std::uint64_t offset = 0;
    int fd = -1;  // allocated regions: the owner's descriptor, for mapping on this node
    // Registered regions: the owner's guard table (its descriptor) and the region's slot in it,
    // through which peers on this node reach it directly; -1: through the owner.
    int guard_fd = -1;
    int slot = -1;
    bool native = false;     // the network transport may reach it once the owner grants the key
    bool read_only = false;  // registered from memory its owner cannot write: gets only
  };
  // Where a put or get of `bytes` at `target` can be done now by a CPU copy (mapped host memory,
  // a local buffer in host memory, valid arguments), or null: then it goes through a request,
  // which reports what is wrong.
  std::byte* direct_now(const RmaTarget& target, const void* local, std::size_t bytes,
                        bool local_device, bool write);
  // direct_now's answer without its calls, for another access to the peer region that the last
  // direct access reached: the same key (rank, region, secret), in range of both the key's size
  // and the size mapped, the region still registered. Null: ask direct_now (a first access,
  // another region, device memory, anything it would refuse).
  [[gnu::always_inline]] std::byte* direct_again(int rank, std::uint64_t region,
                                                 std::uint64_t secret, std::size_t key_size,
                                                 std::uint64_t offset, const void* local,
                                                 std::size_t bytes) {
    const LastDirect& last = last_direct_;
    if (last.data == nullptr || last.rank != rank || last.region != region ||
        last.secret != secret || bytes == 0 || local == nullptr ||
        offset > std::min(key_size, last.size) || bytes > std::min(key_size, last.size) - offset ||
        std::atomic_ref<std::uint32_t>(*last.live).load(std::memory_order_acquire) == 0 ||
        device_of(local) >= 0) {
      return nullptr;
    }
    return last.data + offset;
  }
  // What a region's key carries besides its id and secret: where peers on this node find it
  // (-1: they do not), and whether other nodes may reach it natively (RmaTarget's fields).
  struct RegionAccess {
    int guard_fd = -1;
    int slot = -1;
    bool native = false;
    bool read_only = false;
  };
  Status register_region(void* address, std::size_t bytes, std::uint64_t* id, std::uint64_t* secret,
                         RegionAccess* access = nullptr);
  // Shared memory for one-sided access: *address is the caller's part of it.
  Status allocate_region(std::size_t bytes, void** address, std::uint64_t* id,
                         std::uint64_t* secret, int* fd, RegionAccess* access);
  Status deregister_region(std::uint64_t id);
  Request iput(const void* local, std::size_t bytes, const RmaTarget& target);
  Request iget(void* local, std::size_t bytes, const RmaTarget& target);
  Request iatomic(AtomicOp op, std::size_t width, const RmaTarget& target, std::uint64_t operand,
                  void* result, std::uint64_t compare);
  // iatomic's direct case on the peer region accessed last (direct_again), done here: true when
  // it was; false: ask iatomic (which reports anything wrong).
  bool atomic_again(AtomicOp op, std::size_t width, int rank, std::uint64_t region,
                    std::uint64_t secret, std::size_t key_size, std::uint64_t offset,
                    std::uint64_t operand, void* result, std::uint64_t compare);
  Status flush(int rank);  // -1: every rank
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
  void on_batch_end() override {
    if (!ack_peers_.empty()) send_acks();
  }

 private:
  struct Pending {
    std::uint8_t am = 0;
    std::uint8_t header_size = 0;
    std::array<std::byte, 40> header{};
    const std::byte* payload = nullptr;
    std::size_t payload_size = 0;
    std::uint32_t request = UINT32_MAX;  // completed with the error if sending fails
    bool complete_on_send = false;       // eager sends complete once the transport has the data
    // A pipelined rendezvous stream (am == kAmFrag): send [offset, length) of `stream` in chunks.
    std::uint32_t stream = UINT32_MAX;
    std::uint64_t rreq = 0;
    std::size_t offset = 0;
    std::size_t length = 0;
    // A put (am == kAmPut with a stream): where in which region the stream's bytes go.
    std::uint64_t region = 0;
    std::uint64_t secret = 0;
    std::uint64_t region_offset = 0;
  };
  struct Peer {
    transport::Endpoint* endpoint = nullptr;  // null: unreachable (why says why)
    std::string transport;
    std::string why;
    std::size_t eager_limit = 0;  // largest message sent eagerly
    std::size_t frag_size = 0;    // payload per fragment of a pipelined message
    std::size_t get_from = 0;     // rendezvous messages from this size up use the endpoint's get
    std::size_t read_from = 0;    // from this size up the receiver reads them (below: direct)
    bool get_failed = false;      // a zero-copy get failed once: pipeline from now on
    bool direct_failed = false;   // a direct receive could not be posted: pipeline from now on
    bool read_failed = false;     // a one-sided read failed: clear-to-send from now on
    bool failed = false;          // the peer died: everything involving it fails with `why`
    std::uint64_t failure_order = 0;  // Engine::failure_order
    bool shares_memory = false;       // self or shm: device data can go by CUDA IPC or staging ring
    std::deque<Pending> pending;      // in order; nothing bypasses it
    // Device buffers: the fallback ladder's verdict for this peer, per way of mapping memory
    // (legacy CUDA IPC, cuMem descriptors), and the staging rings.
    struct IpcVerdict {
      bool refused = false;  // failed or refused once: staged from now on
      std::string why;
    };
    IpcVerdict ipc_legacy;
    IpcVerdict ipc_fd;
    IpcVerdict& verdict(mem::IpcKind kind) {
      return kind == mem::IpcKind::kPosixFd ? ipc_fd : ipc_legacy;
    }
    std::unique_ptr<cuda::StageRing> ring_tx;  // ours, to this peer (made on first use)
    std::unique_ptr<cuda::StageRing> ring_rx;  // the peer's, to us (mapped on first fragment)
    std::vector<std::uint64_t> free_slots;     // offsets of free slots in ring_tx
    std::deque<std::uint32_t> stage_streams;   // staged sends waiting for a slot
    // One-sided operations towards this peer not yet complete, and the first failure among
    // those completed since the last flush.
    std::uint32_t rma_outstanding = 0;
    Status rma_error;
    std::string cma_rma_refused;     // why its registered host memory is not reached by CMA
    std::string device_rma_refused;  // why its registered device memory is not mapped here
    std::string native_rma_refused;  // why native puts and gets to it go by messages instead
    std::string map_refused;  // why its allocated regions cannot be mapped here (empty: they can)
    std::vector<RmaAckHeader> acks;  // answers to its one-sided operations, sent by send_acks
    std::uint64_t acks_sent = 0;     // answers sent to it so far,
    std::uint64_t ack_messages = 0;  // in this many messages
  };
  // A copy in flight on a CUDA stream, polled by progress.
  struct DeviceOp {
    // kRmaCopy: a put or get on a peer's device region mapped here (guarded_access).
    enum Kind : std::uint8_t { kIpcGet, kStageFill, kStageDrain, kRmaCopy } kind;
    cuda::Ticket ticket;
    std::uint32_t request;
    int peer;
    std::uint64_t wire = 0;         // kIpcGet: the sender's request; kStageFill: the receiver's
    std::uint64_t offset = 0;       // in the message
    std::uint64_t ring_offset = 0;  // staging: the slot
    std::uint64_t length = 0;
    cuda::IpcKey key;  // kIpcGet, kRmaCopy: unpinned when done
    int device = -1;   // kRmaCopy: the GPU the mapping was made for
  };

  Engine(util::Config config, std::unique_ptr<bootstrap::Bootstrap> bootstrap);
  void setup_transports();
  void setup_ofi(std::size_t local_count);  // local_count: ranks on this node
  void connect_peers();
  void finalize();

  void complete(std::uint32_t index, Status status);
  // Sends an active message now or queues it behind what is already queued for that peer.
  void send_or_queue(int peer, Pending&& pending);
  bool try_send(Peer& peer, Pending& pending);  // true when fully sent
  int drain_pending();
  void protocol_error(int source, const char* what);
  // Asks the transports which peers died, and fails what involves them.
  void check_peers();
  // Before a wait gives up the CPU: check_peers at most every 10 ms. When the CPUs are busy a
  // yield may cost a time slice, and kCheckPeersEvery progress calls then take seconds.
  void check_peers_before_yield();
  void peer_failed(int rank, const std::string& why);
  // The failure of a receive from any source once no other rank is left (others_left_ == 0).
  Status no_one_left() const;

  void handle_eager(int source, std::span<const std::byte> data);
  void handle_rts(int source, std::span<const std::byte> data);
  void handle_rts_read(int source, std::span<const std::byte> data);
  void handle_cts(int source, std::span<const std::byte> data);
  void handle_cts_direct(int source, std::span<const std::byte> data);
  // Device data with a peer that shares no memory (proto/chunked.cpp).
  void start_chunked_receive(std::uint32_t index, int source, std::uint64_t sreq);
  void handle_cts_chunked(int source, std::span<const std::byte> data);
  Status post_chunk(std::uint32_t index);
  void start_chunks(std::uint32_t index);
  void chunk_done(std::uint32_t index, Status status);
  // Whether a chunked transfer's device buffer must go through a pinned bounce (the NIC does
  // not register that GPU's memory).
  static bool needs_bounce(const RequestSlot& slot, transport::Endpoint& endpoint);
  std::byte* take_bounce();
  void return_bounce(RequestSlot* slot);
  // Validates a CTS (plain or direct) for one of our rendezvous sends; null (NACKed) if not.
  RequestSlot* cts_target(int source, const CtsHeader& header, std::uint32_t* index);
  void handle_frag(int source, std::span<const std::byte> data);
  void handle_fin(int source, std::span<const std::byte> data);
  void handle_cancel(int source, std::span<const std::byte> data);
  void handle_nack(int source, std::span<const std::byte> data);
  // One-sided operations (rma.cpp).
  struct Region {
    std::byte* base = nullptr;
    std::size_t size = 0;
    std::uint64_t secret = 0;
    int fd = -1;  // allocated: the memfd, and its mapping (a header page, then base)
    std::byte* mapping = nullptr;
    std::size_t mapping_length = 0;
    int device = -1;  // device memory: its CUDA ordinal (reached by CUDA copies, never mapped)
    int slot = -1;    // its slot in the guard table (registered regions peers reach directly)
    int ipc_fd = -1;  // device memory exported as a file descriptor, for those peers
    // Its registration with native_rma_ (host memory only), made when a rank first asks for it,
    // and where and under which provider key peers reach it.
    void* native = nullptr;
    transport::Endpoint::RemoteRegion native_remote;
    bool native_failed = false;     // registering it failed: no grant
    std::vector<int> native_ranks;  // the ranks granted native access (asked, key checked)
    // The application's own host memory (not allocated here, not device memory): it may be
    // unmapped behind the registration, so the owner writes it with mem::checked_write and looks
    // before reading it.
    bool user_host = false;
    bool read_only = false;  // registered while not all writable: puts and atomics refused
  };
  // Registered regions that peers on this node reach without the owner's progress: host memory
  // by CMA, device memory by CUDA IPC. Each access is bracketed by the accessing rank's counters
  // in the owner's guard table, and deregistration waits for the accesses already begun, so none
  // lands after it returns. (Layout and rules in rma.cpp.)
  struct GuardTable;
  GuardTable* guard_ = nullptr;  // this process's table (made on first registration)
  int guard_fd_ = -1;
  std::vector<int> guard_free_;  // free slots
  Status make_guard();
  void release_guard();  // unmaps and closes this process's table
  // Gives `region` a slot where peers find it (none where they cannot reach it directly).
  void guard_region(Region* region, std::uint64_t id, const mem::MemoryInfo& info);
  // Clears the slot, waits for the accesses begun, then frees it (and closes `ipc_fd`).
  Status release_guard_slot(int index, int ipc_fd);
  // A peer's table mapped here (by rank), made on first use.
  std::map<int, GuardTable*> peer_guards_;
  // A peer's descriptor `fd`, taken with pidfd_getfd; invalid if it cannot be (then
  // peer.map_refused says why, unless the descriptor is simply closed: a stale key).
  util::Fd peer_descriptor(int rank, Peer& peer, int fd);
  GuardTable* peer_guard(const RmaTarget& target, Peer& peer);
  // This rank's counters in the tables of this node's ranks; -1: none (too many ranks).
  int guard_index_ = -2;  // -2: not computed yet
  // A put or get (request `index`) on a peer's registered region through its guard table:
  // true when done here (host memory by CMA, completed) or started (device memory, a CUDA copy
  // that poll_device_ops completes); false when it goes through the owner. `local_gpu`: the GPU
  // holding `local`, -1 for host memory.
  bool guarded_access(std::uint32_t index, const RmaTarget& target, void* local, std::size_t bytes,
                      bool put, int local_gpu);
  // The end of a started access to `rank`'s guard table (this rank's `ended` counter).
  void end_guarded_access(int rank);
  // Registers a host region with native_rma_ for a rank's first ask; false if it cannot be.
  bool register_native(Region* region, std::uint64_t id);
  // A put or get started by the network transport itself on request `index`, completed through
  // on_direct; false when it goes through the owner.
  bool native_access(std::uint32_t index, const RmaTarget& target, void* local, std::size_t bytes,
                     bool put, bool local_device);
  // Native access is by grant. The first access to a peer's region goes by messages and asks the
  // owner, who checks the key as for any access and answers with the region's address and
  // provider key; from then on accesses through the same key go natively. The owner's
  // deregister revokes every grant and waits until each granted rank has no access to the region
  // in flight (or has failed), then closes the registration. So no access with a forged or stale
  // key ever reaches the provider (over tcp a refused one closes the connection), and none lands
  // after deregister returns.
  struct NativeGrant {
    enum class State : std::uint8_t { kAsked, kGranted, kRefused, kRevoked } state = State::kAsked;
    std::uint64_t secret = 0;  // of the key that asked
    transport::Endpoint::RemoteRegion region;
    std::uint64_t size = 0;
    std::uint32_t in_flight = 0;  // native accesses started and not yet ended
  };
  std::map<std::pair<int, std::uint64_t>, NativeGrant> native_grants_;  // by (owner, region)
  // A native access to (rank, region) ended: answers a revoke that waited for it.
  void native_done(int rank, std::uint64_t region);
  // Revokes the grants of region `id` (deregister): waits for every granted rank's answer.
  Status revoke_native(std::uint64_t id);
  std::map<std::uint64_t, std::vector<int>> revoking_;  // region -> ranks yet to answer
  void handle_native_ask(int source, std::span<const std::byte> data);
  void handle_native_grant(int source, std::span<const std::byte> data);
  void handle_native_revoke(int source, std::span<const std::byte> data);
  void handle_native_revoked(int source, std::span<const std::byte> data);
  // The transport that registers regions for native one-sided access (ofi, FERRY_OFI_RMA=auto or
  // native, where the provider has FI_RMA writes and checks keys), or null.
  transport::Transport* native_rma_ = nullptr;
  // A peer's allocated region mapped here (by (rank, region id)).
  struct Mapping {
    std::byte* mapping = nullptr;
    std::size_t mapping_length = 0;
    std::size_t size = 0;  // the region's, as its header said when mapped (the header may change)
  };
  // Where a one-sided access of `length` bytes goes when it needs no message: this process's own
  // region, or a peer's allocated region mapped here; *device says whether it is device memory.
  // Null: by active messages; null with *refusal set: refused (a RmaRefusal code). `write`: a
  // put or atomic.
  std::byte* direct_target(const RmaTarget& target, std::size_t length, bool write,
                           std::uint32_t* refusal, bool* device);
  // The mapping of a peer's allocated region, made on first use; null: not mappable here.
  const Mapping* map_peer_region(const RmaTarget& target, Peer& peer);
  void unmap_peer_regions(int rank);
  // Unmaps the peers' regions that their owners deregistered since: a mapping keeps the memory
  // alive (the owner's munmap frees nothing while a peer maps it), so this runs before every new
  // mapping and every kCheckPeersEvery progress calls, and what a deregistration frees is freed
  // once each rank that accessed the region next calls into ferry.
  void sweep_mappings();
  std::map<std::pair<int, std::uint64_t>, Mapping> mappings_;
  // The mapping used last and its key (an 8-byte get is a few dozen instructions: the tree's
  // lookup was a tenth of them).
  const Mapping* last_mapping_ = nullptr;
  std::pair<int, std::uint64_t> last_mapped_{-1, 0};
  // The peer region that the last direct access reached, for direct_again; forgotten with
  // last_mapping_ (the mapping gone, the peer failed).
  struct LastDirect {
    int rank = -1;
    std::uint64_t region = 0;
    std::uint64_t secret = 0;
    std::size_t size = 0;
    std::byte* data = nullptr;      // the region's first byte here; null: none
    std::uint32_t* live = nullptr;  // its header's word that deregistration clears
  } last_direct_;
  void forget_last_mapping() {
    last_mapping_ = nullptr;
    last_direct_.data = nullptr;
  }
  // Checks an access against the regions; the region's base (*device: whether in device memory),
  // or null with *refusal set.
  // `write`: a put or atomic (refused on a read-only region).
  std::byte* rma_check(std::uint64_t region, std::uint64_t secret, std::uint64_t offset,
                       std::uint64_t length, bool write, std::uint32_t* refusal, bool* device);
  // The region behind a check that passed, for what the owner must know before touching it.
  const Region* rma_region(std::uint64_t id) const {
    auto it = regions_.find(id);
    return it == regions_.end() ? nullptr : &it->second;
  }
  // Moves the bytes of a one-sided access where either end may be device memory (`device`): by
  // CUDA, waited for, else by the CPU.
  Status rma_move(void* destination, const void* source, std::size_t bytes, bool device);
  // An atomic on a word of a region; one in device memory is read, changed and written back by
  // CUDA copies (atomic only against the other one-sided atomics, which all run here).
  Status rma_atomic(std::byte* word, bool device, AtomicOp op, std::size_t width,
                    std::uint64_t operand, std::uint64_t compare, std::uint64_t* previous);
  // A request for a one-sided operation towards `target`, or a failed one (*early).
  std::uint32_t rma_request(RequestKind kind, RequestSlot::Rma rma, const RmaTarget& target,
                            const void* local, std::size_t bytes, Status* early);
  // A put from, or a get into, device memory by messages goes through the slot's host copy.
  Status rma_bounce(RequestSlot& slot, const void* local, std::size_t bytes, bool put);
  void rma_done(const RequestSlot& slot, const Status& status);
  // Completes a one-sided request that needs no message: failed early, empty, refused, or done
  // at once by `apply` on the target's bytes where direct_target finds them. False: it goes by
  // messages. (Defined in rma.cpp, its only user.)
  template <typename Apply>
  bool rma_settled(std::uint32_t index, const RmaTarget& target, std::size_t length, bool write,
                   Status early, Apply apply);
  void handle_put(int source, std::span<const std::byte> data);
  void handle_get(int source, std::span<const std::byte> data);
  void handle_atomic(int source, std::span<const std::byte> data);
  void handle_rma_ack(int source, std::span<const std::byte> data);
  void handle_rma_acks(int source, std::span<const std::byte> data);
  // Answers a put fragment, get or atomic from `peer`. The answers made while handling one batch
  // of messages (what one fi_cq_read returned over ofi, one progress pass otherwise) go when it
  // ends, several to one peer as one kAmRmaAcks (send_acks).
  void rma_ack(int peer, std::uint64_t id, std::uint64_t value, std::uint32_t code);
  int send_acks();
  std::unordered_map<std::uint64_t, Region> regions_;
  std::uint64_t next_region_ = 1;
  std::mt19937_64 secrets_{std::random_device{}()};
  std::shared_ptr<Engine*> handle_;
  bool shut_down_ = false;      // shutdown() ran
  std::size_t held_after_ = 0;  // after retire(): Request handles still held
  bool retired_ = false;
  std::map<const void*, std::function<void()>> teardown_;  // at_teardown's, by owner
  void deliver_eager(std::uint32_t index, int source, Tag tag, std::span<const std::byte> payload);
  // `remote`: the sender exposed its buffer for a one-sided read (null: it did not).
  void start_rendezvous(std::uint32_t index, int source, Tag tag, std::size_t size,
                        std::uint64_t sreq, std::uint64_t address,
                        const transport::Endpoint::RemoteRegion* remote);
  // Asks the sender for a matched rendezvous message: a direct transfer, else fragments.
  void request_data(std::uint32_t index, int source, std::uint64_t sreq, std::size_t length);
  void send_control(int peer, std::uint8_t am, std::span<const std::byte> header);
  // Sends `length` bytes of request `index`'s send buffer to `peer` as a fragment stream: kAmFrag
  // into its request `id`, or kAmPut (a Pending the caller completes with the region fields).
  Pending stream(std::uint8_t am, std::uint32_t index, std::uint64_t id, std::size_t length);

  // Device buffers (device.cpp).
  mem::MemoryInfo classify(const void* buffer) {
    return cuda_ ? cuda_->classify(buffer) : mem::MemoryInfo{};
  }
  void isend_device(std::uint32_t index, int destination, const mem::MemoryInfo& memory);
  void start_device_rendezvous(std::uint32_t index, int source, Tag tag, std::size_t size,
                               std::uint64_t sreq, const cuda::IpcKey* key);
  void start_staged_receive(std::uint32_t index, int source, std::uint64_t sreq,
                            std::uint32_t flags);
  void handle_rts_dev(int source, std::span<const std::byte> data);
  void handle_stage_cts(int source, std::span<const std::byte> data);
  void handle_stage_frag(int source, std::span<const std::byte> data);
  void handle_stage_ack(int source, std::span<const std::byte> data);
  // A staged receive that cannot go on: it fails, and so does the send (FIN with a code).
  void fail_staged_receive(std::uint32_t index, Status status);
  // A FIN with a code: the receiver failed; so does the send.
  void receiver_failed(std::uint32_t index, int source, std::uint32_t code);
  // Finalize: no receive will be posted any more, so an announced message that no posted receive
  // matches never will be: its sender is told (FIN kFinNeverMatched) and its send ends, instead
  // of holding the sender's finalize for FERRY_FINALIZE_TIMEOUT.
  void refuse_unmatched(int source, std::uint64_t sreq);
  bool finalizing_ = false;
  std::size_t refused_unmatched_ = 0;  // announcements refused so (for finalize's warning)
  std::size_t never_matched_ = 0;      // sends of ours that peers refused so
  // Rung 1 of a device receive: map the sender's buffer and start the copies.
  Status start_ipc_get(std::uint32_t index, int source, std::uint64_t sreq,
                       const cuda::IpcKey& key);
  // An announced rendezvous message that waits for its receive.
  static Unexpected unexpected_rendezvous(int source, Tag tag, std::uint64_t size,
                                          std::uint64_t sreq);
  // Records that a way of mapping device memory failed with a peer, once, and logs it.
  void refuse_ipc(int peer, mem::IpcKind kind, const std::string& why);
  // The descriptor that came with a cuMem key from `source` (closed, or invalid if none came).
  util::Fd take_descriptor(int source, std::uint64_t buffer_id);
  void pump_stage(int peer);
  int poll_device_ops();
  // Completes the request once no copy uses its buffer any more.
  void complete_when_idle(std::uint32_t index, Status status);
  void drain_device_ops();

  util::Config config_;
  std::unique_ptr<bootstrap::Bootstrap> bootstrap_;
  std::unique_ptr<cuda::Cuda> cuda_;  // null: every buffer is host memory (cuda_why_ says why)
  std::string cuda_why_;
  bool cuda_ipc_ = true;
  bool test_host_staging_ = false;     // FERRY_TEST_HOST_STAGING
  double test_get_delay_ = 0;          // FERRY_TEST_GET_DELAY
  bool test_stage_open_fail_ = false;  // FERRY_TEST_STAGE_OPEN_FAIL
  std::size_t ipc_split_ = 0;
  int next_lane_ = 0;  // copies rotate over the device's streams (and so its copy engines)
  std::size_t stage_chunk_ = 0;
  std::size_t stage_slots_ = 0;
  std::vector<DeviceOp> device_ops_;
  std::size_t ofi_chunk_ = 0;            // FERRY_OFI_CHUNK
  bool test_ofi_chunked_ = false;        // FERRY_TEST_OFI_CHUNKED
  std::vector<std::byte*> bounce_pool_;  // pinned, ofi_chunk_ bytes each, free for reuse
  std::size_t bounces_made_ = 0;
  std::deque<std::uint64_t> bounce_waiters_;  // chunked transfers (wire ids) waiting for a bounce
  // cuMem descriptors: our mailbox (null, mailbox_why_ says why), and those received but not yet
  // used, by (sender, memory block id), oldest first for a bound.
  std::unique_ptr<util::FdMailbox> mailbox_;
  std::string mailbox_why_;
  std::deque<std::pair<std::pair<int, std::uint64_t>, util::Fd>> descriptors_;
  int rank_ = 0;
  int size_ = 1;
  std::size_t rndv_threshold_ = 0;
  int spin_count_ = 0;
  bool oversubscribed_ = false;  // more ranks on this node than CPUs: waits yield at once
  double timeout_ = 0;
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  transport::self::SelfTransport* self_ = nullptr;  // polled only when it has work
  std::vector<transport::Transport*> polled_;       // the other transports, polled every time
  // The shm transport among them, if any: progress asks it inline whether it has anything to do
  // (an idle poll is then a few loads; a waiting loop that calls progress() sees a peer's store
  // sooner, docs/PERFORMANCE.md, "One-sided").
  transport::shm::ShmTransport* shm_ = nullptr;
  std::vector<std::string> transport_notes_;  // why each transport is or is not here
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;
  std::vector<Peer> peers_;
  // Other ranks that have an endpoint and have not failed: at 0 no one is left to match a receive
  // from any source but this rank itself.
  int others_left_ = 0;
  int last_failed_ = -1;  // the rank whose failure was seen last
  std::uint64_t failures_seen_ = 0;
  std::vector<int> pending_peers_;  // peers whose pending queue is not empty
  std::vector<int> ack_peers_;      // peers with answers in Peer::acks
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
  Matcher matcher_;
  // Operations in flight, by request slot; after requests_ so that they (and the requests they
  // hold) go first.
  std::vector<std::pair<std::uint32_t, std::unique_ptr<Operation>>> operations_;
  bool advancing_ = false;  // an operation's own calls must not advance operations again
  int advance_operations();
  int progress_all();  // progress() past its idle poll
  // Threads (FERRY_THREADS, FERRY_PROGRESS_THREAD).
  // A spin lock: uncontended, one atomic exchange and a plain store (a mutex costs a second
  // atomic operation to let go). Waiters spin a little, then yield: the holder is polling, not
  // sleeping, and lets go between polls.
  void lock() {
    if (locked_.exchange(true, std::memory_order_acquire)) {
      waiting_.fetch_add(1, std::memory_order_relaxed);
      for (int spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
        while (locked_.load(std::memory_order_relaxed)) {
          if (++spins > 64) ::sched_yield();
        }
      }
      waiting_.fetch_sub(1, std::memory_order_relaxed);
    }
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  void unlock() {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    locked_.store(false, std::memory_order_release);
  }
  void progress_loop();
  // FERRY_WAIT_MODE: sleep on the transports' wake-ups (with the lock let go) until one rings or
  // a timer ends (1 ms, doubling to kMaxSleepMs while nothing comes: what a wake-up lost to a
  // race, or a message over ofi, which rings nothing, can cost); only where nothing but a message
  // can end the wait.
  enum class WaitMode { kSpin, kBlock, kAdaptive };
  static constexpr int kMaxSleepMs = 32;
  int sleep_ms_ = 1;
  [[nodiscard]] bool may_sleep() const;
  void sleep_until_work(bool locked);
  void disarm();
  WaitMode wait_mode_ = WaitMode::kSpin;
  bool armed_ = false;  // by arm(), for the application; the next progress() disarms
  bool threaded_ = true;
  std::atomic<bool> locked_{false};
  std::atomic<std::thread::id> owner_{};  // the thread holding the lock
  std::atomic<int> waiting_{0};           // threads waiting for the lock
  std::atomic<bool> stop_progress_{false};
  std::thread progress_thread_;
  bool crash_on_send_ = false;                  // FERRY_TEST_CRASH_AT=first-send names this rank
  bool crash_mid_pipeline_ = false;             // FERRY_TEST_CRASH_AT=mid-pipeline names this rank
  std::size_t outstanding_sends_ = 0;           // send requests not yet complete
  std::uint32_t progress_calls_ = 0;            // peers are checked every kCheckPeersEvery calls
  util::Clock::time_point next_yield_check_{};  // check_peers_before_yield's next
};

}  // namespace ferry::proto
