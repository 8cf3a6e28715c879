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

// inout[i] = inout[i] op in[i] for i < count.
void reduce_into(void* inout, const void* in, std::size_t count, DataType type, ReduceOp op);

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

// IEEE binary16 <-> binary32 in portable bit manipulation, so no F16C or _Float16 is needed.
// Widening is exact (subnormals, signed zeros and infinities included) and quiets a signaling NaN
// as F16C's vcvtph2ps does. Narrowing rounds to nearest even: values from 65520 up become
// infinity, and a NaN stays a quiet NaN with its sign and the top of its payload.
// Written without branches so that loops over them vectorize.

// condition ? if_true : if_false as a bitwise blend. GCC turns a plain ?: whose operand is needed
// on one side only into a branch (it sinks the computation there), and then leaves a loop over it
// scalar, since executing a floating-point operation the source made conditional could raise
// exception flags that the source would not have. A blend needs both operands, so no branch.
constexpr std::uint32_t select_bits(bool condition, std::uint32_t if_true,
                                    std::uint32_t if_false) noexcept {
  return if_false ^ ((if_true ^ if_false) & (0u - static_cast<std::uint32_t>(condition)));
}

constexpr float half_to_float(std::uint16_t h) noexcept {
  const std::uint32_t sign = (std::uint32_t{h} & 0x8000u) << 16;
  const std::uint32_t body = (std::uint32_t{h} & 0x7fffu) << 13;  // exponent and mantissa
  const std::uint32_t exponent = body & 0x0f800000u;
  const std::uint32_t normal = body + (112u << 23);  // rebias 15 -> 127
  const std::uint32_t quiet = (body & 0x007fffffu) != 0 ? 0x00400000u : 0u;
  const std::uint32_t special = body | 0x70000000u | quiet;  // infinity or NaN
  // A subnormal's value is mantissa * 2^-24, a normal float; int -> float is exact below 2^24.
  const std::uint32_t subnormal = std::bit_cast<std::uint32_t>(
      static_cast<float>(static_cast<std::int32_t>(body >> 13)) * 0x1p-24f);
  std::uint32_t bits = exponent == 0x0f800000u ? special : normal;
  bits = select_bits(exponent == 0, subnormal, bits);
  return std::bit_cast<float>(bits | sign);
}

constexpr std::uint16_t float_to_half(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const std::uint32_t sign = (bits >> 16) & 0x8000u;
  // Compared as int32 (the sign is cleared) because SSE2 has signed vector compares only.
  const std::int32_t magnitude = static_cast<std::int32_t>(bits & 0x7fffffffu);
  const std::uint32_t m = static_cast<std::uint32_t>(magnitude);
  // Normal: rebias 127 -> 15 and round the 13 dropped bits to nearest even; a carry out of the
  // mantissa moves into the exponent, and out of the largest exponent into infinity.
  const std::uint32_t normal = (m - (112u << 23) + 0xfffu + ((m >> 13) & 1u)) >> 13;
  // Below 2^-14 the result is subnormal: adding 0.5 (whose ulp is 2^-24, the smallest binary16
  // subnormal) makes the FPU round the value to a multiple of 2^-24, left in the low mantissa bits.
  // Rounding up to 2^-14 gives 0x400, the smallest normal, as it should.
  const std::uint32_t subnormal =
      std::bit_cast<std::uint32_t>(std::bit_cast<float>(m) + 0.5f) - 0x3f000000u;
  const std::uint32_t special = magnitude > 0x7f800000 ? 0x7e00u | ((m >> 13) & 0x3ffu) : 0x7c00u;
  std::uint32_t half = select_bits(magnitude < 0x38800000, subnormal, normal);  // below 2^-14
  half = select_bits(magnitude >= 0x47800000, special, half);  // 2^16 and up, infinity, NaN
  return static_cast<std::uint16_t>(half | sign);
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
