// ferry::Communicator: the public face of the collectives (src/coll).
#include <initializer_list>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "coll/group.hpp"
#include "coll/reduce.hpp"
#include "cuda/cuda.hpp"
#include "proto/device_path.hpp"
#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "proto/stream_ops.hpp"

namespace ferry {
namespace {

Status invalid() { return Status(Code::kInvalidArgument, "collective on an invalid Communicator"); }

// Why a Communicator cannot run collectives (it is empty, or its Context is gone), else ok.
Status unusable(const std::shared_ptr<coll::Group>& group) {
  if (!group) return invalid();
  if (group->detached()) {
    return Status(Code::kInvalidArgument,
                  "collective on a Communicator whose Context is finalized (destroyed)");
  }
  return Status::ok();
}

}  // namespace

Communicator Context::world() {
  auto entry = engine_->enter();
  if (!world_) world_ = coll::Group::world(engine_.get());
  return Communicator(world_);
}

int Communicator::rank() const { return group_ ? group_->rank() : -1; }
int Communicator::size() const { return group_ ? group_->size() : 0; }
int Communicator::world_rank(int rank) const {
  return group_ && rank >= 0 && rank < group_->size() ? group_->member(rank) : -1;
}

Communicator Communicator::split(int color, int key) const {
  if (Status s = unusable(group_); !s) throw Error(s);
  auto entry = group_->engine()->enter();
  if (color < 0 && color != kUndefined) {
    throw Error(Code::kInvalidArgument,
                "split: color " + std::to_string(color) + " is neither kUndefined nor >= 0");
  }
  return Communicator(group_->split(color, key));
}

Status Communicator::revoke() {
  if (Status s = unusable(group_); !s) return s;
  auto entry = group_->engine()->enter();
  group_->revoke();
  return Status();
}

bool Communicator::revoked() const {
  if (!unusable(group_).is_ok()) return false;
  auto entry = group_->engine()->enter();
  group_->engine()->progress();  // a revocation that has arrived is learned
  return group_->revoked();
}

std::vector<int> Communicator::failed_ranks() const {
  if (!unusable(group_).is_ok()) return {};
  auto entry = group_->engine()->enter();
  return group_->failed_members();
}

Status Communicator::agree(std::uint64_t* flag, std::vector<int>* failed) {
  if (Status s = unusable(group_); !s) return s;
  if (flag == nullptr) return Status(Code::kInvalidArgument, "agree: a null flag");
  auto entry = group_->engine()->enter();
  return group_->agree(flag, failed);
}

Communicator Communicator::shrink() const {
  if (Status s = unusable(group_); !s) throw Error(s);
  auto entry = group_->engine()->enter();
  return Communicator(group_->shrink());
}

// The i-forms run a schedule that the engine advances; the blocking forms run it now.
// A revoked communicator fails every call at once (Group::revoked; one that waits fails there).
#define FERRY_NONBLOCKING(name, params, args)                      \
  Request Communicator::i##name params {                           \
    if (!unusable(group_).is_ok()) return Request();               \
    coll::Group& g = *group_;                                      \
    auto entry = g.engine()->enter();                              \
    if (g.revoked()) return g.failed(g.revoked_status("i" #name)); \
    return g.start([&](coll::Plan& p) { return g.name args; });    \
  }
#define FERRY_COLLECTIVE(name, params, args)                  \
  FERRY_NONBLOCKING(name, params, args)                       \
  Status Communicator::name params {                          \
    if (Status s = unusable(group_); !s) return s;            \
    coll::Group& g = *group_;                                 \
    auto entry = g.engine()->enter();                         \
    if (g.revoked()) return g.revoked_status(#name);          \
    return g.run([&](coll::Plan& p) { return g.name args; }); \
  }
// Small ones may go through the node's shared area at once (Group::quick), with the same result
// as through run().
#define FERRY_SMALL_COLLECTIVE(name, params, quick_args, args) \
  FERRY_NONBLOCKING(name, params, args)                        \
  Status Communicator::name params {                           \
    if (Status s = unusable(group_); !s) return s;             \
    coll::Group& g = *group_;                                  \
    auto entry = g.engine()->enter();                          \
    if (g.revoked()) return g.revoked_status(#name);           \
    Status quick;                                              \
    if (g.quick quick_args) return quick;                      \
    return g.run([&](coll::Plan& p) { return g.name args; });  \
  }

FERRY_SMALL_COLLECTIVE(barrier, (),
                       (&quick, coll::Kind::kBarrier, nullptr, nullptr, 0, DataType::kUint8,
                        ReduceOp::kSum, 0),
                       (p))
FERRY_SMALL_COLLECTIVE(broadcast, (void* buffer, std::size_t count, DataType type, int root),
                       (&quick, coll::Kind::kBroadcast, buffer, buffer, count, type, ReduceOp::kSum,
                        root),
                       (p, buffer, count, type, root))
FERRY_SMALL_COLLECTIVE(reduce,
                       (const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                        int root),
                       (&quick, coll::Kind::kReduce, send, recv, count, type, op, root),
                       (p, send, recv, count, type, op, root))
FERRY_SMALL_COLLECTIVE(allreduce,
                       (const void* send, void* recv, std::size_t count, DataType type,
                        ReduceOp op),
                       (&quick, coll::Kind::kAllreduce, send, recv, count, type, op, 0),
                       (p, send, recv, count, type, op))
FERRY_SMALL_COLLECTIVE(allgather, (const void* send, void* recv, std::size_t count, DataType type),
                       (&quick, coll::Kind::kAllgather, send, recv, count, type, ReduceOp::kSum, 0),
                       (p, send, recv, count, type))
FERRY_COLLECTIVE(allgatherv,
                 (const void* send, void* recv, std::span<const std::size_t> counts,
                  std::span<const std::size_t> displacements, DataType type),
                 (p, send, recv, counts, displacements, type))
FERRY_SMALL_COLLECTIVE(reduce_scatter,
                       (const void* send, void* recv, std::size_t count, DataType type,
                        ReduceOp op),
                       (&quick, coll::Kind::kReduceScatter, send, recv, count, type, op, 0),
                       (p, send, recv, count, type, op))
FERRY_COLLECTIVE(gather, (const void* send, void* recv, std::size_t count, DataType type, int root),
                 (p, send, recv, count, type, root))
FERRY_COLLECTIVE(scatter,
                 (const void* send, void* recv, std::size_t count, DataType type, int root),
                 (p, send, recv, count, type, root))
FERRY_COLLECTIVE(alltoallv,
                 (const void* send, std::span<const std::size_t> send_counts,
                  std::span<const std::size_t> send_displacements, void* recv,
                  std::span<const std::size_t> recv_counts,
                  std::span<const std::size_t> recv_displacements, DataType type),
                 (p, send, send_counts, send_displacements, recv, recv_counts, recv_displacements,
                  type, "alltoallv"))
#undef FERRY_SMALL_COLLECTIVE
#undef FERRY_COLLECTIVE
#undef FERRY_NONBLOCKING

namespace {

// alltoall as alltoallv: every block is `count` elements, block m at m * count.
struct EvenBlocks {
  EvenBlocks(int n, std::size_t count)
      : counts(static_cast<std::size_t>(n), count), displacements(static_cast<std::size_t>(n)) {
    for (std::size_t m = 0; m < displacements.size(); ++m) displacements[m] = m * count;
  }
  std::vector<std::size_t> counts, displacements;
};

}  // namespace

// The schedule keeps the pointers it needs, not the spans, so the blocks may go when it is built.
Request Communicator::ialltoall(const void* send, void* recv, std::size_t count, DataType type) {
  if (!unusable(group_).is_ok()) return Request();
  coll::Group& g = *group_;
  auto entry = g.engine()->enter();
  if (g.revoked()) return g.failed(g.revoked_status("ialltoall"));
  const EvenBlocks b(g.size(), count);
  return g.start([&](coll::Plan& p) {
    return g.alltoallv(p, send, b.counts, b.displacements, recv, b.counts, b.displacements, type,
                       "alltoall");
  });
}

Status Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType type) {
  if (Status s = unusable(group_); !s) return s;
  coll::Group& g = *group_;
  auto entry = g.engine()->enter();
  if (g.revoked()) return g.revoked_status("alltoall");
  const EvenBlocks b(g.size(), count);
  return g.run([&](coll::Plan& p) {
    return g.alltoallv(p, send, b.counts, b.displacements, recv, b.counts, b.displacements, type,
                       "alltoall");
  });
}

// ---- Stream-ordered forms (proto/stream_ops.hpp) ----
namespace {

// What is wrong with a stream call's arguments, or ok: checked where the call is made, so that
// what the proxy would find later fails the call instead.
Status check_stream_call(const coll::Group& g, const char* name, std::size_t count, DataType type,
                         int root, std::initializer_list<const void*> buffers,
                         std::optional<ReduceOp> op = std::nullopt) {
  auto bad = [&](const std::string& why) {
    return Status(Code::kInvalidArgument, std::string(name) + " on a stream: " + why);
  };
  const std::size_t element = size_of(type);
  if (element == 0) return bad("unknown data type " + std::to_string(static_cast<int>(type)));
  if (count > std::numeric_limits<std::size_t>::max() / element / 2 / g.size()) {
    return bad(std::to_string(count) + " elements is too many");
  }
  if (root < 0 || root >= g.size()) {
    return bad("root " + std::to_string(root) + " is not in [0, " + std::to_string(g.size()) + ")");
  }
  if (op.has_value()) {
    if (Status s = coll::check_reduction(type, *op); !s) return bad(s.message());
  }
  for (const void* buffer : buffers) {
    if (count > 0 && buffer == nullptr) {
      return bad("a null buffer with " + std::to_string(count) + " elements");
    }
  }
  return Status();
}

// The twin's device set-up (its one-shot area: IPC mappings, host words, the resident kernel's
// stream; a collective of the members) is made by the thread of the first stream collective, not
// by ferry's thread when the stream reaches the call: there its CUDA calls would wait for the
// driver's locks, which a thread blocked launching onto a full stream or graph holds (two H100s:
// graph replays of an allreduce stopped at the first). Every member makes its stream collectives
// in the same order, so all make this one alike; a stream that names no GPU takes part, failing.
// For the same reason, a collective that moves data makes here the host rings its messages to and
// from the members it reaches through shared memory may be staged through (proto/device_path.hpp,
// prepare_staging): ours before the one-shot's set-up, whose allgather every member passes after
// making its own, and the members' after it.
void prepare_twin(coll::Group& twin, CudaStream stream, bool moves_data) {
  proto::Engine* engine = twin.engine();
  cuda::Cuda* gpu = engine->cuda();
  if (gpu == nullptr) return;
  const int mode = gpu->relax_capture();
  std::vector<int> neighbours;  // reached through shared memory, where device data is staged
  if (moves_data) {
    auto entry = engine->enter();
    for (int m : twin.members()) {
      if (m != engine->rank() && engine->links().link(m).shares_memory) neighbours.push_back(m);
    }
  }
  // The rings without the engine's lock (prepare_staging), which ferry's thread needs to drain
  // the streams of a thread that holds the lock registering them waits for.
  for (int m : neighbours) engine->device().prepare_staging(m, false);
  cuda::Cuda::StreamInfo info;
  const bool known = gpu->stream_info(stream, &info).is_ok();
  {
    auto entry = engine->enter();
    if (!neighbours.empty() && known) engine->device().prepare_copies(info.device);
    static_cast<void>(twin.oneshot().ready(known ? info.device : -1, 1, DataType::kUint8));
  }
  for (int m : neighbours) engine->device().prepare_staging(m, true);
  gpu->restore_capture(mode);
}

// The communicator's stream twin and the Context's stream operations, taken under the engine's
// lock, which the twin's set-up and the enqueueing then let go: a full stream blocks the call that
// enqueues on it until the proxy, which needs that lock, has drained it. For a collective (`stream`
// set), the twin's device set-up too (and its staging rings where it `moves_data`). Null parts, and
// *revoked set, for a revoked communicator.
std::pair<std::shared_ptr<coll::Group>, proto::StreamOps*> stream_parts(
    const std::shared_ptr<coll::Group>& group, const char* name, Status* revoked,
    std::optional<CudaStream> collective_stream = std::nullopt, bool moves_data = false) {
  std::shared_ptr<coll::Group> twin;
  {
    auto entry = group->engine()->enter();
    if (group->revoked()) {
      *revoked = group->revoked_status(std::string(name) + " on a stream");
      return {nullptr, nullptr};
    }
    twin = group->stream_twin();
  }
  if (collective_stream.has_value()) prepare_twin(*twin, *collective_stream, moves_data);
  return {twin, &group->engine()->streams()};
}

// Enqueues a collective of the communicator's stream twin, which `build` describes.
template <class Build>
Status enqueue_collective(const std::shared_ptr<coll::Group>& group, CudaStream stream,
                          const char* name, bool moves_data, Build build) {
  // Not a structured binding: clang before 16 cannot capture one.
  Status revoked;
  std::pair<std::shared_ptr<coll::Group>, proto::StreamOps*> parts =
      stream_parts(group, name, &revoked, stream, moves_data);
  if (!revoked.is_ok()) return revoked;
  std::shared_ptr<coll::Group> twin = std::move(parts.first);
  const std::uint32_t comm = twin->base_id();
  return parts.second->enqueue(
      comm, stream,
      [twin, build] {
        auto inner = twin->engine()->enter();
        return twin->start([&](coll::Plan& p) { return build(*twin, p); });
      },
      name);
}

// A collective of one member on a stream: its result is its input, so at most one copy on the
// stream (`bytes` from `src` to `dst`, none where they are the same), with no hand-off to ferry's
// thread (a round trip of the host's per call: 17.7 us for an 8-byte allreduce from NCCL's API
// on an H200, NCCL's own copy 6). *taken is false where the communicator has more members.
Status alone_on_stream(const std::shared_ptr<coll::Group>& group, CudaStream stream, void* dst,
                       const void* src, std::size_t bytes, const char* name, bool* taken) {
  *taken = group->size() == 1;
  if (!*taken) return Status();
  proto::Engine* engine = group->engine();
  auto entry = engine->enter();
  if (group->revoked()) return group->revoked_status(std::string(name) + " on a stream");
  if (Status error = engine->streams().async_error(group->base_id()); !error) {
    return Status(error.code(), std::string(name) +
                                    " on a stream: not enqueued, an earlier stream operation of "
                                    "this communicator failed: " +
                                    error.message());
  }
  cuda::Cuda* gpu = engine->cuda();
  if (gpu == nullptr) {
    return Status(Code::kUnsupported, std::string(name) +
                                          " on a CUDA stream: this process has no CUDA (ferry-info "
                                          "says why)");
  }
  cuda::Cuda::StreamInfo info;
  if (Status s = gpu->stream_info(stream, &info); !s) return s;
  if (bytes == 0 || dst == src) return Status();
  return gpu->copy_on_stream(stream, info.device, dst, src, bytes);
}

}  // namespace

// `alone`: (dst, src, bytes) of a communicator of one member (alone_on_stream).
#define FERRY_STREAM_COLLECTIVE(name, params, checks, alone, args)                         \
  Status Communicator::name params {                                                       \
    if (Status s = unusable(group_); !s) return s;                                         \
    if (Status s = check_stream_call checks; !s) return s;                                 \
    bool taken = false;                                                                    \
    Status by_copy = alone_on_stream(group_, stream, FERRY_UNPAREN alone, #name, &taken);  \
    if (taken) return by_copy;                                                             \
    return enqueue_collective(group_, stream, #name, false,                                \
                              [=](coll::Group& g, coll::Plan& p) { return g.name args; }); \
  }
// The same, first trying one kernel on the stream itself (among one node's GPUs, with no host in
// the loop): `kernel` is its coll::KernelCall, in parentheses.
#define FERRY_STREAM_KERNEL_COLLECTIVE(name, params, checks, alone, kernel, args)          \
  Status Communicator::name params {                                                       \
    if (Status s = unusable(group_); !s) return s;                                         \
    if (Status s = check_stream_call checks; !s) return s;                                 \
    bool taken = false;                                                                    \
    Status by_copy = alone_on_stream(group_, stream, FERRY_UNPAREN alone, #name, &taken);  \
    if (taken) return by_copy;                                                             \
    Status by_kernel = coll::collective_by_kernel(*group_, kernel, stream, &taken);        \
    if (taken) return by_kernel;                                                           \
    return enqueue_collective(group_, stream, #name, true,                                 \
                              [=](coll::Group& g, coll::Plan& p) { return g.name args; }); \
  }
#define FERRY_UNPAREN(...) __VA_ARGS__
using Kind = cuda::Cuda::OneShot::Kind;

FERRY_STREAM_COLLECTIVE(barrier, (CudaStream stream),
                        (*group_, "barrier", 0, DataType::kUint8, 0, {}), (nullptr, nullptr, 0),
                        (p))
FERRY_STREAM_KERNEL_COLLECTIVE(
    broadcast, (void* buffer, std::size_t count, DataType type, int root, CudaStream stream),
    (*group_, "broadcast", count, type, root, {buffer}), (buffer, buffer, 0),
    (coll::KernelCall{"broadcast", Kind::kBroadcast, buffer, buffer, count, type, ReduceOp::kSum,
                      root}),
    (p, buffer, count, type, root))
FERRY_STREAM_KERNEL_COLLECTIVE(reduce,
                               (const void* send, void* recv, std::size_t count, DataType type,
                                ReduceOp op, int root, CudaStream stream),
                               (*group_, "reduce", count, type, root, {send}, op),
                               (recv, send, count* size_of(type)),
                               (coll::KernelCall{"reduce", Kind::kReduce, send, recv, count, type,
                                                 op, root}),
                               (p, send, recv, count, type, op, root))
FERRY_STREAM_KERNEL_COLLECTIVE(
    allgather, (const void* send, void* recv, std::size_t count, DataType type, CudaStream stream),
    (*group_, "allgather", count, type, 0, {send, recv}), (recv, send, count* size_of(type)),
    (coll::KernelCall{"allgather", Kind::kAllgather, send, recv, count, type, ReduceOp::kSum, 0}),
    (p, send, recv, count, type))
FERRY_STREAM_KERNEL_COLLECTIVE(reduce_scatter,
                               (const void* send, void* recv, std::size_t count, DataType type,
                                ReduceOp op, CudaStream stream),
                               (*group_, "reduce_scatter", count, type, 0, {send, recv}, op),
                               (recv, send, count* size_of(type)),
                               (coll::KernelCall{"reduce_scatter", Kind::kReduceScatter, send, recv,
                                                 count, type, op, 0}),
                               (p, send, recv, count, type, op))
FERRY_STREAM_KERNEL_COLLECTIVE(allreduce,
                               (const void* send, void* recv, std::size_t count, DataType type,
                                ReduceOp op, CudaStream stream),
                               (*group_, "allreduce", count, type, 0, {send, recv}, op),
                               (recv, send, count* size_of(type)),
                               (coll::KernelCall{"allreduce", Kind::kAllreduce, send, recv, count,
                                                 type, op, 0}),
                               (p, send, recv, count, type, op))
#undef FERRY_STREAM_COLLECTIVE
#undef FERRY_STREAM_KERNEL_COLLECTIVE
#undef FERRY_UNPAREN

namespace {

// A stream send or receive: by kernels on the stream between GPUs of one node, else a message of
// ferry's thread (coll/stream_p2p.hpp), matched in order per pair.
Status enqueue_message(const std::shared_ptr<coll::Group>& group, bool sending, void* buffer,
                       std::size_t bytes, int peer, CudaStream stream) {
  const char* name = sending ? "send" : "recv";
  if (Status s = unusable(group); !s) return s;
  if (peer < 0 || peer >= group->size()) {
    return Status(Code::kInvalidArgument, std::string(name) + " on a stream: member " +
                                              std::to_string(peer) + " is not in [0, " +
                                              std::to_string(group->size()) + ")");
  }
  if (bytes > 0 && buffer == nullptr) {
    return Status(Code::kInvalidArgument, std::string(name) + " on a stream: a null buffer with " +
                                              std::to_string(bytes) + " bytes");
  }
  Status revoked;
  const auto [twin, streams] = stream_parts(group, name, &revoked);
  if (!revoked.is_ok()) return revoked;
  coll::StreamP2p* p2p = nullptr;
  {
    auto entry = group->engine()->enter();
    p2p = &twin->stream_p2p();
  }
  std::string what = std::string(name) + (sending ? " to " : " from ") + group->peer_label(peer);
  return streams->enqueue(group->base_id(), stream, p2p,
                          coll::StreamP2p::work(twin, sending, buffer, bytes, peer), what);
}

}  // namespace

Status Communicator::send(const void* buffer, std::size_t bytes, int peer, CudaStream stream) {
  return enqueue_message(group_, true, const_cast<void*>(buffer), bytes, peer, stream);
}

Status Communicator::recv(void* buffer, std::size_t bytes, int peer, CudaStream stream) {
  return enqueue_message(group_, false, buffer, bytes, peer, stream);
}

namespace {

proto::StreamOps& streams_of(proto::Engine* engine) {
  auto entry = engine->enter();
  return engine->streams();
}

struct Message {
  bool sending;
  void* buffer;
  std::size_t bytes;
  int peer;
};

// A stream collective that is sends and receives only (alltoall, gather, scatter), made as NCCL
// makes it: one group of them. Between GPUs of one node the small ones are kernels on the stream
// and a block to the member itself a copy on it, none a hand-off to ferry's thread, whose CUDA
// calls could wait for a lock of the driver's that an application thread holds while it waits
// for the stream (PyTorch's all_to_all_single of one element, read back with .cpu(), hung so).
Status by_messages(const std::shared_ptr<coll::Group>& group, CudaStream stream,
                   const std::vector<Message>& messages) {
  proto::StreamOps& streams = streams_of(group->engine());
  streams.group_start();
  Status first;
  for (const Message& m : messages) {
    Status s = enqueue_message(group, m.sending, m.buffer, m.bytes, m.peer, stream);
    if (first.is_ok()) first = s;
  }
  Status ended = streams.group_end();
  return first.is_ok() ? ended : first;
}

}  // namespace

Status Communicator::alltoall(const void* send, void* recv, std::size_t count, DataType type,
                              CudaStream stream) {
  if (Status s = unusable(group_); !s) return s;
  if (Status s = check_stream_call(*group_, "alltoall", count, type, 0, {send, recv}); !s) {
    return s;
  }
  const std::size_t bytes = count * size_of(type);
  bool taken = false;
  Status by_copy = alone_on_stream(group_, stream, recv, send, bytes, "alltoall", &taken);
  if (taken || bytes == 0) return by_copy;
  const int n = group_->size();
  const int me = group_->rank();
  std::vector<Message> messages;
  for (int k = 0; k < n; ++k) {
    const int peer = (me + k) % n;
    const std::size_t at = static_cast<std::size_t>(peer) * bytes;
    messages.push_back(
        {true, const_cast<std::byte*>(static_cast<const std::byte*>(send)) + at, bytes, peer});
    messages.push_back({false, static_cast<std::byte*>(recv) + at, bytes, peer});
  }
  return by_messages(group_, stream, messages);
}

namespace {

// A stream gather (`gathering`: each member's block to the root, which takes them in member
// order) or scatter (the root's block m to member m), as one group of messages.
Status rooted_by_messages(const std::shared_ptr<coll::Group>& group, const char* name,
                          bool gathering, const void* send, void* recv, std::size_t count,
                          DataType type, int root, CudaStream stream) {
  if (Status s = unusable(group); !s) return s;
  if (Status s = check_stream_call(*group, name, count, type, root, {gathering ? send : recv});
      !s) {
    return s;
  }
  const std::size_t bytes = count * size_of(type);
  bool taken = false;
  Status by_copy = alone_on_stream(group, stream, recv, send, bytes, name, &taken);
  if (taken || bytes == 0) return by_copy;
  const bool at_root = group->rank() == root;
  auto* blocks = static_cast<std::byte*>(gathering ? recv : const_cast<void*>(send));
  if (at_root && blocks == nullptr) {
    return Status(Code::kInvalidArgument,
                  std::string(name) + " on a stream: a null buffer at the root");
  }
  std::vector<Message> messages;
  if (gathering) messages.push_back({true, const_cast<void*>(send), bytes, root});
  for (int m = 0; at_root && m < group->size(); ++m) {
    messages.push_back({!gathering, blocks + static_cast<std::size_t>(m) * bytes, bytes, m});
  }
  if (!gathering) messages.push_back({false, recv, bytes, root});
  return by_messages(group, stream, messages);
}

}  // namespace

Status Communicator::gather(const void* send, void* recv, std::size_t count, DataType type,
                            int root, CudaStream stream) {
  return rooted_by_messages(group_, "gather", true, send, recv, count, type, root, stream);
}

Status Communicator::scatter(const void* send, void* recv, std::size_t count, DataType type,
                             int root, CudaStream stream) {
  return rooted_by_messages(group_, "scatter", false, send, recv, count, type, root, stream);
}

void Context::group_start() { streams_of(engine_.get()).group_start(); }
Status Context::group_end() { return streams_of(engine_.get()).group_end(); }
// The errors are read without the engine's lock: they are polled (PyTorch's watchdog, through
// ncclCommGetAsyncError), also while a thread that holds the lock waits.
Status Context::async_error() const {
  const proto::StreamOps* streams = engine_->streams_made();
  return streams == nullptr ? Status::ok() : streams->async_error();
}

Status Communicator::async_error() const {
  if (Status s = unusable(group_); !s) return s;
  const proto::StreamOps* streams = group_->engine()->streams_made();
  return streams == nullptr ? Status::ok() : streams->async_error(group_->base_id());
}

}  // namespace ferry
