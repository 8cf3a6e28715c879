// Communicator state, argument checks and split (see group.hpp); the algorithms are in
// algorithms.cpp.
#include "coll/group.hpp"

#include <algorithm>
#include <limits>
#include <tuple>

#include "coll/reduce.hpp"
#include "coll/schedule.hpp"
#include "cuda/cuda.hpp"
#include "proto/engine.hpp"
#include "util/extent.hpp"
#include "util/log.hpp"

namespace ferry::coll {

struct Group::Ids {
  std::uint32_t next = 1;  // 0 is the world
};

Group::Group(proto::Engine* engine, std::vector<int> members, int rank, std::uint32_t id,
             std::shared_ptr<Ids> ids)
    : engine_(engine),
      handle_(engine->handle()),
      members_(std::move(members)),
      rank_(rank),
      id_(id),
      ids_(std::move(ids)) {
  const util::Config& config = engine_->config();
  small_ = config.get_size(util::Var::kCollSmall);
  allreduce_ = static_cast<int>(config.get_int(util::Var::kCollAllreduce));
  broadcast_ = static_cast<int>(config.get_int(util::Var::kCollBroadcast));
  reduce_ = static_cast<int>(config.get_int(util::Var::kCollReduce));
  allgather_ = static_cast<int>(config.get_int(util::Var::kCollAllgather));
  chunk_ = config.get_size(util::Var::kCollChunk);
  timeout_ = engine_->waiting().timeout();
  // Each member of a one-shot call pushes its data to the n - 1 others, so the size limit
  // shrinks with the members (and so does the exchange area: 2 * n slots of that size).
  const std::size_t peers = members_.size() > 1 ? members_.size() - 1 : 1;
  oneshot_bytes_ = config.get_bool(util::Var::kCudaIpc)
                       ? config.get_size(util::Var::kCollDeviceOneshot) / peers / 256 * 256
                       : 0;
  oneshot_slice_ = config.get_size(util::Var::kCollDeviceOneshotSlice);
  twoshot_from_ = config.get_size(util::Var::kCollDeviceTwoshot);
  resident_us_ = static_cast<std::uint64_t>(config.get_int(util::Var::kCollDeviceResident));
  shared_gpu_ = config.get_bool(util::Var::kCollDeviceSharedGpu);
  // The area's slots hold at most 8 MiB in all (NodeArea::kSlots per member), so a communicator
  // of many members takes smaller calls through it: 1 MiB per member for two, 256 KiB for eight.
  const std::size_t slot_budget = (std::size_t{8} << 20) / NodeArea::kSlots / members_.size();
  nodes_ = std::make_unique<NodeCollectives>(
      *this, std::min(config.get_size(util::Var::kCollNode), slot_budget / 64 * 64));
}

Group::~Group() {
  // Only a group with device state touches the engine here, and only while its Context lives
  // (a Communicator may outlive it, as a global one does: the engine's teardown then released
  // that state); a Communicator may go on any thread.
  if (!oneshot_ || detached()) return;
  auto entry = engine_->enter();
  engine_->cancel_teardown(this);
  release_oneshot();
}

// ---- The one-shot device allreduce ----

bool Group::oneshot_ready(int device, std::size_t count, DataType type) {
  const int n = size();
  const std::size_t bytes = count * size_of(type);
  if (oneshot_bytes_ == 0 || n < 2 || n > cuda::Cuda::kOneShotMembers ||
      (bytes > oneshot_bytes_ && !by_twoshot(bytes))) {
    return false;
  }
  if (!oneshot_) {
    // Decided once. Every member must share this node (and so the GPUs' IPC): the same answer
    // everywhere.
    oneshot_ = std::make_unique<OneShot>();
    engine_->at_teardown(this, [this] {
      release_oneshot();
      oneshot_.reset();
    });
    const std::vector<int> local = engine_->job().local_ranks();
    for (int m : members_) {
      if (std::find(local.begin(), local.end(), m) == local.end()) return false;
    }
    if (Status s = prepare_oneshot(device); !s.is_ok()) {
      if (oneshot_->shared) {
        FERRY_LOG(kInfo, "collectives: no one-shot device allreduce here: %s", s.message().c_str());
      } else {
        FERRY_LOG(kWarn,
                  "collectives: the one-shot device allreduce is off for this communicator: %s",
                  s.message().c_str());
      }
      release_oneshot();
      oneshot_->usable = false;
    }
  }
  return oneshot_->usable && oneshot_->device == device;
}

// Each member makes its exchange area, they swap IPC keys and map each other's, then agree that
// every member succeeded (else nobody uses the path). Every step runs on every member, so their
// collectives stay in step whatever fails.
Status Group::prepare_oneshot(int device) {
  cuda::Cuda* gpu = engine_->cuda();
  OneShot& o = *oneshot_;
  o.device = device;
  const int n = size();
  const std::size_t area_bytes = cuda::Cuda::oneshot_area_bytes(n, oneshot_bytes_);
  struct Offer {
    cuda::IpcKey key;
    std::int64_t ok;
  } mine{};
  Status status = gpu->allocate(device, area_bytes, &o.area);
  if (status.is_ok()) status = gpu->zero(device, o.area, area_bytes);
  void* words = nullptr;
  if (status.is_ok()) status = gpu->map_host(device, 64, &words, &o.words_device);
  o.words = static_cast<unsigned*>(words);
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
  Status exchanged = run(
      [&](Plan& p) { return allgather(p, &mine, offers.data(), sizeof(Offer), DataType::kUint8); });
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
    status = Status(Code::kUnsupported, peer_label(first) + " and " + peer_label(second) +
                                            " share a GPU (FERRY_COLL_DEVICE_SHARED_GPU=1 "
                                            "keeps it, for MPS)");
  }
  for (int m = 0; m < n && status.is_ok(); ++m) {
    const Offer& offer = offers[static_cast<std::size_t>(m)];
    if (m == rank_) {
      o.areas[static_cast<std::size_t>(m)] = o.area;
      continue;
    }
    if (offer.ok == 0) {
      status = Status(Code::kUnsupported, peer_label(m) + " could not make its exchange area");
      break;
    }
    void* mapped = nullptr;
    status = gpu->import_ipc(member(m), offer.key, device, nullptr, &mapped);
    if (!status.is_ok()) {
      status = Status(status.code(), "mapping " + peer_label(m) + "'s area: " + status.message());
      break;
    }
    o.mapped.emplace_back(member(m), offer.key);
    o.areas[static_cast<std::size_t>(m)] = mapped;
  }
  // Agree: the path is used only if every member mapped every area.
  std::int64_t ok = status.is_ok() ? 1 : 0;
  std::int64_t all_ok = 0;
  Status agreed =
      run([&](Plan& p) { return allreduce(p, &ok, &all_ok, 1, DataType::kInt64, ReduceOp::kMin); });
  if (!agreed.is_ok()) return agreed;
  if (!status.is_ok()) return status;
  if (all_ok == 0) return Status(Code::kUnsupported, "another member could not map every area");
  o.usable = true;
  FERRY_LOG(kInfo, "collectives: one-shot device allreduce ready on cuda:%d (%d members, %zu B)",
            device, n, oneshot_bytes_);
  prepare_resident();
  return Status();
}

