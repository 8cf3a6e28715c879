// ferry::Communicator: the public face of the collectives (src/coll).
#include <vector>

#include "coll/group.hpp"
#include "proto/engine.hpp"

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

// The i-forms run a schedule that the engine advances; the blocking forms run it now.
#define FERRY_NONBLOCKING(name, params, args)                   \
  Request Communicator::i##name params {                        \
    if (!unusable(group_).is_ok()) return Request();            \
    coll::Group& g = *group_;                                   \
    auto entry = g.engine()->enter();                           \
    return g.start([&](coll::Plan& p) { return g.name args; }); \
  }
#define FERRY_COLLECTIVE(name, params, args)                  \
  FERRY_NONBLOCKING(name, params, args)                       \
  Status Communicator::name params {                          \
    if (Status s = unusable(group_); !s) return s;            \
    coll::Group& g = *group_;                                 \
    auto entry = g.engine()->enter();                         \
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
  const EvenBlocks b(g.size(), count);
  return g.run([&](coll::Plan& p) {
    return g.alltoallv(p, send, b.counts, b.displacements, recv, b.counts, b.displacements, type,
                       "alltoall");
  });
}

}  // namespace ferry
