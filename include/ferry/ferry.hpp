// ferry public API: a Context per process, tag-matched point-to-point messages with MPI-like
// matching rules, requests, probe and barrier, and collectives over Communicators. Everything a
// user of ferry sees is in include/ferry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "ferry/status.hpp"
#include "ferry/version.hpp"

// CUDA's stream type, as cuda.h and cuda_runtime.h declare it (CUstream and cudaStream_t are both
// CUstream_st*), so that a caller passes its stream as it is and this header needs neither.
struct CUstream_st;

namespace ferry {

// A CUDA stream for the stream-ordered calls (Communicator's forms that take one): a stream of
// the caller's process; nullptr or kLegacyStream is the legacy default stream and kPerThreadStream
// the calling thread's per-thread default stream (cudaStreamPerThread).
using CudaStream = CUstream_st*;
inline CudaStream const kLegacyStream = reinterpret_cast<CudaStream>(0x1);
inline CudaStream const kPerThreadStream = reinterpret_cast<CudaStream>(0x2);

using Tag = std::uint64_t;
inline constexpr Tag kFullMask = ~Tag{0};
inline constexpr int kAnySource = -1;
// Tags with this bit set belong to collectives: sends and receives that name one fail with
// kInvalidArgument, and no receive or probe of the application ever matches one.
inline constexpr Tag kReservedTagBit = Tag{1} << 63;

// Element types and reductions of the collectives.
enum class DataType : std::uint8_t {
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kFloat16,   // IEEE binary16
  kBfloat16,  // bfloat16 (the top half of a binary32)
  kFloat32,
  kFloat64,
};
// kMin and kMax propagate NaN; the bitwise operations take integer types only.
enum class ReduceOp : std::uint8_t { kSum, kProd, kMin, kMax, kBitAnd, kBitOr, kBitXor };
std::size_t size_of(DataType type) noexcept;
const char* to_string(DataType type) noexcept;
const char* to_string(ReduceOp op) noexcept;

namespace proto {
class Engine;
}
namespace coll {
class Group;
}

// What a completed receive (or a probe) learned about the message.
struct MessageInfo {
  int source = -1;
  Tag tag = 0;
  std::size_t bytes = 0;  // for a receive: bytes delivered; for a probe: the message size
};

// A non-blocking operation. Movable, not copyable. Dropping an incomplete Request does not cancel
// the operation: a send still goes out and a receive stays posted (like MPI_Request_free).
// A Request may outlive its Context: one that had not completed then ends with kInvalidArgument,
// a completed one keeps its status and info, and the last such Request frees what the Context
// kept for them.
class Request {
 public:
  // The handling of a request that completed where it started (kDone below) is inline: a
  // one-sided access to mapped memory then costs no call into the library after it.
  Request() noexcept = default;
  Request(Request&& other) noexcept : engine_(other.engine_), index_(other.index_) {
    other.engine_ = nullptr;
  }
  Request& operator=(Request&& other) noexcept {
    if (this != &other) {
      release();
      engine_ = other.engine_;
      index_ = other.index_;
      other.engine_ = nullptr;
    }
    return *this;
  }
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request() { release(); }

  [[nodiscard]] bool valid() const noexcept { return engine_ != nullptr; }
  // Drives progress once; true when the operation has completed (successfully or not).
  bool test() { return engine_ == nullptr || done_at_start() || test_slot(); }
  // Drives progress until the operation completes (or FERRY_TIMEOUT passes: kTimeout, and the
  // operation stays pending); returns its status.
  Status wait() { return engine_ != nullptr && done_at_start() ? Status() : wait_slot(); }
  // Like wait, but gives up after `seconds` with Code::kTimeout; the operation stays pending
  // (wait again, or cancel a receive).
  Status wait_for(double seconds);
  // Cancels a receive that has not matched yet. True if it was canceled (its status is then
  // kCanceled); false for sends and for receives that already matched.
  bool cancel();

  // Valid after completion.
  [[nodiscard]] Status status() const;
  [[nodiscard]] MessageInfo info() const;

  // Waits for all; returns the first non-ok status (all are waited for even after a failure).
  static Status wait_all(std::span<Request> requests);
  // Waits until one completes; returns its index. Requests that are not valid are skipped;
  // returns requests.size() when none is valid, or when FERRY_TIMEOUT (if set) ran out first.
  static std::size_t wait_any(std::span<Request> requests);

