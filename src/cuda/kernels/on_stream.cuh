// The allreduce enqueued on an application's stream: part of kernels.cu's translation unit (after
// oneshot.cuh, whose exchange areas and reduction order it shares).
#pragma once

// ---- LL: small calls, data and flag in one 16-byte store ----
//
// An on-stream area ends with 2 generations x members LL slots of kLLSlotBytes. Line 0 of member
// j's slot holds the signature of its call, line l > 0 bytes [8(l - 1), 8l) of its input, each as
// {low word, flag, high word, flag} with flag the call's number: each half (a word and a flag) is
// one 8-byte store the reader sees whole, so a reader that sees both flags equal to its call's
// number has the line's data, without a fence or a flag of its own. The writer pushes its lines
// into every peer's slot; every thread then reads the lines it reduces from its own area.
namespace {

constexpr unsigned long long kLLSlotBytes = 32769 * 16;  // the signature, then 256 KiB of data
constexpr unsigned long long kLLMaxBytes = 32768 * 8;

// Where the one-shot kernels' part of an area ends (Cuda::oneshot_area_bytes).
__device__ __forceinline__ unsigned long long oneshot_area_end(int members,
                                                               unsigned long long slot_bytes) {
  return mesh_results(members, slot_bytes) +
         (members >= 3 ? 2 * static_cast<unsigned long long>(members) * slot_bytes : 0);
}

__device__ __forceinline__ void ll_store(unsigned char* line, unsigned long long data,
                                         unsigned flag) {
  asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(line),
               "r"(static_cast<unsigned>(data)), "r"(flag), "r"(static_cast<unsigned>(data >> 32)),
               "r"(flag)
               : "memory");
}

// Run every spin of a wait for member `member` (-1: for no peer): every 4,096 spins, whether the
// call must stop (the host raised words[0], or the GPU's clock passed `deadline`, 0: none; then
// words[2] is set). It also writes member + 1 to words[3], which the host reads to tell a member
// that finalized and is still waited for (coll/departed_wait.hpp).
__device__ __forceinline__ bool spin_must_stop(unsigned spins, volatile unsigned* words,
                                               unsigned long long deadline, int member) {
  if ((spins & 4095) != 0) return false;
  if (member >= 0) words[3] = static_cast<unsigned>(member) + 1;
  if (words[0] != 0) return true;
  if (deadline != 0 && now_ns() > deadline) {
    words[2] = 1;
    return true;
  }
  return false;
}

// Waits until `line` (member `member`'s) shows `flag` and gives its data; false where the call
// must stop: the host raised words[0] (a member died or finalized, the communicator was revoked,
// or a member saw a mismatch) or the GPU's clock passed `deadline` (then words[2] is set).
__device__ __forceinline__ bool ll_load(const unsigned char* line, unsigned flag,
                                        volatile unsigned* words, unsigned long long deadline,
                                        int member, unsigned long long* data) {
  unsigned a, b, c, d;
  for (unsigned spins = 1;; ++spins) {
    asm volatile("ld.volatile.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(a), "=r"(b), "=r"(c), "=r"(d)
                 : "l"(line)
                 : "memory");
    if (b == flag && d == flag) break;
    if (spin_must_stop(spins, words, deadline, member)) return false;
  }
  *data = static_cast<unsigned long long>(c) << 32 | a;
  return true;
}

// Bytes [at, at + 8) of `in` (of `bytes`), zero past its end, whatever its alignment.
__device__ __forceinline__ unsigned long long ll_input(const unsigned char* in,
                                                       unsigned long long bytes,
                                                       unsigned long long at) {
  if (at + 8 <= bytes && (reinterpret_cast<std::uintptr_t>(in + at) & 7) == 0) {
    return *reinterpret_cast<const unsigned long long*>(in + at);
  }
  unsigned long long v = 0;
  for (unsigned k = 0; k < 8 && at + k < bytes; ++k) {
    v |= static_cast<unsigned long long>(in[at + k]) << (8 * k);
  }
  return v;
}

