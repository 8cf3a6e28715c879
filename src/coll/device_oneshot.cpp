// The one-shot device allreduce of one Group (see device_oneshot.hpp).
#include "coll/device_oneshot.hpp"

#include <algorithm>

#include "coll/group.hpp"
#include "proto/engine.hpp"
#include "proto/stream_ops.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace ferry::coll {

// FERRY_STREAM_LL's largest value (util/config.hpp) is what the LL slots of an area hold.
static_assert(cuda::Cuda::kLLMaxBytes == 262144);

DeviceOneShot::DeviceOneShot(Group& group, const util::Config& config)
    : group_(group),
      on_stream_((group.id() & kKernelTwinBit) != 0),
      slice_(config.get_size(util::Var::kCollDeviceOneshotSlice)),
      twoshot_from_(on_stream_ ? 0 : config.get_size(util::Var::kCollDeviceTwoshot)),
      resident_us_(
          on_stream_ ? 0
                     : static_cast<std::uint64_t>(config.get_int(util::Var::kCollDeviceResident))),
      // On a stream, kernels also where members share a GPU (slower there than ferry's thread,
      // which then launches device reductions while the application's stream waits for it: an
      // application thread in a blocking CUDA call, a tensor's .cpu(), holds the driver's lock
      // those launches wait for, behind that stream, for ever).
      shared_gpu_(on_stream_ || config.get_bool(util::Var::kCollDeviceSharedGpu)),
      ll_bytes_(on_stream_ ? config.get_size(util::Var::kStreamLl) : 0) {
  // Each member of a one-shot call pushes its data to the n - 1 others, so the size limit
  // shrinks with the members (and so does the exchange area: 2 * n slots of that size).
  const std::size_t peers = group.size() > 1 ? static_cast<std::size_t>(group.size()) - 1 : 1;
  const util::Var limit = on_stream_ ? util::Var::kStreamKernel : util::Var::kCollDeviceOneshot;
  bytes_ = config.get_bool(util::Var::kCudaIpc) ? config.get_size(limit) / peers / 256 * 256 : 0;
}

DeviceOneShot::~DeviceOneShot() {
  // Only a group with device state touches the engine here, and only while its Context lives
  // (a Communicator may outlive it, as a global one does: the engine's teardown then released
  // that state); a Communicator may go on any thread.
  if (!state_ || group_.detached()) return;
  proto::Engine* engine = group_.engine();
  auto entry = engine->enter();
  engine->cancel_teardown(this);
  // The kernels stop now; the memory goes where no stream waits for ferry's thread (as
  // StreamP2p's: a free waits for the GPU's work, and such a stream's for the engine's lock).
  stop_kernels();
  cuda::Cuda* gpu = engine->cuda();
  std::shared_ptr<State> held(std::move(state_));
  engine->streams().release_when_idle([gpu, held] { free_state(gpu, *held); });
}

bool DeviceOneShot::ready(int device, std::size_t count, DataType type) {
  const int n = group_.size();
  const std::size_t bytes = count * size_of(type);
  if (bytes_ == 0 || n < 2 || n > cuda::Cuda::kOneShotMembers ||
      (bytes > bytes_ && !by_twoshot(bytes))) {
    return false;
  }
  if (!state_) {
    // Decided once. Every member must share this node (and so the GPUs' IPC): the same answer
    // everywhere.
    state_ = std::make_unique<State>();
    group_.engine()->at_teardown(this, [this] {
      release();
      state_.reset();
    });
    const std::vector<int> local = group_.engine()->job().local_ranks();
    for (int m : group_.members()) {
      if (std::find(local.begin(), local.end(), m) == local.end()) return false;
    }
    if (Status s = prepare(device); !s.is_ok()) {
      if (state_->shared) {
        FERRY_LOG(kInfo, "collectives: no one-shot device allreduce here: %s", s.message().c_str());
      } else {
        FERRY_LOG(kWarn,
                  "collectives: the one-shot device allreduce is off for this communicator: %s",
                  s.message().c_str());
      }
      release();
      state_->usable = false;
    }
  }
  return state_->usable && state_->device == device;
}

