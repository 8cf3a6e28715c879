// The collective algorithms: each builds the schedule of one collective for this member.
//   small (latency):  dissemination barrier, binomial broadcast and reduce, recursive doubling
//                     allreduce (any member count: the extra members fold in first), Bruck
//                     allgather
//   large (bandwidth): ring reduce-scatter + ring allgather, pipelined chain broadcast,
//                     ring reduce-scatter + gather for reduce
// Every member reduces in an order fixed by the member count, the sizes and the algorithm, so the
// results are the same bits on every member and from run to run.
#include <algorithm>
#include <functional>

#include "coll/group.hpp"
#include "coll/reduce.hpp"
#include "coll/schedule.hpp"
#include "proto/engine.hpp"

namespace ferry::coll {
namespace {

// `count` elements cut into n blocks whose sizes differ by at most one.
struct Blocks {
  Blocks(std::size_t count, int n, std::size_t element)
      : base(count / static_cast<std::size_t>(n)),
        extra(count % static_cast<std::size_t>(n)),
        element(element) {}
  [[nodiscard]] std::size_t elements(int b) const {
    return base + (static_cast<std::size_t>(b) < extra ? 1 : 0);
  }
  [[nodiscard]] std::size_t bytes(int b) const { return elements(b) * element; }
  [[nodiscard]] std::size_t offset(int b) const {
    const auto ub = static_cast<std::size_t>(b);
    return (ub * base + std::min(ub, extra)) * element;
  }
  std::size_t base, extra, element;
};

int mod(int a, int n) { return ((a % n) + n) % n; }

// Ring reduce-scatter over n - 1 rounds: member r ends with block (r + shift + 1) mod n reduced
// over all members, written by the last round to out(n - 2, block). out(t, block) is where round
// t writes its partial result; round t + 1 sends it on.
void ring_reduce_scatter(Schedule& s, int rank, int n, const Blocks& blocks, const std::byte* in,
                         int shift, const std::function<std::byte*(int, int)>& out) {
  std::byte* tmp = s.scratch(blocks.bytes(0));
  const int next = mod(rank + 1, n);
  const int prev = mod(rank - 1, n);
  for (int t = 0; t + 1 < n; ++t) {
    const int send_block = mod(rank + shift - t, n);
    const int recv_block = mod(rank + shift - t - 1, n);
    const std::byte* from = t == 0 ? in + blocks.offset(send_block) : out(t - 1, send_block);
    s.recv(prev, tmp, blocks.bytes(recv_block));
    s.send(next, from, blocks.bytes(send_block));
    s.reduce(out(t, recv_block), tmp, in + blocks.offset(recv_block), blocks.elements(recv_block));
    s.next_round();
  }
}

// Ring allgather over n - 1 rounds: member r starts with block (r + shift) mod n at own (which
// is copied to where(block) unless it is there), and ends with every block at where(b).
void ring_allgather(Schedule& s, int rank, int n, const std::byte* own, int shift,
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

Request Group::barrier() {
  auto s = begin("barrier", 0, DataType::kUint8);
  const int n = size();
  for (int k = 1; k < n; k <<= 1) {
    s->send(mod(rank_ + k, n), nullptr, 0);
    s->recv(mod(rank_ - k, n), nullptr, 0);
    s->next_round();
  }
  return start(std::move(s));
}

Request Group::broadcast(void* buffer, std::size_t count, DataType type, int root) {
  auto s = begin("broadcast", count, type);
  if (Request bad = check("broadcast", {buffer}, count, type, root); bad.valid()) return bad;
  const int n = size();
  const std::size_t bytes = count * size_of(type);
  auto* data = static_cast<std::byte*>(buffer);
  const int vr = mod(rank_ - root, n);  // rank relative to the root
  auto real = [&](int v) { return mod(v + root, n); };
  const bool chain = broadcast_ == 2 || (broadcast_ == 0 && bytes >= small_ && n > 2);
  if (n == 1 || bytes == 0) {
    // nothing moves
  } else if (chain) {
    // The root's data flows down the chain vr 0 -> 1 -> ... in pieces: in round t member vr
    // receives piece t - vr + 1 and passes on piece t - vr.
    const std::size_t piece = chunk_;
    const auto pieces = static_cast<long>((bytes + piece - 1) / piece);
    for (long t = 0; t + 1 < pieces + n; ++t) {
      const long in = t - vr + 1;
      const long out = t - vr;
      if (vr > 0 && in >= 0 && in < pieces) {
        const auto at = static_cast<std::size_t>(in) * piece;
        s->recv(real(vr - 1), data + at, std::min(piece, bytes - at));
      }
      if (vr + 1 < n && out >= 0 && out < pieces) {
        const auto at = static_cast<std::size_t>(out) * piece;
        s->send(real(vr + 1), data + at, std::min(piece, bytes - at));
      }
      s->next_round();
    }
  } else {
    // Binomial tree: receive from the parent, then send to the children, farthest first.
    int mask = 1;
    while (mask < n) {
      if ((vr & mask) != 0) {
        s->recv(real(vr - mask), data, bytes);
        s->next_round();
        break;
      }
      mask <<= 1;
    }
    for (mask >>= 1; mask > 0; mask >>= 1) {
      if (vr + mask < n) s->send(real(vr + mask), data, bytes);
    }
    s->next_round();
  }
  return start(std::move(s));
}

Request Group::reduce(const void* send, void* recv, std::size_t count, DataType type, ReduceOp op,
                      int root) {
  auto s = begin("reduce", count, type, op, true);
  if (Status c = check_reduction(type, op); !c.is_ok()) {
    return engine_->failed(Status(c.code(), "reduce: " + c.message()));
  }
  if (Request bad = check("reduce", {send, rank_ == root ? recv : send}, count, type, root);
      bad.valid()) {
    return bad;
  }
  const int n = size();
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  const bool ring = reduce_ == 2 || (reduce_ == 0 && bytes >= small_ && n > 2);
  if (bytes == 0) {
    // nothing to reduce
  } else if (n == 1) {
    s->copy(result, in, bytes);
  } else if (ring) {
    // Member r ends the reduce-scatter with block r (shift n - 1), then sends it to the root.
    const Blocks blocks(count, n, element);
    std::byte* alternate[2] = {s->scratch(blocks.bytes(0)), s->scratch(blocks.bytes(0))};
    std::byte* last = rank_ == root ? result + blocks.offset(rank_) : s->scratch(blocks.bytes(0));
    ring_reduce_scatter(*s, rank_, n, blocks, in, n - 1,
                        [&](int t, int) { return t == n - 2 ? last : alternate[t % 2]; });
    for (int m = 0; m < n; ++m) {
      if (rank_ == root && m != root) s->recv(m, result + blocks.offset(m), blocks.bytes(m));
    }
    if (rank_ != root) s->send(root, last, blocks.bytes(rank_));
    s->next_round();
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
      s->send(parent, in, bytes);  // a leaf (n > 1, so not the root)
    } else {
      std::byte* acc = rank_ == root ? result : s->scratch(bytes);
      std::vector<std::byte*> parts;
      for (int child : children) {
        parts.push_back(s->scratch(bytes));
        s->recv(child, parts.back(), bytes);
      }
      s->reduce(acc, in, parts[0], count);
      for (std::size_t i = 1; i < parts.size(); ++i) s->reduce(acc, acc, parts[i], count);
      s->next_round();
      if (parent >= 0) s->send(parent, acc, bytes);
    }
    s->next_round();
  }
  return start(std::move(s));
}

Request Group::allreduce(const void* send, void* recv, std::size_t count, DataType type,
                         ReduceOp op) {
  auto s = begin("allreduce", count, type, op, true);
  if (Status c = check_reduction(type, op); !c.is_ok()) {
    return engine_->failed(Status(c.code(), "allreduce: " + c.message()));
  }
  if (Request bad = check("allreduce", {send, recv}, count, type); bad.valid()) return bad;
  const int n = size();
  const std::size_t element = size_of(type);
  const std::size_t bytes = count * element;
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  const bool ring =
      allreduce_ == 2 || (allreduce_ == 0 && bytes >= small_ && count >= std::size_t(n));
  if (bytes == 0) {
    // nothing to reduce
  } else if (n == 1) {
    s->copy(result, in, bytes);
  } else if (ring) {
    // Reduce-scatter leaves block r + 1 complete at member r (in the result buffer), and the
    // allgather passes the complete blocks around.
    const Blocks blocks(count, n, element);
    ring_reduce_scatter(*s, rank_, n, blocks, in, 0,
                        [&](int, int block) { return result + blocks.offset(block); });
    ring_allgather(
        *s, rank_, n, result + blocks.offset(mod(rank_ + 1, n)), 1,
        [&](int b) { return result + blocks.offset(b); }, [&](int b) { return blocks.bytes(b); });
  } else {
    // Recursive doubling over the largest power of two p <= n: the first 2 (n - p) members pair
    // up, the even one hands its data to the odd one and gets the result back at the end.
    int p = 1;
    while (p * 2 <= n) p *= 2;
    const int extra = n - p;
    std::byte* tmp = s->scratch(bytes);
    const std::byte* current = in;  // where this member's partial result is
    int vrank;                      // rank among the p, or -1 for a member that handed over
    if (rank_ < 2 * extra) {
      if (rank_ % 2 == 0) {
        s->send(rank_ + 1, in, bytes);
        s->next_round();
        vrank = -1;
      } else {
        s->recv(rank_ - 1, tmp, bytes);
        s->reduce(result, tmp, in, count);  // the lower member's data first
        s->next_round();
        current = result;
        vrank = rank_ / 2;
      }
    } else {
      vrank = rank_ - extra;
    }
    if (vrank >= 0) {
      for (int mask = 1; mask < p; mask <<= 1) {
        const int vpartner = vrank ^ mask;
        const int partner = vpartner < extra ? vpartner * 2 + 1 : vpartner + extra;
        s->send(partner, current, bytes);
        s->recv(partner, tmp, bytes);
        if (vpartner < vrank) {
          s->reduce(result, tmp, current, count);
        } else {
          s->reduce(result, current, tmp, count);
        }
        s->next_round();
        current = result;
      }
      if (rank_ < 2 * extra) s->send(rank_ - 1, result, bytes);
    } else {
      s->recv(rank_ + 1, result, bytes);
    }
    s->next_round();
  }
  return start(std::move(s));
}

Request Group::reduce_scatter(const void* send, void* recv, std::size_t count, DataType type,
                              ReduceOp op) {
  const int n = size();
  auto s = begin("reduce_scatter", count, type, op, true);
  if (Status c = check_reduction(type, op); !c.is_ok()) {
    return engine_->failed(Status(c.code(), "reduce_scatter: " + c.message()));
  }
  if (Request bad =
          check("reduce_scatter", {send, recv}, count * static_cast<std::size_t>(n), type);
      bad.valid()) {
    return bad;
  }
  const std::size_t bytes = count * size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  if (bytes == 0) {
    // nothing to reduce
  } else if (n == 1) {
    s->copy(result, in, bytes);
  } else {
    const Blocks blocks(count * static_cast<std::size_t>(n), n, size_of(type));
    std::byte* alternate[2] = {s->scratch(bytes), s->scratch(bytes)};
    ring_reduce_scatter(*s, rank_, n, blocks, in, n - 1,
                        [&](int t, int) { return t == n - 2 ? result : alternate[t % 2]; });
  }
  return start(std::move(s));
}

Request Group::allgather(const void* send, void* recv, std::size_t count, DataType type) {
  const int n = size();
  auto s = begin("allgather", count, type);
  if (Request bad = check("allgather", {send, recv}, count, type); bad.valid()) return bad;
  const std::size_t bytes = count * size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  const bool ring =
      allgather_ == 2 || (allgather_ == 0 && bytes * static_cast<std::size_t>(n) >= small_);
  if (bytes == 0) {
    // nothing moves
  } else if (ring || n == 1) {
    ring_allgather(
        *s, rank_, n, in, 0, [&](int b) { return result + static_cast<std::size_t>(b) * bytes; },
        [&](int) { return bytes; });
  } else {
    // Bruck: after round k a member holds the blocks of the next 2^(k+1) members (from itself),
    // in a scratch buffer that is rotated into place at the end.
    std::byte* gathered = s->scratch(bytes * static_cast<std::size_t>(n));
    s->copy(gathered, in, bytes);
    s->next_round();
    for (int k = 1; k < n; k <<= 1) {
      const auto blocks = static_cast<std::size_t>(std::min(k, n - k));
      s->send(mod(rank_ - k, n), gathered, blocks * bytes);
      s->recv(mod(rank_ + k, n), gathered + static_cast<std::size_t>(k) * bytes, blocks * bytes);
      s->next_round();
    }
    for (int i = 0; i < n; ++i) {
      s->copy(result + static_cast<std::size_t>(mod(rank_ + i, n)) * bytes,
              gathered + static_cast<std::size_t>(i) * bytes, bytes);
    }
    s->next_round();
  }
  return start(std::move(s));
}

Request Group::allgatherv(const void* send, void* recv, std::span<const std::size_t> counts,
                          std::span<const std::size_t> displacements, DataType type) {
  const int n = size();
  auto s = begin("allgatherv", counts.size() == std::size_t(n) ? counts[rank_] : 0, type);
  if (counts.size() != std::size_t(n) || displacements.size() != std::size_t(n)) {
    return engine_->failed(
        Status(Code::kInvalidArgument, "allgatherv: " + std::to_string(counts.size()) +
                                           " counts and " + std::to_string(displacements.size()) +
                                           " displacements for " + std::to_string(n) + " members"));
  }
  std::size_t total = 0;
  for (std::size_t c : counts) total += c;
  if (Request bad = check("allgatherv", {total > 0 ? recv : nullptr}, total, type); bad.valid()) {
    return bad;
  }
  if (Request bad = check("allgatherv", {send}, counts[rank_], type); bad.valid()) return bad;
  const std::size_t element = size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  if (total > 0) {
    ring_allgather(
        *s, rank_, n, in, 0, [&](int b) { return result + displacements[b] * element; },
        [&](int b) { return counts[b] * element; });
  }
  return start(std::move(s));
}

Request Group::alltoallv(const void* send, std::span<const std::size_t> send_counts,
                         std::span<const std::size_t> send_displacements, void* recv,
                         std::span<const std::size_t> recv_counts,
                         std::span<const std::size_t> recv_displacements, DataType type,
                         const char* name) {
  const int n = size();
  auto s = begin(name, send_counts.size() == std::size_t(n) ? send_counts[0] : 0, type);
  const auto un = static_cast<std::size_t>(n);
  if (send_counts.size() != un || send_displacements.size() != un || recv_counts.size() != un ||
      recv_displacements.size() != un) {
    return engine_->failed(Status(Code::kInvalidArgument, std::string(name) +
                                                              ": counts and displacements need " +
                                                              std::to_string(n) + " entries each"));
  }
  std::size_t sent = 0;
  std::size_t received = 0;
  for (std::size_t m = 0; m < un; ++m) {
    sent += send_counts[m];
    received += recv_counts[m];
  }
  if (Request bad = check(name, {send}, sent, type); bad.valid()) return bad;
  if (Request bad = check(name, {recv}, received, type); bad.valid()) return bad;
  const std::size_t element = size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  auto* result = static_cast<std::byte*>(recv);
  if (send_counts[rank_] != recv_counts[rank_]) {
    return engine_->failed(Status(
        Code::kInvalidArgument, std::string(name) + ": this member sends itself " +
                                    std::to_string(send_counts[rank_]) + " elements but expects " +
                                    std::to_string(recv_counts[rank_])));
  }
  // All at once, each member starting with its right-hand neighbour so that not everyone sends
  // to member 0 first.
  for (int i = 1; i < n; ++i) {
    const int from = mod(rank_ - i, n);
    const int to = mod(rank_ + i, n);
    s->recv(from, result + recv_displacements[from] * element, recv_counts[from] * element);
    s->send(to, in + send_displacements[to] * element, send_counts[to] * element);
  }
  s->copy(result + recv_displacements[rank_] * element, in + send_displacements[rank_] * element,
          recv_counts[rank_] * element);
  s->next_round();
  return start(std::move(s));
}

Request Group::gather(const void* send, void* recv, std::size_t count, DataType type, int root) {
  const int n = size();
  auto s = begin("gather", count, type);
  if (Request bad = check("gather", {send, rank_ == root ? recv : send}, count, type, root);
      bad.valid()) {
    return bad;
  }
  const std::size_t bytes = count * size_of(type);
  auto* result = static_cast<std::byte*>(recv);
  if (bytes > 0) {
    if (rank_ == root) {
      for (int m = 0; m < n; ++m) {
        if (m != root) s->recv(m, result + static_cast<std::size_t>(m) * bytes, bytes);
      }
      s->copy(result + static_cast<std::size_t>(root) * bytes, send, bytes);
    } else {
      s->send(root, send, bytes);
    }
    s->next_round();
  }
  return start(std::move(s));
}

Request Group::scatter(const void* send, void* recv, std::size_t count, DataType type, int root) {
  const int n = size();
  auto s = begin("scatter", count, type);
  if (Request bad = check("scatter", {recv, rank_ == root ? send : recv}, count, type, root);
      bad.valid()) {
    return bad;
  }
  const std::size_t bytes = count * size_of(type);
  const auto* in = static_cast<const std::byte*>(send);
  if (bytes > 0) {
    if (rank_ == root) {
      for (int m = 0; m < n; ++m) {
        if (m != root) s->send(m, in + static_cast<std::size_t>(m) * bytes, bytes);
      }
      s->copy(recv, in + static_cast<std::size_t>(root) * bytes, bytes);
    } else {
      s->recv(root, recv, bytes);
    }
    s->next_round();
  }
  return start(std::move(s));
}

}  // namespace ferry::coll
