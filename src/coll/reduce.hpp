// Host reduction kernels of the collectives: element-wise sum, prod, min, max and bitwise ops over
// every ferry::DataType, and the binary16 / bfloat16 conversions the 16-bit float types go through.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

#include "ferry/ferry.hpp"
#include "ferry/status.hpp"

namespace ferry::coll {

// Ok, or kInvalidArgument naming the type and the op: unknown enum values are refused, and the
// bitwise ops take integer types only.
Status check_reduction(DataType type, ReduceOp op);
// Whether `type` is one of the integer types (int8 ... uint64).
bool is_integer(DataType type);

// out[i] = a[i] op b[i] for i < count. out may be a or b (the same pointer); partial overlap is
// not allowed. Buffers are aligned to the element size.
//
// Integers wrap (two's complement) in sum and prod. min and max on float types follow IEEE
// 754-2019 minimum/maximum: a NaN operand gives a quiet NaN, and -0 orders below +0, so the result
// does not depend on the order of the operands. float16 and bfloat16 are widened to float, combined
// there and rounded back to nearest even; float has enough precision that this equals rounding
// the exact result once (24 >= 2 * 11 + 2). The kernels assume the default floating-point
// environment (round to nearest) and a build without -ffast-math, which would drop the NaN tests.
//
// An invalid (type, op), which check_reduction refuses, does nothing.
void reduce_to(void* out, const void* a, const void* b, std::size_t count, DataType type,
               ReduceOp op);

// out[i] = in[i] * factor, multiplied as kProd combines two elements (factor: one element of
// `type`); out may be in. NCCL's pre-multiplied sums (ncclRedOpCreatePreMulSum, and ncclAvg of a
// float type: a factor of 1/n) scale each member's input so.
void multiply_to(void* out, const void* in, std::size_t count, DataType type, const void* factor);
// out[i] = in[i] / divisor, truncated toward zero, for an integer type (others: nothing); out may
// be in. divisor > 0. ncclAvg of an integer type: the sum, divided by the member count.
void divide_to(void* out, const void* in, std::size_t count, DataType type, std::uint64_t divisor);

// IEEE binary16 <-> binary32 in portable bit manipulation, so no F16C or _Float16 is needed.
// Widening is exact (subnormals, signed zeros and infinities included) and quiets a signaling NaN
// as F16C's vcvtph2ps does. Narrowing rounds to nearest even: values from 65520 up become
// infinity, and a NaN stays a quiet NaN with its sign and the top of its payload. Both let the FPU
// do the scaling and rounding (a multiply by a power of two rounds exactly once) and have no
// branches, so loops over them vectorize; they assume round-to-nearest, and are right with FTZ/DAZ
// set too.

// condition ? if_true : if_false as a bitwise blend. GCC turns a plain ?: whose operand is needed
// on one side only into a branch (it sinks the computation there), and then leaves a loop over it
// scalar, since executing a floating-point operation the source made conditional could raise
// exception flags that the source would not have. A blend needs both operands, so no branch.
inline std::uint32_t select_bits(bool condition, std::uint32_t if_true,
                                 std::uint32_t if_false) noexcept {
  return if_false ^ ((if_true ^ if_false) & (0u - static_cast<std::uint32_t>(condition)));
}

inline float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t body = (std::uint32_t{h} & 0x7fffu) << 13;  // exponent and mantissa
  // Normal, infinity, NaN: rebias the exponent by 224 (all ones then stays all ones) and scale by
  // 2^-112, which brings the bias from 15 + 224 to 127 and quiets a signaling NaN.
  const float normal = std::bit_cast<float>(body + (224u << 23)) * 0x1p-112f;
  // Subnormal: the mantissa under the exponent of 0.5 is 0.5 + mantissa * 2^-24; subtracting 0.5
  // leaves the value, exactly.
  const float subnormal = std::bit_cast<float>((body >> 13) | 0x3f000000u) - 0.5f;
  return std::bit_cast<float>(sign | select_bits(body < 0x00800000u,
                                                 std::bit_cast<std::uint32_t>(subnormal),
                                                 std::bit_cast<std::uint32_t>(normal)));
}

inline std::uint16_t float_to_half(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t magnitude = bits & 0x7fffffffu;
  // 4 |value|, except that everything from 2^16 up overflows to infinity in the first product.
  const float scaled = std::bit_cast<float>(magnitude) * 0x1p112f * 0x1p-110f;
  // Adding 2^(e + 15), e the exponent of value (at least -14, that of the smallest binary16
  // normal), leaves 4 |value| rounded to nearest even at binary16 precision in the low 11 bits
  // (12 with a rounding carry) of the sum's mantissa, and e + 14 in the low 5 bits of the sum's
  // exponent: the two fields add up to the binary16 encoding, carry and subnormals included.
  // Compared as int32 (the sign is clear) because SSE2 has only signed vector compares.
  const std::int32_t exponent_bits = static_cast<std::int32_t>(magnitude & 0x7f800000u);
  const std::uint32_t exponent =
      static_cast<std::uint32_t>(exponent_bits < (113 << 23) ? (113 << 23) : exponent_bits);
  const float sum = std::bit_cast<float>(exponent + (15u << 23)) + scaled;
  const std::uint32_t sum_bits = std::bit_cast<std::uint32_t>(sum);
  const std::uint32_t finite = ((sum_bits >> 13) & 0x7c00u) + (sum_bits & 0x0fffu);
  const std::uint32_t nan = 0x7e00u | ((magnitude >> 13) & 0x03ffu);
  const bool is_nan = static_cast<std::int32_t>(magnitude) > 0x7f800000;
  return static_cast<std::uint16_t>(((bits >> 16) & 0x8000u) | select_bits(is_nan, nan, finite));
}

// bfloat16 is the top half of a binary32: widening is exact (a signaling NaN stays one).
constexpr float bf16_to_float(std::uint16_t b) noexcept {
  return std::bit_cast<float>(std::uint32_t{b} << 16);
}

// Rounds to nearest even; overflow gives infinity. A NaN is kept quiet explicitly, since rounding
// its bits could carry it into infinity and truncating them could drop its whole payload.
constexpr std::uint16_t float_to_bf16(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t rounded = (bits + 0x7fffu + ((bits >> 16) & 1u)) >> 16;
  const std::uint32_t nan = (bits >> 16) | 0x0040u;
  const bool is_nan = static_cast<std::int32_t>(bits & 0x7fffffffu) > 0x7f800000;
  return static_cast<std::uint16_t>(is_nan ? nan : rounded);
}

}  // namespace ferry::coll