bool DeviceOneShot::mesh_ready(int device, cuda::Cuda::OneShot::Kind kind, std::size_t bytes) {
  const auto n = static_cast<std::size_t>(group_.size());
  // A reduce's blocks are the ring's: count / n elements, or one more.
  const std::size_t block = kind == cuda::Cuda::OneShot::Kind::kReduceScatter ? bytes
                            : kind == cuda::Cuda::OneShot::Kind::kReduce      ? bytes / n + 16
                                                                              : 0;
  // On a stream a reduce between two takes the generation's two slots (kernels/mesh.cuh,
  // reduce_pair).
  const bool pair = on_stream_ && n == 2 && kind == cuda::Cuda::OneShot::Kind::kReduce;
  const bool fits = pair        ? bytes <= 2 * bytes_
                    : block > 0 ? (block + 255) / 256 * 256 <= bytes_
                                : bytes <= n * bytes_;
  // A broadcast's kernel waits twice for every member: below 2 MiB the host path was faster (four
  // H100s: 8 B 22.6 against 41 us, 1 MiB 39.8 against 56.6; 8 MiB 153 against 83). On a stream
  // the other way is ferry's thread, slower at every size.
  const bool worth =
      on_stream_ || kind != cuda::Cuda::OneShot::Kind::kBroadcast || bytes >= (2u << 20);
  // Launched, two members keep their own algorithms (copy engines); on a stream the other way is
  // ferry's thread, so two members take the kernels too.
  return n >= (on_stream_ ? 2u : 3u) && bytes > 0 && fits && worth &&
         ready(device, 1, DataType::kUint8);
}

std::size_t DeviceOneShot::round_bytes(cuda::Cuda::OneShot::Kind kind) const {
  using Kind = cuda::Cuda::OneShot::Kind;
  const auto n = static_cast<std::size_t>(group_.size());
  // mesh_ready's fits, in whole 256-byte pieces so that every round starts aligned as the call.
  const auto whole = [](std::size_t bytes) { return bytes / 256 * 256; };
  switch (kind) {
    case Kind::kBroadcast:
      return whole(n * bytes_);
    case Kind::kAllgather:  // a part of each member's block a round (Cuda::OneShot::stride)
      return on_stream_ ? whole(n * bytes_) : 0;
    case Kind::kReduceScatter:  // a part of each block a round, at most a slot
      return on_stream_ ? whole(bytes_) : 0;
    case Kind::kReduce:
      // Between two (reduce_pair) each element's operands are the same whatever the round; among
      // more the ring's blocks, and so the order of operands, depend on the whole count.
      return on_stream_ && n == 2 ? whole(2 * bytes_) : 0;
    case Kind::kAllreduce:
      // The one-shot kernel's limit: on a stream two members have no two-shot kernel
      // (by_twoshot); among more the ring's order depends on the whole count, as the reduce's.
      return on_stream_ && n == 2 ? bytes_ : 0;
  }
  return 0;
}