 private:
  friend class proto::Engine;
  friend class Context;
  friend class coll::Group;
  // The handle keeps its slot alive (the engine frees it only once released), so the index alone
  // names the operation.
  Request(proto::Engine* engine, std::uint32_t index) noexcept : engine_(engine), index_(index) {}
  // An operation that completed successfully where it was started (a one-sided access to mapped
  // memory) has no slot: its handle holds kDone, and asking it costs nothing.
  static constexpr std::uint32_t kDone = 0xffffffffu;
  [[nodiscard]] bool done_at_start() const noexcept { return index_ == kDone; }
  void release() noexcept {
    if (engine_ != nullptr && !done_at_start()) release_slot();
    engine_ = nullptr;
  }
  void release_slot() noexcept;
  bool test_slot();
  Status wait_slot();

  proto::Engine* engine_ = nullptr;
  std::uint32_t index_ = 0;
};

struct Options {
  // Overrides for FERRY_* variables (name without or with the FERRY_ prefix), taking precedence
  // over the environment. Validated like the environment.
  std::map<std::string, std::string> config;
};

class Communicator;

// One-sided communication. A rank registers a range of its memory (Context::register_memory) and
// sends the region's packed key to the ranks that may access it; they unpack it (RemoteKey::unpack)
// and put to it, get from it and apply atomics to it without the owner posting anything.
//
// Rules (docs/ARCHITECTURE.md, "One-sided"):
// - The owner's progress applies the operations (any call into its Context, or
//   FERRY_PROGRESS_THREAD=1): a rank that never calls ferry stalls the ranks accessing it.
// - A request completes when the operation is done at the target: a put's data is in the target's
//   memory, a get's data in the local buffer, an atomic applied (and its old value stored). Local
//   buffers must stay untouched until then. Operations on one region that overlap and are not
//   separated by a completed request (or flush) may be applied in any order.
// - Atomics on one region are atomic with respect to each other and to std::atomic_ref operations
//   of the owner's threads on the same naturally aligned word; plain loads and stores by the owner
//   race with them.
// - Keys are checked at the target on every use: an unknown or deregistered region, a key that
//   does not match, an out-of-range or misaligned access fail the request (never a stray write).
//   Over ofi, puts and gets of host memory go by the provider's own one-sided calls, without
//   the owner, once the owner has checked the key and granted it (the first access through a key
//   goes by messages and asks); a forged or stale key is never granted and fails as above.
//   deregister() revokes the grants and waits until each granted rank has no access to the
//   region in flight, which that rank answers in its next call into ferry.
// - Peers on the owner's node put to and get from registered memory without the owner: host
//   memory by CMA (process_vm_writev/readv), done when the call returns; device memory by CUDA
//   IPC and a CUDA copy in flight, done when the initiator's progress sees it finished (a window
//   of them overlaps). deregister() waits for such accesses already begun (a device copy in
//   flight ends in its initiator's next call into ferry). Where that is not
//   possible (another node, CMA or IPC refused, more than 256 ranks on the node, more than 1024
//   regions registered at once) the owner's progress applies them.
// - Device memory (CUDA) may be registered and may be the local buffer. Otherwise a registered
//   device region is reached through its owner, which copies with CUDA (waited for, in its
//   progress); a local device buffer is moved through a host copy. Atomics on a device region are
//   read, changed and written back by the owner: atomic with respect to the other one-sided atomics
//   on it, not to kernels or copies that touch the word meanwhile. An atomic's result must be host
//   memory.

// A registered range of this process's memory. Movable; deregisters when destroyed.
struct KeyAccess;  // api/rma.cpp: what the engine needs of a key

class MemoryRegion {
 public:
  MemoryRegion() = default;
  MemoryRegion(MemoryRegion&& other) noexcept;
  MemoryRegion& operator=(MemoryRegion&& other) noexcept;
  MemoryRegion(const MemoryRegion&) = delete;
  MemoryRegion& operator=(const MemoryRegion&) = delete;
  ~MemoryRegion();