// Line `line` (> 0) of `count` elements: for each element, the members' values (words[m],
// member m's) combined by `combine(x, i)` (x[m] member m's value of element i), into out.
template <class E, class Combine>
__device__ __forceinline__ void ll_lanes(void* out_buffer, unsigned long long count,
                                         unsigned long long line,
                                         const unsigned long long (&words)[kMaxMembers],
                                         int members, Combine&& combine) {
  using T = typename E::Storage;
  constexpr unsigned kPer = 8 / sizeof(T);
  union Lanes {
    unsigned long long whole;
    T item[kPer];
  };
  Lanes lanes[kMaxMembers];
#pragma unroll
  for (int j = 0; j < kMaxMembers; ++j) lanes[j].whole = j < members ? words[j] : 0;
  auto* out = static_cast<T*>(out_buffer);
#pragma unroll
  for (unsigned e = 0; e < kPer; ++e) {
    const unsigned long long i = (line - 1) * kPer + e;
    if (i >= count) break;
    T x[kMaxMembers];
#pragma unroll
    for (int j = 0; j < kMaxMembers; ++j) x[j] = lanes[j].item[e];
    out[i] = combine(x, i);
  }
}

// Line `line` (> 0) reduced: this member's input and every peer's line, element by element in the
// order's sequence, into out.
template <class E, int kOp>
__device__ __forceinline__ void ll_combine(void* out_buffer, unsigned long long count,
                                           const Order& order, unsigned long long line,
                                           const unsigned long long (&words)[kMaxMembers],
                                           int members) {
  using T = typename E::Storage;
  ll_lanes<E>(out_buffer, count, line, words, members,
              [&](const T (&x)[kMaxMembers], unsigned long long i) {
                return combine_members<E, kOp>(x, order, i);
              });
}

template <class E>
__device__ __forceinline__ void ll_combine_op(int op, bool bitwise, void* out,
                                              unsigned long long count, const Order& order,
                                              unsigned long long line,
                                              const unsigned long long (&words)[kMaxMembers],
                                              int members) {
#define FERRY_LL(kOp) return ll_combine<E, kOp>(out, count, order, line, words, members)
  switch (op) {
    case kSum:
      FERRY_LL(kSum);
    case kProd:
      FERRY_LL(kProd);
    case kMin:
      FERRY_LL(kMin);
    case kMax:
      FERRY_LL(kMax);
    default:
      break;
  }
  if (!bitwise) return;
  switch (op) {
    case kBitAnd:
      FERRY_LL(kBitAnd);
    case kBitOr:
      FERRY_LL(kBitOr);
    case kBitXor:
      FERRY_LL(kBitXor);
    default:
      break;
  }
#undef FERRY_LL
}