// Each member makes its exchange area, they swap IPC keys and map each other's, then agree that
// every member succeeded (else nobody uses the path). Every step runs on every member, so their
// collectives stay in step whatever fails.
Status DeviceOneShot::prepare(int device) {
  cuda::Cuda* gpu = group_.engine()->cuda();
  State& o = *state_;
  o.device = device;
  const int n = group_.size();
  const std::size_t area_bytes = on_stream_ ? cuda::Cuda::on_stream_area_bytes(n, bytes_)
                                            : cuda::Cuda::oneshot_area_bytes(n, bytes_);
  struct Offer {
    cuda::IpcKey key;
    std::int64_t ok;
  } mine{};
  // A member without a device (a stream of no GPU of its process) still takes part, failing.
  Status status = device < 0 ? Status(Code::kInvalidArgument, "no CUDA device named")
                             : gpu->allocate(device, area_bytes, &o.area);
  if (status.is_ok()) status = gpu->zero(device, o.area, area_bytes);
  void* words = nullptr;
  if (status.is_ok()) status = gpu->map_host(device, 64, &words, &o.words_device);
  o.words = static_cast<unsigned*>(words);
  if (status.is_ok() && on_stream_) {
    status = gpu->allocate(device, 256, &o.counters);
    if (status.is_ok()) status = gpu->zero(device, o.counters, 256);
    // Loaded now, not at the first launch, when streams may wait for ferry's thread.
    if (status.is_ok() && !gpu->kernels_missing(device).empty()) {
      status = Status(Code::kUnsupported, gpu->kernels_missing(device));
    }
  }
  if (status.is_ok()) {
    const mem::MemoryInfo info = gpu->classify(o.area);
    util::Fd none;
    status = info.ipc == mem::IpcKind::kLegacy
                 ? gpu->export_ipc(o.area, info, &o.key, &none)
                 : Status(Code::kUnsupported, "its exchange area has no CUDA IPC handle");
  }
  mine.key = o.key;
  mine.ok = status.is_ok() ? 1 : 0;
  std::vector<Offer> offers(static_cast<std::size_t>(n));
  Status exchanged = group_.run([&](Plan& p) {
    return group_.allgather(p, &mine, offers.data(), sizeof(Offer), DataType::kUint8);
  });
  if (!exchanged.is_ok()) return exchanged;
  // The most members on one GPU, from the device UUIDs in the offers: every member sees the same
  // offers, so all decide alike. Members that share a GPU without MPS take turns on it by time
  // slices, and blocks that wait for each other then cost milliseconds a call (2.5 ms for 8 B on
  // one H100, against 0.4-0.5 ms by the ring): the one-shot path is for a GPU per member
  // (FERRY_COLL_DEVICE_SHARED_GPU overrides, for MPS, where a call's blocks are divided among
  // the members of a GPU so that all fit on it at once).
  int sharing = 1;
  int first = -1;  // the first pair of members on one GPU
  int second = -1;
  for (int m = 0; m < n; ++m) {
    const Offer& a = offers[static_cast<std::size_t>(m)];
    if (a.ok == 0) continue;
    int same = 1;
    for (int k = m + 1; k < n; ++k) {
      const Offer& b = offers[static_cast<std::size_t>(k)];
      if (b.ok == 0 || b.key.uuid != a.key.uuid) continue;
      ++same;
      if (first < 0) {
        first = m;
        second = k;
      }
    }
    sharing = std::max(sharing, same);
  }
  o.max_blocks = static_cast<unsigned>(std::max(1, cuda::Cuda::kOneShotBlocks / sharing));
  if (sharing > 1 && !shared_gpu_ && status.is_ok()) {
    o.shared = true;
    status =
        Status(Code::kUnsupported, group_.peer_label(first) + " and " + group_.peer_label(second) +
                                       " share a GPU (FERRY_COLL_DEVICE_SHARED_GPU=1 "
                                       "keeps it, for MPS)");
  }
  for (int m = 0; m < n && status.is_ok(); ++m) {
    const Offer& offer = offers[static_cast<std::size_t>(m)];
    if (m == group_.rank()) {
      o.areas[static_cast<std::size_t>(m)] = o.area;
      continue;
    }
    if (offer.ok == 0) {
      status =
          Status(Code::kUnsupported, group_.peer_label(m) + " could not make its exchange area");
      break;
    }
    void* mapped = nullptr;
    status = gpu->import_ipc(group_.member(m), offer.key, device, nullptr, &mapped);
    if (!status.is_ok()) {
      status =
          Status(status.code(), "mapping " + group_.peer_label(m) + "'s area: " + status.message());
      break;
    }
    o.mapped.emplace_back(group_.member(m), offer.key);
    o.areas[static_cast<std::size_t>(m)] = mapped;
  }
  // Agree: the path is used only if every member mapped every area.
  std::int64_t ok = status.is_ok() ? 1 : 0;
  std::int64_t all_ok = 0;
  Status agreed = group_.run([&](Plan& p) {
    return group_.allreduce(p, &ok, &all_ok, 1, DataType::kInt64, ReduceOp::kMin);
  });
  if (!agreed.is_ok()) return agreed;
  if (!status.is_ok()) return status;
  if (all_ok == 0) return Status(Code::kUnsupported, "another member could not map every area");
  o.usable = true;
  FERRY_LOG(kInfo, "collectives: one-shot device allreduce%s ready on cuda:%d (%d members, %zu B)",
            on_stream_ ? " on streams" : "", device, n, bytes_);
  if (on_stream_) {
    o.watch = group_.engine()->streams().watch(group_.base_id(), [this] { return watch(); });
    return Status();
  }
  prepare_resident();
  return Status();
}

