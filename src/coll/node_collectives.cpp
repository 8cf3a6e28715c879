// Small blocking collectives through the node's shared area (node_area.hpp has its rules): a
// member copies its data into its slot and raises a word; the others wait for the word and read
// the slot, with no message, no matching and no progress from the writer. Taken where every
// member shares this node, the buffers are host memory, the call is blocking and no algorithm is
// forced; the non-blocking forms keep their messages.
//
// Waiting: each poll of a word also makes progress (other traffic goes on, a dead member is
// noticed), yields after FERRY_SPIN_COUNT empty polls and naps after a while (Engine::spin_step);
// every 1024 polls it checks the member waited for and FERRY_TIMEOUT. A member that fails a call
// marks its control line failed and raises the area's `left` word; every member looks at that
// word before each call and stops using the area when it is up: the next collectives go by
// messages on every member.
#include <algorithm>
#include <cstring>

#include "coll/group.hpp"
#include "coll/reduce.hpp"
#include "proto/engine.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"
#include "util/node.hpp"

namespace ferry::coll {
namespace {

constexpr const char* kKindNames[] = {"?",         "barrier",        "broadcast", "allreduce",
                                      "allgather", "reduce_scatter", "reduce"};

// What a call is, in one word every member can compare: kind, type, op, root and the bytes per
// member (below 2^24: FERRY_COLL_NODE is at most 1 MiB; a streamed broadcast, which may be
// larger, gives its exact size beside the word).
constexpr std::size_t kStreamed = (std::size_t{1} << 24) - 1;
std::uint64_t signature(Kind kind, std::size_t bytes, DataType type, ReduceOp op, int root) {
  bytes = std::min<std::size_t>(bytes, kStreamed);  // a streamed broadcast's size goes apart
  return std::uint64_t{static_cast<std::uint8_t>(kind)} |
         (std::uint64_t{static_cast<std::uint8_t>(type)} << 8) |
         (std::uint64_t{static_cast<std::uint8_t>(op)} << 16) |
         (std::uint64_t{static_cast<std::uint16_t>(root)} << 24) | (std::uint64_t{bytes} << 40);
}

std::string describe(std::uint64_t s) {
  const auto kind = static_cast<Kind>(s & 0xff);
  const auto type = static_cast<DataType>((s >> 8) & 0xff);
  const auto op = static_cast<ReduceOp>((s >> 16) & 0xff);
  std::string text = (s & 0xff) < std::size(kKindNames) ? kKindNames[s & 0xff] : "?";
  text += (s >> 40) == kStreamed ? std::string(" of 16 MiB or more")
                                 : " of " + std::to_string(s >> 40) + " bytes";
  if (kind == Kind::kBroadcast) text += " from member " + std::to_string((s >> 24) & 0xffff);
  if (kind != Kind::kBarrier) text += std::string(" of ") + to_string(type);
  if (kind == Kind::kAllreduce) text += std::string(" (") + to_string(op) + ")";
  return text;
}

// out = the reduction of the n inputs in recursive doubling's order (Group::allreduce): the first
// 2 (n - pow2) inputs fold in pairs, lower first, then the pow2 partial results combine at
// distance 1, 2, 4..., lower first; the inputs start `offset` bytes in. `scratch` holds pow2
// buffers of count elements.
void reduce_in_doubling_order(std::byte* out, const std::vector<const std::byte*>& x,
                              std::size_t offset, std::size_t count, DataType type, ReduceOp op,
                              std::byte* scratch) {
  const int n = static_cast<int>(x.size());
  const std::size_t bytes = count * size_of(type);
  int pow2 = 1;
  while (pow2 * 2 <= n) pow2 *= 2;
  const int extra = n - pow2;
  auto tmp = [&](int k) { return scratch + static_cast<std::size_t>(k) * bytes; };
  const std::byte* v[64];  // pow2 <= 64: members of one node (checked by prepare_node)
  for (int k = 0; k < pow2; ++k) {
    const auto at = static_cast<std::size_t>(k);
    if (k < extra) {
      reduce_to(tmp(k), x[2 * at] + offset, x[2 * at + 1] + offset, count, type, op);
      v[k] = tmp(k);
    } else {
      v[k] = x[at + static_cast<std::size_t>(extra)] + offset;
    }
  }
  for (int step = 1; step < pow2; step *= 2) {
    for (int k = 0; k + step < pow2; k += 2 * step) {
      std::byte* to = 2 * step == pow2 ? out : tmp(k);  // the last step writes the result
      reduce_to(to, v[k], v[k + step], count, type, op);
      v[k] = to;
    }
  }
}

// out = a block of the n inputs (starting `offset` bytes in, `count` elements) in the ring's
// order: the block passes from member `first` to first + 1, first + 2..., each adding its own
// data on the right, so the result is x_f op x_f+1 op ... op x_f-1, from the left (Group::
// allreduce's reduce-scatter starts block b at member b, reduce_scatter's and reduce's at b + 1).
// out may be one of the inputs' own block (the reduction goes element by element).
void reduce_in_ring_order(std::byte* out, const std::vector<const std::byte*>& x, int first,
                          std::size_t offset, std::size_t count, DataType type, ReduceOp op) {
  const int n = static_cast<int>(x.size());
  const std::byte* left = x[static_cast<std::size_t>(first)] + offset;
  for (int t = 1; t < n; ++t) {
    const std::byte* right = x[static_cast<std::size_t>((first + t) % n)] + offset;
    reduce_to(out, left, right, count, type, op);
    left = out;
  }
}

// The binomial tree's order (Group::reduce below FERRY_COLL_SMALL), over ranks relative to
// `root`: member v folds into its own input the partial results of its children v + 1, v + 2,
// v + 4... below `limit` (nearest first; each child the same over its own subtree). Returns where
// v's partial result is: its input for a leaf, else `out` at depth 0 and scratch buffer
// depth - 1 (of count elements each) below, which a parent reads before the next child reuses it.
const std::byte* reduce_in_tree_order(std::byte* out, const std::vector<const std::byte*>& x,
                                      int root, int v, int limit, std::size_t count, DataType type,
                                      ReduceOp op, std::byte* scratch, int depth) {
  const int n = static_cast<int>(x.size());
  auto input = [&](int relative) { return x[static_cast<std::size_t>((relative + root) % n)]; };
  if (limit == 1 || v + 1 >= n) return input(v);
  std::byte* acc =
      depth == 0 ? out : scratch + static_cast<std::size_t>(depth - 1) * count * size_of(type);
  reduce_to(acc, input(v), input(v + 1), count, type, op);  // child v + 1 is a leaf
  for (int mask = 2; mask < limit && v + mask < n; mask <<= 1) {
    const std::byte* part =
        reduce_in_tree_order(nullptr, x, root, v + mask, mask, count, type, op, scratch, depth + 1);
    reduce_to(acc, acc, part, count, type, op);
  }
  return acc;
}

}  // namespace

// One call through the area: its number, its deadline, and the waits.
class Group::NodeCall {
 public:
  static constexpr std::uint64_t kGenerations = NodeArea::kGenerations;

