// Device code of ferry's CUDA module: the element-wise reductions of the collectives on device
// buffers. nvcc compiles it into a fatbin (sm_90 code and PTX) that libferry embeds and loads
// through the driver (cuModuleLoadData), so the library needs no CUDA runtime.
//
// The arithmetic is the host kernels' (src/coll/reduce.cpp), element by element: integers wrap,
// float min/max are IEEE 754-2019 minimum/maximum (-0 below +0, a NaN operand gives NaN), and
// float16/bfloat16 combine in float and round to nearest even. So a collective gives the same bits
// on device buffers as on host buffers, NaN payloads aside (the GPU makes a canonical NaN).
// Built without fast-math flags: denormals are kept and nothing is contracted into an FMA.
#include <cstddef>
#include <cstdint>
#include <type_traits>

namespace {

// The values of ferry::DataType and ferry::ReduceOp (include/ferry/ferry.hpp); cuda.cpp checks
// that they agree.
enum Type : int {
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUint8,
  kUint16,
  kUint32,
  kUint64,
  kFloat16,
  kBfloat16,
  kFloat32,
  kFloat64
};
enum Op : int { kSum, kProd, kMin, kMax, kBitAnd, kBitOr, kBitXor };

// As on the host: sum and prod in an unsigned type at least as wide as unsigned int.
template <class T>
using Wide = std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;

template <class T, int kOp>
__device__ __forceinline__ T combine_integer(T a, T b) {
  using W = Wide<T>;
  const W x = static_cast<W>(a);
  const W y = static_cast<W>(b);
  if constexpr (kOp == kSum) return static_cast<T>(x + y);
  if constexpr (kOp == kProd) return static_cast<T>(x * y);
  if constexpr (kOp == kMin) return a < b ? a : b;
  if constexpr (kOp == kMax) return a < b ? b : a;
  if constexpr (kOp == kBitAnd) return static_cast<T>(x & y);
  if constexpr (kOp == kBitOr) return static_cast<T>(x | y);
  if constexpr (kOp == kBitXor) return static_cast<T>(x ^ y);
  return a;
}

__device__ __forceinline__ float bits_to(std::uint32_t b, float) { return __uint_as_float(b); }
__device__ __forceinline__ double bits_to(std::uint64_t b, double) {
  return __longlong_as_double(static_cast<long long>(b));
}
__device__ __forceinline__ std::uint32_t to_bits(float v) { return __float_as_uint(v); }
__device__ __forceinline__ std::uint64_t to_bits(double v) {
  return static_cast<std::uint64_t>(__double_as_longlong(v));
}

template <class T, int kOp>
__device__ __forceinline__ T combine_float(T a, T b) {
  if constexpr (kOp == kSum) return a + b;
  if constexpr (kOp == kProd) return a * b;
  if constexpr (kOp == kMin || kOp == kMax) {
    if (a != a || b != b) return a + b;  // a quiet NaN
    if (a == b) {
      // Only the zeros differ: -0 orders below +0.
      return kOp == kMin ? bits_to(to_bits(a) | to_bits(b), T())
                         : bits_to(to_bits(a) & to_bits(b), T());
    }
    return (a < b) == (kOp == kMin) ? a : b;
  }
  return a;
}

// float16 and bfloat16 travel as their bits.
__device__ __forceinline__ float half_to_float(std::uint16_t h) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
  return f;
}
__device__ __forceinline__ std::uint16_t float_to_half(float f) {
  std::uint16_t h;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
  return h;
}
__device__ __forceinline__ float bf16_to_float(std::uint16_t b) {
  return __uint_as_float(static_cast<std::uint32_t>(b) << 16);
}
__device__ __forceinline__ std::uint16_t float_to_bf16(float f) {
  std::uint16_t b;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(b) : "f"(f));
  return b;
}

struct Half {};
struct Bf16 {};

template <class T>
struct Element {
  using Storage = T;
  template <int kOp>
  __device__ __forceinline__ static T combine(T a, T b) {
    if constexpr (std::is_floating_point<T>::value) {
      return combine_float<T, kOp>(a, b);
    } else {
      return combine_integer<T, kOp>(a, b);
    }
  }
};
template <>
struct Element<Half> {
  using Storage = std::uint16_t;
  template <int kOp>
  __device__ __forceinline__ static std::uint16_t combine(std::uint16_t a, std::uint16_t b) {
    return float_to_half(combine_float<float, kOp>(half_to_float(a), half_to_float(b)));
  }
};
template <>
struct Element<Bf16> {
  using Storage = std::uint16_t;
  template <int kOp>
  __device__ __forceinline__ static std::uint16_t combine(std::uint16_t a, std::uint16_t b) {
    return float_to_bf16(combine_float<float, kOp>(bf16_to_float(a), bf16_to_float(b)));
  }
};