// The resident kernel is a choice each member makes for itself (a call of one block is the same
// on the wire either way).
void DeviceOneShot::prepare_resident() {
  State& o = *state_;
  if (resident_us_ == 0 || slice_ == 0) return;
  cuda::Cuda::OneShot shape;
  shape.members = group_.size();
  shape.me = group_.rank();
  shape.slot_bytes = bytes_;
  shape.areas = o.areas;
  shape.words = o.words_device;
  if (Status s = group_.engine()->cuda()->resident_open(o.device, shape, resident_us_, &o.resident);
      !s.is_ok()) {
    o.resident = -1;
    FERRY_LOG(kInfo, "collectives: no resident one-shot kernel: %s", s.message().c_str());
  }
}

void DeviceOneShot::release() {
  if (!state_) return;
  stop_kernels();
  free_state(group_.engine()->cuda(), *state_);
}

void DeviceOneShot::stop_kernels() {
  State& o = *state_;
  // A kernel of a collective that was never completed (its Request dropped) stops waiting for
  // its peers before its memory goes.
  if (o.words != nullptr) __atomic_store_n(&o.words[0], 1u, __ATOMIC_RELEASE);
  if (o.watch >= 0) group_.engine()->streams().unwatch(o.watch);
  o.watch = -1;
}

void DeviceOneShot::free_state(cuda::Cuda* gpu, State& o) {
  if (o.counters != nullptr) gpu->release(o.device, o.counters);
  o.counters = nullptr;
  for (const auto& [memory, size] : o.staging) gpu->release(o.device, memory);
  o.staging.clear();
  if (o.resident >= 0) gpu->resident_close(o.resident);
  o.resident = -1;
  for (const auto& [rank, key] : o.mapped) gpu->unpin(rank, o.device, key);
  o.mapped.clear();
  if (o.area != nullptr) gpu->release(o.device, o.area);
  o.area = nullptr;
  if (o.words != nullptr) gpu->unmap_host(o.device, o.words);
  o.words = nullptr;
  o.usable = false;
}

Status DeviceOneShot::launch(const Execution::Action& a, DataType type, ReduceOp op, int lane,
                             bool blocking, cuda::Ticket* ticket) {
  State& o = *state_;
  cuda::Cuda::OneShot call;
  call.out = a.to;
  call.in = a.from;
  call.count = a.size;
  call.type = type;
  call.op = op;
  call.members = group_.size();
  call.me = group_.rank();
  const auto form = static_cast<Plan::OneShot>(a.member);
  call.kind = form == Plan::OneShot::kAllgather       ? cuda::Cuda::OneShot::Kind::kAllgather
              : form == Plan::OneShot::kReduceScatter ? cuda::Cuda::OneShot::Kind::kReduceScatter
              : form == Plan::OneShot::kBroadcast     ? cuda::Cuda::OneShot::Kind::kBroadcast
              : form == Plan::OneShot::kReduce        ? cuda::Cuda::OneShot::Kind::kReduce
                                                      : cuda::Cuda::OneShot::Kind::kAllreduce;
  call.root = a.root;
  const bool allreduce = call.kind == cuda::Cuda::OneShot::Kind::kAllreduce;
  call.ring = form == Plan::OneShot::kAllreduceRing;  // Group::allreduce's choice of order
  call.two_shot = allreduce && by_twoshot(a.size * size_of(type));
  call.sequence = a.sequence;
  call.slot_bytes = bytes_;
  call.block_bytes = slice_;
  call.max_blocks = o.max_blocks;
  call.areas = o.areas;
  call.words = o.words_device;
  cuda::Cuda* gpu = group_.engine()->cuda();
  // The resident kernel takes a blocking call of one block once the launched calls before it are
  // done (it runs beside them, and a member runs one call at a time). Blocking calls are finished
  // before the next begins, so it never holds two.
  if (blocking && allreduce && !call.two_shot && o.resident >= 0 &&
      a.size * size_of(type) <= slice_ && (!o.launched || gpu->done(o.last_launch))) {
    o.launched = false;
    Status s = gpu->resident_post(o.resident, call, ticket);
    if (s.is_ok()) return s;
    FERRY_LOG(kWarn, "collectives: the resident one-shot kernel is off for this communicator: %s",
              s.message().c_str());
    gpu->resident_close(o.resident);
    o.resident = -1;
  }
  Status s = gpu->allreduce_oneshot_async(o.device, lane, call, ticket);
  if (s.is_ok()) {
    o.last_launch = *ticket;
    o.launched = true;
  }
  return s;
}