// A call of at most kLLMaxBytes by LL, every block taking lines by the grid's stride. A member
// whose signature differs from this one's raises words[1] and words[0] (every member then stops).
__device__ void ll_allreduce(void* out, const void* in, unsigned long long count, int type, int op,
                             int members, int me, int ring, unsigned long long sequence,
                             unsigned long long slot_bytes, const Areas& areas,
                             volatile unsigned* words, unsigned long long deadline) {
  const unsigned long long bytes = count * type_size(type);
  const unsigned long long lines = (bytes + 7) / 8 + 1;
  const unsigned flag = static_cast<unsigned>(sequence);
  const unsigned long long ll_offset =
      oneshot_area_end(members, slot_bytes) +
      (sequence & 1) * static_cast<unsigned long long>(members) * kLLSlotBytes;
  const unsigned long long signature =
      count << 8 | static_cast<unsigned long long>(type) << 4 | static_cast<unsigned>(op);
  const auto* input = static_cast<const unsigned char*>(in);
  const unsigned long long first = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long line = first; line < lines; line += stride) {
    const unsigned long long data = line == 0 ? signature : ll_input(input, bytes, (line - 1) * 8);
    for (int j = 0; j < members; ++j) {
      if (j == me) continue;
      ll_store(areas.area[j] + ll_offset + static_cast<unsigned long long>(me) * kLLSlotBytes +
                   line * 16,
               data, flag);
    }
  }
  const unsigned char* mine = areas.area[me] + ll_offset;
  const Order order(count, members, ring != 0);
  for (unsigned long long line = first; line < lines; line += stride) {
    unsigned long long got[kMaxMembers];
    bool stopped = false;
    for (int j = 0; j < members && !stopped; ++j) {
      got[j] = 0;
      if (j == me) {
        got[j] = line == 0 ? signature : ll_input(input, bytes, (line - 1) * 8);
      } else if (!ll_load(mine + static_cast<unsigned long long>(j) * kLLSlotBytes + line * 16,
                          flag, words, deadline, j, &got[j])) {
        stopped = true;
      }
    }
    if (stopped) return;
    if (line == 0) {
      for (int j = 0; j < members; ++j) {
        if (got[j] != signature) {
          words[1] = 1;
          words[0] = 1;
          return;
        }
      }
      continue;
    }
    with_element(type, [&](auto element, bool bitwise) {
      ll_combine_op<decltype(element)>(op, bitwise, out, count, order, line, got, members);
    });
  }
}

// ---- LL forms of allgather, broadcast, reduce-scatter and reduce (two or more members) ----
//
// The same slots and lines as ll_allreduce: every member sends line 0 (its call's signature, with
// the kind's bit of kernels/mesh.cuh) to every peer and waits for every peer's, so a member runs at
// most one call ahead of another; the data lines go where the collective sends them (allgather: a
// member's input to every peer; broadcast: the root's buffer to every peer; reduce-scatter: block
// j of a member's input to member j; reduce: every member's input to the root), and each member
// reads what it needs from its own slots. `count` is the elements of one member's part (the
// allgather's input, the buffer, a block, the reduce's input).

// Bytes [at, at + 8) of `out` (of `bytes`) from a line's data, where they fall inside.
__device__ __forceinline__ void ll_output(unsigned char* out, unsigned long long bytes,
                                          unsigned long long at, unsigned long long data) {
  if (at + 8 <= bytes && (reinterpret_cast<std::uintptr_t>(out + at) & 7) == 0) {
    *reinterpret_cast<unsigned long long*>(out + at) = data;
    return;
  }
  for (unsigned k = 0; k < 8 && at + k < bytes; ++k) {
    out[at + k] = static_cast<unsigned char>(data >> (8 * k));
  }
}

// Line `line` (> 0) of a reduce-scatter's block: the members' values (words[m], member m's)
// combined along the chain start, start + 1, ... (mod members), the ring's order
// (ring_reduce_scatter, ferry_reduce_scatter_mesh), into out.
template <class E, int kOp>
__device__ __forceinline__ void ll_chain(void* out_buffer, unsigned long long count,
                                         unsigned long long line,
                                         const unsigned long long (&words)[kMaxMembers],
                                         int members, int start) {
  using T = typename E::Storage;
  ll_lanes<E>(out_buffer, count, line, words, members,
              [&](const T (&x)[kMaxMembers], unsigned long long) {
                T acc = x[start];
                for (int k = 1; k < members; ++k) {
                  acc = E::template combine<kOp>(acc, x[start + k < members ? start + k
                                                                            : start + k - members]);
                }
                return acc;
              });
}

