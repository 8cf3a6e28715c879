// Small blocking collectives through the node's shared area (node_area.hpp has its rules): a
// member copies its data into its slot and raises a word; the others wait for the word and read
// the slot, with no message, no matching and no progress from the writer. Taken where every
// member shares this node, the buffers are host memory, the call is blocking and no algorithm is
// forced; the non-blocking forms keep their messages.
//
// Waiting: every eighth poll of a word also makes progress (other traffic goes on, a dead member
// is noticed), yields after FERRY_SPIN_COUNT empty polls and naps after a while
// (Waiting::spin_step); every poll steps where waits yield at once (more ranks than CPUs: the
// polls between only delayed the writer sharing our CPU; node_call.hpp, step_mask_). Every 1024
// polls it checks the member waited for and FERRY_TIMEOUT. A member that fails a call
// marks its control line failed and raises the area's `left` word; every member looks at that
// word before each call and stops using the area when it is up: the next collectives go by
// messages on every member.
#include "coll/node_collectives.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "coll/group.hpp"
#include "coll/node_call.hpp"
#include "coll/node_orders.hpp"
#include "coll/reduce.hpp"
#include "proto/engine.hpp"
#include "util/clock.hpp"
#include "util/cma.hpp"
#include "util/log.hpp"
#include "util/node.hpp"