Status DeviceOneShot::outcome() {
  if (!state_ || state_->words == nullptr) return Status();
  if (state_->resident >= 0) {
    if (Status s = group_.engine()->cuda()->resident_outcome(state_->resident); !s.is_ok()) {
      stop();
      return Status(s.code(),
                    "the resident one-shot kernel could not be started again: " + s.message());
    }
  }
  if (__atomic_load_n(&state_->words[0], __ATOMIC_ACQUIRE) != 0) {
    // Stopped (maybe before this kernel ran): its result is not complete.
    return Status(Code::kPeerFailed,
                  "the one-shot allreduce was stopped after an earlier collective of this "
                  "communicator failed (a member died or timed out)");
  }
  if (__atomic_load_n(&state_->words[1], __ATOMIC_ACQUIRE) == 0) return Status();
  __atomic_store_n(&state_->words[1], 0u, __ATOMIC_RELEASE);
  return Status(Code::kInvalidArgument,
                "the members' calls of this device collective differ in kind, count, type or "
                "op (do the members make the same collectives with the same counts, types and "
                "op?)");
}

// A device allreduce by the two-shot kernel from FERRY_COLL_DEVICE_TWOSHOT / (members - 1) up
// (where the one-shot kernel's limit stops by default), where the one-shot path is set up: between
// two members any size (in rounds past the area's two slots); among more, up to a part per slot
// (21 MiB for four members), past which the ring is faster (kernels/twoshot.cuh).
bool DeviceOneShot::by_twoshot(std::size_t bytes) const {
  const auto n = static_cast<std::size_t>(group_.size());
  // On a stream, among three or more members, where the one-shot kernel's limit stops, up to a
  // part per slot (the host path's choice with the default FERRY_COLL_DEVICE_TWOSHOT).
  if (on_stream_) return n >= 3 && bytes > bytes_ && bytes <= n * bytes_;
  if (n < 2 || twoshot_from_ == 0 || bytes < std::max<std::size_t>(twoshot_from_ / (n - 1), 1)) {
    return false;
  }
  return n == 2 || bytes <= n * bytes_;
}

cuda::Cuda::OneShot DeviceOneShot::on_stream_call(cuda::Cuda::OneShot::Kind kind, void* out,
                                                  const void* in, std::size_t count, DataType type,
                                                  ReduceOp op, int root, bool ring) const {
  const State& o = *state_;
  cuda::Cuda::OneShot call;
  call.kind = kind;
  call.root = root;
  call.out = out;
  call.in = in;
  call.count = count;
  call.type = type;
  call.op = op;
  call.members = group_.size();
  call.me = group_.rank();
  call.ring = ring;
  call.two_shot =
      kind == cuda::Cuda::OneShot::Kind::kAllreduce && by_twoshot(count * size_of(type));
  call.slot_bytes = bytes_;
  call.block_bytes = slice_;
  call.max_blocks = o.max_blocks;
  call.areas = o.areas;
  call.words = o.words_device;
  call.counters = o.counters;
  call.ll_bytes = ll_bytes_;
  const double timeout = group_.timeout();
  call.timeout_ns = timeout > 0 ? static_cast<std::uint64_t>(timeout * 1e9) : 0;
  return call;
}

Status DeviceOneShot::staging(std::size_t bytes, void** pointer) {
  State& o = *state_;
  if (o.staging.empty() || o.staging.back().second < bytes) {
    // A larger one beside the others: calls enqueued before may still use those. At least twice
    // the last, so that calls of growing sizes keep at most twice the largest, not one of each.
    const std::size_t last = o.staging.empty() ? 0 : o.staging.back().second;
    const std::size_t size = std::max({bytes, bytes_, 2 * last});
    void* memory = nullptr;
    if (Status s = group_.engine()->cuda()->allocate(o.device, size, &memory); !s) return s;
    o.staging.emplace_back(memory, size);
  }
  *pointer = o.staging.back().first;
  return Status();
}

Status DeviceOneShot::watch() {
  if (!state_ || state_->words == nullptr || state_->reported) return Status();
  Status failure = watched_failure();
  state_->reported = !failure.is_ok();
  return failure;
}