// The resident kernel is a choice each member makes for itself (a call of one block is the same
// on the wire either way).
void Group::prepare_resident() {
  OneShot& o = *oneshot_;
  if (resident_us_ == 0 || oneshot_slice_ == 0) return;
  cuda::Cuda::OneShot shape;
  shape.members = size();
  shape.me = rank_;
  shape.slot_bytes = oneshot_bytes_;
  shape.areas = o.areas;
  shape.words = o.words_device;
  if (Status s = engine_->cuda()->resident_open(o.device, shape, resident_us_, &o.resident);
      !s.is_ok()) {
    o.resident = -1;
    FERRY_LOG(kInfo, "collectives: no resident one-shot kernel: %s", s.message().c_str());
  }
}

std::string Group::peer_label(int m) const {
  return "member " + std::to_string(m) + " (rank " + std::to_string(member(m)) + ")";
}

void Group::release_oneshot() {
  if (!oneshot_) return;
  OneShot& o = *oneshot_;
  cuda::Cuda* gpu = engine_->cuda();
  // A kernel of a collective that was never completed (its Request dropped) stops waiting for
  // its peers before its memory goes.
  if (o.words != nullptr) __atomic_store_n(&o.words[0], 1u, __ATOMIC_RELEASE);
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

Status Group::launch_oneshot(const Execution::Action& a, DataType type, ReduceOp op, int lane,
                             bool blocking, cuda::Ticket* ticket) {
  OneShot& o = *oneshot_;
  cuda::Cuda::OneShot call;
  call.out = a.to;
  call.in = a.from;
  call.count = a.size;
  call.type = type;
  call.op = op;
  call.members = size();
  call.me = rank_;
  call.ring = a.member == 1;  // Group::allreduce's choice of order
  call.two_shot = by_twoshot(a.size * size_of(type));
  call.sequence = a.sequence;
  call.slot_bytes = oneshot_bytes_;
  call.block_bytes = oneshot_slice_;
  call.max_blocks = o.max_blocks;
  call.areas = o.areas;
  call.words = o.words_device;
  cuda::Cuda* gpu = engine_->cuda();
  // The resident kernel takes a blocking call of one block once the launched calls before it are
  // done (it runs beside them, and a member runs one call at a time). Blocking calls are finished
  // before the next begins, so it never holds two.
  if (blocking && !call.two_shot && o.resident >= 0 && a.size * size_of(type) <= oneshot_slice_ &&
      (!o.launched || gpu->done(o.last_launch))) {
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

Status Group::oneshot_outcome() {
  if (!oneshot_ || oneshot_->words == nullptr) return Status();
  if (oneshot_->resident >= 0) {
    if (Status s = engine_->cuda()->resident_outcome(oneshot_->resident); !s.is_ok()) {
      stop_oneshot();
      return Status(s.code(),
                    "the resident one-shot kernel could not be started again: " + s.message());
    }
  }
  if (__atomic_load_n(&oneshot_->words[0], __ATOMIC_ACQUIRE) != 0) {
    // Stopped (maybe before this kernel ran): its result is not complete.
    return Status(Code::kPeerFailed,
                  "the one-shot allreduce was stopped after an earlier collective of this "
                  "communicator failed (a member died or timed out)");
  }
  if (__atomic_load_n(&oneshot_->words[1], __ATOMIC_ACQUIRE) == 0) return Status();
  __atomic_store_n(&oneshot_->words[1], 0u, __ATOMIC_RELEASE);
  return Status(Code::kInvalidArgument,
                "the members' one-shot allreduces differ in count, type or op (do the members "
                "pass the same counts, types and op?)");
}

void Group::stop_oneshot() {
  if (!oneshot_ || oneshot_->words == nullptr) return;
  __atomic_store_n(&oneshot_->words[0], 1u, __ATOMIC_RELEASE);
  oneshot_->usable = false;
}

std::shared_ptr<Group> Group::world(proto::Engine* engine) {
  std::vector<int> members(static_cast<std::size_t>(engine->size()));
  for (std::size_t i = 0; i < members.size(); ++i) members[i] = static_cast<int>(i);
  return std::shared_ptr<Group>(
      new Group(engine, std::move(members), engine->rank(), 0, std::make_shared<Ids>()));
}

Request Group::start_schedule(std::unique_ptr<Schedule> schedule) {
  return engine_->operations().start(std::move(schedule));
}

std::string Group::where(int device) {
  return device == Plan::kHost ? std::string("host memory") : "on cuda:" + std::to_string(device);
}

Request Group::failed(Status status) { return engine_->operations().failed(std::move(status)); }

Status Group::check(Plan& p, const char* name, std::initializer_list<const void*> buffers,
                    std::size_t elements, DataType type, int root) {
  auto bad = [&](Code code, const std::string& why) {
    return Status(code, std::string(name) + ": " + why);
  };
  const std::size_t element = size_of(type);
  if (element == 0) {
    return bad(Code::kInvalidArgument,
               "unknown data type " + std::to_string(static_cast<int>(type)));
  }
  if (elements > std::numeric_limits<std::size_t>::max() / element / 2) {
    return bad(Code::kInvalidArgument, std::to_string(elements) + " elements is too many");
  }
  if (root < 0 || root >= size()) {
    return bad(Code::kInvalidArgument,
               "root " + std::to_string(root) + " is not in [0, " + std::to_string(size()) + ")");
  }
  if (elements == 0) return Status();
  for (const void* buffer : buffers) {
    if (buffer == nullptr) {
      return bad(Code::kInvalidArgument,
                 "a null buffer with " + std::to_string(elements) + " elements");
    }
    if (Status s = util::check_extent(name, "buffer", buffer, elements * element); !s.is_ok()) {
      return s;
    }
    cuda::Cuda* gpu = engine_->cuda();
    const mem::MemoryInfo memory = gpu != nullptr ? gpu->classify(buffer) : mem::MemoryInfo{};
    const int device = memory.device_only() ? std::max(memory.device, 0) : Plan::kHost;
    if (p.placed() && device != p.device()) {
      return bad(Code::kUnsupported,
                 "its buffers are " + where(p.device()) + " and " + where(device) +
                     "; one collective's buffers must all be host memory or all be on one GPU");
    }
    if (!p.placed() && device != Plan::kHost) {
      if (std::string missing = gpu->kernels_missing(device); !missing.empty()) {
        return bad(Code::kUnsupported, "device buffers need ferry's device kernels: " + missing);
      }
    }
    p.place(device);
  }
  return Status();
}

Status Group::check_blocks(const char* name, const void* buffer,
                           std::span<const std::size_t> counts,
                           std::span<const std::size_t> displacements, DataType type) {
  const std::size_t element = size_of(type);
  for (std::size_t m = 0; m < counts.size(); ++m) {
    std::size_t end = 0;
    std::size_t bytes = 0;
    if (counts[m] == 0) continue;
    if (__builtin_add_overflow(displacements[m], counts[m], &end) ||
        !util::multiply(end, element, &bytes) || !util::fits_address_space(buffer, bytes)) {
      return Status(Code::kInvalidArgument, std::string(name) + ": block " + std::to_string(m) +
                                                " (" + std::to_string(counts[m]) +
                                                " elements at displacement " +
                                                std::to_string(displacements[m]) +
                                                ") reaches past the end of the address space");
    }
  }
  return Status();
}

std::shared_ptr<Group> Group::split(int color, int key) {
  // Every member learns every (color, key, next free id); a new communicator takes the largest
  // next free id of its members, which none of them uses yet.
  std::vector<std::int64_t> mine = {color, key, ids_->next};
  std::vector<std::int64_t> all(3 * static_cast<std::size_t>(size()));
  Status status =
      run([&](Plan& p) { return allgather(p, mine.data(), all.data(), 3, DataType::kInt64); });
  if (!status.is_ok()) {
    throw Error(status.code(), "split: exchanging colors and keys: " + status.message());
  }
  if (color == Communicator::kUndefined) return nullptr;
  std::vector<std::tuple<std::int64_t, int>> order;  // (key, member) for members of our color
  std::int64_t id = 0;
  for (int m = 0; m < size(); ++m) {
    const std::int64_t* entry = &all[3 * static_cast<std::size_t>(m)];
    if (entry[0] != color) continue;
    order.emplace_back(entry[1], m);
    id = std::max(id, entry[2]);
  }
  if (id >= (std::int64_t{1} << kIdBits)) {
    throw Error(Code::kNoResources, "split: this process has made " + std::to_string(id) +
                                        " communicators, the most a job may have");
  }
  std::sort(order.begin(), order.end());
  std::vector<int> members;
  int rank = -1;
  for (const auto& [k, m] : order) {
    if (m == rank_) rank = static_cast<int>(members.size());
    members.push_back(member(m));
  }
  ids_->next = static_cast<std::uint32_t>(id) + 1;
  return std::shared_ptr<Group>(
      new Group(engine_, std::move(members), rank, static_cast<std::uint32_t>(id), ids_));
}

bool Group::quick(Status* status, Kind kind, const void* send, void* recv, std::size_t count,
                  DataType type, ReduceOp op, int root) {
  if (!nodes_->set_up()) return false;  // the first call sets the area up, through run()
  const std::size_t element = size_of(type);
  if (element == 0 || count > nodes_->bytes() / element) return false;
  const std::size_t bytes = count * element;
  const auto n = static_cast<std::size_t>(size());
  // Where Group's algorithms would take the area (algorithms.cpp), and arguments that check()
  // accepts: anything else goes through run(), which decides the same way or reports the error.
  switch (kind) {
    case Kind::kBarrier:
      break;
    case Kind::kBroadcast:
      if (broadcast_ != 0 || broadcast_by_chain(bytes) || bytes == 0 || recv == nullptr ||
          root < 0 || root >= static_cast<int>(n)) {
        return false;
      }
      break;
    case Kind::kAllreduce:
      if (allreduce_ != 0 || bytes == 0 || send == nullptr || recv == nullptr ||
          !check_reduction(type, op).is_ok()) {
        return false;
      }
      break;
    case Kind::kAllgather:
      if (allgather_ != 0 || bytes == 0 || send == nullptr || recv == nullptr) {
        return false;
      }
      break;
    case Kind::kReduce:
      if (reduce_ != 0 || bytes == 0 || send == nullptr || (rank_ == root && recv == nullptr) ||
          root < 0 || root >= static_cast<int>(n) || !check_reduction(type, op).is_ok()) {
        return false;
      }
      break;
    case Kind::kReduceScatter:  // `count` elements per member, the input is n times that
      if (bytes == 0 || bytes > nodes_->bytes() / n || send == nullptr || recv == nullptr ||
          !check_reduction(type, op).is_ok()) {
        return false;
      }
      break;
  }
  if (cuda::Cuda* gpu = engine_->cuda()) {
    for (const void* buffer : {send, static_cast<const void*>(recv)}) {
      if (buffer != nullptr && gpu->classify(buffer).device_only()) return false;
    }
  }
  if (!nodes_->usable()) return false;
  next_tag();  // as run() would: every member numbers its collectives alike
  switch (kind) {
    case Kind::kBarrier:
      *status = nodes_->barrier();
      break;
    case Kind::kBroadcast:
      *status = nodes_->broadcast(recv, count, type, root);
      break;
    case Kind::kAllreduce:
      *status = nodes_->allreduce(send, recv, count, type, op, allreduce_by_ring(bytes, count));
      break;
    case Kind::kAllgather:
      *status = nodes_->allgather(send, recv, count, type);
      break;
    case Kind::kReduce:
      *status = nodes_->reduce(send, recv, count, type, op, root, reduce_by_ring(bytes));
      break;
    case Kind::kReduceScatter:
      *status = nodes_->reduce_scatter(send, recv, count, type, op);
      break;
  }
  return true;
}

}  // namespace ferry::coll
