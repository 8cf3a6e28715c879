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

Group::Group(proto::Engine* engine, std::vector<int> members, int rank, std::uint32_t id,
             std::shared_ptr<Ids> ids)
    : engine_(engine),
      handle_(engine->handle()),
      members_(std::move(members)),
      rank_(rank),
      id_(id),
      ids_(std::move(ids)),
      revocations_(&engine->revocations()) {
  // A stream twin is revoked with its communicator, whose id enrolls them both.
  if ((id_ & kStreamTwinBit) == 0) revocations_->enroll(id_, members_);
  const util::Config& config = engine_->config();
  small_ = config.get_size(util::Var::kCollSmall);
  allreduce_ = static_cast<int>(config.get_int(util::Var::kCollAllreduce));
  broadcast_ = static_cast<int>(config.get_int(util::Var::kCollBroadcast));
  reduce_ = static_cast<int>(config.get_int(util::Var::kCollReduce));
  allgather_ = static_cast<int>(config.get_int(util::Var::kCollAllgather));
  chunk_ = config.get_size(util::Var::kCollChunk);
  timeout_ = engine_->waiting().timeout();
  oneshot_ = std::make_unique<DeviceOneShot>(*this, config);
  // The area's slots hold at most 8 MiB in all (NodeArea::kSlots per member), so a communicator
  // of many members takes smaller calls through it: 1 MiB per member for two, 256 KiB for eight.
  const std::size_t slot_budget = (std::size_t{8} << 20) / NodeArea::kSlots / members_.size();
  nodes_ = std::make_unique<NodeCollectives>(
      *this, std::min(config.get_size(util::Var::kCollNode), slot_budget / 64 * 64));
}

Group::~Group() {
  // A Communicator may go on any thread, and after its Context (nothing to tell then).
  if (detached() || (id_ & kStreamTwinBit) != 0) return;
  auto entry = engine_->enter();
  revocations_->leave(id_);
}

StreamP2p& Group::stream_p2p() {
  if (!p2p_) p2p_ = std::make_unique<StreamP2p>(*this, engine_->config());
  return *p2p_;
}

std::string Group::call_label(std::uint32_t sequence) const {
  return "#" + std::to_string(sequence & 0xffffffu) + " on communicator " +
         std::to_string(base_id()) + ((id_ & kStreamTwinBit) != 0 ? " (stream-ordered)" : "");
}

std::string Group::peer_label(int m) const {
  return "member " + std::to_string(m) + " (rank " + std::to_string(member(m)) + ")";
}

std::string Group::departed_label(int m) const {
  return peer_label(m) + " finalized (its Context ended) without joining it";
}

int Group::first_departed() const {
  int first = -1;
  std::uint64_t earliest = 0;
  for (int m = 0; m < size(); ++m) {
    const std::uint64_t order = engine_->liveness().departure_order(member(m));
    if (order != 0 && (first < 0 || order < earliest)) {
      first = m;
      earliest = order;
    }
  }
  return first;
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

proto::Waiting::Note Group::waiting_note(const Immediate* call) {
  return engine_->waiting().note(
      [](const void* subject, std::uintptr_t) {
        return static_cast<const Immediate*>(subject)->describe_wait();
      },
      call);
}

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
  if (id >= std::int64_t{kIdLimit}) {
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

std::shared_ptr<Group> Group::stream_twin() {
  if (!twin_) {
    twin_ = std::shared_ptr<Group>(new Group(engine_, members_, rank_, id_ | kStreamTwinBit, ids_));
  }
  return twin_;
}

std::shared_ptr<Group> Group::kernel_twin() {
  if (!kernel_twin_) {
    kernel_twin_ = std::shared_ptr<Group>(
        new Group(engine_, members_, rank_, id_ | kStreamTwinBit | kKernelTwinBit, ids_));
  }
  return kernel_twin_;
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