// What watch() reports (stopping the calls for good), or ok.
Status DeviceOneShot::watched_failure() {
  const unsigned* words = state_->words;
  const std::string what = "a collective run as a kernel on a stream, on communicator " +
                           std::to_string(group_.base_id());
  if (__atomic_load_n(&words[1], __ATOMIC_ACQUIRE) != 0) {
    stop();
    return Status(Code::kInvalidArgument,
                  what +
                      ": the members' calls differ in count, type or op (do the members pass "
                      "the same counts, types and op, in the same order?)");
  }
  if (__atomic_load_n(&words[2], __ATOMIC_ACQUIRE) != 0) {
    stop();
    return Status(Code::kTimeout, what + ": a member did not arrive within FERRY_TIMEOUT (" +
                                      std::to_string(group_.timeout()) + " s)");
  }
  if (group_.revoked()) {
    stop();
    return group_.revoked_status(what);
  }
  proto::Engine* engine = group_.engine();
  for (int m = 0; m < group_.size(); ++m) {
    if (const std::string* why = engine->liveness().failure(group_.member(m)); why != nullptr) {
      stop();
      return Status(Code::kPeerFailed, what + ": " + group_.peer_label(m) + " failed: " + *why);
    }
  }
  if (const int m = state_->departed.look(&state_->words[3], group_); m >= 0) {
    stop();
    return Status(Code::kCanceled, what + ": " + group_.departed_label(m));
  }
  return Status();
}

void DeviceOneShot::stop() {
  if (!state_ || state_->words == nullptr) return;
  __atomic_store_n(&state_->words[0], 1u, __ATOMIC_RELEASE);
  state_->usable = false;
}

