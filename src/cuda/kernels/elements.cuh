// The element types and operations of the reductions, as the host's (src/coll/reduce.cpp): part of
// kernels.cu's translation unit, included after the standard headers.
#pragma once

namespace {

// The values of ferry::DataType and ferry::ReduceOp (include/ferry/ferry.hpp); impl/launches.cpp
// checks that they agree.
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