  [[nodiscard]] bool valid() const { return id_ != 0; }
  [[nodiscard]] void* address() const { return address_; }
  [[nodiscard]] std::size_t size() const { return size_; }
  // Registered from memory this process cannot write (Context::register_memory): peers may get
  // from it; their puts and atomics fail with kInvalidArgument.
  [[nodiscard]] bool read_only() const { return read_only_; }
  // The key to hand to the ranks that may access the region (a few dozen bytes).
  [[nodiscard]] std::vector<std::byte> remote_key() const;
  // Accesses that arrive afterwards fail at their initiator; gets still being answered from the
  // region are cut short (their initiators get an error). Waits only for direct accesses by peers
  // on this node that have begun (each a single copy); kTimeout after FERRY_TIMEOUT if a peer
  // stays inside one, which may then still write to the memory.
  Status deregister();

 private:
  friend class Context;
  friend struct KeyAccess;
  MemoryRegion(std::shared_ptr<proto::Engine*> engine, std::uint64_t id, std::uint64_t secret,
               void* address, std::size_t size, int rank, int fd)
      : engine_(std::move(engine)),
        id_(id),
        secret_(secret),
        address_(address),
        size_(size),
        rank_(rank),
        fd_(fd) {}
  std::shared_ptr<proto::Engine*> engine_;  // null once the Context is gone
  std::uint64_t id_ = 0;
  std::uint64_t secret_ = 0;
  void* address_ = nullptr;
  std::size_t size_ = 0;
  int rank_ = -1;
  int fd_ = -1;  // allocate_memory: the descriptor peers on the node map
  // register_memory: where peers on the node find the region without the owner (-1: they do not)
  int guard_fd_ = -1;
  int slot_ = -1;
  // Whether the network transport may reach it by itself once its owner grants the key.
  bool native_ = false;
  bool read_only_ = false;
};

// A region of another rank (or of this one), as received from its owner.
class RemoteKey {
 public:
  // Checks the packed form (length, format, rank within the job is checked on use).
  static Status unpack(std::span<const std::byte> packed, RemoteKey* out);
  [[nodiscard]] int rank() const { return rank_; }
  [[nodiscard]] std::size_t size() const { return size_; }
  // The owner registered the region from memory it cannot write: gets only.
  [[nodiscard]] bool read_only() const { return read_only_; }

 private:
  friend class Context;
  friend struct KeyAccess;
  int rank_ = -1;
  std::uint64_t id_ = 0;
  std::uint64_t secret_ = 0;
  std::size_t size_ = 0;
  int fd_ = -1;
  int guard_fd_ = -1;
  int slot_ = -1;
  bool native_ = false;
  bool read_only_ = false;
};

// Atomic operations on a 4- or 8-byte unsigned word of a region. Each returns the word's previous
// value where the caller asks for it. kCompareSwap stores `operand` if the word equals `compare`.
enum class AtomicOp : std::uint8_t { kAdd, kSwap, kCompareSwap, kAnd, kOr, kXor };
const char* to_string(AtomicOp op) noexcept;

// One per rank: usually one per process, but several ranks (of one job or of several) may live
// side by side in one process, each a Context of its own. Safe to call from several threads at once
// (FERRY_THREADS=multi, the default: one lock around each call, let go while a blocking call
// waits); FERRY_THREADS=single skips the lock for applications that call from one thread at a time.
// Requests and Communicators follow their Context's mode.
class Context {
 public:
  // Joins the job described by the environment (ferryrun's variables), or a job of one process
  // when none is set. Throws ferry::Error with what failed and why.
  static Context init(const Options& options = {});

  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  // Finalizes: drains queued sends, waits for the other ranks (bounded), releases every resource.
  ~Context();

  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  [[nodiscard]] int local_rank() const;
  [[nodiscard]] int local_size() const;
  // Ranks of the processes on this node (this one included), in local-rank order. The launcher
  // says where it can (PMIx, ferryrun); otherwise ranks compare node identities (boot id,
  // namespaces, /dev/shm), so containers and network namespaces count as separate nodes.
  [[nodiscard]] std::vector<int> local_ranks() const;

