// The one-shot allreduce kernel: part of kernels.cu's translation unit (after elements.cuh).
#pragma once

// ---- One-shot allreduce among the GPUs of one node ----
//
// Every member owns an exchange area that every other member has mapped (CUDA IPC): two
// generations (by the parity of the call's sequence number) of one slot per member, then one
// flag per (generation, member, block). Block b of each member pushes its slice of the input into
// slot `me` of every peer's area, fences, and raises its flag there to the sequence number; then it
// waits for the flags of block b of every peer in its own area, and reduces the slice from its own
// input and the slots, all local memory. A member can run at most one call ahead of another (it
// needs the other's data to finish), so two generations keep a slot from being overwritten while
// it is read. The reduction order is recursive doubling's (include/ferry/ferry.hpp: the host
// algorithm for these sizes), so results are bitwise those of the host path.
namespace {

constexpr int kMaxMembers = 8;
constexpr int kMaxBlocks = 128;

struct Areas {
  unsigned char* area[kMaxMembers];  // each member's exchange area as mapped here
};

__device__ __forceinline__ unsigned long long load_relaxed(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}
__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// The order of the host algorithm the call stands in for: recursive doubling (a tree), or the
// ring's reduce-scatter, where block b of n (count / n elements, the first count % n blocks one
// more) is reduced along the chain of members b, b + 1, ... (mod n), the partial result first.
struct Order {
  __device__ Order(std::size_t count, int members, bool ring)
      : members(members),
        ring(ring),
        base(count / static_cast<std::size_t>(members)),
        longer(count % static_cast<std::size_t>(members)) {
    pow2 = 1;
    while (pow2 * 2 <= members) pow2 *= 2;
    extra = members - pow2;
  }
  int members;
  bool ring;
  std::size_t base, longer;
  int pow2, extra;
};

__device__ __forceinline__ std::size_t type_size(int type) {
  return type == kInt8 || type == kUint8                                              ? 1
         : type == kInt16 || type == kUint16 || type == kFloat16 || type == kBfloat16 ? 2
         : type == kInt32 || type == kUint32 || type == kFloat32                      ? 4
                                                                                      : 8;
}

// Among three or more members an area has, after the slots and the flags, 2 generations x members
// slots more where the two-shot mesh kernel's owners write the reduced parts (kernels/twoshot.cuh;
// Cuda::oneshot_area_bytes): where they start.
__device__ __forceinline__ std::size_t mesh_results(int members, std::size_t slot_bytes) {
  return 2 * static_cast<std::size_t>(members) * slot_bytes +
         4 * static_cast<std::size_t>(members) * kMaxBlocks * 16;
}

// Flag values: a call's sequence number in the low 48 bits, a two-shot call's round above them.
constexpr unsigned long long kSequenceBits = (1ull << 48) - 1;

__device__ __forceinline__ void store_relaxed(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// Run by thread 0 of block `block`, after the block's stores: raises this member's flag for the
// block, (value, signature), in every peer's flag array at `flags_offset` (of 16-byte flags,
// [member][block]). The signatures, then one fence.acq_rel.sys (which the block's barrier before
// makes cumulative over its threads' stores), then the values as relaxed stores: a flag barrier
// among four H100s took 4.8 us so against 8.2 with a fence.sc.sys and a release store per peer
// (bench/mesh_allreduce_probe.cu); the waiter's one fence after its relaxed reads pairs with it.
__device__ void raise_flags(const Areas& areas, std::size_t flags_offset, int members, int me,
                            unsigned block, unsigned long long value,
                            unsigned long long signature) {
  const auto flag_of = [&](int j) {
    return reinterpret_cast<unsigned long long*>(areas.area[j] + flags_offset) +
           2 * (static_cast<std::size_t>(me) * kMaxBlocks + block);
  };
  for (int j = 0; j < members; ++j) {
    if (j != me) flag_of(j)[1] = signature;
  }
  asm volatile("fence.acq_rel.sys;" ::: "memory");
  for (int j = 0; j < members; ++j) {
    if (j != me) store_relaxed(flag_of(j), value);
  }
}

// Whether a flag that reads `seen` shows `value`: equal, or where kRounds a later round of the
// same call (a two-shot member may raise round k + 1's flag before its peer saw round k's).
template <bool kRounds>
__device__ __forceinline__ bool reached(unsigned long long seen, unsigned long long value) {
  if (!kRounds) return seen == value;
  return (seen & kSequenceBits) == (value & kSequenceBits) && seen >= value;
}

// Run by thread 0 of block `block`: waits for every peer's flag for the block to show `value` in
// this member's area. Returns 1 where the block must stop: the host raised words[0] (a member
// died, or the call timed out), a peer's call differs (then words[1] is set too), or the GPU's
// clock passed `deadline` (nanoseconds, 0: none; then words[2] is set).
template <bool kRounds>
__device__ int wait_flags(const Areas& areas, std::size_t flags_offset, int members, int me,
                          unsigned block, unsigned long long value, unsigned long long signature,
                          volatile unsigned* words, unsigned long long deadline = 0) {
  const auto flag_of = [&](int j) {
    return reinterpret_cast<const unsigned long long*>(areas.area[me] + flags_offset) +
           2 * (static_cast<std::size_t>(j) * kMaxBlocks + block);
  };
  for (int j = 0; j < members; ++j) {
    if (j == me) continue;
    const auto* flag = flag_of(j);
    // The grid follows the size, so a peer whose call differs may not run this block; its
    // block 0, which always runs, shows the difference. The stop word is host memory, a slow
    // read: look at it once in a while.
    const auto* block0 = flag - 2 * static_cast<std::size_t>(block);
    for (unsigned spins = 1; !reached<kRounds>(load_relaxed(flag), value); ++spins) {
      if ((spins & 63) == 0 && block != 0 &&
          (load_relaxed(block0) & kSequenceBits) == (value & kSequenceBits)) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        if (block0[1] != signature) {
          words[1] = 1;
          return 1;
        }
      }
      if ((spins & 4095) == 0) {
        // Who is waited for, for the host (spin_must_stop).
        words[3] = static_cast<unsigned>(j) + 1;
        if (words[0] != 0) return 1;
        if (deadline != 0 && now_ns() > deadline) {
          words[2] = 1;
          return 1;
        }
      }
    }
  }
  // One fence for every peer's flag: what each wrote before raising it is visible from here.
  asm volatile("fence.acq_rel.sys;" ::: "memory");
  for (int j = 0; j < members; ++j) {
    if (j != me && flag_of(j)[1] != signature) {
      words[1] = 1;
      return 1;
    }
  }
  return 0;
}

// raise_flags, then wait_flags for a one-shot call.
__device__ int exchange_flags(const Areas& areas, std::size_t flags_offset, int members, int me,
                              unsigned block, unsigned long long sequence,
                              unsigned long long signature, volatile unsigned* words,
                              unsigned long long deadline) {
  raise_flags(areas, flags_offset, members, me, block, sequence, signature);
  return wait_flags<false>(areas, flags_offset, members, me, block, sequence, signature, words,
                           deadline);
}

// Block `block` of `blocks`'s part of [lo, hi): whole 16-byte units of elements.
__device__ void block_part(std::size_t lo, std::size_t hi, std::size_t unit, unsigned block,
                           unsigned blocks, std::size_t* first, std::size_t* last) {
  const std::size_t per_block = (hi - lo + blocks - 1) / blocks;
  const std::size_t span = (per_block + unit - 1) / unit * unit;
  const std::size_t start = lo + span * block;
  *first = start < hi ? start : hi;
  *last = *first + span < hi ? *first + span : hi;
}

// The ring's block (of its reduce-scatter) that element i belongs to.
__device__ __forceinline__ int ring_block(const Order& order, std::size_t i) {
  const std::size_t head = order.longer * (order.base + 1);
  return static_cast<int>(i < head ? i / (order.base + 1)
                                   : order.longer + (i - head) / order.base);
}

// Element i reduced over the members' values x[0..members) in the order's sequence.
template <class E, int kOp>
__device__ __forceinline__ typename E::Storage combine_members(
    const typename E::Storage (&x)[kMaxMembers], const Order& order, std::size_t i) {
  using T = typename E::Storage;
  if (order.ring) {
    const int b = ring_block(order, i);
    T acc = x[0];
#pragma unroll
    for (int m = 1; m < kMaxMembers; ++m) {
      if (m == b) acc = x[m];
    }
    for (int k = 1; k < order.members; ++k) {
      const int j = b + k < order.members ? b + k : b + k - order.members;
#pragma unroll
      for (int m = 0; m < kMaxMembers; ++m) {
        if (m == j) acc = E::template combine<kOp>(acc, x[m]);
      }
    }
    return acc;
  }
  // Members below 2 * extra fold in pairs (the lower one's data first); then the pow2
  // survivors combine like recursive doubling: at distance 1, 2, 4..., lower index first.
  T v[kMaxMembers];
#pragma unroll
  for (int k = 0; k < kMaxMembers; ++k) {
    if (k < order.pow2) {
      v[k] =
          k < order.extra ? E::template combine<kOp>(x[2 * k], x[2 * k + 1]) : x[k + order.extra];
    }
  }
#pragma unroll
  for (int step = 1; step < kMaxMembers; step *= 2) {
#pragma unroll
    for (int k = 0; k + step < kMaxMembers; k += 2 * step) {
      if (k + step < order.pow2) v[k] = E::template combine<kOp>(v[k], v[k + step]);
    }
  }
  return v[0];
}

// out[first, last) = the members' data reduced in the order's sequence: this member's from `in`,
// the others' from their slots in this member's area. first is a whole number of 16-byte units
// into the buffers. kWide (the launched kernel): with two members, where every buffer is 16-byte
// aligned, the body goes in 16-byte loads (either order is one combine: member 0's value first,
// or with the ring's order member 1's first in the second block). Otherwise, and always in the
// resident kernel (whose calls are small, and whose registers the wide path would crowd onto the
// stack: 3 us more per 8-byte call), element by element.
template <class E, int kOp, bool kWide>
__device__ void oneshot_reduce(void* out_buffer, const void* in_buffer, std::size_t count,
                               std::size_t first, std::size_t last, int members, int me, bool ring,
                               const Areas& areas, std::size_t slot_offset,
                               std::size_t slot_bytes) {
  using T = typename E::Storage;
  constexpr std::size_t kVector = 16 / sizeof(T);
  auto* out = static_cast<T*>(out_buffer);
  const T* source[kMaxMembers];
  std::uintptr_t alignment =
      reinterpret_cast<std::uintptr_t>(out) | reinterpret_cast<std::uintptr_t>(in_buffer);
#pragma unroll
  for (int j = 0; j < kMaxMembers; ++j) {
    source[j] = nullptr;
    if (j < members) {
      source[j] = j == me ? static_cast<const T*>(in_buffer)
                          : reinterpret_cast<const T*>(areas.area[me] + slot_offset +
                                                       static_cast<std::size_t>(j) * slot_bytes);
      alignment |= reinterpret_cast<std::uintptr_t>(source[j]);
    }
  }
  const Order order(count, members, ring);
  std::size_t tail = first;
  if (kWide && members == 2 && (alignment & 15) == 0) {
    union Lanes {
      uint4 whole;
      T item[kVector];
    };
    // The ring's first block (member 0's value first) is the longer half.
    const std::size_t split = ring ? (count + 1) / 2 : count;
    const std::size_t end = last / kVector;
    for (std::size_t v = first / kVector + threadIdx.x; v < end; v += blockDim.x) {
      Lanes x, y, z;
      x.whole = reinterpret_cast<const uint4*>(source[0])[v];
      y.whole = reinterpret_cast<const uint4*>(source[1])[v];
#pragma unroll
      for (std::size_t e = 0; e < kVector; ++e) {
        const bool zero_first = v * kVector + e < split;
        z.item[e] = E::template combine<kOp>(zero_first ? x.item[e] : y.item[e],
                                             zero_first ? y.item[e] : x.item[e]);
      }
      reinterpret_cast<uint4*>(out)[v] = z.whole;
    }
    tail = end * kVector > first ? end * kVector : first;
  }
  for (std::size_t i = tail + threadIdx.x; i < last; i += blockDim.x) {
    T item[kMaxMembers];
#pragma unroll
    for (int j = 0; j < kMaxMembers; ++j) {
      if (j < members) item[j] = source[j][i];
    }
    out[i] = combine_members<E, kOp>(item, order, i);
  }
}

// One type's reduction of a one-shot slice, by op. Its own switch, not with_op: with a lambda per
// (type, op) the resident kernel's stack frame grew from 2 KB to 6 KB (ptxas -v), and its calls
// were measured with this code.
template <class E, bool kWide>
__device__ void oneshot_op(int op, bool bitwise, void* out, const void* in, std::size_t count,
                           std::size_t first, std::size_t last, int members, int me, bool ring,
                           const Areas& areas, std::size_t slot_offset, std::size_t slot_bytes) {
#define FERRY_ONESHOT(kOp)                                                                    \
  return oneshot_reduce<E, kOp, kWide>(out, in, count, first, last, members, me, ring, areas, \
                                       slot_offset, slot_bytes)
  switch (op) {
    case kSum:
      FERRY_ONESHOT(kSum);
    case kProd:
      FERRY_ONESHOT(kProd);
    case kMin:
      FERRY_ONESHOT(kMin);
    case kMax:
      FERRY_ONESHOT(kMax);
    default:
      break;
  }
  if (!bitwise) return;
  switch (op) {
    case kBitAnd:
      FERRY_ONESHOT(kBitAnd);
    case kBitOr:
      FERRY_ONESHOT(kBitOr);
    case kBitXor:
      FERRY_ONESHOT(kBitXor);
    default:
      break;
  }
#undef FERRY_ONESHOT
}

}  // namespace

