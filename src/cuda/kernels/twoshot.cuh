// The two-shot allreduce kernel: part of kernels.cu's translation unit (after oneshot.cuh).
#pragma once

// ---- Two-shot allreduce between two GPUs ----
//
// Past the one-shot kernel's best size (two members only): each member pushes the half of its
// input that the other reduces into slot space of the other's area, raises its flags, reduces its
// own half from its input and the other's push, writes the result both to its output and into the
// other's area, raises a second set of flags, and copies the other's half of the result out of its
// own area. Each half crosses NVLink twice as in a ring (once as input, once as result), but the
// reduction is fused with the second crossing, and each member reads and writes local memory
// 2.5 times the data instead of the one-shot's 3. For two members the generation's two slots are
// one buffer of 2 x slot_bytes (the one-shot leaves a member's own slot unused), so a call takes
// up to twice the one-shot's limit with no more memory. The halves are split at a whole 16-byte
// unit; the order of operands is the ring's (member 0's value first in the ring's first block,
// (count + 1) / 2 elements; member 1's after), or member 0's first everywhere for recursive
// doubling's order, so the bits are the host path's.
namespace {

template <class E, int kOp>
__device__ void twoshot_reduce(void* out_buffer, const void* in_buffer, const unsigned char* local,
                               unsigned char* remote, std::size_t first, std::size_t last,
                               std::size_t split, int me) {
  using T = typename E::Storage;
  constexpr std::size_t kVector = 16 / sizeof(T);
  auto* out = static_cast<T*>(out_buffer);
  const auto* mine = static_cast<const T*>(in_buffer);
  const auto* theirs = reinterpret_cast<const T*>(local);
  auto* copy = reinterpret_cast<T*>(remote);
  // This member's value is the left operand where it is member 0 below `split`, or member 1 from
  // there.
  const auto combine = [&](std::size_t i, T x, T y) {
    return (i < split) == (me == 0) ? E::template combine<kOp>(x, y)
                                    : E::template combine<kOp>(y, x);
  };
  std::size_t tail = first;
  const std::uintptr_t addresses =
      reinterpret_cast<std::uintptr_t>(out) | reinterpret_cast<std::uintptr_t>(mine);
  if ((addresses & 15) == 0) {
    union Lanes {
      uint4 whole;
      T item[kVector];
    };
    const std::size_t end = last / kVector;
    for (std::size_t v = first / kVector + threadIdx.x; v < end; v += blockDim.x) {
      Lanes x, y, z;
      x.whole = reinterpret_cast<const uint4*>(mine)[v];
      y.whole = reinterpret_cast<const uint4*>(theirs)[v];
#pragma unroll
      for (std::size_t e = 0; e < kVector; ++e) {
        z.item[e] = combine(v * kVector + e, x.item[e], y.item[e]);
      }
      reinterpret_cast<uint4*>(out)[v] = z.whole;
      reinterpret_cast<uint4*>(copy)[v] = z.whole;
    }
    tail = end * kVector > first ? end * kVector : first;
  }
  for (std::size_t i = tail + threadIdx.x; i < last; i += blockDim.x) {
    const T z = combine(i, mine[i], theirs[i]);
    out[i] = z;
    copy[i] = z;
  }
}


// dst = src over `bytes` by the threads of one block.
__device__ void block_copy(unsigned char* dst, const unsigned char* src, std::size_t bytes) {
  strided_copy(dst, src, bytes, threadIdx.x, blockDim.x);
}


}  // namespace