  Request isend(const void* buffer, std::size_t bytes, int destination, Tag tag);
  // A synchronous send (MPI_Issend's): completes only once the receiver has matched it, whatever
  // its size (an eager send may complete as soon as the message is on its way).
  Request issend(const void* buffer, std::size_t bytes, int destination, Tag tag);
  // Receives the first message from `source` (or kAnySource) whose tag matches `tag` on the bits
  // set in `mask`. Messages from one sender that match are received in the order they were sent.
  // Unless its message is already here, it fails (kPeerFailed, or kUnsupported where no
  // transport reaches the rank) when `source` has failed, and for kAnySource once every other
  // rank has: a message this rank sends itself is then received by naming this rank.
  Request irecv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask = kFullMask);

  // Blocking forms. With FERRY_TIMEOUT set they give up after it with kTimeout: a send withdraws
  // what the receiver has not taken (it never reads the buffer after returning); a receive that
  // has not matched is canceled.
  Status send(const void* buffer, std::size_t bytes, int destination, Tag tag);
  Status ssend(const void* buffer, std::size_t bytes, int destination, Tag tag);
  Status recv(void* buffer, std::size_t capacity, int source, Tag tag, MessageInfo* info = nullptr,
              Tag mask = kFullMask);

  // A message that a receive with these arguments would match, without receiving it.
  std::optional<MessageInfo> iprobe(int source, Tag tag, Tag mask = kFullMask);
  // Waits for such a message. Returns source -1 when none can come any more (`source` failed or
  // cannot be reached; for kAnySource, every other rank) or, with FERRY_TIMEOUT set, when none
  // came in time.
  MessageInfo probe(int source, Tag tag, Tag mask = kFullMask);

  // All ranks enter before any leaves; progresses communication while waiting.
  Status barrier();

  // One-sided communication (see MemoryRegion above). register_memory registers host memory (or
  // CUDA device memory); the region stays accessible until deregistered (or destroyed). Host
  // memory must be mapped readable (else kInvalidArgument naming the gap); memory this process
  // cannot write (a read-only mapping, constant data) is registered read-only: peers' puts and
  // atomics on it fail at the peer. Memory unmapped while registered is never written or read
  // by a peer's operation: it fails at the peer (the owner goes on), as after deregister.
  Status register_memory(void* address, std::size_t bytes, MemoryRegion* region);
  // Allocates `bytes` of zeroed host memory for one-sided access and registers it (region->
  // address()); the memory lives until the region is deregistered. Ranks on this node map it
  // and access it directly (loads, stores, CPU atomics, no progress needed from the owner);
  // other ranks go through the owner's progress as with register_memory.
  Status allocate_memory(std::size_t bytes, MemoryRegion* region);
  // Copies `bytes` from `local` to the key's region at `offset`.
  Request iput(const void* local, std::size_t bytes, const RemoteKey& key, std::uint64_t offset);
  // Copies `bytes` from the key's region at `offset` into `local`.
  Request iget(void* local, std::size_t bytes, const RemoteKey& key, std::uint64_t offset);
  // Applies `op` to the `width`-byte word (4 or 8) at `offset` of the key's region, which must be
  // aligned to `width`; stores the previous value in *result (a uint32_t or uint64_t) unless null.
  Request iatomic(AtomicOp op, std::size_t width, const RemoteKey& key, std::uint64_t offset,
                  std::uint64_t operand, void* result = nullptr, std::uint64_t compare = 0);
  // Waits until every one-sided operation this rank started towards `rank` (flush) or towards
  // any rank (flush_all) has completed, including those whose Requests were dropped. Returns the
  // first failure among them since the last flush; flush(rank) of a dead rank is kPeerFailed;
  // kTimeout where FERRY_TIMEOUT runs out first.
  Status flush(int rank);
  Status flush_all();

  // Every rank of the job, in rank order. Valid while this Context lives.
  Communicator world();

  // Moves pending work forward; returns the number of events handled.
  int progress();

  // Event-driven waiting from the application's own poll/epoll loop: arm(), and if it returns
  // true, sleep until event_fd() is readable (a peer on this node sent here) or a timeout of your
  // choosing, then progress(). arm() returns false when there is work already: progress() instead
  // of sleeping. Messages from other nodes (ofi) and a peer's death do not ring event_fd(): keep
  // a timeout (arm() looks for dead peers, so a death shows within one of them). -1 when
  // there is no such descriptor. Not meant for use beside FERRY_PROGRESS_THREAD, whose polls
  // would end the arming. Blocking calls wait as FERRY_WAIT_MODE says (spin, block, adaptive).
  [[nodiscard]] int event_fd() const;
  bool arm();