// Block `block` of `blocks` of one member's one-shot call: out = the reduction of every member's
// `in` over `count` elements; see above. words[0] is a host word: nonzero makes a block stop
// waiting (a member died, or the call timed out); a block sets words[1] when a peer's call differs
// in count, type or op. The grid (at most kMaxBlocks blocks) follows the size, the same on every
// member for the same call; block b waits for block b of each peer, until `deadline` (wait_flags).
template <bool kWide>
__device__ void oneshot_block(void* out, const void* in, unsigned long long count, int type, int op,
                              int members, int me, int ring, unsigned long long sequence,
                              unsigned long long slot_bytes, const Areas& areas,
                              volatile unsigned* words, unsigned block, unsigned blocks,
                              unsigned long long deadline = 0) {
  const std::size_t size = type_size(type);
  std::size_t first, last;
  block_part(0, count, 16 / size, block, blocks, &first, &last);
  const std::size_t generation = sequence & 1;
  const std::size_t slot_offset = generation * members * slot_bytes;
  // Flags: [generation][member][block] of (sequence, signature).
  const std::size_t flags_offset =
      2 * static_cast<std::size_t>(members) * slot_bytes + generation * members * kMaxBlocks * 16;
  const unsigned long long signature =
      count << 8 | static_cast<unsigned long long>(type) << 4 | static_cast<unsigned>(op);

  // Push the slice to every peer. kWide: each thread loads four 16-byte units before storing
  // them to every peer, so loads stay in flight while stores cross the links (8 MiB between two
  // H200s: 44-46 against 55-56 us a call); else a unit at a time, peer by peer (what a call of
  // one block needs, in the fewest registers).
  const auto* source = static_cast<const unsigned char*>(in) + first * size;
  const std::size_t bytes = (last - first) * size;
  if constexpr (kWide) {
    unsigned char* target[kMaxMembers];
    std::uintptr_t alignment = reinterpret_cast<std::uintptr_t>(source);
#pragma unroll
    for (int j = 0; j < kMaxMembers; ++j) {
      target[j] = nullptr;
      if (j < members && j != me) {
        target[j] =
            areas.area[j] + slot_offset + static_cast<std::size_t>(me) * slot_bytes + first * size;
        alignment |= reinterpret_cast<std::uintptr_t>(target[j]);
      }
    }
    std::size_t tail = 0;
    if ((alignment & 15) == 0) {
      const std::size_t units = bytes / 16;
      const std::size_t stride = blockDim.x;
      const auto* from = reinterpret_cast<const uint4*>(source);
      std::size_t k = threadIdx.x;
      for (; k + 3 * stride < units; k += 4 * stride) {
        const uint4 a = from[k];
        const uint4 b = from[k + stride];
        const uint4 c = from[k + 2 * stride];
        const uint4 d = from[k + 3 * stride];
#pragma unroll
        for (int j = 0; j < kMaxMembers; ++j) {
          if (target[j] == nullptr) continue;
          auto* to = reinterpret_cast<uint4*>(target[j]);
          to[k] = a;
          to[k + stride] = b;
          to[k + 2 * stride] = c;
          to[k + 3 * stride] = d;
        }
      }
      for (; k < units; k += stride) {
        const uint4 a = from[k];
#pragma unroll
        for (int j = 0; j < kMaxMembers; ++j) {
          if (target[j] != nullptr) reinterpret_cast<uint4*>(target[j])[k] = a;
        }
      }
      tail = units * 16;
    }
    for (std::size_t k = tail + threadIdx.x; k < bytes; k += blockDim.x) {
      const unsigned char c = source[k];
#pragma unroll
      for (int j = 0; j < kMaxMembers; ++j) {
        if (target[j] != nullptr) target[j][k] = c;
      }
    }
  } else {
    for (int j = 0; j < members; ++j) {
      if (j == me) continue;
      unsigned char* target =
          areas.area[j] + slot_offset + static_cast<std::size_t>(me) * slot_bytes + first * size;
      std::size_t tail = 0;
      if (((reinterpret_cast<std::uintptr_t>(source) | reinterpret_cast<std::uintptr_t>(target)) &
           15) == 0) {
        for (std::size_t k = threadIdx.x; k < bytes / 16; k += blockDim.x) {
          reinterpret_cast<uint4*>(target)[k] = reinterpret_cast<const uint4*>(source)[k];
        }
        tail = bytes / 16 * 16;
      }
      for (std::size_t k = tail + threadIdx.x; k < bytes; k += blockDim.x) target[k] = source[k];
    }
  }
  // The block's pushes, then (by thread 0, cumulatively for the block) the flags.
  __syncthreads();
  __shared__ int stop;
  if (threadIdx.x == 0) {
    stop = exchange_flags(areas, flags_offset, members, me, block, sequence, signature, words,
                          deadline);
  }
  __syncthreads();
  if (stop == 0) {
    with_element(type, [&](auto element, bool bitwise) {
      oneshot_op<decltype(element), kWide>(op, bitwise, out, in, count, first, last, members, me,
                                           ring != 0, areas, slot_offset, slot_bytes);
    });
  }
}

namespace {

// When `lane_flag` is set, the last block of the launch to finish stores `done` there (host memory
// the CPU polls for completion), after the others counted themselves in `blocks_done` (reset for
// the next call).
__device__ void finish_call(unsigned* blocks_done, volatile unsigned* lane_flag, unsigned done) {
  if (lane_flag == nullptr) return;
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence();
    if (atomicAdd(blocks_done, 1u) == gridDim.x - 1) {
      *blocks_done = 0;
      __threadfence_system();
      *lane_flag = done;
    }
  }
}

}  // namespace

// One launch of a one-shot call (a block per slice, see oneshot_block; finish_call reports it).
extern "C" __global__ void __launch_bounds__(512)
    ferry_allreduce_oneshot(void* out, const void* in, unsigned long long count, int type, int op,
                            int members, int me, int ring, unsigned long long sequence,
                            unsigned long long slot_bytes, Areas areas, volatile unsigned* words,
                            unsigned* blocks_done, volatile unsigned* lane_flag, unsigned done) {
  oneshot_block<true>(out, in, count, type, op, members, me, ring, sequence, slot_bytes, areas,
                      words, blockIdx.x, gridDim.x);
  finish_call(blocks_done, lane_flag, done);
}
