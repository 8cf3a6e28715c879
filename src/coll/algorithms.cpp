// The collective algorithms: each builds the schedule of one collective for this member.
//   small (latency):  dissemination barrier, binomial broadcast and reduce, recursive doubling
//                     allreduce (any member count: the extra members fold in first), Bruck
//                     allgather
//   large (bandwidth): ring reduce-scatter + ring allgather, pipelined chain broadcast,
//                     ring reduce-scatter + gather for reduce
// Every member reduces in an order fixed by the member count, the sizes and the algorithm, so the
// results are the same bits on every member and from run to run.
#include <algorithm>
#include <cstdint>
#include <functional>

#include "coll/group.hpp"
#include "coll/reduce.hpp"
#include "coll/schedule.hpp"
#include "proto/engine.hpp"
#include "util/extent.hpp"

namespace ferry::coll {
namespace {

int mod(int a, int n) { return ((a % n) + n) % n; }

// Ring reduce-scatter over n - 1 steps: member r ends with block (r + shift + 1) mod n reduced
// over all members, written by the last step to out(n - 2, block). out(t, block) is where step
// t writes its partial result; step t + 1 sends it on. Each step moves its blocks in pieces of
// `piece` bytes or less, a round each, so a received piece is reduced while it is in the cache
// (pieces change no operand's order: the bits are the same for any piece size).
void ring_reduce_scatter(Plan& s, int rank, int n, const Blocks& blocks, const std::byte* in,
                         int shift, const std::function<std::byte*(int, int)>& out,
                         std::size_t piece) {
  const std::size_t piece_elements = std::max<std::size_t>(1, piece / blocks.element);
  const std::size_t piece_bytes = piece_elements * blocks.element;
  std::byte* tmp = s.scratch(std::min(blocks.bytes(0), piece_bytes));
  const int next = mod(rank + 1, n);
  const int prev = mod(rank - 1, n);
  auto pieces = [&](int b) {
    const std::size_t elements = blocks.elements(b);
    return elements == 0 ? 0 : 1 + (elements - 1) / piece_elements;
  };
  // The elements of block b's piece k, or SIZE_MAX where it has none (piece 0 always goes,
  // empty or not, so an empty block still takes its step's round).
  auto piece_of = [&](int b, std::size_t k) {
    const std::size_t elements = blocks.elements(b);
    const std::size_t first = k * piece_elements;
    if (first >= elements && k != 0) return SIZE_MAX;
    return std::min(piece_elements, elements - std::min(first, elements));
  };
  for (int t = 0; t + 1 < n; ++t) {
    const int send_block = mod(rank + shift - t, n);
    const int recv_block = mod(rank + shift - t - 1, n);
    const std::byte* from = t == 0 ? in + blocks.offset(send_block) : out(t - 1, send_block);
    std::byte* to = out(t, recv_block);
    const std::byte* own = in + blocks.offset(recv_block);
    const std::size_t rounds =
        std::max<std::size_t>(1, std::max(pieces(send_block), pieces(recv_block)));
    for (std::size_t k = 0; k < rounds; ++k) {
      const std::size_t at = k * piece_elements * blocks.element;
      if (const std::size_t elements = piece_of(recv_block, k); elements != SIZE_MAX) {
        s.recv(prev, tmp, elements * blocks.element);
        s.reduce(to + at, tmp, own + at, elements);
      }
      if (const std::size_t elements = piece_of(send_block, k); elements != SIZE_MAX) {
        s.send(next, from + at, elements * blocks.element);
      }
      s.next_round();
    }
  }
}

// Ring allgather over n - 1 rounds: member r starts with block (r + shift) mod n at own (which
// is copied to where(block) unless it is there), and ends with every block at where(b).
void ring_allgather(Plan& s, int rank, int n, const std::byte* own, int shift,
                    const std::function<std::byte*(int)>& where,
                    const std::function<std::size_t(int)>& bytes) {
  const int next = mod(rank + 1, n);
  const int prev = mod(rank - 1, n);
  const int mine = mod(rank + shift, n);
  for (int t = 0; t + 1 < n; ++t) {
    const int send_block = mod(rank + shift - t, n);
    const int recv_block = mod(rank + shift - t - 1, n);
    s.recv(prev, where(recv_block), bytes(recv_block));
    s.send(next, t == 0 ? own : where(send_block), bytes(send_block));
    if (t == 0) s.copy(where(mine), own, bytes(mine));
    s.next_round();
  }
  if (n == 1) s.copy(where(mine), own, bytes(mine));
}

}  // namespace

Status Group::barrier(Plan& p) {
  p.describe({"barrier", 0, DataType::kUint8});
  if (nodes_->ready(p, 0)) return nodes_->barrier();
  const int n = size();
  for (int k = 1; k < n; k <<= 1) {
    p.send(mod(rank_ + k, n), nullptr, 0);
    p.recv(mod(rank_ - k, n), nullptr, 0);
    p.next_round();
  }
  return Status();
}

Status Group::broadcast(Plan& p, void* buffer, std::size_t count, DataType type, int root) {
  p.describe({"broadcast", count, type});
  if (Status bad = check(p, "broadcast", {buffer}, count, type, root); !bad.is_ok()) return bad;
  const int n = size();
  const std::size_t bytes = count * size_of(type);
  auto* data = static_cast<std::byte*>(buffer);
  const int vr = mod(rank_ - root, n);  // rank relative to the root
  auto real = [&](int v) { return mod(v + root, n); };
  // A chain of one piece is n - 1 hops where the tree takes log2 n: the chain needs pieces.
  const bool chain = broadcast_by_chain(bytes);
  if (n == 1 || bytes == 0) {
    // nothing moves
  } else if (p.device() != Plan::kHost && broadcast_ == 0 &&
             oneshot_->mesh_ready(
                 p.device(), cuda::Cuda::OneShot::Kind::kBroadcast,
                 std::min(bytes, oneshot_->round_bytes(cuda::Cuda::OneShot::Kind::kBroadcast)))) {
    // Device buffers of three or more members on a node: one kernel per GPU (kernels/mesh.cuh),
    // in rounds past what one takes.
    const std::size_t round =
        oneshot_->round_bytes(cuda::Cuda::OneShot::Kind::kBroadcast) / size_of(type);
    for (std::size_t at = 0; at < count; at += round) {
      p.oneshot(data + at * size_of(type), data + at * size_of(type), std::min(round, count - at),
                oneshot_->next(), Plan::OneShot::kBroadcast, root);
    }
  } else if (!chain && broadcast_ == 0 && nodes_->ready(p, bytes)) {
    return nodes_->broadcast(buffer, count, type, root);
  } else if (broadcast_by_stream(bytes) && nodes_->ready(p, 0)) {
    return nodes_->stream_broadcast(buffer, count, type, root);
  } else if (chain) {
    // The root's data flows down the chain vr 0 -> 1 -> ... in pieces: in round t member vr
    // receives piece t - vr + 1 and passes on piece t - vr. Pieces of FERRY_COLL_CHUNK, or an
    // eighth of the message up to 4 MiB where that is larger: each piece costs a handshake, and
    // eight keep the chain's fill and drain to a few pieces' time (4 ranks, 16 MiB, host, this
    // VM: 512 KiB pieces 1.8-2.2 GB/s, 2 MiB 2.3-3.3).
    const std::size_t piece = std::max(chunk_, std::min(bytes / 8, std::size_t{4} << 20));
    const auto pieces = static_cast<long>((bytes + piece - 1) / piece);
    for (long t = 0; t + 1 < pieces + n; ++t) {
      const long in = t - vr + 1;
      const long out = t - vr;
      if (vr > 0 && in >= 0 && in < pieces) {
        const auto at = static_cast<std::size_t>(in) * piece;
        p.recv(real(vr - 1), data + at, std::min(piece, bytes - at));
      }
      if (vr + 1 < n && out >= 0 && out < pieces) {
        const auto at = static_cast<std::size_t>(out) * piece;
        p.send(real(vr + 1), data + at, std::min(piece, bytes - at));
      }
      p.next_round();
    }
  } else {
    // Binomial tree: receive from the parent, then send to the children, farthest first.
    int mask = 1;
    while (mask < n) {
      if ((vr & mask) != 0) {
        p.recv(real(vr - mask), data, bytes);
        p.next_round();
        break;
      }
      mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (vr + mask < n) p.send(real(vr + mask), data, bytes);
    }
    p.next_round();
  }
  return Status();
}

Status Group::reduce(Plan& p, const void* send, void* recv, std::size_t count, DataType type,
                     ReduceOp op, int root) {
  p.describe({"reduce", count, type, op, true});
  if (Status c = check_reduction(type, op); !c.is_ok()) {
    return Status(c.code(), "reduce: " + c.message());
  }
  if (Status bad = check(p, "reduce", {send, rank_ == root ? recv : send}, count, type, root);
      !bad.is_ok()) {
    return bad;
  }
  const int n = size();
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  const bool ring = reduce_by_ring(bytes);
  if (bytes == 0) {
    // nothing to reduce
  } else if (n == 1) {
    p.copy(result, in, bytes);
  } else if (p.device() != Plan::kHost && ring && reduce_ == 0 &&
             oneshot_->mesh_ready(p.device(), cuda::Cuda::OneShot::Kind::kReduce, bytes)) {
    // Device buffers of three or more members on a node: one kernel per GPU (kernels/mesh.cuh),
    // in the ring's order below.
    p.oneshot(result, in, count, oneshot_->next(), Plan::OneShot::kReduce, root);
  } else if (reduce_ == 0 && nodes_->ready(p, bytes)) {
    return nodes_->reduce(send, recv, count, type, op, root, ring);
  } else if (ring) {
    // Member r ends the reduce-scatter with block r (shift n - 1), then sends it to the root.
    const Blocks blocks(count, n, element);
    std::byte* alternate[2] = {p.scratch(blocks.bytes(0)), p.scratch(blocks.bytes(0))};
    std::byte* last = rank_ == root ? result + blocks.offset(rank_) : p.scratch(blocks.bytes(0));
    ring_reduce_scatter(
        p, rank_, n, blocks, in, n - 1,
        [&](int t, int) { return t == n - 2 ? last : alternate[t % 2]; }, ring_piece(p));
    for (int m = 0; m < n; ++m) {
      if (rank_ == root && m != root) p.recv(m, result + blocks.offset(m), blocks.bytes(m));
    }
    if (rank_ != root) p.send(root, last, blocks.bytes(rank_));
    p.next_round();
  } else {
    // Binomial tree: the children's partial results (whole subtrees of higher relative rank)
    // are folded in from the nearest, so the order is that of the relative ranks.
    const int vr = mod(rank_ - root, n);
    std::vector<int> children;
    int parent = -1;
    for (int mask = 1; mask < n; mask <<= 1) {
      if ((vr & mask) != 0) {
        parent = mod(vr - mask + root, n);
        break;
      }
      if (vr + mask < n) children.push_back(mod(vr + mask + root, n));
    }
    if (children.empty()) {
      p.send(parent, in, bytes);  // a leaf (n > 1, so not the root)
    } else {
      std::byte* acc = rank_ == root ? result : p.scratch(bytes);
      std::vector<std::byte*> parts;
      for (int child : children) {
        parts.push_back(p.scratch(bytes));
        p.recv(child, parts.back(), bytes);
      }
      p.reduce(acc, in, parts[0], count);
      for (std::size_t i = 1; i < parts.size(); ++i) p.reduce(acc, acc, parts[i], count);
      p.next_round();
      if (parent >= 0) p.send(parent, acc, bytes);
    }
    p.next_round();
  }
  return Status();
}

Status Group::allreduce(Plan& p, const void* send, void* recv, std::size_t count, DataType type,
                        ReduceOp op) {
  p.describe({"allreduce", count, type, op, true});
  if (Status c = check_reduction(type, op); !c.is_ok()) {
    return Status(c.code(), "allreduce: " + c.message());
  }
  if (Status bad = check(p, "allreduce", {send, recv}, count, type); !bad.is_ok()) return bad;
  const int n = size();
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  const bool ring = allreduce_by_ring(bytes, count);
  if (bytes == 0) {
    // nothing to reduce
  } else if (n == 1) {
    p.copy(result, in, bytes);
  } else if (p.device() != Plan::kHost && allreduce_ == 0 &&
             oneshot_->ready(p.device(), count, type)) {
    // Device buffers of members that share a node: one kernel per GPU, no messages, reducing in
    // the order of the algorithm it stands in for (so the bits are the host path's).
    p.oneshot(result, in, count, oneshot_->next(),
              ring ? Plan::OneShot::kAllreduceRing : Plan::OneShot::kAllreduce, 0);
  } else if (allreduce_ == 0 && nodes_->ready(p, bytes)) {
    return nodes_->allreduce(send, recv, count, type, op, ring);
  } else if (ring) {
    // Reduce-scatter leaves block r + 1 complete at member r (in the result buffer), and the
    // allgather passes the complete blocks around.
    const Blocks blocks(count, n, element);
    ring_reduce_scatter(
        p, rank_, n, blocks, in, 0, [&](int, int block) { return result + blocks.offset(block); },
        ring_piece(p));
    ring_allgather(
        p, rank_, n, result + blocks.offset(mod(rank_ + 1, n)), 1,
        [&](int b) { return result + blocks.offset(b); }, [&](int b) { return blocks.bytes(b); });
  } else {
    // Recursive doubling over the largest power of two pow2 <= n: the first 2 (n - pow2) members
    // pair up, the even one hands its data to the odd one and gets the result back at the end.
    int pow2 = 1;
    while (pow2 * 2 <= n) pow2 *= 2;
    const int extra = n - pow2;
    std::byte* tmp = p.scratch(bytes);
    const std::byte* current = in;  // where this member's partial result is
    int vrank;                      // rank among the p, or -1 for a member that handed over
    if (rank_ < 2 * extra) {
      if (rank_ % 2 == 0) {
        p.send(rank_ + 1, in, bytes);
        p.next_round();
        vrank = -1;
      } else {
        p.recv(rank_ - 1, tmp, bytes);
        p.reduce(result, tmp, in, count);  // the lower member's data first
        p.next_round();
        current = result;
        vrank = rank_ / 2;
      }
    } else {
      vrank = rank_ - extra;
    }
    if (vrank >= 0) {
      for (int mask = 1; mask < pow2; mask <<= 1) {
        const int vpartner = vrank ^ mask;
        const int partner = vpartner < extra ? vpartner * 2 + 1 : vpartner + extra;
        p.send(partner, current, bytes);
        p.recv(partner, tmp, bytes);
        if (vpartner < vrank) {
          p.reduce(result, tmp, current, count);
        } else {
          p.reduce(result, current, tmp, count);
        }
        p.next_round();
        current = result;
      }
      if (rank_ < 2 * extra) p.send(rank_ - 1, result, bytes);
    } else {
      p.recv(rank_ + 1, result, bytes);
    }
    p.next_round();
  }
  return Status();
}

Status Group::reduce_scatter(Plan& p, const void* send, void* recv, std::size_t count,
                             DataType type, ReduceOp op) {
  const int n = size();
  p.describe({"reduce_scatter", count, type, op, true});
  if (Status c = check_reduction(type, op); !c.is_ok()) {
    return Status(c.code(), "reduce_scatter: " + c.message());
  }
  std::size_t total = 0;
  if (!util::multiply(count, static_cast<std::size_t>(n), &total)) {
    return Status(Code::kInvalidArgument,
                  "reduce_scatter: " + std::to_string(count) + " elements per member is too many");
  }
  if (Status bad = check(p, "reduce_scatter", {send}, total, type); !bad.is_ok()) return bad;
  if (Status bad = check(p, "reduce_scatter", {recv}, count, type); !bad.is_ok()) return bad;
  const std::size_t bytes = count * size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  if (bytes == 0) {
    // nothing to reduce
  } else if (n == 1) {
    p.copy(result, in, bytes);
  } else if (p.device() != Plan::kHost &&
             oneshot_->mesh_ready(p.device(), cuda::Cuda::OneShot::Kind::kReduceScatter, bytes)) {
    // Device buffers of three or more members on a node: one kernel per GPU (kernels/mesh.cuh),
    // in the ring's order below.
    p.oneshot(result, in, count, oneshot_->next(), Plan::OneShot::kReduceScatter, 0);
  } else if (nodes_->ready(p, bytes * static_cast<std::size_t>(n))) {
    return nodes_->reduce_scatter(send, recv, count, type, op);
  } else {
    const Blocks blocks(count * static_cast<std::size_t>(n), n, size_of(type));
    std::byte* alternate[2] = {p.scratch(bytes), p.scratch(bytes)};
    ring_reduce_scatter(
        p, rank_, n, blocks, in, n - 1,
        [&](int t, int) { return t == n - 2 ? result : alternate[t % 2]; }, ring_piece(p));
  }
  return Status();
}

Status Group::allgather(Plan& p, const void* send, void* recv, std::size_t count, DataType type) {
  const int n = size();
  p.describe({"allgather", count, type});
  std::size_t total = 0;
  if (!util::multiply(count, static_cast<std::size_t>(n), &total)) {
    return Status(Code::kInvalidArgument,
                  "allgather: " + std::to_string(count) + " elements per member is too many");
  }
  if (Status bad = check(p, "allgather", {send}, count, type); !bad.is_ok()) return bad;
  if (Status bad = check(p, "allgather", {recv}, total, type); !bad.is_ok()) return bad;
  const std::size_t bytes = count * size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  const bool ring = allgather_by_ring(bytes);
  if (bytes == 0) {
    // nothing moves
  } else if (p.device() != Plan::kHost && allgather_ == 0 &&
             oneshot_->mesh_ready(p.device(), cuda::Cuda::OneShot::Kind::kAllgather, bytes)) {
    // Device buffers of three or more members on a node: one kernel per GPU (kernels/mesh.cuh).
    p.oneshot(result, in, count, oneshot_->next(), Plan::OneShot::kAllgather, 0);
  } else if (allgather_ == 0 && nodes_->ready(p, bytes)) {
    // On one node the area takes the ring's sizes too (3 ranks, 128 KiB each: 6.5-6.8 us against
    // 26-27 by the ring's messages on this VM).
    return nodes_->allgather(send, recv, count, type);
  } else if (ring || n == 1) {
    ring_allgather(
        p, rank_, n, in, 0, [&](int b) { return result + static_cast<std::size_t>(b) * bytes; },
        [&](int) { return bytes; });
  } else {
    // Bruck: after round k a member holds the blocks of the next 2^(k+1) members (from itself),
    // in a scratch buffer that is rotated into place at the end.
    std::byte* gathered = p.scratch(bytes * static_cast<std::size_t>(n));
    p.copy(gathered, in, bytes);
    p.next_round();
    for (int k = 1; k < n; k <<= 1) {
      const auto blocks = static_cast<std::size_t>(std::min(k, n - k));
      p.send(mod(rank_ - k, n), gathered, blocks * bytes);
      p.recv(mod(rank_ + k, n), gathered + static_cast<std::size_t>(k) * bytes, blocks * bytes);
      p.next_round();
    }
    for (int i = 0; i < n; ++i) {
      p.copy(result + static_cast<std::size_t>(mod(rank_ + i, n)) * bytes,
             gathered + static_cast<std::size_t>(i) * bytes, bytes);
    }
    p.next_round();
  }
  return Status();
}

Status Group::allgatherv(Plan& p, const void* send, void* recv, std::span<const std::size_t> counts,
                         std::span<const std::size_t> displacements, DataType type) {
  const int n = size();
  p.describe({"allgatherv", counts.size() == std::size_t(n) ? counts[rank_] : 0, type});
  if (counts.size() != std::size_t(n) || displacements.size() != std::size_t(n)) {
    return (
        Status(Code::kInvalidArgument, "allgatherv: " + std::to_string(counts.size()) +
                                           " counts and " + std::to_string(displacements.size()) +
                                           " displacements for " + std::to_string(n) + " members"));
  }
  std::size_t total = 0;
  for (std::size_t c : counts) {
    if (__builtin_add_overflow(total, c, &total)) {
      return Status(Code::kInvalidArgument, "allgatherv: the counts add up past SIZE_MAX");
    }
  }
  if (Status bad = check(p, "allgatherv", {total > 0 ? recv : nullptr}, total, type);
      !bad.is_ok()) {
    return bad;
  }
  if (Status bad = check_blocks("allgatherv", recv, counts, displacements, type); !bad.is_ok()) {
    return bad;
  }
  if (Status bad = check(p, "allgatherv", {send}, counts[rank_], type); !bad.is_ok()) return bad;
  const std::size_t element = size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  if (total > 0) {
    ring_allgather(
        p, rank_, n, in, 0, [&](int b) { return result + displacements[b] * element; },
        [&](int b) { return counts[b] * element; });
  }
  return Status();
}

Status Group::alltoallv(Plan& p, const void* send, std::span<const std::size_t> send_counts,
                        std::span<const std::size_t> send_displacements, void* recv,
                        std::span<const std::size_t> recv_counts,
                        std::span<const std::size_t> recv_displacements, DataType type,
                        const char* name) {
  const int n = size();
  p.describe({name, send_counts.size() == std::size_t(n) ? send_counts[0] : 0, type});
  const auto un = static_cast<std::size_t>(n);
  if (send_counts.size() != un || send_displacements.size() != un || recv_counts.size() != un ||
      recv_displacements.size() != un) {
    return (Status(Code::kInvalidArgument, std::string(name) + ": counts and displacements need " +
                                               std::to_string(n) + " entries each"));
  }
  std::size_t sent = 0;
  std::size_t received = 0;
  for (std::size_t m = 0; m < un; ++m) {
    if (__builtin_add_overflow(sent, send_counts[m], &sent) ||
        __builtin_add_overflow(received, recv_counts[m], &received)) {
      return Status(Code::kInvalidArgument,
                    std::string(name) + ": the counts add up past SIZE_MAX");
    }
  }
  if (Status bad = check(p, name, {send}, sent, type); !bad.is_ok()) return bad;
  if (Status bad = check(p, name, {recv}, received, type); !bad.is_ok()) return bad;
  if (Status bad = check_blocks(name, send, send_counts, send_displacements, type); !bad.is_ok()) {
    return bad;
  }
  if (Status bad = check_blocks(name, recv, recv_counts, recv_displacements, type); !bad.is_ok()) {
    return bad;
  }
  const std::size_t element = size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  if (send_counts[rank_] != recv_counts[rank_]) {
    return (Status(Code::kInvalidArgument, std::string(name) + ": this member sends itself " +
                                               std::to_string(send_counts[rank_]) +
                                               " elements but expects " +
                                               std::to_string(recv_counts[rank_])));
  }
  // All at once, each member starting with its right-hand neighbour so that not everyone sends
  // to member 0 first.
  for (int i = 1; i < n; ++i) {
    const int from = mod(rank_ - i, n);
    const int to = mod(rank_ + i, n);
    p.recv(from, result + recv_displacements[from] * element, recv_counts[from] * element);
    p.send(to, in + send_displacements[to] * element, send_counts[to] * element);
  }
  p.copy(result + recv_displacements[rank_] * element, in + send_displacements[rank_] * element,
         recv_counts[rank_] * element);
  p.next_round();
  return Status();
}

Status Group::gather(Plan& p, const void* send, void* recv, std::size_t count, DataType type,
                     int root) {
  const int n = size();
  p.describe({"gather", count, type});
  if (Status bad = check(p, "gather", {send, rank_ == root ? recv : send}, count, type, root);
      !bad.is_ok()) {
    return bad;
  }
  const std::size_t bytes = count * size_of(type);
  auto* result = static_cast<std::byte*>(recv);
  if (bytes > 0) {
    if (rank_ == root) {
      for (int m = 0; m < n; ++m) {
        if (m != root) p.recv(m, result + static_cast<std::size_t>(m) * bytes, bytes);
      }
      p.copy(result + static_cast<std::size_t>(root) * bytes, send, bytes);
    } else {
      p.send(root, send, bytes);
    }
    p.next_round();
  }
  return Status();
}

Status Group::scatter(Plan& p, const void* send, void* recv, std::size_t count, DataType type,
                      int root) {
  const int n = size();
  p.describe({"scatter", count, type});
  if (Status bad = check(p, "scatter", {recv, rank_ == root ? send : recv}, count, type, root);
      !bad.is_ok()) {
    return bad;
  }
  const std::size_t bytes = count * size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  if (bytes > 0) {
    if (rank_ == root) {
      for (int m = 0; m < n; ++m) {
        if (m != root) p.send(m, in + static_cast<std::size_t>(m) * bytes, bytes);
      }
      p.copy(recv, in + static_cast<std::size_t>(root) * bytes, bytes);
    } else {
      p.recv(root, recv, bytes);
    }
    p.next_round();
  }
  return Status();
}

}  // namespace ferry::coll