// Element values x (member m's at x[m]) reduced in the binomial tree's order to `root`
// (Group::reduce below FERRY_COLL_SMALL): with v a rank relative to the root, member v folds into
// its own value the partial results of its children v + 1, v + 2, v + 4, ... (below v's lowest
// set bit), nearest first, each the same of its subtree.
template <class E, int kOp>
__device__ __forceinline__ typename E::Storage tree_combine(
    const typename E::Storage (&x)[kMaxMembers], int members, int root) {
  typename E::Storage partial[kMaxMembers];
  for (int v = members - 1; v >= 0; --v) {
    const int real = v + root < members ? v + root : v + root - members;
    typename E::Storage acc = x[real];
    for (int mask = 1; mask < members && (v & mask) == 0; mask <<= 1) {
      if (v + mask < members) acc = E::template combine<kOp>(acc, partial[v + mask]);
    }
    partial[v] = acc;
  }
  return partial[0];
}

__device__ void ll_mesh(int kind, void* out, const void* in, unsigned long long count, int type,
                        int op, int members, int me, int ring, int root,
                        unsigned long long sequence, unsigned long long slot_bytes,
                        const Areas& areas, volatile unsigned* words,
                        unsigned long long deadline) {
  const unsigned long long bytes = count * type_size(type);
  const unsigned long long lines = (bytes + 7) / 8 + 1;
  const unsigned flag = static_cast<unsigned>(sequence);
  const unsigned long long ll_offset =
      oneshot_area_end(members, slot_bytes) +
      (sequence & 1) * static_cast<unsigned long long>(members) * kLLSlotBytes;
  const unsigned long long bit = kind == 1   ? kAllgatherBit
                                 : kind == 2 ? kReduceScatterBit
                                 : kind == 3 ? kBroadcastBit
                                             : kReduceBit | static_cast<unsigned long long>(root) << 53;
  const unsigned long long signature =
      bit | count << 8 | static_cast<unsigned long long>(type) << 4 |
      static_cast<unsigned>(kind == 3 ? root : kind == 1 ? 0 : op);
  const auto* input = static_cast<const unsigned char*>(kind == 3 ? out : in);
  auto* output = static_cast<unsigned char*>(out);
  const unsigned long long first = blockIdx.x * blockDim.x + threadIdx.x;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  const auto slot_line = [&](int area, int slot, unsigned long long line) {
    return areas.area[area] + ll_offset + static_cast<unsigned long long>(slot) * kLLSlotBytes +
           line * 16;
  };
  for (unsigned long long line = first; line < lines; line += stride) {
    const unsigned long long at = (line - 1) * 8;
    for (int k = 1; k < members; ++k) {
      const int j = me + k < members ? me + k : me + k - members;
      unsigned long long data = signature;
      if (line > 0) {
        if ((kind == 3 && me != root) || (kind == 4 && j != root)) continue;
        data = kind == 2 ? ll_input(input + static_cast<unsigned long long>(j) * bytes, bytes, at)
                         : ll_input(input, bytes, at);
      }
      ll_store(slot_line(j, me, line), data, flag);
    }
  }
  for (unsigned long long line = first; line < lines; line += stride) {
    const unsigned long long at = (line - 1) * 8;
    if (line == 0) {
      for (int j = 0; j < members; ++j) {
        unsigned long long theirs = 0;
        if (j == me) continue;
        if (!ll_load(slot_line(me, j, 0), flag, words, deadline, j, &theirs)) return;
        if (theirs != signature) {
          words[1] = 1;
          words[0] = 1;
          return;
        }
      }
      continue;
    }
    if (kind == 1) {  // allgather: the own part, then each peer's
      ll_output(output + static_cast<unsigned long long>(me) * bytes, bytes, at,
                ll_input(input, bytes, at));
      for (int j = 0; j < members; ++j) {
        unsigned long long data = 0;
        if (j == me) continue;
        if (!ll_load(slot_line(me, j, line), flag, words, deadline, j, &data)) return;
        ll_output(output + static_cast<unsigned long long>(j) * bytes, bytes, at, data);
      }
    } else if (kind == 3) {  // broadcast: the root's line
      if (me == root) continue;
      unsigned long long data = 0;
      if (!ll_load(slot_line(me, root, line), flag, words, deadline, root, &data)) return;
      ll_output(output, bytes, at, data);
    } else if (kind == 4) {  // reduce: every member's line at the root, in the host's order
      if (me != root) continue;
      unsigned long long got[kMaxMembers];
      for (int j = 0; j < members; ++j) {
        got[j] = 0;
        if (j == me) {
          got[j] = ll_input(input, bytes, at);
        } else if (!ll_load(slot_line(me, j, line), flag, words, deadline, j, &got[j])) {
          return;
        }
      }
      const Order order(count, members, true);
      with_element(type, [&](auto element, bool bitwise) {
        using E = decltype(element);
        using T = typename E::Storage;
        with_op(op, bitwise, [&](auto kOp) {
          ll_lanes<E>(out, count, line, got, members,
                      [&](const T (&x)[kMaxMembers], unsigned long long i) {
                        if (ring == 0) return tree_combine<E, kOp>(x, members, root);
                        // Ring block b is reduced at member b along b + 1, b + 2, ..., b
                        // (Group::reduce's reduce-scatter, ferry_reduce_mesh).
                        const int b = ring_block(order, i);
                        const int start = b + 1 < members ? b + 1 : 0;
                        T acc = x[start];
                        for (int k = 1; k < members; ++k) {
                          acc = E::template combine<kOp>(
                              acc, x[start + k < members ? start + k : start + k - members]);
                        }
                        return acc;
                      });
        });
      });
    } else {  // reduce-scatter: this member's block from every member, along the ring's chain
      unsigned long long got[kMaxMembers];
      for (int j = 0; j < members; ++j) {
        got[j] = 0;
        if (j == me) {
          got[j] = ll_input(input + static_cast<unsigned long long>(me) * bytes, bytes, at);
        } else if (!ll_load(slot_line(me, j, line), flag, words, deadline, j, &got[j])) {
          return;
        }
      }
      const int start = me + 1 < members ? me + 1 : 0;
      with_element(type, [&](auto element, bool bitwise) {
        with_op(op, bitwise, [&](auto kOp) {
          ll_chain<decltype(element), kOp>(out, count, line, got, members, start);
        });
      });
    }
  }
}