  NodeCall(Group& group, std::uint64_t signature)
      : g_(group), area_(*group.node_), signature_(signature), call_(++group.node_calls_) {
    if (g_.timeout_ > 0) deadline_ = util::deadline_after(g_.timeout_);
  }

  // Waits until every member is done with the call that last used the line or slot that `bytes`
  // of data for this call go to.
  Status room(std::size_t bytes) {
    const std::uint64_t reuse = bytes <= NodeArea::kInlineBytes ? kGenerations : NodeArea::kSlots;
    if (call_ <= reuse) return Status();
    for (int m = 0; m < g_.size(); ++m) {
      std::uint64_t& seen = g_.node_done_seen_[static_cast<std::size_t>(m)];
      if (seen + reuse >= call_) continue;
      const NodeArea::Control& c = area_.control(m);
      for (;;) {
        // The newest call m posted is in the generation before ours, if m posted it.
        const std::uint64_t last =
            area_.generation(m, call_ - 1).call.load(std::memory_order_acquire);
        if (last > 0) seen = std::max(seen, last - 1);
        seen = std::max(seen, c.done.load(std::memory_order_acquire));
        if (seen + reuse >= call_) break;
        if (Status s = wait(m); !s.is_ok()) return s;
      }
    }
    return Status();
  }

  // Our data for this call, then the word that announces it (which also says we are done with
  // the calls before).
  void post(const void* data, std::size_t bytes) {
    NodeArea::Generation& generation = area_.generation(g_.rank_, call_);
    if (bytes > 0) std::memcpy(area_.data(g_.rank_, call_, bytes), data, bytes);
    generation.signature.store(signature_, std::memory_order_relaxed);
    generation.call.store(call_, std::memory_order_release);
    posted_ = true;
  }

