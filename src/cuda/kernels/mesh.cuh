// ---- Allgather, reduce-scatter, broadcast and reduce among the GPUs of one node ----
//
// The two halves of the two-shot mesh allreduce as collectives of their own, on the one-shot
// exchange area and its flags, over NVLink. Allgather: each member copies its input into its own
// area (the generation's data), raises its flags, copies its input to its place in the output, and
// reads the peers' inputs from their areas into theirs. Reduce-scatter: each member writes block j
// of its input into member j's area (at the generation's data + its own index * part bytes:
// writes, because on four H100s they took 16 MiB at 171 GB/s of bus bandwidth where copying the
// blocks into the own area for their owners to read took 147-154), raises its flags, and reduces
// its own block from its input and the copies in its area in the ring's order
// (ring_reduce_scatter's chain: member me + 1's value first, its own last). Broadcast: the call is
// cut into a part per member; the root copies its buffer into its area, each other member copies
// its part from the root's area into its own area and its buffer, and then the other parts from
// their owners' areas (the root's egress is the data once, not members - 1 times; a chain
// pipelined in 16 KiB chunks per block, tried instead, took 8 MiB at 83-88 GB/s against 102-104).
// Reduce: the reduce-scatter on the ring's blocks (Group::reduce's ring: block r, of count /
// members elements or one more, reduced at member r along the same chain), each result left in
// its member's area, from where the root reads them. Block b of each member waits only for block
// b of the others. The caller keeps a call within the generation (allgather: its input;
// reduce-scatter and reduce: a block per slot; broadcast: the data).
namespace {

// Signatures: the allreduce's fields with a bit of their own, so that members whose calls differ
// in kind see it as they see a difference in count.
constexpr unsigned long long kAllgatherBit = 1ull << 58;
constexpr unsigned long long kReduceScatterBit = 1ull << 59;
constexpr unsigned long long kBroadcastBit = 1ull << 60;
constexpr unsigned long long kReduceBit = 1ull << 61;  // and the root at bit 53

// out[first, last) = the members' sources[m][first, last) reduced along the chain start,
// start + 1, ... (mod members), the partial result first.
template <class E, int kOp>
__device__ void chain_reduce(const unsigned char* const (&sources)[kMaxMembers], unsigned char* out,
                             int members, int start, std::size_t first, std::size_t last) {
  using T = typename E::Storage;
  constexpr std::size_t kVector = 16 / sizeof(T);
  const unsigned char* chain[kMaxMembers];
  std::uintptr_t alignment = reinterpret_cast<std::uintptr_t>(out);
#pragma unroll
  for (int k = 0; k < kMaxMembers; ++k) {
    chain[k] = nullptr;
    if (k < members) {
      chain[k] = sources[start + k < members ? start + k : start + k - members];
      alignment |= reinterpret_cast<std::uintptr_t>(chain[k]);
    }
  }
  std::size_t tail = first;
  if ((alignment & 15) == 0) {
    const std::size_t end = last / kVector;
    for (std::size_t v = first / kVector + threadIdx.x; v < end; v += blockDim.x) {
      reinterpret_cast<uint4*>(out)[v] = chain_unit<E, kOp>(chain, members, v);
    }
    tail = end * kVector > first ? end * kVector : first;
  }
  for (std::size_t i = tail + threadIdx.x; i < last; i += blockDim.x) {
    T acc = reinterpret_cast<const T*>(chain[0])[i];
    for (int k = 1; k < members; ++k) {
      acc = E::template combine<kOp>(acc, reinterpret_cast<const T*>(chain[k])[i]);
    }
    reinterpret_cast<T*>(out)[i] = acc;
  }
}

}  // namespace