// The end of a call on a stream: the launch's last block raises the call's number in counters[0]
// (counters[1] counts the blocks that finished).
__device__ __forceinline__ void count_call(unsigned long long* counters,
                                           unsigned long long sequence) {
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    auto* blocks_done = reinterpret_cast<unsigned*>(counters + 1);
    if (atomicAdd(blocks_done, 1u) == gridDim.x - 1) {
      *blocks_done = 0;
      *reinterpret_cast<volatile unsigned long long*>(counters) = sequence;
      __threadfence();
    }
  }
}

}  // namespace

// The call enqueued on an application's stream (Cuda::collective_on_stream): LL up to `ll_bytes`
// (FERRY_STREAM_LL, at most kLLMaxBytes), else the one-shot kernel's blocks and flags. The GPU
// keeps the call's number (counters[0], raised by the launch's last block; counters[1] counts the
// blocks), so that every replay of a graph that captured the launch is a call of its own, with no
// host in the loop. A block that waits for its peers past `timeout_ns` (0: no limit) stops and
// sets words[2]; words[0], raised by the host, stops it as in the launched call.
extern "C" __global__ void __launch_bounds__(512)
    ferry_allreduce_on_stream(void* out, const void* in, unsigned long long count, int type, int op,
                              int members, int me, int ring, unsigned long long slot_bytes,
                              Areas areas, volatile unsigned* words, unsigned long long* counters,
                              unsigned long long timeout_ns, unsigned long long ll_bytes) {
  __shared__ unsigned long long sequence;
  if (threadIdx.x == 0) sequence = *reinterpret_cast<volatile unsigned long long*>(counters) + 1;
  __syncthreads();
  const unsigned long long deadline = timeout_ns != 0 ? now_ns() + timeout_ns : 0;
  if (count * type_size(type) <= ll_bytes && ll_bytes <= kLLMaxBytes) {
    ll_allreduce(out, in, count, type, op, members, me, ring, sequence, slot_bytes, areas, words,
                 deadline);
  } else {
    oneshot_block<true>(out, in, count, type, op, members, me, ring, sequence, slot_bytes, areas,
                        words, blockIdx.x, gridDim.x, deadline);
  }
  count_call(counters, sequence);
}