// One launch of a two-shot call (see above; the arguments are ferry_allreduce_oneshot's, with
// members = 2). Block b of each member handles part b of both halves and waits only for block b
// of the other. A call larger than the generation's 2 x slot_bytes goes in rounds of slot_bytes,
// alternating between the two halves of that buffer, each round's halves split at slot_bytes / 2
// and its parts placed as if the round were full, so block b's places are the same in every
// round. Round k + 1's push goes out before the wait for round k's results, so that wait and
// the next round's overlap the copies: block b writes round k + 1's push into the place of round
// k - 1 once it has seen the other's round k push flag (raised after the other copied round
// k - 1's results out) and round k - 1's result flag (raised after the other reduced its round
// k - 1 input). A round's flags carry the round above the sequence number, and a wait takes a
// later round of the same call as well (a member may raise round k + 1's push flag before the
// other saw round k's). 96 registers (one block of 512 threads per multiprocessor, as the grid
// has): left to itself the compiler took 64 and spilled.
extern "C" __global__ void __maxnreg__(96)
    ferry_allreduce_twoshot(void* out, const void* in, unsigned long long count, int type, int op,
                            int members, int me, int ring, unsigned long long sequence,
                            unsigned long long slot_bytes, Areas areas, volatile unsigned* words,
                            unsigned* blocks_done, volatile unsigned* lane_flag, unsigned done) {
  const std::size_t size = type_size(type);
  const std::size_t unit = 16 / size;
  const std::size_t half_way = (count + 1) / 2;
  const std::size_t split = ring != 0 ? half_way : count;
  const int other = 1 - me;
  const std::size_t generation = sequence & 1;
  const std::size_t data_offset = generation * members * slot_bytes;
  const std::size_t push_flags =
      2 * static_cast<std::size_t>(members) * slot_bytes + generation * members * kMaxBlocks * 16;
  const std::size_t result_flags =
      push_flags + 2 * static_cast<std::size_t>(members) * kMaxBlocks * 16;
  // Bit 3 (ops are below 8) tells a two-shot call from a one-shot one of the same count, which
  // members whose FERRY_COLL_DEVICE_TWOSHOT differ would make.
  const unsigned long long signature =
      count << 8 | static_cast<unsigned long long>(type) << 4 | 8u | static_cast<unsigned>(op);
  unsigned char* local = areas.area[me] + data_offset;
  unsigned char* remote = areas.area[other] + data_offset;
  // One round where the call fits the generation's buffer, its halves split at a whole unit past
  // half way; else rounds of slot_bytes split at their middle.
  std::size_t round = count;
  std::size_t half = (half_way + unit - 1) / unit * unit;
  if (count * size > 2 * slot_bytes) {
    round = slot_bytes / size;  // a whole number of units
    half = round / 2;
  }
  if (half > round) half = round;
  const unsigned long long rounds = (count + round - 1) / round;
  std::size_t own_first, own_last, other_first, other_last;
  block_part(me == 0 ? 0 : half, me == 0 ? half : round, unit, blockIdx.x, gridDim.x, &own_first,
             &own_last);
  block_part(other == 0 ? 0 : half, other == 0 ? half : round, unit, blockIdx.x, gridDim.x,
             &other_first, &other_last);
  // A block's part [first, last) of round k, in elements from the round's start (clipped to the
  // last round's length); the round's data lies at (k & 1) * slot_bytes in each area's buffer.
  struct Part {
    std::size_t start, first, last, place;
  };
  const auto part = [&](unsigned long long k, std::size_t first, std::size_t last) {
    const std::size_t start = k * round;
    const std::size_t length = count - start < round ? count - start : round;
    return Part{start, first < length ? first : length, last < length ? last : length,
                (k & 1) * slot_bytes};
  };
  const auto push = [&](unsigned long long k) {
    const Part p = part(k, other_first, other_last);
    block_copy(remote + p.place + p.first * size,
               static_cast<const unsigned char*>(in) + (p.start + p.first) * size,
               (p.last - p.first) * size);
    __syncthreads();
    if (threadIdx.x == 0) {
      raise_flags(areas, push_flags, 2, me, blockIdx.x, sequence | k << 48, signature);
    }
  };
  // One word per wait: no barrier separates a round's last read of a word from thread 0's next
  // write of the other.
  __shared__ int pushed_stop, results_stop;
  push(0);
  for (unsigned long long k = 0; k < rounds; ++k) {
    const unsigned long long value = sequence | k << 48;
    if (threadIdx.x == 0) {
      pushed_stop = wait_flags<true>(areas, push_flags, 2, me, blockIdx.x, value, signature, words);
    }
    __syncthreads();
    if (pushed_stop != 0) break;
    const Part own = part(k, own_first, own_last);
    with_element(type, [&](auto element, bool bitwise) {
      with_op(op, bitwise, [&](auto kOp) {
        twoshot_reduce<decltype(element), kOp>(
            static_cast<unsigned char*>(out) + own.start * size,
            static_cast<const unsigned char*>(in) + own.start * size, local + own.place,
            remote + own.place, own.first, own.last, split > own.start ? split - own.start : 0,
            me);
      });
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      raise_flags(areas, result_flags, 2, me, blockIdx.x, value, signature);
    }
    if (k + 1 < rounds) push(k + 1);
    if (threadIdx.x == 0) {
      results_stop =
          wait_flags<true>(areas, result_flags, 2, me, blockIdx.x, value, signature, words);
    }
    __syncthreads();
    if (results_stop != 0) break;
    const Part theirs = part(k, other_first, other_last);
    block_copy(static_cast<unsigned char*>(out) + (theirs.start + theirs.first) * size,
               local + theirs.place + theirs.first * size, (theirs.last - theirs.first) * size);
  }
  finish_call(blocks_done, lane_flag, done);
}


// ---- Two-shot allreduce among three or more GPUs ----
//
// The same two phases for n members on a full mesh (NVLink through switches, every pair at full
// speed): the call is cut into n parts of whole 16-byte units, part j being member j's. Each
// member writes each other part of its input into its owner's area (at its own index) and raises
// its flags; reduces its own part from its input and the copies in its area, in the host
// algorithm's order, writing the result to its output and, in the same pass, into every other
// member's area of results (at its own index); raises its result flags; and copies the other
// parts' results out of its own area of results. Each member moves 2 (n - 1) / n of the data over
// its links, as a ring does, in two steps instead of 2 (n - 1), all of it by writes: in
// bench/mesh_allreduce_probe.cu (four H100s, 20 calls back to back, float sums), 16 MiB took
// 106 us writing the results against 119-123 reading them from the owners' areas (NCCL 104),
// 8 MiB 69-78 against 75-76, and writing them over the owner's copy of the input (once the other
// member said it had reduced: a third set of flags) 124-125. A call takes at most the
// generation's n slots (a part per slot): larger ones take the ring, which moves them faster
// than this kernel did in rounds (four H100s, 64 MiB: 148 GB/s in rounds of half the slots; the
// ring 242 on four H200s).
namespace {

// Unit v (16 bytes) of the buffers chain[0..members) reduced along the chain, the partial result
// first, element by element.
template <class E, int kOp>
__device__ __forceinline__ uint4 chain_unit(const unsigned char* const (&chain)[kMaxMembers],
                                            int members, std::size_t v) {
  using T = typename E::Storage;
  constexpr std::size_t kVector = 16 / sizeof(T);
  union Lanes {
    uint4 whole;
    T item[kVector];
  };
  Lanes x[kMaxMembers];
#pragma unroll
  for (int k = 0; k < kMaxMembers; ++k) {
    if (k < members) x[k].whole = reinterpret_cast<const uint4*>(chain[k])[v];
  }
  Lanes z;
#pragma unroll
  for (std::size_t e = 0; e < kVector; ++e) {
    T acc = x[0].item[e];
#pragma unroll
    for (int k = 1; k < kMaxMembers; ++k) {
      if (k < members) acc = E::template combine<kOp>(acc, x[k].item[e]);
    }
    z.item[e] = acc;
  }
  return z.whole;
}

// Elements [first, last) of a part (from element `base` of the call) reduced over every member's
// value in the order's sequence: member m's value at sources[m][i - base]; the result stored at
// out[i - base] and at copies[k][i - base] for each k < members - 1 (the other members' areas).
template <class E, int kOp>
__device__ void mesh_reduce(const unsigned char* const (&sources)[kMaxMembers], unsigned char* out,
                            unsigned char* const (&copies)[kMaxMembers], std::size_t base,
                            std::size_t first, std::size_t last, const Order& order) {
  using T = typename E::Storage;
  constexpr std::size_t kVector = 16 / sizeof(T);
  const int members = order.members;
  std::uintptr_t alignment = reinterpret_cast<std::uintptr_t>(out);
#pragma unroll
  for (int m = 0; m < kMaxMembers; ++m) {
    if (m < members) alignment |= reinterpret_cast<std::uintptr_t>(sources[m]);
    if (m + 1 < members) alignment |= reinterpret_cast<std::uintptr_t>(copies[m]);
  }
  // Element by element: where the buffers are not 16-byte aligned, in recursive doubling's order
  // (small calls, by this kernel only where forced), and for the units a ring block's boundary
  // cuts.
  const auto one = [&](std::size_t i) {
    T item[kMaxMembers];
#pragma unroll
    for (int m = 0; m < kMaxMembers; ++m) {
      if (m < members) item[m] = reinterpret_cast<const T*>(sources[m])[i];
    }
    const T z = combine_members<E, kOp>(item, order, base + i);
    reinterpret_cast<T*>(out)[i] = z;
#pragma unroll
    for (int k = 0; k + 1 < kMaxMembers; ++k) {
      if (k + 1 < members) reinterpret_cast<T*>(copies[k])[i] = z;
    }
  };
  std::size_t tail = first;
  if ((alignment & 15) == 0 && order.ring) {
    const std::size_t end = last / kVector;
    for (std::size_t v = first / kVector + threadIdx.x; v < end; v += blockDim.x) {
      const std::size_t i = base + v * kVector;
      const int b = ring_block(order, i);
      if (ring_block(order, i + kVector - 1) != b) {
        for (std::size_t e = 0; e < kVector; ++e) one(v * kVector + e);
        continue;
      }
      // The ring's chain for block b: members b, b + 1, ... (mod n).
      const unsigned char* chain[kMaxMembers];
#pragma unroll
      for (int k = 0; k < kMaxMembers; ++k) {
        chain[k] = k < members ? sources[b + k < members ? b + k : b + k - members] : nullptr;
      }
      const uint4 z = chain_unit<E, kOp>(chain, members, v);
      reinterpret_cast<uint4*>(out)[v] = z;
#pragma unroll
      for (int k = 0; k + 1 < kMaxMembers; ++k) {
        if (k + 1 < members) reinterpret_cast<uint4*>(copies[k])[v] = z;
      }
    }
    tail = end * kVector > first ? end * kVector : first;
  }
  for (std::size_t i = tail + threadIdx.x; i < last; i += blockDim.x) one(i);
}

}  // namespace

namespace {

// A two-shot call among 3 to kMaxMembers members (see above; the arguments are
// ferry_allreduce_oneshot's, and a deadline by the GPU's clock, 0: none), run by each block:
// launched (ferry_allreduce_twoshot_mesh) or on an application's stream (ferry_mesh_on_stream).
// Block b handles sub-part b of every part and waits only for block b of each peer. The caller
// keeps a part within a slot (count * size <= members * slot_bytes).
__device__ void twoshot_mesh(void* out, const void* in, unsigned long long count, int type, int op,
                             int members, int me, int ring, unsigned long long sequence,
                             unsigned long long slot_bytes, const Areas& areas,
                             volatile unsigned* words, unsigned long long deadline) {
  const std::size_t size = type_size(type);
  const std::size_t unit = 16 / size;
  const auto n = static_cast<std::size_t>(members);
  const std::size_t generation = sequence & 1;
  const std::size_t data_offset = generation * n * slot_bytes;
  const std::size_t copied_flags = 2 * n * slot_bytes + generation * n * kMaxBlocks * 16;
  const std::size_t result_flags = copied_flags + 2 * n * kMaxBlocks * 16;
  const std::size_t results_offset = mesh_results(members, slot_bytes) + generation * n * slot_bytes;
  // Bit 3 marks a two-shot call, as in the two-member kernel.
  const unsigned long long signature =
      count << 8 | static_cast<unsigned long long>(type) << 4 | 8u | static_cast<unsigned>(op);
  // Part j at j * part_bytes of the generation in every area (slots are multiples of 256 bytes,
  // so a part that fits one is whole units).
  const std::size_t part = ((count + n - 1) / n + unit - 1) / unit * unit;
  const std::size_t part_bytes = part * size;
  std::size_t first, last;
  block_part(0, part, unit, blockIdx.x, gridDim.x, &first, &last);
  const Order order(count, members, ring != 0);
  // Member j's part: its first element, and this block's share [lo, hi) of it.
  struct Share {
    std::size_t base, lo, hi;
  };
  const auto share = [&](int j) {
    const std::size_t base = static_cast<std::size_t>(j) * part;
    const std::size_t length = base < count ? (count - base < part ? count - base : part) : 0;
    return Share{base, first < length ? first : length, last < length ? last : length};
  };
  const auto at = [&](int j) {
    return data_offset + static_cast<std::size_t>(j) * part_bytes;
  };
  // Each other part into its owner's area at this member's place (writes over NVLink, the next
  // member first), then the flags.
  for (int k = 1; k < members; ++k) {
    const int j = me + k < members ? me + k : me + k - members;
    const Share s = share(j);
    block_copy(areas.area[j] + at(me) + s.lo * size,
               static_cast<const unsigned char*>(in) + (s.base + s.lo) * size,
               (s.hi - s.lo) * size);
  }
  __syncthreads();
  __shared__ int stop;
  if (threadIdx.x == 0) {
    raise_flags(areas, copied_flags, members, me, blockIdx.x, sequence, signature);
    stop = wait_flags<false>(areas, copied_flags, members, me, blockIdx.x, sequence, signature,
                             words, deadline);
  }
  __syncthreads();
  if (stop == 0) {
    const Share own = share(me);
    const unsigned char* sources[kMaxMembers];
#pragma unroll
    for (int m = 0; m < kMaxMembers; ++m) {
      sources[m] = nullptr;
      if (m < members) {
        sources[m] = m == me ? static_cast<const unsigned char*>(in) + own.base * size
                             : areas.area[me] + at(m);
      }
    }
    // The result to the output and into every other member's area of results, at this member's
    // place (writes over NVLink, the next member first).
    unsigned char* const result = static_cast<unsigned char*>(out) + own.base * size;
    unsigned char* copies[kMaxMembers];
#pragma unroll
    for (int k = 0; k < kMaxMembers; ++k) {
      const int j = me + 1 + k < members ? me + 1 + k : me + 1 + k - members;
      copies[k] = k + 1 < members ? areas.area[j] + results_offset + (at(me) - data_offset)
                                  : nullptr;
    }
    with_element(type, [&](auto element, bool bitwise) {
      with_op(op, bitwise, [&](auto kOp) {
        mesh_reduce<decltype(element), kOp>(sources, result, copies, own.base, own.lo, own.hi,
                                            order);
      });
    });
    __syncthreads();
    // A second word: no barrier separates the first's last read from this write.
    __shared__ int results_stop;
    if (threadIdx.x == 0) {
      raise_flags(areas, result_flags, members, me, blockIdx.x, sequence, signature);
      results_stop = wait_flags<false>(areas, result_flags, members, me, blockIdx.x, sequence,
                                       signature, words, deadline);
    }
    __syncthreads();
    if (results_stop == 0) {
      for (int j = 0; j < members; ++j) {
        if (j == me) continue;
        const Share s = share(j);
        block_copy(static_cast<unsigned char*>(out) + (s.base + s.lo) * size,
                   areas.area[me] + results_offset + (at(j) - data_offset) + s.lo * size,
                   (s.hi - s.lo) * size);
      }
    }
  }
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512)
    ferry_allreduce_twoshot_mesh(void* out, const void* in, unsigned long long count, int type,
                                 int op, int members, int me, int ring,
                                 unsigned long long sequence, unsigned long long slot_bytes,
                                 Areas areas, volatile unsigned* words, unsigned* blocks_done,
                                 volatile unsigned* lane_flag, unsigned done) {
  twoshot_mesh(out, in, count, type, op, members, me, ring, sequence, slot_bytes, areas, words, 0);
  finish_call(blocks_done, lane_flag, done);
}