  // Waits for member m's data of this call and checks that m made the same call.
  Status await(int m, const std::byte** data) {
    const NodeArea::Generation& generation = area_.generation(m, call_);
    std::uint64_t posted = 0;
    while ((posted = generation.call.load(std::memory_order_acquire)) < call_) {
      if (Status s = wait(m); !s.is_ok()) return s;
    }
    // What room() will need, for free.
    auto& seen = g_.node_done_seen_[static_cast<std::size_t>(m)];
    seen = std::max(seen, posted - 1);
    const std::uint64_t theirs = generation.signature.load(std::memory_order_relaxed);
    if (Status s = check_signature(m, theirs); !s.is_ok()) return s;
    *data = area_.data(m, call_, theirs >> 40);
    return Status();
  }

  // room(), post() and, where `all`, await() of every member into `inputs` (ours too): the
  // reductions read everyone's data from the area.
  Status exchange(const void* data, std::size_t bytes, std::vector<const std::byte*>& inputs,
                  bool all = true) {
    Status s = room(bytes);
    if (s.is_ok()) post(data, bytes);
    for (int m = 0; all && m < g_.size() && s.is_ok(); ++m) {
      s = await(m, &inputs[static_cast<std::size_t>(m)]);
    }
    return s;
  }

  [[nodiscard]] Status check_signature(int m, std::uint64_t theirs) const {
    if (theirs == signature_) return Status();
    return Status(Code::kInvalidArgument,
                  what() + ": " + g_.peer_label(m) + " called " + describe(theirs) +
                      "; every member must make the same call (same counts, types, ops and "
                      "root)");
  }

  [[nodiscard]] std::uint64_t number() const { return call_; }

  // Our data's slot for this call (after post()).
  [[nodiscard]] std::byte* slot(std::size_t bytes) const {
    return area_.data(g_.rank_, call_, bytes);
  }

  // A split allreduce: our block of the result is in our slot; then wait for member m's.
  void announce_reduced() { set_stage(NodeArea::kReduced); }
  Status await_reduced(int m) { return await_stage(m, NodeArea::kReduced); }

  // Our progress within this call, and a wait for member m's (whose line for this call holds
  // nothing older: a stage of an earlier call is below every stage of this one).
  void set_stage(std::uint64_t stage) {
    area_.generation(g_.rank_, call_)
        .progress.store(NodeArea::progress(call_, stage), std::memory_order_release);
  }
  Status await_stage(int m, std::uint64_t stage) { return await_stage_of(m, call_, stage); }

  // The same in member m's line of this call or of an earlier one (less than kGenerations calls
  // ago, so the line still holds it).
  Status await_stage_of(int m, std::uint64_t call, std::uint64_t stage) {
    const NodeArea::Generation& generation = area_.generation(m, call);
    while (generation.progress.load(std::memory_order_acquire) < NodeArea::progress(call, stage)) {
      if (Status s = wait(m); !s.is_ok()) return s;
    }
    return Status();
  }

  // A streamed broadcast's reader: waits until the root has written `stage` pieces, or posted
  // (a root that made another call posts it, and the first wait then reports the mismatch).
  Status await_root_stage(int root, std::uint64_t stage, std::size_t bytes) {
    const NodeArea::Generation& generation = area_.generation(root, call_);
    while (generation.progress.load(std::memory_order_acquire) < NodeArea::progress(call_, stage) &&
           generation.call.load(std::memory_order_acquire) < call_) {
      if (Status s = wait(root); !s.is_ok()) return s;
    }
    if (stage > 1) return Status();
    if (Status s = check_signature(root, generation.signature.load(std::memory_order_relaxed));
        !s.is_ok()) {
      return s;
    }
    std::uint64_t theirs = 0;
    std::memcpy(&theirs, generation.data, sizeof(theirs));
    if (theirs == bytes) return Status();
    return Status(Code::kInvalidArgument, what() + ": " + g_.peer_label(root) + " broadcasts " +
                                              std::to_string(theirs) +
                                              " bytes; every member must make the same call");
  }

  // A streamed broadcast's root: the signature and the exact size, before the first piece.
  void announce_stream(std::size_t bytes) {
    NodeArea::Generation& generation = area_.generation(g_.rank_, call_);
    const std::uint64_t exact = bytes;
    std::memcpy(generation.data, &exact, sizeof(exact));
    generation.signature.store(signature_, std::memory_order_relaxed);
  }