  // Ends the whole job: the launcher stops every rank and exits with `code`, printing `reason`.
  // Does not return (the process exits with `code` if the launcher has not killed it within 10 s).
  [[noreturn]] void abort(int code, const std::string& reason);

  // Stream-ordered groups (see Communicator's stream forms): the stream calls made between
  // group_start() and the matching group_end() start together, so a member's sends and receives to
  // and from each other never wait for one another (as ncclGroupStart/End). Groups nest; the
  // outermost group_end enqueues them all, on the one stream they must all name. The group is the
  // Context's, not the calling thread's.
  void group_start();
  Status group_end();
  // The first failure of a stream-ordered operation of this Context, on any of its
  // communicators (its stream went on, its results are not valid), or ok. It stays.
  // Communicator::async_error is one communicator's, which refuses that communicator's later
  // stream calls.
  [[nodiscard]] Status async_error() const;

  // What each rank of the job waits for now, a line each: "rank 2: waiting 3.20 s: allreduce #4
  // on communicator 0 (...); not arrived: member 3 (rank 3)" or "rank 1: not waiting in ferry".
  // A blocking call appears once it has waited about 100 ms. Under ferryrun (which prints the
  // same table when a job times out, on SIGUSR1 and when a rank dies) every rank is listed; under
  // other launchers only this one.
  [[nodiscard]] std::string wait_report() const;

  // Per peer: the transport in use and why (for ferry-info and error messages).
  [[nodiscard]] std::string describe_peer(int rank) const;
  // The transports this process has, and why the absent ones are absent.
  [[nodiscard]] std::vector<std::string> describe_transports() const;

 private:
  explicit Context(std::unique_ptr<proto::Engine> engine);
  // A blocking send's wait for its request (withdrawn after FERRY_TIMEOUT).
  Status wait_send(Request request);
  // Finalizes and lets the engine go; Requests still held keep its husk (their slots) until the
  // last of them goes.
  void close() noexcept;
  std::unique_ptr<proto::Engine> engine_;
  std::shared_ptr<coll::Group> world_;  // made on first use; goes before the engine
};

// A group of ranks that runs collectives together: Context::world(), or a part of one made by
// split(). Every member calls the same collectives in the same order (as in MPI); each call has a
// blocking form returning its Status and a non-blocking i-form returning a Request, which moves
// forward in any progress of the Context (waits on other requests included).
//
// Counts are in elements of `type`. A receive buffer may be the send buffer (in place) where the
// operation allows it: allreduce, reduce, and for allgather and gather a send buffer at this rank's
// block of the receive buffer. Buffers must stay untouched until the operation completes.
// Results are the same bits on every rank and from run to run for a given rank count, sizes and
// algorithm (docs/ARCHITECTURE.md, "Collectives"). The buffers of one call are all host memory or
// all CUDA device memory of one GPU (ready: the stream that wrote them synchronized), else the call
// fails with kUnsupported; device buffers give the same bits as host buffers, NaN payloads aside.
// Where every member is on one node, a small device allreduce (FERRY_COLL_DEVICE_ONESHOT; with two
// members any from FERRY_COLL_DEVICE_TWOSHOT up, with more up to members times the one-shot limit)
// runs as one kernel per GPU, which needs every member to pass device buffers when any does.
//
// A dead member fails the collective (kPeerFailed) on every member that waits, and members that
// pass different counts get kInvalidArgument, not a hang. Under FERRY_TIMEOUT a blocking form
// returns kTimeout with its transfers withdrawn (its buffers are free again); a wait on an i-form's
// Request returns kTimeout and leaves the collective running, as for point-to-point requests.
// After a failure the communicator should not be used for further collectives: revoke it and
// shrink it (below).
//
// A Communicator may outlive its Context (a global one, say): the Context's destruction releases
// the communicator's device state, and its collectives then fail with kInvalidArgument (split
// throws). Destroying a Context while another thread uses one of its Communicators is an error.
class Communicator {
 public:
  Communicator() = default;  // not valid: every call fails with kInvalidArgument
  [[nodiscard]] bool valid() const noexcept { return group_ != nullptr; }
  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  // The job rank of member `rank`.
  [[nodiscard]] int world_rank(int rank) const;