namespace {

// The bodies of the kernels below, run by each block: launched (ferry_*_mesh, completion by
// finish_call) or on an application's stream (ferry_mesh_on_stream, kernels/on_stream.cuh, which
// passes the call's number the GPU keeps and a deadline by the GPU's clock; 0: none).

// One allgather among 2 to kMaxMembers members (see above; `count` elements per member, member
// j's at j * stride elements of `out`: a round of a larger call takes a part of each member's).
// The caller keeps count * size within members * slot_bytes.
__device__ void allgather_mesh(void* out, const void* in, unsigned long long count,
                               unsigned long long stride, int type, int members, int me,
                               unsigned long long sequence, unsigned long long slot_bytes,
                               const Areas& areas, volatile unsigned* words,
                               unsigned long long deadline) {
  const auto n = static_cast<std::size_t>(members);
  const std::size_t data_offset = (sequence & 1) * n * slot_bytes;
  const std::size_t flags = 2 * n * slot_bytes + (sequence & 1) * n * kMaxBlocks * 16;
  const unsigned long long signature =
      kAllgatherBit | count << 8 | static_cast<unsigned long long>(type) << 4;
  const std::size_t bytes = count * type_size(type);
  const std::size_t stride_bytes = stride * type_size(type);
  std::size_t first, last;
  block_part(0, bytes, 16, blockIdx.x, gridDim.x, &first, &last);
  const auto* input = static_cast<const unsigned char*>(in);
  auto* output = static_cast<unsigned char*>(out);
  block_copy(areas.area[me] + data_offset + first, input + first, last - first);
  __syncthreads();
  if (threadIdx.x == 0) raise_flags(areas, flags, members, me, blockIdx.x, sequence, signature);
  // While the peers copy theirs: this member's own place in the output.
  block_copy(output + static_cast<std::size_t>(me) * stride_bytes + first, input + first,
             last - first);
  __shared__ int stop;
  if (threadIdx.x == 0) {
    stop = wait_flags<false>(areas, flags, members, me, blockIdx.x, sequence, signature, words,
                             deadline);
  }
  __syncthreads();
  if (stop == 0) {
    // Each member reads from the next one first, so no area is read by every member at once.
    for (int k = 1; k < members; ++k) {
      const int j = me + k < members ? me + k : me + k - members;
      block_copy(output + static_cast<std::size_t>(j) * stride_bytes + first,
                 areas.area[j] + data_offset + first, last - first);
    }
  }
}

// One reduce-scatter among 2 to kMaxMembers members (see above; `count` elements per member's
// block, block j at j * stride elements of `in`: a round of a larger call takes a part of each
// block). The caller keeps count * size within slot_bytes.
__device__ void reduce_scatter_mesh(void* out, const void* in, unsigned long long count,
                                    unsigned long long stride, int type, int op, int members,
                                    int me, unsigned long long sequence,
                                    unsigned long long slot_bytes, const Areas& areas,
                                    volatile unsigned* words, unsigned long long deadline) {
  const std::size_t size = type_size(type);
  const auto n = static_cast<std::size_t>(members);
  const std::size_t data_offset = (sequence & 1) * n * slot_bytes;
  const std::size_t flags = 2 * n * slot_bytes + (sequence & 1) * n * kMaxBlocks * 16;
  const unsigned long long signature = kReduceScatterBit | count << 8 |
                                       static_cast<unsigned long long>(type) << 4 |
                                       static_cast<unsigned>(op);
  const std::size_t block_bytes = count * size;
  const std::size_t stride_bytes = stride * size;
  const std::size_t part_bytes = (block_bytes + 255) / 256 * 256;
  std::size_t first, last;
  block_part(0, count, 16 / size, blockIdx.x, gridDim.x, &first, &last);
  const auto* input = static_cast<const unsigned char*>(in);
  // Block j of the input into member j's area, at this member's place (writes over NVLink).
  for (int k = 1; k < members; ++k) {
    const int j = me + k < members ? me + k : me + k - members;
    block_copy(areas.area[j] + data_offset + static_cast<std::size_t>(me) * part_bytes +
                   first * size,
               input + static_cast<std::size_t>(j) * stride_bytes + first * size,
               (last - first) * size);
  }
  __syncthreads();
  __shared__ int stop;
  if (threadIdx.x == 0) {
    raise_flags(areas, flags, members, me, blockIdx.x, sequence, signature);
    stop = wait_flags<false>(areas, flags, members, me, blockIdx.x, sequence, signature, words,
                             deadline);
  }
  __syncthreads();
  if (stop == 0) {
    const unsigned char* sources[kMaxMembers];
#pragma unroll
    for (int m = 0; m < kMaxMembers; ++m) {
      sources[m] = nullptr;
      if (m < members) {
        sources[m] = m == me ? input + static_cast<std::size_t>(me) * stride_bytes
                             : areas.area[me] + data_offset + static_cast<std::size_t>(m) *
                                                                  part_bytes;
      }
    }
    const int start = me + 1 < members ? me + 1 : 0;
    with_element(type, [&](auto element, bool bitwise) {
      with_op(op, bitwise, [&](auto kOp) {
        chain_reduce<decltype(element), kOp>(sources, static_cast<unsigned char*>(out), members,
                                             start, first, last);
      });
    });
  }
}

// One broadcast among 2 to kMaxMembers members from `root` (see above; `out` the buffer). The
// caller keeps count * size within members * slot_bytes.
__device__ void broadcast_mesh(void* out, unsigned long long count, int type, int members, int me,
                               unsigned long long sequence, unsigned long long slot_bytes,
                               const Areas& areas, volatile unsigned* words,
                               unsigned long long deadline, int root) {
  const auto n = static_cast<std::size_t>(members);
  const std::size_t data_offset = (sequence & 1) * n * slot_bytes;
  const std::size_t copied_flags = 2 * n * slot_bytes + (sequence & 1) * n * kMaxBlocks * 16;
  const std::size_t part_flags = copied_flags + 2 * n * kMaxBlocks * 16;
  const unsigned long long signature = kBroadcastBit | count << 8 |
                                       static_cast<unsigned long long>(type) << 4 |
                                       static_cast<unsigned>(root);
  const std::size_t bytes = count * type_size(type);
  const std::size_t part = (bytes + 16 * n - 1) / (16 * n) * 16;
  std::size_t first, last;
  block_part(0, part, 16, blockIdx.x, gridDim.x, &first, &last);
  // This block's share of part j: bytes [lo, hi) of the buffer.
  struct Share {
    std::size_t lo, hi;
  };
  const auto share = [&](int j) {
    const std::size_t base = static_cast<std::size_t>(j) * part;
    const std::size_t lo = base + first < bytes ? base + first : bytes;
    return Share{lo, base + last < bytes ? base + last : bytes};
  };
  auto* buffer = static_cast<unsigned char*>(out);
  if (me == root) {
    for (int j = 0; j < members; ++j) {
      const Share s = share(j);
      block_copy(areas.area[me] + data_offset + s.lo, buffer + s.lo, s.hi - s.lo);
    }
  }
  __syncthreads();
  __shared__ int stop;
  if (threadIdx.x == 0) {
    stop = exchange_flags(areas, copied_flags, members, me, blockIdx.x, sequence, signature,
                          words, deadline);
  }
  __syncthreads();
  if (stop != 0) return;
  if (me != root) {
    const Share s = share(me);
    block_copy(areas.area[me] + data_offset + s.lo, areas.area[root] + data_offset + s.lo,
               s.hi - s.lo);
    // The two copies cut the bytes among the threads differently where the buffer is not
    // 16-byte aligned.
    __syncthreads();
    block_copy(buffer + s.lo, areas.area[me] + data_offset + s.lo, s.hi - s.lo);
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    stop = exchange_flags(areas, part_flags, members, me, blockIdx.x, sequence, signature, words,
                          deadline);
  }
  __syncthreads();
  if (stop == 0 && me != root) {
    for (int k = 1; k < members; ++k) {
      const int j = me + k < members ? me + k : me + k - members;
      const Share s = share(j);
      block_copy(buffer + s.lo, areas.area[j] + data_offset + s.lo, s.hi - s.lo);
    }
  }
}

// One reduce among 2 to kMaxMembers members to `root` (see above; `out` the root's). The caller
// keeps a ring block (count / members elements, rounded up) within slot_bytes.
__device__ void reduce_mesh(void* out, const void* in, unsigned long long count, int type, int op,
                            int members, int me, unsigned long long sequence,
                            unsigned long long slot_bytes, const Areas& areas,
                            volatile unsigned* words, unsigned long long deadline, int root) {
  const std::size_t size = type_size(type);
  const auto n = static_cast<std::size_t>(members);
  const std::size_t data_offset = (sequence & 1) * n * slot_bytes;
  const std::size_t copied_flags = 2 * n * slot_bytes + (sequence & 1) * n * kMaxBlocks * 16;
  const std::size_t result_flags = copied_flags + 2 * n * kMaxBlocks * 16;
  const unsigned long long signature =
      kReduceBit | static_cast<unsigned long long>(root) << 53 | count << 8 |
      static_cast<unsigned long long>(type) << 4 | static_cast<unsigned>(op);
  // The ring's blocks: the first count % members have one element more.
  const std::size_t base = count / n;
  const std::size_t longer = count % n;
  const auto start = [&](int j) {
    const auto b = static_cast<std::size_t>(j);
    return b < longer ? b * (base + 1) : longer * (base + 1) + (b - longer) * base;
  };
  const auto length = [&](int j) { return base + (static_cast<std::size_t>(j) < longer ? 1 : 0); };
  const std::size_t part_bytes = ((base + 1) * size + 255) / 256 * 256;
  std::size_t first, last;
  block_part(0, base + 1, 16 / size, blockIdx.x, gridDim.x, &first, &last);
  const auto lo = [&](int j) { return first < length(j) ? first : length(j); };
  const auto hi = [&](int j) { return last < length(j) ? last : length(j); };
  const auto place = [&](int j) {
    return areas.area[j] + data_offset + static_cast<std::size_t>(j) * part_bytes;
  };
  const auto* input = static_cast<const unsigned char*>(in);
  // Ring block j of the input into member j's area, at this member's place.
  for (int k = 1; k < members; ++k) {
    const int j = me + k < members ? me + k : me + k - members;
    block_copy(areas.area[j] + data_offset + static_cast<std::size_t>(me) * part_bytes +
                   lo(j) * size,
               input + (start(j) + lo(j)) * size, (hi(j) - lo(j)) * size);
  }
  __syncthreads();
  __shared__ int stop;
  if (threadIdx.x == 0) {
    stop = exchange_flags(areas, copied_flags, members, me, blockIdx.x, sequence, signature,
                          words, deadline);
  }
  __syncthreads();
  if (stop == 0) {
    const unsigned char* sources[kMaxMembers];
#pragma unroll
    for (int m = 0; m < kMaxMembers; ++m) {
      sources[m] = nullptr;
      if (m < members) {
        sources[m] = m == me ? input + start(me) * size
                             : areas.area[me] + data_offset + static_cast<std::size_t>(m) *
                                                                  part_bytes;
      }
    }
    // The root's block straight to its output; the others' into their own place in their areas.
    unsigned char* target =
        me == root ? static_cast<unsigned char*>(out) + start(me) * size : place(me);
    with_element(type, [&](auto element, bool bitwise) {
      with_op(op, bitwise, [&](auto kOp) {
        chain_reduce<decltype(element), kOp>(sources, target, members,
                                             me + 1 < members ? me + 1 : 0, lo(me), hi(me));
      });
    });
    __syncthreads();
    if (threadIdx.x == 0) {
      raise_flags(areas, result_flags, members, me, blockIdx.x, sequence, signature);
      if (me == root) {
        stop = wait_flags<false>(areas, result_flags, members, me, blockIdx.x, sequence,
                                 signature, words, deadline);
      }
    }
    __syncthreads();
    if (stop == 0 && me == root) {
      for (int k = 1; k < members; ++k) {
        const int j = me + k < members ? me + k : me + k - members;
        block_copy(static_cast<unsigned char*>(out) + (start(j) + lo(j)) * size,
                   place(j) + lo(j) * size, (hi(j) - lo(j)) * size);
      }
    }
  }
}

// One reduce between two members whose data fits the generation's two slots: the other member
// writes its whole input into the generation's data of the root's area and raises its flags; each block of the root then reduces its
// share from its input and that slot straight into its output, the root's value first (the
// binomial tree's order between two). Each byte crosses the link once, where the ring's blocks
// cross it twice (two H200s, 16 MiB on a stream: 89 us by the ring's blocks, NCCL 56).
__device__ void reduce_pair(void* out, const void* in, unsigned long long count, int type, int op,
                            int me, unsigned long long sequence, unsigned long long slot_bytes,
                            const Areas& areas, volatile unsigned* words,
                            unsigned long long deadline, int root) {
  const std::size_t size = type_size(type);
  const std::size_t data_offset = (sequence & 1) * 2 * slot_bytes;
  const std::size_t copied_flags = 4 * slot_bytes + (sequence & 1) * 2 * kMaxBlocks * 16;
  const unsigned long long signature =
      kReduceBit | static_cast<unsigned long long>(root) << 53 | count << 8 |
      static_cast<unsigned long long>(type) << 4 | static_cast<unsigned>(op);
  std::size_t first, last;
  block_part(0, count, 16 / size, blockIdx.x, gridDim.x, &first, &last);
  const int other = 1 - root;
  unsigned char* slot = areas.area[root] + data_offset;
  const auto* input = static_cast<const unsigned char*>(in);
  if (me != root) block_copy(slot + first * size, input + first * size, (last - first) * size);
  __syncthreads();
  __shared__ int stop;
  if (threadIdx.x == 0) {
    stop = exchange_flags(areas, copied_flags, 2, me, blockIdx.x, sequence, signature, words,
                          deadline);
  }
  __syncthreads();
  if (stop != 0 || me != root) return;
  const unsigned char* sources[kMaxMembers] = {};
  sources[root] = input;
  sources[other] = slot;
  with_element(type, [&](auto element, bool bitwise) {
    with_op(op, bitwise, [&](auto kOp) {
      chain_reduce<decltype(element), kOp>(sources, static_cast<unsigned char*>(out), 2, root,
                                           first, last);
    });
  });
}

}  // namespace