  // Done with this call: or, on a failure, our mark that we use the area no more.
  Status finish(Status status) {
    NodeArea::Control& c = area_.control(g_.rank_);
    if (status.is_ok()) {
      if (!posted_) c.done.store(call_, std::memory_order_release);
      return status;
    }
    c.failed.store(1, std::memory_order_release);
    area_.left().store(1, std::memory_order_release);
    FERRY_LOG(kInfo, "collectives: the shared area is off for this communicator after: %s",
              status.message().c_str());
    g_.node_.reset();
    return status;
  }

 private:
  // One poll's wait for member m.
  Status wait(int m) {
    ++polls_;
    if ((polls_ & 7) != 0) return Status();  // the rest every 8 polls: the word is seen sooner
    if (area_.control(m).failed.load(std::memory_order_acquire) != 0) {
      return Status(Code::kPeerFailed,
                    what() + ": " + g_.peer_label(m) +
                        " failed a collective of this communicator and stopped using the area");
    }
    g_.engine_->spin_step(&idle_);
    if ((polls_ & 1023) != 0) return Status();
    if (const std::string* why = g_.engine_->peer_failure(g_.member(m))) {
      return Status(Code::kPeerFailed, what() + ": " + g_.peer_label(m) + " is gone: " + *why);
    }
    if (g_.timeout_ > 0 && util::Clock::now() >= deadline_) {
      return Status(Code::kTimeout, what() + ": not complete after FERRY_TIMEOUT (" +
                                        std::to_string(g_.timeout_) + " s), waiting for " +
                                        g_.peer_label(m));
    }
    return Status();
  }

  [[nodiscard]] std::string what() const {
    return describe(signature_) + " over " + std::to_string(g_.size()) +
           " members (through the node's shared area)";
  }