// Calls f(E{}, bitwise) with the Element type of `type` (bitwise: the type takes the bitwise ops).
template <class F>
__device__ __forceinline__ void with_element(int type, F&& f) {
  switch (type) {
    case kInt8:
      return f(Element<std::int8_t>{}, true);
    case kInt16:
      return f(Element<std::int16_t>{}, true);
    case kInt32:
      return f(Element<std::int32_t>{}, true);
    case kInt64:
      return f(Element<std::int64_t>{}, true);
    case kUint8:
      return f(Element<std::uint8_t>{}, true);
    case kUint16:
      return f(Element<std::uint16_t>{}, true);
    case kUint32:
      return f(Element<std::uint32_t>{}, true);
    case kUint64:
      return f(Element<std::uint64_t>{}, true);
    case kFloat16:
      return f(Element<Half>{}, false);
    case kBfloat16:
      return f(Element<Bf16>{}, false);
    case kFloat32:
      return f(Element<float>{}, false);
    case kFloat64:
      return f(Element<double>{}, false);
    default:
      break;
  }
}

// Calls f(std::integral_constant<int, kOp>{}) for `op`; the bitwise ops only where `bitwise`
// (the caller checked the pair with check_reduction).
template <class F>
__device__ __forceinline__ void with_op(int op, bool bitwise, F&& f) {
  switch (op) {
    case kSum:
      return f(std::integral_constant<int, kSum>{});
    case kProd:
      return f(std::integral_constant<int, kProd>{});
    case kMin:
      return f(std::integral_constant<int, kMin>{});
    case kMax:
      return f(std::integral_constant<int, kMax>{});
    default:
      break;
  }
  if (!bitwise) return;
  switch (op) {
    case kBitAnd:
      return f(std::integral_constant<int, kBitAnd>{});
    case kBitOr:
      return f(std::integral_constant<int, kBitOr>{});
    case kBitXor:
      return f(std::integral_constant<int, kBitXor>{});
    default:
      break;
  }
}

// out[i] = a[i] op b[i]. Each thread reads its elements before writing them, so out may be a or b.
// Where the three buffers are 16-byte aligned the body goes in 16-byte loads and stores.
template <class E, int kOp>
__device__ void reduce_elements(void* out_buffer, const void* a_buffer, const void* b_buffer,
                                std::size_t count) {
  using T = typename E::Storage;
  constexpr std::size_t kVector = 16 / sizeof(T);
  auto* out = static_cast<T*>(out_buffer);
  const auto* a = static_cast<const T*>(a_buffer);
  const auto* b = static_cast<const T*>(b_buffer);
  const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  const bool aligned =
      ((reinterpret_cast<std::uintptr_t>(out) | reinterpret_cast<std::uintptr_t>(a) |
        reinterpret_cast<std::uintptr_t>(b)) &
       15) == 0;
  const std::size_t vectors = aligned ? count / kVector : 0;
  for (std::size_t v = first; v < vectors; v += stride) {
    union Lanes {
      uint4 whole;
      T item[kVector];
    } x, y, z;
    x.whole = reinterpret_cast<const uint4*>(a)[v];
    y.whole = reinterpret_cast<const uint4*>(b)[v];
#pragma unroll
    for (std::size_t j = 0; j < kVector; ++j) {
      z.item[j] = E::template combine<kOp>(x.item[j], y.item[j]);
    }
    reinterpret_cast<uint4*>(out)[v] = z.whole;
  }
  for (std::size_t i = vectors * kVector + first; i < count; i += stride) {
    out[i] = E::template combine<kOp>(a[i], b[i]);
  }
}

}  // namespace

// out = a op b over `count` elements of `type`. The caller checked (type, op).
extern "C" __global__ void __launch_bounds__(512)
    ferry_reduce(void* out, const void* a, const void* b, unsigned long long count, int type,
                 int op) {
  with_element(type, [&](auto element, bool bitwise) {
    with_op(op, bitwise,
            [&](auto kOp) { reduce_elements<decltype(element), kOp>(out, a, b, count); });
  });
}