  // Collective: members that pass the same color form a new communicator, ordered by key (ties by
  // rank here). A member passing kUndefined gets an invalid Communicator. Throws ferry::Error.
  static constexpr int kUndefined = -1;
  Communicator split(int color, int key) const;

  // ---- Surviving failures (docs/design/failures.md, "Fault-tolerant communicators") ----
  // A member that sees a failure (kPeerFailed, kTimeout) revokes the communicator, the survivors
  // shrink it, and they go on with the new one:
  //   if (!comm.allreduce(...)) { comm.revoke(); comm = comm.shrink(); /* rebalance, redo */ }
  //
  // Revokes the communicator on every member: each collective of it that waits now (host or
  // stream-ordered, on any member) and every later one fails with kRevoked, so that no member
  // stays blocked on members that stopped using it. Returns at once; the members learn it in
  // their next progress (any call into ferry), and each passes it on, so it reaches them all even
  // if this rank dies meanwhile. Stream-ordered sends and receives already enqueued are not cut
  // short. agree and shrink still work on it.
  Status revoke();
  // Whether it was revoked (here or by a member), after a progress call.
  [[nodiscard]] bool revoked() const;
  // The members (ranks of this communicator) this rank knows to have failed, ascending; the
  // survivors may know different sets until they agree (agree's `failed`).
  [[nodiscard]] std::vector<int> failed_ranks() const;
  // Fault-tolerant agreement, collective over the members that are alive (works on a revoked
  // communicator too): every member that returns ok returns the same *flag, the bitwise AND of
  // the flags of all members that survive it (and of some that died during it), and the same
  // *failed (unless null): the members all of them now count as failed (a member that ended its
  // Context without joining counts as failed). Members that die before or during the call do not
  // stop it. kTimeout under FERRY_TIMEOUT names whom it waited for;
  // kPeerFailed when the others counted this member as failed.
  Status agree(std::uint64_t* flag, std::vector<int>* failed = nullptr);
  // A new communicator of the members that survive, agreed by all of them (members keep their
  // order), even when more members die during the call: those are left out too, as are members
  // that ended their Context. One that dies
  // after it is a dead member of the new communicator, whose collectives then fail with
  // kPeerFailed (shrink again). Works on a revoked communicator. Throws ferry::Error (kTimeout
  // under FERRY_TIMEOUT, naming whom it waited for).
  [[nodiscard]] Communicator shrink() const;