// Whether a call of `kind` whose part is `bytes` goes by LL lines (Cuda::collective_on_stream
// computes the grid by the same rule): allgather, broadcast and reduce-scatter up to `ll_bytes`
// (FERRY_STREAM_LL, at most kLLMaxBytes), and reduce (in the ring's order or the binomial tree's,
// as the host path at that size).
__device__ __forceinline__ bool mesh_by_ll(int kind, unsigned long long bytes,
                                           unsigned long long ll_bytes) {
  return kind != 0 && bytes <= ll_bytes && ll_bytes <= kLLMaxBytes;
}

// A collective among 2 to kMaxMembers members enqueued on an application's stream, on the same
// area and counters as ferry_allreduce_on_stream (the calls of both kernels are numbered
// together): `kind` is Cuda::OneShot::Kind's (0: an allreduce by the two-shot mesh kernel,
// 1: allgather, 2: reduce-scatter, 3: broadcast from `root`, 4: reduce to `root`, between two
// members by reduce_pair); small ones by
// LL lines (ll_mesh), the others the launched kernel's blocks (kernels/twoshot.cuh,
// kernels/mesh.cuh) with the number the GPU keeps. `stride`: the elements between members' blocks
// of an allgather's output or a reduce-scatter's input (count, or a larger call's count for its
// rounds, which the host sends with ll_bytes 0).
extern "C" __global__ void __launch_bounds__(512)
    ferry_mesh_on_stream(void* out, const void* in, unsigned long long count, int type, int op,
                         int members, int me, int ring, unsigned long long slot_bytes, Areas areas,
                         volatile unsigned* words, unsigned long long* counters,
                         unsigned long long timeout_ns, int kind, int root,
                         unsigned long long ll_bytes, unsigned long long stride) {
  __shared__ unsigned long long sequence;
  if (threadIdx.x == 0) sequence = *reinterpret_cast<volatile unsigned long long*>(counters) + 1;
  __syncthreads();
  const unsigned long long deadline = timeout_ns != 0 ? now_ns() + timeout_ns : 0;
  if (mesh_by_ll(kind, count * type_size(type), ll_bytes)) {
    ll_mesh(kind, out, in, count, type, op, members, me, ring, root, sequence, slot_bytes, areas,
            words, deadline);
    count_call(counters, sequence);
    return;
  }
  switch (kind) {
    case 0:
      twoshot_mesh(out, in, count, type, op, members, me, ring, sequence, slot_bytes, areas, words,
                   deadline);
      break;
    case 1:
      allgather_mesh(out, in, count, stride, type, members, me, sequence, slot_bytes, areas, words,
                     deadline);
      break;
    case 2:
      reduce_scatter_mesh(out, in, count, stride, type, op, members, me, sequence, slot_bytes,
                          areas, words, deadline);
      break;
    case 3:
      broadcast_mesh(out, count, type, members, me, sequence, slot_bytes, areas, words, deadline,
                     root);
      break;
    default:
      if (members == 2 && count * type_size(type) <= 2 * slot_bytes) {
        reduce_pair(out, in, count, type, op, me, sequence, slot_bytes, areas, words, deadline,
                    root);
      } else {
        reduce_mesh(out, in, count, type, op, members, me, sequence, slot_bytes, areas, words,
                    deadline, root);
      }
      break;
  }
  count_call(counters, sequence);
}