// dst = src over `bytes` bytes of device memory (either may be a peer's IPC mapping): the copy
// engine's work done by the SMs, where the engine's start-up per copy shows
// (FERRY_CUDA_IPC_KERNEL_COPY).
namespace {

// dst = src over `bytes`, this thread taking units first, first + stride, ...: four 16-byte loads
// in flight per thread before their stores where both are 16-byte aligned, else byte by byte.
__device__ __forceinline__ void strided_copy(void* dst, const void* src, std::size_t bytes,
                                             std::size_t first, std::size_t stride) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  std::size_t tail = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) & 15) == 0) {
    const std::size_t units = bytes / 16;
    auto* o = static_cast<uint4*>(dst);
    const auto* i = static_cast<const uint4*>(src);
    std::size_t k = first;
    for (; k + 3 * stride < units; k += 4 * stride) {
      const uint4 a = i[k];
      const uint4 b = i[k + stride];
      const uint4 c = i[k + 2 * stride];
      const uint4 d = i[k + 3 * stride];
      o[k] = a;
      o[k + stride] = b;
      o[k + 2 * stride] = c;
      o[k + 3 * stride] = d;
    }
    for (; k < units; k += stride) o[k] = i[k];
    tail = units * 16;
  }
  for (std::size_t t = tail + first; t < bytes; t += stride) out[t] = in[t];
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512)
    ferry_copy(void* dst, const void* src, unsigned long long bytes) {
  strided_copy(dst, src, bytes, static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
               static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

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

// Flag values: a call's sequence number in the low 48 bits, a two-shot call's round above them.
constexpr unsigned long long kSequenceBits = (1ull << 48) - 1;

// Run by thread 0 of block `block`, after the block's stores: raises this member's flag for the
// block, (value, signature), in every peer's flag array at `flags_offset` (of 16-byte flags,
// [member][block]).
__device__ void raise_flags(const Areas& areas, std::size_t flags_offset, int members, int me,
                            unsigned block, unsigned long long value,
                            unsigned long long signature) {
  __threadfence_system();
  for (int j = 0; j < members; ++j) {
    if (j == me) continue;
    auto* flag = reinterpret_cast<unsigned long long*>(areas.area[j] + flags_offset) +
                 2 * (static_cast<std::size_t>(me) * kMaxBlocks + block);
    flag[1] = signature;
    store_release(flag, value);
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
// died, or the call timed out), or a peer's call differs (then words[1] is set too).
template <bool kRounds>
__device__ int wait_flags(const Areas& areas, std::size_t flags_offset, int members, int me,
                          unsigned block, unsigned long long value, unsigned long long signature,
                          volatile unsigned* words) {
  int stop = 0;
  for (int j = 0; j < members && stop == 0; ++j) {
    if (j == me) continue;
    const auto* flag = reinterpret_cast<const unsigned long long*>(areas.area[me] + flags_offset) +
                       2 * (static_cast<std::size_t>(j) * kMaxBlocks + block);
    // The grid follows the size, so a peer whose call differs may not run this block; its
    // block 0, which always runs, shows the difference. The stop word is host memory, a slow
    // read: look at it once in a while.
    const auto* block0 = flag - 2 * static_cast<std::size_t>(block);
    bool differs = false;
    for (unsigned spins = 1; !reached<kRounds>(load_relaxed(flag), value); ++spins) {
      if ((spins & 63) == 0 && block != 0 &&
          (load_relaxed(block0) & kSequenceBits) == (value & kSequenceBits)) {
        asm volatile("fence.acq_rel.sys;" ::: "memory");
        if (block0[1] != signature) {
          differs = true;
          break;
        }
      }
      if ((spins & 4095) == 0 && words[0] != 0) {
        stop = 1;
        break;
      }
    }
    asm volatile("fence.acq_rel.sys;" ::: "memory");
    if (stop == 0 && (differs || flag[1] != signature)) {
      words[1] = 1;
      stop = 1;
    }
  }
  return stop;
}

// raise_flags, then wait_flags for a one-shot call.
__device__ int exchange_flags(const Areas& areas, std::size_t flags_offset, int members, int me,
                              unsigned block, unsigned long long sequence,
                              unsigned long long signature, volatile unsigned* words) {
  raise_flags(areas, flags_offset, members, me, block, sequence, signature);
  return wait_flags<false>(areas, flags_offset, members, me, block, sequence, signature, words);
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

// Element i reduced over the members' values x[0..members) in the order's sequence.
template <class E, int kOp>
__device__ __forceinline__ typename E::Storage combine_members(
    const typename E::Storage (&x)[kMaxMembers], const Order& order, std::size_t i) {
  using T = typename E::Storage;
  if (order.ring) {
    const std::size_t head = order.longer * (order.base + 1);
    const int b =
        static_cast<int>(i < head ? i / (order.base + 1) : order.longer + (i - head) / order.base);
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
// member for the same call; block b waits for block b of each peer.
template <bool kWide>
__device__ void oneshot_block(void* out, const void* in, unsigned long long count, int type, int op,
                              int members, int me, int ring, unsigned long long sequence,
                              unsigned long long slot_bytes, const Areas& areas,
                              volatile unsigned* words, unsigned block, unsigned blocks) {
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
    stop = exchange_flags(areas, flags_offset, members, me, block, sequence, signature, words);
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
  if (((reinterpret_cast<std::uintptr_t>(out) | reinterpret_cast<std::uintptr_t>(mine)) & 15) == 0) {
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

// ---- The resident one-shot kernel ----
//
// One block that stays on the GPU between one communicator's small calls (one block's worth of
// data, so the grid is the one ferry_allreduce_oneshot would have and members may mix the two),
// so a call costs no launch. The host writes the call into `box` (host memory), each field with
// the call's number (mod 256) in its top byte; lanes of the first warp read the fields side by
// side and take the call when every field carries the next number, so seeing the call and its
// arguments costs one round trip over the bus. The block runs it as block 0 of 1, then stores
// `done`. It leaves when no call came for `idle_ns` (so a cudaDeviceSynchronize of the
// application waits at most that long) or when words[0] is raised, and stores `exited` = `epoch`
// as its last act. The host launches it again for a call posted after that (cuda.cpp).
namespace {

constexpr int kMailboxFields = 5;  // out, in, count, shape (type | op << 8 | ring << 16), sequence
constexpr unsigned long long kFieldMask = (1ull << 56) - 1;

struct Mailbox {
  unsigned long long field[8];  // written by the host
  unsigned long long done;      // calls finished so far
  unsigned long long exited;    // the epoch of the last launch that has left
  unsigned long long spare[6];
};

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512)
    ferry_allreduce_resident(Mailbox* box, unsigned long long taken, unsigned long long epoch,
                             unsigned long long idle_ns, int members, int me,
                             unsigned long long slot_bytes, Areas areas, volatile unsigned* words) {
  __shared__ unsigned long long call[kMailboxFields];
  __shared__ int leave;
  const unsigned lane = threadIdx.x;
  for (;;) {
    if (lane < 32) {
      const unsigned long long want = (taken + 1) & 0xff;
      const unsigned long long since = now_ns();
      for (unsigned spins = 1;; ++spins) {
        const unsigned long long v = lane < kMailboxFields ? load_acquire(&box->field[lane]) : 0;
        if (__all_sync(0xffffffffu, lane >= kMailboxFields || v >> 56 == want)) {
          if (lane < kMailboxFields) call[lane] = v & kFieldMask;
          if (lane == 0) leave = 0;
          break;
        }
        if ((spins & 15) == 0) {
          int out = 0;
          if (lane == 0) out = words[0] != 0 || now_ns() - since > idle_ns;
          if (__shfl_sync(0xffffffffu, out, 0) != 0) {
            if (lane == 0) leave = 1;
            break;
          }
        }
      }
    }
    __syncthreads();
    if (leave != 0) break;
    const unsigned long long shape = call[3];
    oneshot_block<false>(
        reinterpret_cast<void*>(call[0]), reinterpret_cast<const void*>(call[1]), call[2],
        static_cast<int>(shape & 0xff), static_cast<int>(shape >> 8 & 0xff), members, me,
        static_cast<int>(shape >> 16 & 1), call[4], slot_bytes, areas, words, 0, 1);
    ++taken;
    // The block's results, then `done` (a release after the barrier covers every thread's).
    __syncthreads();
    if (lane == 0) store_release(&box->done, taken);
  }
  if (lane == 0) {
    __threadfence_system();
    store_release(&box->exited, epoch);
  }
}