  Group& g_;
  NodeArea& area_;
  std::uint64_t signature_;
  std::uint64_t call_;
  std::chrono::steady_clock::time_point deadline_;
  int idle_ = 0;
  std::uint32_t polls_ = 0;
  bool posted_ = false;
};

bool Group::node_ready(const Plan& p, std::size_t bytes) {
  if (node_bytes_ == 0 || bytes > node_bytes_ || size() < 2 || !p.immediate() ||
      p.device() != Plan::kHost) {
    return false;
  }
  if (!node_decided_) {
    node_decided_ = true;
    const Status s = prepare_node();
    if (s.code() == Code::kUnsupported) {
      FERRY_LOG(kInfo, "collectives: no shared area for this communicator: %s",
                s.message().c_str());
    } else if (!s.is_ok()) {
      FERRY_LOG(kWarn, "collectives: no shared area for this communicator (messages instead): %s",
                s.message().c_str());
    }
    if (!s.is_ok()) node_.reset();
  }
  // The area set up just now may be the smaller one (prepare_node).
  return node_usable() && bytes <= node_bytes_;
}

bool Group::node_usable() {
  if (!node_) return false;
  // A member that failed a call through the area (and so left it) takes the others with it:
  // this call and the next go by messages on every member.
  if (node_->left().load(std::memory_order_acquire) == 0) return true;
  FERRY_LOG(kInfo, "collectives: a member left the shared area; messages from here on");
  node_.reset();
  return false;
}

bool Group::quick(Status* status, Kind kind, const void* send, void* recv, std::size_t count,
                  DataType type, ReduceOp op, int root) {
  if (!node_) return false;  // the first call sets the area up, through run()
  const std::size_t element = size_of(type);
  if (element == 0 || count > node_bytes_ / element) return false;
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
      if (bytes == 0 || bytes > node_bytes_ / n || send == nullptr || recv == nullptr ||
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
  if (!node_usable()) return false;
  next_tag();  // as run() would: every member numbers its collectives alike
  switch (kind) {
    case Kind::kBarrier:
      *status = node_barrier();
      break;
    case Kind::kBroadcast:
      *status = node_broadcast(recv, count, type, root);
      break;
    case Kind::kAllreduce:
      *status = node_allreduce(send, recv, count, type, op, allreduce_by_ring(bytes, count));
      break;
    case Kind::kAllgather:
      *status = node_allgather(send, recv, count, type);
      break;
    case Kind::kReduce:
      *status = node_reduce(send, recv, count, type, op, root, reduce_by_ring(bytes));
      break;
    case Kind::kReduceScatter:
      *status = node_reduce_scatter(send, recv, count, type, op);
      break;
  }
  return true;
}

// Member 0 creates the area and tells the others its name; they map it; all agree that every
// member did (else nobody uses it); then the name goes. Every step runs on every member, so their
// collectives stay in step whatever fails.
Status Group::prepare_node() {
  const int n = size();
  const std::vector<int> local = engine_->local_ranks();
  for (int m : members_) {
    if (std::find(local.begin(), local.end(), m) == local.end()) {
      return Status(Code::kUnsupported, "not every member is on this node");
    }
  }
  if (n > 64) return Status(Code::kUnsupported, "more than 64 members");
  struct Offer {
    char name[120];
    std::int64_t ok;
    std::uint64_t slot_bytes;  // what every member then takes through the area
  } offer{};
  Status status;
  std::unique_ptr<NodeArea> area;  // node_ only once every member has it
  if (rank_ == 0) {
    const std::string name =
        util::shm_name(engine_->job_id(), engine_->rank(), "coll" + std::to_string(id_));
    // Where /dev/shm has no room for the whole area (a container's is often 64 MiB), one with
    // slots of kSmallNodeBytes: small calls keep the area, larger ones take messages.
    for (const std::size_t slot : {node_bytes_, std::min(node_bytes_, kSmallNodeBytes)}) {
      try {
        if (engine_->config().get_bool(util::Var::kTestCollAreaFail)) {
          throw Error(Code::kNoResources, "collective area /dev/shm" + name +
                                              ": reserving its bytes failed (injected by "
                                              "FERRY_TEST_COLL_AREA_FAIL)");
        }
        area = NodeArea::create(name, n, slot);
        offer.ok = name.size() < sizeof(offer.name) ? 1 : 0;
        offer.slot_bytes = slot;
        std::memcpy(offer.name, name.data(), std::min(name.size(), sizeof(offer.name) - 1));
        if (slot < node_bytes_) {
          FERRY_LOG(kWarn,
                    "collectives: %s; a smaller area instead, taking calls of up to %zu bytes "
                    "per member (larger ones by messages)",
                    status.message().c_str(), slot);
        }
        status = Status();
        break;
      } catch (const Error& e) {
        status = Status(e.code(), e.what());
        if (e.code() != Code::kNoResources || slot <= kSmallNodeBytes) break;
      }
    }
  }
  Status told =
      run([&](Plan& p) { return broadcast(p, &offer, sizeof(offer), DataType::kUint8, 0); });
  if (!told.is_ok()) return told;
  if (rank_ != 0 && offer.ok != 1) {
    status = Status(Code::kUnsupported, "member 0 could not create the area");
  } else if (rank_ != 0) {
    try {
      area = NodeArea::attach(std::string(offer.name, strnlen(offer.name, sizeof(offer.name))), n,
                              offer.slot_bytes);
    } catch (const Error& e) {
      status = Status(e.code(), e.what());
    }
  }
  std::int64_t ok = area != nullptr ? 1 : 0;
  std::int64_t all_ok = 0;
  Status agreed =
      run([&](Plan& p) { return allreduce(p, &ok, &all_ok, 1, DataType::kInt64, ReduceOp::kMin); });
  if (area) area->unlink();
  if (!agreed.is_ok()) return agreed;
  if (!status.is_ok()) return status;
  if (all_ok == 0) return Status(Code::kUnsupported, "a member could not map the area");
  node_ = std::move(area);
  node_bytes_ = offer.slot_bytes;  // the same on every member
  node_done_seen_.assign(static_cast<std::size_t>(n), 0);
  node_inputs_.assign(static_cast<std::size_t>(n), nullptr);
  FERRY_LOG(kInfo, "collectives: shared area ready (%d members, up to %zu bytes each)", n,
            node_bytes_);
  return Status();
}

Status Group::node_barrier() {
  NodeCall call(*this, signature(Kind::kBarrier, 0, DataType::kUint8, ReduceOp::kSum, 0));
  Status s = call.room(0);
  if (s.is_ok()) call.post(nullptr, 0);
  const std::byte* slot = nullptr;
  for (int m = 0; m < size() && s.is_ok(); ++m) {
    if (m != rank_) s = call.await(m, &slot);
  }
  return call.finish(std::move(s));
}

Status Group::node_broadcast(void* buffer, std::size_t count, DataType type, int root) {
  const std::size_t bytes = count * size_of(type);
  NodeCall call(*this, signature(Kind::kBroadcast, bytes, type, ReduceOp::kSum, root));
  Status s;
  if (rank_ == root) {
    s = call.room(bytes);
    if (s.is_ok()) call.post(buffer, bytes);
  } else {
    const std::byte* slot = nullptr;
    s = call.await(root, &slot);
    if (s.is_ok()) std::memcpy(buffer, slot, bytes);
  }
  return call.finish(std::move(s));
}

// Larger than a slot: the root writes its data piece by piece into the area's ring of
// kStreamPieces pieces, each reader copies each piece out once it is there and counts it in its
// own line, and the root writes piece k only when every reader has copied piece k - kStreamPieces
// (so root and readers copy at once, and a piece moves through the cache twice, where a
// message's single copy by process_vm_readv goes through the kernel). Before the first piece,
// the root waits until every member is done with the last streamed broadcast, which used the
// same ring: its line of that call shows all its pieces written or copied out, or, 64 calls
// later, room() has already waited for more.
Status Group::node_stream_broadcast(void* buffer, std::size_t count, DataType type, int root) {
  const std::size_t bytes = count * size_of(type);
  // Eight pieces or more, so root and readers overlap, of 16 KiB up to the ring's piece.
  const std::size_t piece = std::clamp<std::size_t>(
      (bytes / NodeArea::kStreamPieces + 4095) / 4096 * 4096, 16 << 10, NodeArea::kStreamPiece);
  const std::uint64_t pieces = (bytes + piece - 1) / piece;
  NodeCall call(*this, signature(Kind::kBroadcast, bytes, type, ReduceOp::kSum, root));
  auto* data = static_cast<std::byte*>(buffer);
  const std::uint64_t last = node_stream_call_;
  const std::uint64_t last_pieces = node_stream_pieces_;
  node_stream_call_ = call.number();
  node_stream_pieces_ = pieces;
  Status s;
  if (rank_ == root) {
    s = call.room(0);
    if (last > 0 && call.number() - last < NodeArea::kGenerations) {
      for (int m = 0; m < size() && s.is_ok(); ++m) {
        if (m != rank_) s = call.await_stage_of(m, last, last_pieces);
      }
    }
    if (s.is_ok()) call.announce_stream(bytes);
    for (std::uint64_t k = 0; k < pieces && s.is_ok(); ++k) {
      if (k >= NodeArea::kStreamPieces) {
        for (int m = 0; m < size() && s.is_ok(); ++m) {
          if (m != rank_) s = call.await_stage(m, k - NodeArea::kStreamPieces + 1);
        }
        if (!s.is_ok()) break;
      }
      const std::size_t at = k * piece;
      std::memcpy(node_->stream_piece(k, piece), data + at, std::min(piece, bytes - at));
      call.set_stage(k + 1);
    }
    if (s.is_ok()) call.post(nullptr, 0);
    return call.finish(std::move(s));
  }
  for (std::uint64_t k = 0; k < pieces && s.is_ok(); ++k) {
    s = call.await_root_stage(root, k + 1, bytes);
    if (!s.is_ok()) break;
    const std::size_t at = k * piece;
    std::memcpy(data + at, node_->stream_piece(k, piece), std::min(piece, bytes - at));
    call.set_stage(k + 1);
  }
  return call.finish(std::move(s));
}

Status Group::node_allreduce(const void* send, void* recv, std::size_t count, DataType type,
                             ReduceOp op, bool ring_order) {
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  const int n = size();
  auto* out = static_cast<std::byte*>(recv);
  NodeCall call(*this, signature(Kind::kAllreduce, bytes, type, op, 0));
  Status s = call.exchange(send, bytes, node_inputs_);
  if (!s.is_ok()) return call.finish(std::move(s));
  const bool split = n >= 3 && bytes >= kNodeSplitBytes;
  // Every member reduces the whole call, or (split) only its block of the ring's blocks.
  const Blocks blocks(count, split || ring_order ? n : 1, element);
  std::size_t pow2 = 1;
  while (pow2 * 2 <= static_cast<std::size_t>(n)) pow2 *= 2;
  if (!ring_order && node_scratch_.size() < pow2 * blocks.bytes(0)) {
    node_scratch_.resize(pow2 * blocks.bytes(0));
  }
  auto reduce_block = [&](int b) {
    const std::size_t at = blocks.offset(b);
    if (blocks.elements(b) == 0) return;
    if (ring_order) {
      reduce_in_ring_order(out + at, node_inputs_, b, at, blocks.elements(b), type, op);
    } else {
      reduce_in_doubling_order(out + at, node_inputs_, at, blocks.elements(b), type, op,
                               node_scratch_.data());
    }
  };
  if (!split) {
    for (int b = 0; b < (ring_order ? n : 1); ++b) reduce_block(b);
    return call.finish(std::move(s));
  }
  // Split: each member reduces its block (what the others read of its data was only that
  // block's), writes it over its own data in its slot, and copies the others' blocks from
  // theirs. The bits are those of the whole reduction: the same operands in the same order.
  reduce_block(rank_);
  std::memcpy(call.slot(bytes) + blocks.offset(rank_), out + blocks.offset(rank_),
              blocks.bytes(rank_));
  call.announce_reduced();
  for (int k = 1; k < n && s.is_ok(); ++k) {
    const int m = (rank_ + k) % n;
    s = call.await_reduced(m);
    if (!s.is_ok()) break;
    std::memcpy(out + blocks.offset(m),
                node_inputs_[static_cast<std::size_t>(m)] + blocks.offset(m), blocks.bytes(m));
  }
  return call.finish(std::move(s));
}

Status Group::node_reduce(const void* send, void* recv, std::size_t count, DataType type,
                          ReduceOp op, int root, bool ring_order) {
  const int n = size();
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  NodeCall call(*this, signature(Kind::kReduce, bytes, type, op, root));
  // The others are done once their input is posted; the root reduces from the slots (so only
  // the root sees a member that made another call).
  Status s = call.exchange(send, bytes, node_inputs_, rank_ == root);
  if (rank_ != root || !s.is_ok()) return call.finish(std::move(s));
  auto* out = static_cast<std::byte*>(recv);
  if (ring_order) {
    // The ring reduce-scatter (shift n - 1), whose block b, started by member b + 1, goes to
    // the root.
    const Blocks blocks(count, n, element);
    for (int b = 0; b < n; ++b) {
      if (blocks.elements(b) == 0) continue;
      reduce_in_ring_order(out + blocks.offset(b), node_inputs_, (b + 1) % n, blocks.offset(b),
                           blocks.elements(b), type, op);
    }
  } else {
    int depth = 0;
    while ((1 << depth) < n) ++depth;
    if (node_scratch_.size() < static_cast<std::size_t>(depth) * bytes) {
      node_scratch_.resize(static_cast<std::size_t>(depth) * bytes);
    }
    reduce_in_tree_order(out, node_inputs_, root, 0, n, count, type, op, node_scratch_.data(), 0);
  }
  return call.finish(std::move(s));
}

Status Group::node_reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                                  ReduceOp op) {
  const int n = size();
  const std::size_t block = count * size_of(type);
  const std::size_t bytes = block * static_cast<std::size_t>(n);
  NodeCall call(*this, signature(Kind::kReduceScatter, bytes, type, op, 0));
  Status s = call.exchange(send, bytes, node_inputs_);
  if (!s.is_ok()) return call.finish(std::move(s));
  // The ring (shift n - 1) leaves block r at member r, started by member r + 1 and passed on
  // through r + 2, ...: the same operands in the same order.
  reduce_in_ring_order(static_cast<std::byte*>(recv), node_inputs_, (rank_ + 1) % n,
                       static_cast<std::size_t>(rank_) * block, count, type, op);
  return call.finish(std::move(s));
}

Status Group::node_allgather(const void* send, void* recv, std::size_t count, DataType type) {
  const std::size_t bytes = count * size_of(type);
  auto* out = static_cast<std::byte*>(recv);
  NodeCall call(*this, signature(Kind::kAllgather, bytes, type, ReduceOp::kSum, 0));
  Status s = call.room(bytes);
  if (s.is_ok()) call.post(send, bytes);
  for (int m = 0; m < size() && s.is_ok(); ++m) {
    const std::byte* from = static_cast<const std::byte*>(send);
    if (m != rank_) s = call.await(m, &from);
    if (s.is_ok()) std::memmove(out + static_cast<std::size_t>(m) * bytes, from, bytes);
  }
  return call.finish(std::move(s));
}

}  // namespace ferry::coll