// The launched calls (the arguments are ferry_allreduce_oneshot's, and the root for a broadcast
// and a reduce; op and ring unused where the collective has none).
extern "C" __global__ void __launch_bounds__(512)
    ferry_allgather_mesh(void* out, const void* in, unsigned long long count, int type, int op,
                         int members, int me, int ring, unsigned long long sequence,
                         unsigned long long slot_bytes, Areas areas, volatile unsigned* words,
                         unsigned* blocks_done, volatile unsigned* lane_flag, unsigned done) {
  allgather_mesh(out, in, count, count, type, members, me, sequence, slot_bytes, areas, words,
                 0);
  finish_call(blocks_done, lane_flag, done);
}

extern "C" __global__ void __launch_bounds__(512)
    ferry_reduce_scatter_mesh(void* out, const void* in, unsigned long long count, int type,
                              int op, int members, int me, int ring, unsigned long long sequence,
                              unsigned long long slot_bytes, Areas areas,
                              volatile unsigned* words, unsigned* blocks_done,
                              volatile unsigned* lane_flag, unsigned done) {
  reduce_scatter_mesh(out, in, count, count, type, op, members, me, sequence, slot_bytes, areas,
                      words, 0);
  finish_call(blocks_done, lane_flag, done);
}

extern "C" __global__ void __launch_bounds__(512)
    ferry_broadcast_mesh(void* out, const void* in, unsigned long long count, int type, int op,
                         int members, int me, int ring, unsigned long long sequence,
                         unsigned long long slot_bytes, Areas areas, volatile unsigned* words,
                         unsigned* blocks_done, volatile unsigned* lane_flag, unsigned done,
                         int root) {
  broadcast_mesh(out, count, type, members, me, sequence, slot_bytes, areas, words, 0, root);
  finish_call(blocks_done, lane_flag, done);
}

extern "C" __global__ void __launch_bounds__(512)
    ferry_reduce_mesh(void* out, const void* in, unsigned long long count, int type, int op,
                      int members, int me, int ring, unsigned long long sequence,
                      unsigned long long slot_bytes, Areas areas, volatile unsigned* words,
                      unsigned* blocks_done, volatile unsigned* lane_flag, unsigned done,
                      int root) {
  reduce_mesh(out, in, count, type, op, members, me, sequence, slot_bytes, areas, words, 0, root);
  finish_call(blocks_done, lane_flag, done);
}