Status collective_by_kernel(Group& group, const KernelCall& c, void* stream, bool* taken) {
  using Kind = cuda::Cuda::OneShot::Kind;
  *taken = false;
  proto::Engine* engine = group.engine();
  cuda::Cuda* gpu = engine->cuda();
  const std::size_t bytes = c.count * size_of(c.type);
  if (gpu == nullptr || !engine->waiting().threaded() || bytes == 0 || group.size() < 2 ||
      !group.by_device_kernel(c.kind, c.count)) {
    return Status();
  }
  const auto n = static_cast<std::size_t>(group.size());
  // The bytes of the input and of the output (a broadcast's one buffer is both).
  const std::size_t in_bytes = c.kind == Kind::kReduceScatter ? n * bytes : bytes;
  const std::size_t out_bytes = c.kind == Kind::kAllgather ? n * bytes : bytes;
  const bool one_buffer = c.kind == Kind::kBroadcast || c.kind == Kind::kAllreduce;
  // A reduce's output is the root's alone.
  const bool has_out = c.kind != Kind::kReduce || group.rank() == c.root;
  std::vector<cuda::Cuda::OneShot> calls;
  int device = -1;
  void* staged_in = nullptr;  // where the kernel works, where not in the buffers
  void* staged_out = nullptr;
  {
    auto entry = engine->enter();
    // What the thread's path reports at once.
    if (group.revoked() || !engine->streams().async_error(group.base_id()).is_ok()) {
      return Status();
    }
    std::shared_ptr<Group> twin = group.kernel_twin();
    DeviceOneShot& kernels = twin->oneshot();
    // The set-up's CUDA calls are legal while this thread's stream captures a graph.
    const int mode = gpu->relax_capture();
    cuda::Cuda::StreamInfo info;
    const bool known = gpu->stream_info(stream, &info).is_ok();
    const int on = known ? info.device : -1;
    // A call larger than one kernel takes goes in rounds where the kind allows (round_bytes).
    const std::size_t most = kernels.round_bytes(c.kind) / size_of(c.type);
    const std::size_t per_call = most > 0 && c.count > most ? most : c.count;
    const bool ready = c.kind == Kind::kAllreduce
                           ? kernels.ready(on, per_call, c.type)
                           : kernels.mesh_ready(on, c.kind, per_call * size_of(c.type));
    gpu->restore_capture(mode);
    if (!ready || !known) return Status();
    // The host algorithm's order: a reduce in the binomial tree's has a kernel by LL lines only,
    // except between two members, whose kernel past the LL lines (kernels/mesh.cuh, reduce_pair)
    // keeps the tree's order at any size it takes.
    const bool ring = c.kind == Kind::kAllreduce ? twin->allreduce_by_ring(bytes, c.count)
                      : c.kind == Kind::kReduce  ? twin->reduce_in_ring_order(bytes)
                                                 : true;
    if (c.kind == Kind::kReduce && !ring && n > 2 && bytes > kernels.ll_limit()) return Status();
    *taken = true;
    // Buffers the kernel cannot reach go through device memory of its own, by copies on the
    // stream: every member runs the kernel alike, whatever its buffers.
    auto reachable = [&](const void* buffer) {
      const mem::MemoryInfo memory = gpu->classify(buffer);
      return memory.kind == mem::MemoryKind::kCudaManaged ||
             (memory.kind == mem::MemoryKind::kCudaDevice && memory.device == info.device);
    };
    if (!reachable(c.send) || (has_out && !reachable(c.recv))) {
      const std::size_t in_place = (in_bytes + 255) / 256 * 256;
      void* staging = nullptr;
      if (Status s = kernels.staging(one_buffer ? in_bytes : in_place + out_bytes, &staging); !s) {
        return Status(s.code(), std::string(c.name) +
                                    " on a stream: device memory to stage host buffers through: " +
                                    s.message() + " (the other members wait for this call)");
      }
      staged_in = staging;
      staged_out = one_buffer ? staging : static_cast<std::byte*>(staging) + in_place;
    }
    auto* out = static_cast<std::byte*>(staged_out != nullptr ? staged_out : c.recv);
    const auto* in = static_cast<const std::byte*>(staged_in != nullptr ? staged_in : c.send);
    if (per_call == c.count) {
      calls.push_back(kernels.on_stream_call(c.kind, out, in, c.count, c.type, c.op, c.root, ring));
    } else {
      // Rounds of per_call elements. An allreduce's (between two members) keep the order of
      // operands of the whole call: in the ring's order member 0's value comes first in its first
      // block, (count + 1) / 2 elements, and member 1's in the second, so each round lies in one of
      // the two and takes recursive doubling's order (member 0's first everywhere), the members
      // named the other way round in the second block.
      // An allgather's and a reduce-scatter's rounds take the same part of every member's block
      // (the kernel's stride is the whole count); a reduce's between two, as a broadcast's, a part
      // of the buffer.
      const std::size_t split = c.kind == Kind::kAllreduce && ring ? (c.count + 1) / 2 : c.count;
      for (std::size_t at = 0; at < c.count;) {
        const std::size_t end = std::min(at + per_call, at < split ? split : c.count);
        const std::size_t offset = at * size_of(c.type);
        cuda::Cuda::OneShot round = kernels.on_stream_call(c.kind, out + offset, in + offset,
                                                           end - at, c.type, c.op, c.root, ring);
        if (c.kind == Kind::kAllgather || c.kind == Kind::kReduceScatter) round.stride = c.count;
        // A short last round by the blocks too: LL lines take no stride, and a reduce's LL
        // lines their own order of operands.
        if (c.kind != Kind::kAllreduce && c.kind != Kind::kBroadcast) round.ll_bytes = 0;
        if (c.kind == Kind::kAllreduce) round.ring = false;
        if (c.kind == Kind::kAllreduce && at >= split) {
          round.me = 1 - round.me;
          std::swap(round.areas[0], round.areas[1]);
        }
        calls.push_back(round);
        at = end;
      }
    }
    device = info.device;
  }
  // Not under the engine's lock: a full stream blocks these calls until its work drains, which
  // may need ferry's stream thread. The kernel is enqueued even where the copy in failed, so that
  // the other members' calls end.
  Status copied = staged_in != nullptr
                      ? gpu->copy_on_stream(stream, device, staged_in, c.send, in_bytes)
                      : Status();
  // Every round is enqueued, so that the other members' rounds end whatever failed here.
  Status launched;
  for (const cuda::Cuda::OneShot& call : calls) {
    Status s = gpu->collective_on_stream(stream, device, call);
    if (launched.is_ok()) launched = s;
  }
  if (launched.is_ok() && copied.is_ok() && staged_out != nullptr && has_out) {
    copied = gpu->copy_on_stream(stream, device, c.recv, staged_out, out_bytes);
  }
  if (!launched.is_ok()) copied = launched;
  if (!copied.is_ok()) {
    return Status(copied.code(), std::string(c.name) + " on a stream: " + copied.message());
  }
  return Status();
}

}  // namespace ferry::coll