namespace ferry::coll {

bool NodeCollectives::ready(const Plan& p, std::size_t bytes) {
  if (bytes_ == 0 || bytes > bytes_ || g_.size() < 2 || !p.immediate() ||
      p.device() != Plan::kHost) {
    return false;
  }
  if (!decided_) {
    decided_ = true;
    const Status s = prepare();
    if (s.code() == Code::kUnsupported) {
      FERRY_LOG(kInfo, "collectives: no shared area for this communicator: %s",
                s.message().c_str());
    } else if (!s.is_ok()) {
      FERRY_LOG(kWarn, "collectives: no shared area for this communicator (messages instead): %s",
                s.message().c_str());
    }
    if (!s.is_ok()) area_.reset();
  }
  // The area set up just now may be the smaller one (prepare).
  return usable() && bytes <= bytes_;
}

bool NodeCollectives::usable() {
  if (!area_) return false;
  // A member that failed a call through the area (and so left it) takes the others with it:
  // this call and the next go by messages on every member.
  if (area_->left().load(std::memory_order_acquire) == 0) return true;
  FERRY_LOG(kInfo, "collectives: a member left the shared area; messages from here on");
  area_.reset();
  return false;
}

// Member 0 creates the area and tells the others its name; they map it; all agree that every
// member did (else nobody uses it); then the name goes. Every step runs on every member, so their
// collectives stay in step whatever fails.
Status NodeCollectives::prepare() {
  const int n = g_.size();
  const std::vector<int> local = g_.engine()->job().local_ranks();
  for (int m : g_.members()) {
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
  std::unique_ptr<NodeArea> area;  // area_ only once every member has it
  if (g_.rank() == 0) {
    const std::string name = util::shm_name(g_.engine()->job().job_id(), g_.engine()->rank(),
                                            "coll" + std::to_string(g_.id()));
    // Where /dev/shm has no room for the whole area (a container's is often 64 MiB), one with
    // slots of kSmallBytes: small calls keep the area, larger ones take messages.
    for (const std::size_t slot : {bytes_, std::min(bytes_, kSmallBytes)}) {
      try {
        if (g_.engine()->config().get_bool(util::Var::kTestCollAreaFail)) {
          throw Error(Code::kNoResources, "collective area /dev/shm" + name +
                                              ": reserving its bytes failed (injected by "
                                              "FERRY_TEST_COLL_AREA_FAIL)");
        }
        area = NodeArea::create(name, n, slot);
        offer.ok = name.size() < sizeof(offer.name) ? 1 : 0;
        offer.slot_bytes = slot;
        std::memcpy(offer.name, name.data(), std::min(name.size(), sizeof(offer.name) - 1));
        if (slot < bytes_) {
          FERRY_LOG(kWarn,
                    "collectives: %s; a smaller area instead, taking calls of up to %zu bytes "
                    "per member (larger ones by messages)",
                    status.message().c_str(), slot);
        }
        status = Status();
        break;
      } catch (const Error& e) {
        status = Status(e.code(), e.what());
        if (e.code() != Code::kNoResources || slot <= kSmallBytes) break;
      }
    }
  }
  Status told =
      g_.run([&](Plan& p) { return g_.broadcast(p, &offer, sizeof(offer), DataType::kUint8, 0); });
  if (!told.is_ok()) return told;
  if (g_.rank() != 0 && offer.ok != 1) {
    status = Status(Code::kUnsupported, "member 0 could not create the area");
  } else if (g_.rank() != 0) {
    try {
      area = NodeArea::attach(std::string(offer.name, strnlen(offer.name, sizeof(offer.name))), n,
                              offer.slot_bytes);
    } catch (const Error& e) {
      status = Status(e.code(), e.what());
    }
  }
  if (area) area->control(g_.rank()).pid.store(::getpid(), std::memory_order_relaxed);
  std::int64_t ok = area != nullptr ? 1 : 0;
  std::int64_t all_ok = 0;
  Status agreed = g_.run(
      [&](Plan& p) { return g_.allreduce(p, &ok, &all_ok, 1, DataType::kInt64, ReduceOp::kMin); });
  if (area) area->unlink();
  if (!agreed.is_ok()) return agreed;
  if (!status.is_ok()) return status;
  if (all_ok == 0) return Status(Code::kUnsupported, "a member could not map the area");
  area_ = std::move(area);
  bytes_ = offer.slot_bytes;  // the same on every member
  done_seen_.assign(static_cast<std::size_t>(n), 0);
  inputs_.assign(static_cast<std::size_t>(n), nullptr);
  cma_ = g_.engine()->config().get_bool(util::Var::kShmCma);
  FERRY_LOG(kInfo, "collectives: shared area ready (%d members, up to %zu bytes each)", n, bytes_);
  return Status();
}

Status NodeCollectives::barrier() {
  Call call(*this, node_call::signature(Kind::kBarrier, 0, DataType::kUint8, ReduceOp::kSum, 0));
  Status s = call.room(0);
  if (s.is_ok()) call.post(nullptr, 0);
  const std::byte* slot = nullptr;
  for (int m = 0; m < g_.size() && s.is_ok(); ++m) {
    if (m != g_.rank()) s = call.await(m, &slot);
  }
  return call.finish(std::move(s));
}

Status NodeCollectives::broadcast(void* buffer, std::size_t count, DataType type, int root) {
  const std::size_t bytes = count * size_of(type);
  Call call(*this, node_call::signature(Kind::kBroadcast, bytes, type, ReduceOp::kSum, root));
  if (bytes >= cma_bytes()) return call.finish(pass_by_address(call, buffer, buffer, bytes, root));
  Status s;
  if (g_.rank() == root) {
    s = call.room(bytes);
    if (s.is_ok()) call.post(buffer, bytes);
  } else {
    const std::byte* slot = nullptr;
    s = call.await(root, &slot);
    if (s.is_ok()) std::memcpy(buffer, slot, bytes);
  }
  return call.finish(std::move(s));
}

// The root's inline data says where its buffer is (0: in its slot, as a smaller broadcast's).
// Every member posts the call (readers with no data), and each reader's stage in this call: kRead
// once it has read the buffer by CMA, kRefused where it could not (it then waits for the root's
// stage kCopied, the data in the root's slot), kCopied once it has copied it from there.
namespace {
constexpr std::uint64_t kRead = 1;
constexpr std::uint64_t kRefused = 2;
constexpr std::uint64_t kCopied = 3;
}  // namespace

Status NodeCollectives::pass_by_address(Call& call, const void* from, void* into, std::size_t bytes,
                                        int root) {
  NodeArea::Generation& line = area_->generation(root, call.number());
  if (g_.rank() == root) {
    Status s = call.room(bytes);
    if (!s.is_ok()) return s;
    const std::uint64_t address = cma_ ? reinterpret_cast<std::uintptr_t>(from) : 0;
    std::memcpy(line.data, &address, sizeof(address));
    if (address == 0) {
      call.post(from, bytes);
      return Status();
    }
    call.post(nullptr, 0);
    bool refused = false;
    for (int m = 0; m < g_.size() && s.is_ok(); ++m) {
      if (m == root) continue;
      s = call.await_stage_of_poster(m, kRead);
      refused = refused || call.stage(m) == kRefused;
    }
    if (!s.is_ok() || !refused) return s;
    cma_ = false;  // copies from now on, as the member that could not read asks
    std::memcpy(call.slot(bytes), from, bytes);
    call.set_stage(kCopied);
    for (int m = 0; m < g_.size() && s.is_ok(); ++m) {
      if (m != root && call.stage(m) == kRefused) s = call.await_stage_of_poster(m, kCopied);
    }
    return s;
  }
  // Readers post the call too (no data), so that a member that made another call sees it.
  if (Status s = call.room(0); !s.is_ok()) return s;
  call.post(nullptr, 0);
  const std::byte* slot = nullptr;
  if (Status s = call.await(root, &slot); !s.is_ok()) return s;
  std::uint64_t address = 0;
  std::memcpy(&address, line.data, sizeof(address));
  if (address == 0) {
    std::memcpy(into, slot, bytes);
    return Status();
  }
  const Status read = read_by_address(root, into, address, bytes);
  if (read.is_ok()) {
    call.set_stage(kRead);
    return Status();
  }
  if (read.code() == Code::kPeerFailed) return read;
  call.set_stage(kRefused);
  if (Status s = call.await_stage(root, kCopied); !s.is_ok()) return s;
  std::memcpy(into, slot, bytes);
  call.set_stage(kCopied);
  return Status();
}

Status NodeCollectives::read_by_address(int owner, void* into, std::uint64_t address,
                                        std::size_t bytes) {
  if (!cma_) return Status(Code::kUnsupported, "CMA refused before");
  const auto pid = static_cast<int>(area_->control(owner).pid.load(std::memory_order_relaxed));
  Status read = util::cma_read(pid, into, address, bytes);
  if (read.code() == Code::kUnsupported) {
    cma_ = false;
    FERRY_LOG(kInfo, "collectives: data through the area by copies from now on: %s",
              read.message().c_str());
  }
  return read;
}

// Larger than a slot: the root writes its data piece by piece into the area's ring of
// kStreamPieces pieces, each reader copies each piece out once it is there and counts it in its
// own line, and the root writes piece k only when every reader has copied piece k - kStreamPieces
// (so root and readers copy at once, and a piece moves through the cache twice, where a
// message's single copy by process_vm_readv goes through the kernel). Before the first piece,
// the root waits until every member is done with the last streamed broadcast, which used the
// same ring: its line of that call shows all its pieces written or copied out, or, 64 calls
// later, room() has already waited for more.
Status NodeCollectives::stream_broadcast(void* buffer, std::size_t count, DataType type, int root) {
  const std::size_t bytes = count * size_of(type);
  // Eight pieces or more, so root and readers overlap, of 16 KiB up to the ring's piece.
  const std::size_t piece = std::clamp<std::size_t>(
      (bytes / NodeArea::kStreamPieces + 4095) / 4096 * 4096, 16 << 10, NodeArea::kStreamPiece);
  const std::uint64_t pieces = (bytes + piece - 1) / piece;
  Call call(*this, node_call::signature(Kind::kBroadcast, bytes, type, ReduceOp::kSum, root));
  auto* data = static_cast<std::byte*>(buffer);
  const std::uint64_t last = stream_call_;
  const std::uint64_t last_pieces = stream_pieces_;
  stream_call_ = call.number();
  stream_pieces_ = pieces;
  Status s;
  if (g_.rank() == root) {
    s = call.room(0);
    if (last > 0 && call.number() - last < NodeArea::kGenerations) {
      for (int m = 0; m < g_.size() && s.is_ok(); ++m) {
        if (m != g_.rank()) s = call.await_stage_of(m, last, last_pieces);
      }
    }
    if (s.is_ok()) call.announce_stream(bytes);
    for (std::uint64_t k = 0; k < pieces && s.is_ok(); ++k) {
      if (k >= NodeArea::kStreamPieces) {
        for (int m = 0; m < g_.size() && s.is_ok(); ++m) {
          if (m != g_.rank()) s = call.await_stage(m, k - NodeArea::kStreamPieces + 1);
        }
        if (!s.is_ok()) break;
      }
      const std::size_t at = k * piece;
      std::memcpy(area_->stream_piece(k, piece), data + at, std::min(piece, bytes - at));
      call.set_stage(k + 1);
    }
    if (s.is_ok()) call.post(nullptr, 0);
    return call.finish(std::move(s));
  }
  for (std::uint64_t k = 0; k < pieces && s.is_ok(); ++k) {
    s = call.await_root_stage(root, k + 1, bytes);
    if (!s.is_ok()) break;
    const std::size_t at = k * piece;
    std::memcpy(data + at, area_->stream_piece(k, piece), std::min(piece, bytes - at));
    call.set_stage(k + 1);
  }
  return call.finish(std::move(s));
}

Status NodeCollectives::allreduce(const void* send, void* recv, std::size_t count, DataType type,
                                  ReduceOp op, bool ring_order) {
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  const int n = g_.size();
  auto* out = static_cast<std::byte*>(recv);
  Call call(*this, node_call::signature(Kind::kAllreduce, bytes, type, op, 0));
  Status s = call.exchange(send, bytes, inputs_);
  if (!s.is_ok()) return call.finish(std::move(s));
  const bool split = n >= 3 && bytes >= kSplitBytes;
  // Every member reduces the whole call, or (split) only its block of the ring's blocks.
  const Blocks blocks(count, split || ring_order ? n : 1, element);
  std::size_t pow2 = 1;
  while (pow2 * 2 <= static_cast<std::size_t>(n)) pow2 *= 2;
  if (!ring_order && scratch_.size() < pow2 * blocks.bytes(0)) {
    scratch_.resize(pow2 * blocks.bytes(0));
  }
  auto reduce_block = [&](int b) {
    const std::size_t at = blocks.offset(b);
    if (blocks.elements(b) == 0) return;
    if (ring_order) {
      reduce_in_ring_order(out + at, inputs_, b, at, blocks.elements(b), type, op);
    } else {
      reduce_in_doubling_order(out + at, inputs_, at, blocks.elements(b), type, op,
                               scratch_.data());
    }
  };
  if (!split) {
    for (int b = 0; b < (ring_order ? n : 1); ++b) reduce_block(b);
    return call.finish(std::move(s));
  }
  // Split: each member reduces its block (what the others read of its data was only that
  // block's), writes it over its own data in its slot, and copies the others' blocks from
  // theirs. The bits are those of the whole reduction: the same operands in the same order.
  reduce_block(g_.rank());
  std::memcpy(call.slot(bytes) + blocks.offset(g_.rank()), out + blocks.offset(g_.rank()),
              blocks.bytes(g_.rank()));
  call.announce_reduced();
  for (int k = 1; k < n && s.is_ok(); ++k) {
    const int m = (g_.rank() + k) % n;
    s = call.await_reduced(m);
    if (!s.is_ok()) break;
    std::memcpy(out + blocks.offset(m), inputs_[static_cast<std::size_t>(m)] + blocks.offset(m),
                blocks.bytes(m));
  }
  return call.finish(std::move(s));
}

Status NodeCollectives::reduce(const void* send, void* recv, std::size_t count, DataType type,
                               ReduceOp op, int root, bool ring_order) {
  const int n = g_.size();
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  Call call(*this, node_call::signature(Kind::kReduce, bytes, type, op, root));
  if (n == 2 && bytes >= cma_bytes() && bytes < kCmaReduceEnd) {
    // The root reads the other's input (any order of the two operands gives the same bits).
    if (scratch_.size() < bytes) scratch_.resize(bytes);
    Status s = pass_by_address(call, send, scratch_.data(), bytes, 1 - root);
    if (s.is_ok() && g_.rank() == root) reduce_to(recv, send, scratch_.data(), count, type, op);
    return call.finish(std::move(s));
  }
  if (bytes >= kPiecedBytes) {
    return reduce_in_pieces(call, send, recv, count, type, op, root, ring_order);
  }
  // The others are done once their input is posted; the root reduces from the slots (so only
  // the root sees a member that made another call).
  Status s = call.exchange(send, bytes, inputs_, g_.rank() == root);
  if (g_.rank() != root || !s.is_ok()) return call.finish(std::move(s));
  auto* out = static_cast<std::byte*>(recv);
  if (ring_order) {
    // The ring reduce-scatter (shift n - 1), whose block b, started by member b + 1, goes to
    // the root.
    const Blocks blocks(count, n, element);
    for (int b = 0; b < n; ++b) {
      if (blocks.elements(b) == 0) continue;
      reduce_in_ring_order(out + blocks.offset(b), inputs_, (b + 1) % n, blocks.offset(b),
                           blocks.elements(b), type, op);
    }
  } else {
    int depth = 0;
    while ((1 << depth) < n) ++depth;
    if (scratch_.size() < static_cast<std::size_t>(depth) * bytes) {
      scratch_.resize(static_cast<std::size_t>(depth) * bytes);
    }
    reduce_in_tree_order(out, inputs_, root, 0, n, count, type, op, scratch_.data(), 0);
  }
  return call.finish(std::move(s));
}

// The others post their input in pieces and are done; the root reduces each piece once every
// member's is there, reading its own input in place (a copy of the piece where the result goes
// over it), in the same order as reduce() (a block of the ring's at a time, clipped to the
// piece, or the tree over the piece, whose partial results then stay in the cache).
Status NodeCollectives::reduce_in_pieces(Call& call, const void* send, void* recv,
                                         std::size_t count, DataType type, ReduceOp op, int root,
                                         bool ring_order) {
  const int n = g_.size();
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  const Pieces pieces = NodeCollectives::pieces(bytes, element);
  Status s;
  if (g_.rank() != root) {
    s = call.room(bytes);
    if (!s.is_ok()) return call.finish(std::move(s));
    call.begin_pieces();
    for (std::uint64_t k = 0; k < pieces.count; ++k) {
      call.post_piece(send, bytes, pieces.at(k), pieces.length(k, bytes), k);
    }
    call.post(nullptr, 0);
    return call.finish(std::move(s));
  }
  const auto* mine = static_cast<const std::byte*>(send);
  auto* out = static_cast<std::byte*>(recv);
  const bool overlap = mine < out + bytes && out < mine + bytes;
  if (overlap && own_.size() < pieces.size) own_.resize(pieces.size);
  int depth = 0;
  while ((1 << depth) < n) ++depth;
  if (!ring_order && scratch_.size() < static_cast<std::size_t>(depth) * pieces.size) {
    scratch_.resize(static_cast<std::size_t>(depth) * pieces.size);
  }
  pieces_.resize(static_cast<std::size_t>(n));
  const Blocks blocks(count, n, element);
  for (std::uint64_t k = 0; k < pieces.count && s.is_ok(); ++k) {
    const std::size_t at = pieces.at(k);
    const std::size_t length = pieces.length(k, bytes);
    for (int m = 0; m < n && s.is_ok(); ++m) {
      if (m == root) continue;
      const std::byte* slot = nullptr;
      s = call.await_piece(m, k, bytes, &slot);
      pieces_[static_cast<std::size_t>(m)] = slot + at;
    }
    if (!s.is_ok()) break;
    if (overlap) std::memcpy(own_.data(), mine + at, length);
    pieces_[static_cast<std::size_t>(root)] = overlap ? own_.data() : mine + at;
    const std::size_t first = at / element;
    const std::size_t elements = length / element;
    if (!ring_order) {
      reduce_in_tree_order(out + at, pieces_, root, 0, n, elements, type, op, scratch_.data(), 0);
      continue;
    }
    for (int b = 0; b < n; ++b) {  // block b of the ring, started by member b + 1
      const std::size_t begin = blocks.offset(b) / element;
      const std::size_t lo = std::max(begin, first);
      const std::size_t hi = std::min(begin + blocks.elements(b), first + elements);
      if (lo >= hi) continue;
      reduce_in_ring_order(out + lo * element, pieces_, (b + 1) % n, (lo - first) * element,
                           hi - lo, type, op);
    }
  }
  return call.finish(std::move(s));
}

Status NodeCollectives::reduce_scatter(const void* send, void* recv, std::size_t count,
                                       DataType type, ReduceOp op) {
  const int n = g_.size();
  const std::size_t block = count * size_of(type);
  const std::size_t bytes = block * static_cast<std::size_t>(n);
  Call call(*this, node_call::signature(Kind::kReduceScatter, bytes, type, op, 0));
  Status s = call.exchange(send, bytes, inputs_);
  if (!s.is_ok()) return call.finish(std::move(s));
  // The ring (shift n - 1) leaves block r at member r, started by member r + 1 and passed on
  // through r + 2, ...: the same operands in the same order.
  reduce_in_ring_order(static_cast<std::byte*>(recv), inputs_, (g_.rank() + 1) % n,
                       static_cast<std::size_t>(g_.rank()) * block, count, type, op);
  return call.finish(std::move(s));
}

Status NodeCollectives::allgather(const void* send, void* recv, std::size_t count, DataType type) {
  const std::size_t bytes = count * size_of(type);
  auto* out = static_cast<std::byte*>(recv);
  Call call(*this, node_call::signature(Kind::kAllgather, bytes, type, ReduceOp::kSum, 0));
  if (g_.size() == 2 && bytes >= cma_bytes()) {
    return call.finish(allgather_by_address(call, send, out, bytes));
  }
  Status s = call.room(bytes);
  if (s.is_ok()) call.post(send, bytes);
  for (int m = 0; m < g_.size() && s.is_ok(); ++m) {
    const std::byte* from = static_cast<const std::byte*>(send);
    if (m != g_.rank()) s = call.await(m, &from);
    if (s.is_ok()) std::memmove(out + static_cast<std::size_t>(m) * bytes, from, bytes);
  }
  return call.finish(std::move(s));
}

// Two members, each the other's root of pass_by_address at once. A member's stage in this
// call is a sum: 1 once it has the other's block, or 2 where it could not read it (then 4 more
// once it has it from the other's slot); 2 more once its own block is in its slot for the other.
// So the stage is even where the member could not read, and at least 3 once a member that the
// other could not read has copied for it (one that could not read, and was read, never copies).
Status NodeCollectives::allgather_by_address(Call& call, const void* send, std::byte* out,
                                             std::size_t bytes) {
  constexpr std::uint64_t kHave = 1;
  constexpr std::uint64_t kCouldNot = 2;
  constexpr std::uint64_t kInSlot = 2;
  constexpr std::uint64_t kHaveFromSlot = 4;
  const int other = 1 - g_.rank();
  Status s = call.room(bytes);
  if (!s.is_ok()) return s;
  const std::uint64_t address = cma_ ? reinterpret_cast<std::uintptr_t>(send) : 0;
  std::memcpy(area_->generation(g_.rank(), call.number()).data, &address, sizeof(address));
  call.post(address == 0 ? send : nullptr, address == 0 ? bytes : 0);
  const std::byte* slot = nullptr;
  if (s = call.await(other, &slot); !s.is_ok()) return s;
  std::uint64_t theirs = 0;
  std::memcpy(&theirs, area_->generation(other, call.number()).data, sizeof(theirs));
  std::byte* into = out + static_cast<std::size_t>(other) * bytes;
  Status read;
  if (theirs == 0) {
    std::memcpy(into, slot, bytes);
  } else {
    read = read_by_address(other, into, theirs, bytes);
    if (read.code() == Code::kPeerFailed) return read;
  }
  std::memmove(out + static_cast<std::size_t>(g_.rank()) * bytes, send, bytes);
  std::uint64_t mine = read.is_ok() ? kHave : kCouldNot;
  call.set_stage(mine);
  if (address != 0) {
    // Until the other has our block, or says it could not read it: then it is copied for it.
    if (s = call.await_stage(other, kHave); !s.is_ok()) return s;
    if (call.stage(other) % 2 == 0) {
      cma_ = false;
      std::memcpy(call.slot(bytes), send, bytes);
      mine += kInSlot;
      call.set_stage(mine);
    }
  }
  if (read.is_ok()) return Status();
  if (s = call.await_stage(other, kHave + kInSlot); !s.is_ok()) return s;
  std::memcpy(into, slot, bytes);
  call.set_stage(mine + kHaveFromSlot);
  return Status();
}

}  // namespace ferry::coll