  Status barrier();
  Request ibarrier();
  Status broadcast(void* buffer, std::size_t count, DataType type, int root);
  Request ibroadcast(void* buffer, std::size_t count, DataType type, int root);
  // `recv` matters at the root only.
  Status reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                int root);
  Request ireduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                  int root);
  Status allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  Request iallreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op);
  // recv holds size() blocks of `count` elements, member r's at block r.
  Status allgather(const void* send, void* recv, std::size_t count, DataType type);
  Request iallgather(const void* send, void* recv, std::size_t count, DataType type);
  // Member r contributes counts[r] elements, placed at recv + displacements[r] (in elements).
  Status allgatherv(const void* send, void* recv, std::span<const std::size_t> counts,
                    std::span<const std::size_t> displacements, DataType type);
  Request iallgatherv(const void* send, void* recv, std::span<const std::size_t> counts,
                      std::span<const std::size_t> displacements, DataType type);
  // send holds size() blocks of `count` elements; member r gets the reduction of block r.
  Status reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                        ReduceOp op);
  Request ireduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                          ReduceOp op);
  // Block r of send goes to member r, and member r's block for us lands at block r of recv.
  Status alltoall(const void* send, void* recv, std::size_t count, DataType type);
  Request ialltoall(const void* send, void* recv, std::size_t count, DataType type);
  Status alltoallv(const void* send, std::span<const std::size_t> send_counts,
                   std::span<const std::size_t> send_displacements, void* recv,
                   std::span<const std::size_t> recv_counts,
                   std::span<const std::size_t> recv_displacements, DataType type);
  Request ialltoallv(const void* send, std::span<const std::size_t> send_counts,
                     std::span<const std::size_t> send_displacements, void* recv,
                     std::span<const std::size_t> recv_counts,
                     std::span<const std::size_t> recv_displacements, DataType type);
  // recv (size() blocks of count) matters at the root only.
  Status gather(const void* send, void* recv, std::size_t count, DataType type, int root);
  Request igather(const void* send, void* recv, std::size_t count, DataType type, int root);
  // send (size() blocks of count) matters at the root only.
  Status scatter(const void* send, void* recv, std::size_t count, DataType type, int root);
  Request iscatter(const void* send, void* recv, std::size_t count, DataType type, int root);

  // ---- Stream-ordered forms ----
  // Each enqueues the operation on a CUDA stream and returns at once: it starts once the work
  // enqueued on `stream` before it is done (the kernels and copies that wrote its buffers), and
  // the work enqueued after it waits for its result. A stream that captures a CUDA graph captures
  // it: every replay of the graph communicates again, with the same buffers, and no call into
  // ferry. The buffers are device or host memory. An allreduce among the GPUs of one node (up to
  // FERRY_STREAM_KERNEL, and among three or more up to members times that / (members - 1)) is a
  // kernel on the stream itself, and so are allgather, reduce_scatter, broadcast and reduce among
  // three or more GPUs of one node (up to the same sizes), and send and recv between GPUs of one
  // node (a group's in one launch; messages past FERRY_STREAM_P2P move their data by
  // ferry's thread behind it); every other call runs as the host-synchronous call would, by a
  // thread of ferry's (which needs FERRY_THREADS=multi, the default). Every member enqueues the
  // same stream calls of a communicator in the same order, on one stream (or on streams ordered
  // among themselves); they never mix with its host-synchronous calls, which remain usable beside
  // them. The first stream collective of a communicator (and its first allreduce that runs as a
  // kernel) sets up its device path, a collective of the members made by the calling thread. A
  // graph must not be replayed after its communicator is gone.
  //
  // The return value says whether the call was enqueued (arguments, the stream, and an earlier
  // failure of this communicator's: async_error). A failure while it runs (a dead member,
  // FERRY_TIMEOUT) does not stop the stream: the stream goes on, the results are not valid, and
  // async_error (this communicator's, as ncclCommGetAsyncError) says what happened; from then on
  // this communicator's stream calls are refused, while others (one shrunk without the dead
  // member) go on. The Context's destruction releases every stream still waiting.
  Status barrier(CudaStream stream);
  // The first failure of this communicator's stream operations (or of its kernels, which ferry's
  // thread watches), or ok; kInvalidArgument for one that is not valid or whose Context ended.
  [[nodiscard]] Status async_error() const;
  Status broadcast(void* buffer, std::size_t count, DataType type, int root, CudaStream stream);
  Status reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                int root, CudaStream stream);
  Status allreduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                   CudaStream stream);
  Status allgather(const void* send, void* recv, std::size_t count, DataType type,
                   CudaStream stream);
  Status reduce_scatter(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                        CudaStream stream);
  Status alltoall(const void* send, void* recv, std::size_t count, DataType type,
                  CudaStream stream);
  Status gather(const void* send, void* recv, std::size_t count, DataType type, int root,
                CudaStream stream);
  Status scatter(const void* send, void* recv, std::size_t count, DataType type, int root,
                 CudaStream stream);
  // Point-to-point between members, matched in order per pair (no tags), as ncclSend/ncclRecv:
  // a receive takes the next send of `peer` to this member on this communicator, whose size must
  // be `bytes` or less. Pair a member's sends and receives in a group (Context::group_start). The
  // first stream send or receive between two members waits for the other's first one (it sets
  // up their pair, as NCCL's first send/recv between two ranks connects them).
  Status send(const void* buffer, std::size_t bytes, int peer, CudaStream stream);
  Status recv(void* buffer, std::size_t bytes, int peer, CudaStream stream);

 private:
  friend class Context;
  friend struct CommunicatorAccess;  // the library's other front ends (src/api/access.hpp)
  explicit Communicator(std::shared_ptr<coll::Group> group) : group_(std::move(group)) {}
  std::shared_ptr<coll::Group> group_;
};

}  // namespace ferry
