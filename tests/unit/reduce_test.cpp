// The host reduction kernels against slow scalar references written independently of them:
// every (type, op), wrapping, NaN and signed zeros, aliasing, and the 16-bit float conversions.
#include "coll/reduce.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace ferry::coll {
namespace {

constexpr DataType kAllTypes[] = {
    DataType::kInt8,    DataType::kInt16,    DataType::kInt32,   DataType::kInt64,
    DataType::kUint8,   DataType::kUint16,   DataType::kUint32,  DataType::kUint64,
    DataType::kFloat16, DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64,
};
constexpr ReduceOp kAllOps[] = {ReduceOp::kSum,   ReduceOp::kProd,   ReduceOp::kMin,
                                ReduceOp::kMax,   ReduceOp::kBitAnd, ReduceOp::kBitOr,
                                ReduceOp::kBitXor};
// 1031 elements cross the kernels' blocks (at most 256 elements) and leave a tail.
constexpr std::size_t kCounts[] = {0, 1, 7, 1031};

bool is_integer(DataType type) {
  return type != DataType::kFloat16 && type != DataType::kBfloat16 && type != DataType::kFloat32 &&
         type != DataType::kFloat64;
}
bool is_bitwise(ReduceOp op) {
  return op == ReduceOp::kBitAnd || op == ReduceOp::kBitOr || op == ReduceOp::kBitXor;
}
std::string label(DataType type, ReduceOp op, std::size_t count) {
  return std::string(to_string(type)) + " " + to_string(op) + " count " + std::to_string(count);
}

// --- Integer reference: exact in uint64 modulo 2^64, then cut to the type's width and mapped to
// two's complement by hand.
std::uint64_t integer_reference(std::uint64_t a, std::uint64_t b, ReduceOp op, unsigned bits,
                                bool is_signed) {
  const std::uint64_t mask = bits == 64 ? ~std::uint64_t{0} : (std::uint64_t{1} << bits) - 1;
  auto value = [&](std::uint64_t x) -> long double {  // the element's mathematical value
    x &= mask;
    if (is_signed && bits < 64 && (x >> (bits - 1)) != 0) {
      return static_cast<long double>(x) - std::ldexp(1.0L, static_cast<int>(bits));
    }
    if (is_signed && bits == 64 && (x >> 63) != 0) {
      return -static_cast<long double>(~x) - 1;
    }
    return static_cast<long double>(x);
  };
  switch (op) {
    case ReduceOp::kSum:
      return (a + b) & mask;
    case ReduceOp::kProd:
      return (a * b) & mask;
    case ReduceOp::kMin:
      return (value(a) <= value(b) ? a : b) & mask;
    case ReduceOp::kMax:
      return (value(a) >= value(b) ? a : b) & mask;
    case ReduceOp::kBitAnd:
      return a & b & mask;
    case ReduceOp::kBitOr:
      return (a | b) & mask;
    case ReduceOp::kBitXor:
      return (a ^ b) & mask;
  }
  return 0;
}

// --- binary16 reference: decoded with ldexp, rounded by comparing with midpoints (exact in
// double) between neighbouring values.
double half_value(std::uint16_t h) {
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  double magnitude;
  if (exponent == 0) {
    magnitude = std::ldexp(mantissa, -24);
  } else if (exponent == 31) {
    magnitude = mantissa == 0 ? std::numeric_limits<double>::infinity()
                              : std::numeric_limits<double>::quiet_NaN();
  } else {
    magnitude = std::ldexp(1024 + mantissa, exponent - 25);
  }
  return (h & 0x8000) != 0 ? -magnitude : magnitude;
}

// Correctly rounded (nearest, ties to even) binary16 of any double; NaN gives 0x7e00.
std::uint16_t round_to_half(double x) {
  if (std::isnan(x)) return 0x7e00;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  if (a >= 65520.0) return sign | 0x7c00;  // 65504 + half an ulp: rounds past the largest finite
  // Positive finite patterns are ordered like their values: find the last one <= a.
  std::uint32_t lo = 0;
  std::uint32_t hi = 0x7bff;
  while (lo < hi) {
    const std::uint32_t mid = (lo + hi + 1) / 2;
    if (half_value(static_cast<std::uint16_t>(mid)) <= a) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const double below = half_value(static_cast<std::uint16_t>(lo));
  if (below == a) return sign | lo;
  const double above = lo == 0x7bff ? 65536.0 : half_value(static_cast<std::uint16_t>(lo + 1));
  const double midpoint = (below + above) / 2;
  std::uint32_t pick;
  if (a < midpoint) {
    pick = lo;
  } else if (a > midpoint) {
    pick = lo + 1;
  } else {
    pick = (lo & 1) == 0 ? lo : lo + 1;
  }
  return static_cast<std::uint16_t>(sign | pick);
}

// --- bfloat16 reference: the two neighbours of a float, compared through their midpoint.
double bf16_value(std::uint16_t b) {
  std::uint32_t bits = std::uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, sizeof f);
  return f;
}

std::uint16_t round_to_bf16(float x) {
  if (std::isnan(x)) return 0x7fc0;
  std::uint32_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  const std::uint32_t sign = bits & 0x80000000u;
  const std::uint32_t below_bits = (bits & 0x7fffffffu) & 0xffff0000u;
  const std::uint32_t above_bits = below_bits + 0x10000u;
  const double a = std::fabs(static_cast<double>(x));
  const double below = bf16_value(static_cast<std::uint16_t>(below_bits >> 16));
  // Past the largest finite bfloat16, infinity counts as the next power of two, 2^128.
  const double above = above_bits >= 0x7f800000u
                           ? std::ldexp(1.0, 128)
                           : bf16_value(static_cast<std::uint16_t>(above_bits >> 16));
  if (std::isinf(a)) return static_cast<std::uint16_t>((sign | 0x7f800000u) >> 16);
  const double midpoint = (below + above) / 2;
  std::uint32_t pick;
  if (a < midpoint) {
    pick = below_bits;
  } else if (a > midpoint) {
    pick = above_bits;
  } else {
    pick = ((below_bits >> 16) & 1) == 0 ? below_bits : above_bits;
  }
  return static_cast<std::uint16_t>((sign | pick) >> 16);
}

bool is_quiet_half_nan(std::uint16_t h) { return (h & 0x7e00) == 0x7e00; }
bool is_half_nan(std::uint16_t h) { return (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0; }
bool is_quiet_bf16_nan(std::uint16_t b) { return (b & 0x7fc0) == 0x7fc0; }
bool is_bf16_nan(std::uint16_t b) { return (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0; }

// IEEE 754-2019 minimum/maximum on doubles; NaN handled by the callers.
double min_reference(double a, double b) {
  if (a < b) return a;
  if (b < a) return b;
  return std::signbit(a) ? a : b;  // equal: only the zeros' signs can differ
}
double max_reference(double a, double b) {
  if (a < b) return b;
  if (b < a) return a;
  return std::signbit(a) ? b : a;
}

template <class F>
bool is_quiet_nan(F x) {
  using Bits = std::conditional_t<sizeof(F) == 4, std::uint32_t, std::uint64_t>;
  Bits bits;
  std::memcpy(&bits, &x, sizeof bits);
  const Bits quiet_bit = Bits{1} << (std::numeric_limits<F>::digits - 2);
  return std::isnan(x) && (bits & quiet_bit) != 0;
}

// A float or double result compared bit for bit (NaN: any quiet NaN).
template <class F>
::testing::AssertionResult float_matches(F a, F b, F got, ReduceOp op) {
  if (std::isnan(a) || std::isnan(b)) {
    if (is_quiet_nan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << to_string(op) << "(" << a << ", " << b << ") gave " << got << ", not a quiet NaN";
  }
  F want;
  switch (op) {
    case ReduceOp::kSum:
      want = a + b;
      break;
    case ReduceOp::kProd:
      want = a * b;
      break;
    case ReduceOp::kMin:
      want = static_cast<F>(min_reference(a, b));
      break;
    case ReduceOp::kMax:
      want = static_cast<F>(max_reference(a, b));
      break;
    default:
      return ::testing::AssertionFailure() << "bitwise op on a float";
  }
  if (std::isnan(want) ? std::isnan(got) : std::memcmp(&want, &got, sizeof want) == 0) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure()
         << to_string(op) << "(" << a << ", " << b << ") gave " << got << ", want " << want;
}

// binary16 results: exact arithmetic in double (products and sums of binary16 values are exact
// there) rounded once, which is what the kernels must match.
::testing::AssertionResult half_matches(std::uint16_t a, std::uint16_t b, std::uint16_t got,
                                        ReduceOp op) {
  const double x = half_value(a);
  const double y = half_value(b);
  if (std::isnan(x) || std::isnan(y)) {
    if (is_quiet_half_nan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << std::hex << "half " << to_string(op) << "(0x" << a << ", 0x" << b << ") gave 0x"
           << got << ", not a quiet NaN";
  }
  double exact = 0;
  switch (op) {
    case ReduceOp::kSum:
      exact = x + y;
      break;
    case ReduceOp::kProd:
      exact = x * y;
      break;
    case ReduceOp::kMin:
      exact = min_reference(x, y);
      break;
    case ReduceOp::kMax:
      exact = max_reference(x, y);
      break;
    default:
      return ::testing::AssertionFailure() << "bitwise op on float16";
  }
  const std::uint16_t want = round_to_half(exact);
  if (std::isnan(exact) ? is_quiet_half_nan(got) : got == want) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << std::hex << "half " << to_string(op) << "(0x" << a
                                       << ", 0x" << b << ") gave 0x" << got << ", want 0x" << want;
}

// bfloat16 results: the float operation, rounded to nearest even by the reference.
::testing::AssertionResult bf16_matches(std::uint16_t a, std::uint16_t b, std::uint16_t got,
                                        ReduceOp op) {
  const auto x = static_cast<float>(bf16_value(a));
  const auto y = static_cast<float>(bf16_value(b));
  if (std::isnan(x) || std::isnan(y)) {
    if (is_quiet_bf16_nan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure()
           << std::hex << "bf16 " << to_string(op) << "(0x" << a << ", 0x" << b << ") gave 0x"
           << got << ", not a quiet NaN";
  }
  float exact = 0;
  switch (op) {
    case ReduceOp::kSum:
      exact = x + y;
      break;
    case ReduceOp::kProd:
      exact = x * y;
      break;
    case ReduceOp::kMin:
      exact = static_cast<float>(min_reference(x, y));
      break;
    case ReduceOp::kMax:
      exact = static_cast<float>(max_reference(x, y));
      break;
    default:
      return ::testing::AssertionFailure() << "bitwise op on bfloat16";
  }
  const std::uint16_t want = round_to_bf16(exact);
  if (std::isnan(exact) ? is_quiet_bf16_nan(got) : got == want) {
    return ::testing::AssertionSuccess();
  }
  return ::testing::AssertionFailure() << std::hex << "bf16 " << to_string(op) << "(0x" << a
                                       << ", 0x" << b << ") gave 0x" << got << ", want 0x" << want;
}

// Raw little-endian element access, so that one code path serves every type.
std::uint64_t load(const std::vector<unsigned char>& buffer, std::size_t index, std::size_t size) {
  std::uint64_t value = 0;
  std::memcpy(&value, buffer.data() + index * size, size);
  return value;
}

template <class F>
F load_as(const std::vector<unsigned char>& buffer, std::size_t index) {
  F value;
  std::memcpy(&value, buffer.data() + index * sizeof(F), sizeof(F));
  return value;
}

::testing::AssertionResult element_matches(DataType type, ReduceOp op,
                                           const std::vector<unsigned char>& a,
                                           const std::vector<unsigned char>& b,
                                           const std::vector<unsigned char>& out,
                                           std::size_t index) {
  const std::size_t size = size_of(type);
  switch (type) {
    case DataType::kFloat32:
      return float_matches(load_as<float>(a, index), load_as<float>(b, index),
                           load_as<float>(out, index), op);
    case DataType::kFloat64:
      return float_matches(load_as<double>(a, index), load_as<double>(b, index),
                           load_as<double>(out, index), op);
    case DataType::kFloat16:
      return half_matches(static_cast<std::uint16_t>(load(a, index, 2)),
                          static_cast<std::uint16_t>(load(b, index, 2)),
                          static_cast<std::uint16_t>(load(out, index, 2)), op);
    case DataType::kBfloat16:
      return bf16_matches(static_cast<std::uint16_t>(load(a, index, 2)),
                          static_cast<std::uint16_t>(load(b, index, 2)),
                          static_cast<std::uint16_t>(load(out, index, 2)), op);
    default: {
      const bool is_signed = type == DataType::kInt8 || type == DataType::kInt16 ||
                             type == DataType::kInt32 || type == DataType::kInt64;
      const std::uint64_t want = integer_reference(load(a, index, size), load(b, index, size), op,
                                                   static_cast<unsigned>(size * 8), is_signed);
      const std::uint64_t got = load(out, index, size);
      if (got == want) return ::testing::AssertionSuccess();
      return ::testing::AssertionFailure()
             << "0x" << std::hex << load(a, index, size) << " " << to_string(op) << " 0x"
             << load(b, index, size) << " gave 0x" << got << ", want 0x" << want;
    }
  }
}

// Random bit patterns (every class of float value shows up) with the interesting values mixed in.
std::vector<unsigned char> random_elements(DataType type, std::size_t count, std::mt19937_64& rng) {
  const std::size_t size = size_of(type);
  std::vector<unsigned char> buffer(count * size);
  for (std::size_t i = 0; i < count; ++i) {
    std::uint64_t value = rng();
    if (rng() % 4 == 0) {
      // Small magnitudes, so that sums and products do not only overflow or underflow.
      switch (type) {
        case DataType::kFloat16:
          value = 0x3000 + rng() % 0x1800 + ((rng() & 1) << 15);
          break;
        case DataType::kBfloat16:
          value = 0x3e00 + rng() % 0x300 + ((rng() & 1) << 15);
          break;
        case DataType::kFloat32: {
          const float f = std::ldexp(static_cast<float>(rng() % 20000) - 10000.0f, -7);
          std::memcpy(&value, &f, 4);
          break;
        }
        case DataType::kFloat64: {
          const double d = std::ldexp(static_cast<double>(rng() % 20000) - 10000.0, -7);
          std::memcpy(&value, &d, 8);
          break;
        }
        default:
          value = rng() % 5;
          if (rng() & 1) value = 0 - value;
      }
    }
    std::memcpy(buffer.data() + i * size, &value, size);
  }
  return buffer;
}

TEST(Reduce, EveryTypeAndOpMatchesAScalarReference) {
  std::mt19937_64 rng(12345);
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (is_bitwise(op) && !is_integer(type)) continue;
      for (std::size_t count : kCounts) {
        SCOPED_TRACE(label(type, op, count));
        const std::size_t size = size_of(type);
        const auto a = random_elements(type, count, rng);
        const auto b = random_elements(type, count, rng);
        // A canary after the last element: the kernels must not write past count.
        std::vector<unsigned char> out((count + 1) * size, 0xa5);
        reduce_to(out.data(), a.data(), b.data(), count, type, op);
        for (std::size_t i = 0; i < count; ++i) {
          ASSERT_TRUE(element_matches(type, op, a, b, out, i)) << "at element " << i;
        }
        for (std::size_t k = 0; k < size; ++k) ASSERT_EQ(out[count * size + k], 0xa5);
      }
    }
  }
}

TEST(Reduce, OutputMayAliasAnInput) {
  std::mt19937_64 rng(99);
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (is_bitwise(op) && !is_integer(type)) continue;
      SCOPED_TRACE(label(type, op, 1031));
      const std::size_t count = 1031;
      const auto a = random_elements(type, count, rng);
      const auto b = random_elements(type, count, rng);

      auto out_is_a = a;  // out == a
      reduce_to(out_is_a.data(), out_is_a.data(), b.data(), count, type, op);
      auto out_is_b = b;  // out == b: the operand order must stay a op b
      reduce_to(out_is_b.data(), a.data(), out_is_b.data(), count, type, op);
      auto all_same = a;  // out == a == b
      reduce_to(all_same.data(), all_same.data(), all_same.data(), count, type, op);
      for (std::size_t i = 0; i < count; ++i) {
        ASSERT_TRUE(element_matches(type, op, a, b, out_is_a, i)) << "out == a, element " << i;
        ASSERT_TRUE(element_matches(type, op, a, b, out_is_b, i)) << "out == b, element " << i;
        ASSERT_TRUE(element_matches(type, op, a, a, all_same, i)) << "out == a == b, element " << i;
      }
    }
  }
}

TEST(Reduce, ZeroCountTouchesNothing) {
  for (DataType type : kAllTypes) {
    reduce_to(nullptr, nullptr, nullptr, 0, type, ReduceOp::kSum);
    reduce_to(nullptr, nullptr, nullptr, 0, type, ReduceOp::kMax);
  }
}

template <class T>
T reduce_one(T a, T b, DataType type, ReduceOp op) {
  T out;
  reduce_to(&out, &a, &b, 1, type, op);
  return out;
}

TEST(Reduce, IntegersWrapInsteadOfOverflowing) {
  EXPECT_EQ(reduce_one<std::int8_t>(127, 1, DataType::kInt8, ReduceOp::kSum), -128);
  EXPECT_EQ(reduce_one<std::int8_t>(-128, -1, DataType::kInt8, ReduceOp::kSum), 127);
  EXPECT_EQ(reduce_one<std::int8_t>(16, 16, DataType::kInt8, ReduceOp::kProd), 0);
  EXPECT_EQ(reduce_one<std::int8_t>(-128, -1, DataType::kInt8, ReduceOp::kProd), -128);
  EXPECT_EQ(reduce_one<std::uint8_t>(200, 100, DataType::kUint8, ReduceOp::kSum), 44);
  EXPECT_EQ(reduce_one<std::int16_t>(-32768, -1, DataType::kInt16, ReduceOp::kProd), -32768);
  EXPECT_EQ(reduce_one<std::int16_t>(300, 300, DataType::kInt16, ReduceOp::kProd), 24464);
  // 65535 * 65535 overflows int, to which uint16 promotes.
  EXPECT_EQ(reduce_one<std::uint16_t>(65535, 65535, DataType::kUint16, ReduceOp::kProd), 1);
  constexpr std::int32_t kMax32 = std::numeric_limits<std::int32_t>::max();
  constexpr std::int32_t kMin32 = std::numeric_limits<std::int32_t>::min();
  EXPECT_EQ(reduce_one<std::int32_t>(kMax32, 1, DataType::kInt32, ReduceOp::kSum), kMin32);
  EXPECT_EQ(reduce_one<std::int32_t>(kMin32, -1, DataType::kInt32, ReduceOp::kProd), kMin32);
  EXPECT_EQ(reduce_one<std::int32_t>(65536, 65536, DataType::kInt32, ReduceOp::kProd), 0);
  EXPECT_EQ(reduce_one<std::uint32_t>(0xffffffffu, 2, DataType::kUint32, ReduceOp::kSum), 1u);
  constexpr std::int64_t kMax64 = std::numeric_limits<std::int64_t>::max();
  constexpr std::int64_t kMin64 = std::numeric_limits<std::int64_t>::min();
  EXPECT_EQ(reduce_one<std::int64_t>(kMax64, 1, DataType::kInt64, ReduceOp::kSum), kMin64);
  EXPECT_EQ(reduce_one<std::int64_t>(kMin64, -1, DataType::kInt64, ReduceOp::kProd), kMin64);
  EXPECT_EQ(reduce_one<std::int64_t>(std::int64_t{1} << 32, std::int64_t{1} << 32, DataType::kInt64,
                                     ReduceOp::kProd),
            0);
  EXPECT_EQ(reduce_one<std::uint64_t>(~std::uint64_t{0}, ~std::uint64_t{0}, DataType::kUint64,
                                      ReduceOp::kProd),
            1u);
  // Signed min and max compare as signed, unsigned as unsigned.
  EXPECT_EQ(reduce_one<std::int8_t>(-1, 1, DataType::kInt8, ReduceOp::kMin), -1);
  EXPECT_EQ(reduce_one<std::uint8_t>(255, 1, DataType::kUint8, ReduceOp::kMin), 1);
  EXPECT_EQ(reduce_one<std::int64_t>(kMin64, kMax64, DataType::kInt64, ReduceOp::kMax), kMax64);
}

TEST(Reduce, MinMaxPropagateNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float snan = std::numeric_limits<float>::signaling_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax}) {
    SCOPED_TRACE(to_string(op));
    for (float other : {1.0f, -inf, inf, 0.0f, -0.0f}) {
      EXPECT_TRUE(is_quiet_nan(reduce_one(nan, other, DataType::kFloat32, op)));
      EXPECT_TRUE(is_quiet_nan(reduce_one(other, nan, DataType::kFloat32, op)));
      EXPECT_TRUE(is_quiet_nan(reduce_one(snan, other, DataType::kFloat32, op)));
      EXPECT_TRUE(is_quiet_nan(reduce_one(other, snan, DataType::kFloat32, op)));
      const double d = other;
      EXPECT_TRUE(is_quiet_nan(reduce_one(static_cast<double>(nan), d, DataType::kFloat64, op)));
      EXPECT_TRUE(is_quiet_nan(reduce_one(d, static_cast<double>(nan), DataType::kFloat64, op)));
    }
    // float16 and bfloat16, signaling NaNs (quiet bit clear) included.
    for (std::uint16_t h_nan :
         {std::uint16_t{0x7e00}, std::uint16_t{0x7c01}, std::uint16_t{0xfd00}}) {
      EXPECT_TRUE(
          is_quiet_half_nan(reduce_one<std::uint16_t>(h_nan, 0x3c00, DataType::kFloat16, op)));
      EXPECT_TRUE(
          is_quiet_half_nan(reduce_one<std::uint16_t>(0xfc00, h_nan, DataType::kFloat16, op)));
    }
    for (std::uint16_t b_nan :
         {std::uint16_t{0x7fc0}, std::uint16_t{0x7f81}, std::uint16_t{0xffa0}}) {
      EXPECT_TRUE(
          is_quiet_bf16_nan(reduce_one<std::uint16_t>(b_nan, 0x3f80, DataType::kBfloat16, op)));
      EXPECT_TRUE(
          is_quiet_bf16_nan(reduce_one<std::uint16_t>(0xff80, b_nan, DataType::kBfloat16, op)));
    }
  }
  // Infinities of opposite signs are ordered, not NaN (inf + -inf would be).
  EXPECT_EQ(reduce_one(inf, -inf, DataType::kFloat32, ReduceOp::kMin), -inf);
  EXPECT_EQ(reduce_one(-inf, inf, DataType::kFloat32, ReduceOp::kMax), inf);
  EXPECT_EQ(reduce_one<std::uint16_t>(0x7c00, 0xfc00, DataType::kFloat16, ReduceOp::kMin), 0xfc00);
  EXPECT_EQ(reduce_one<std::uint16_t>(0xff80, 0x7f80, DataType::kBfloat16, ReduceOp::kMax), 0x7f80);
}

TEST(Reduce, MinMaxOrderNegativeZeroBelowPositiveZero) {
  for (auto [a, b] : {std::pair{0.0f, -0.0f}, std::pair{-0.0f, 0.0f}}) {
    EXPECT_TRUE(std::signbit(reduce_one(a, b, DataType::kFloat32, ReduceOp::kMin)));
    EXPECT_FALSE(std::signbit(reduce_one(a, b, DataType::kFloat32, ReduceOp::kMax)));
    const double x = a;
    const double y = b;
    EXPECT_TRUE(std::signbit(reduce_one(x, y, DataType::kFloat64, ReduceOp::kMin)));
    EXPECT_FALSE(std::signbit(reduce_one(x, y, DataType::kFloat64, ReduceOp::kMax)));
  }
  EXPECT_EQ(reduce_one<std::uint16_t>(0x0000, 0x8000, DataType::kFloat16, ReduceOp::kMin), 0x8000);
  EXPECT_EQ(reduce_one<std::uint16_t>(0x8000, 0x0000, DataType::kFloat16, ReduceOp::kMax), 0x0000);
  EXPECT_EQ(reduce_one<std::uint16_t>(0x0000, 0x8000, DataType::kBfloat16, ReduceOp::kMin), 0x8000);
}

TEST(Reduce, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(0.0f), 0x0000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);   // largest finite
  EXPECT_EQ(float_to_half(65519.99f), 0x7bff);  // just under the midpoint to 2^16
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);   // the midpoint ties to "even": infinity
  EXPECT_EQ(float_to_half(-1e10f), 0xfc00);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(float_to_half(0x1p-24f), 0x0001);      // smallest subnormal
  EXPECT_EQ(float_to_half(0x1p-25f), 0x0000);      // half of it ties to even: zero
  EXPECT_EQ(float_to_half(0x1.8p-25f), 0x0001);    // above the tie
  EXPECT_EQ(float_to_half(0x3p-25f), 0x0002);      // 1.5 * 2^-24 ties to even: 2
  EXPECT_EQ(float_to_half(-0x1p-26f), 0x8000);     // underflows to -0
  EXPECT_EQ(float_to_half(0x1p-14f), 0x0400);      // smallest normal
  EXPECT_EQ(float_to_half(0x1.ffcp-15f), 0x0400);  // largest subnormal + half ulp: tie, even
  EXPECT_EQ(float_to_half(0x1.002p0f), 0x3c00);    // 1 + 2^-11: tie, 1.0 is even
  EXPECT_EQ(float_to_half(0x1.006p0f), 0x3c02);    // 1 + 3 * 2^-11: tie, rounds up to even
  EXPECT_EQ(float_to_half(0x1.002p0f + 0x1p-20f), 0x3c01);  // just over the tie
  EXPECT_EQ(float_to_half(1e-10f), 0x0000);
  EXPECT_EQ(float_to_half(std::numeric_limits<float>::denorm_min()), 0x0000);

  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0001), 0x1p-24f);
  EXPECT_EQ(half_to_float(0x03ff), 0x1.ff8p-15f);
  EXPECT_EQ(half_to_float(0x0400), 0x1p-14f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)) && half_to_float(0x8000) == 0.0f);
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(half_to_float(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(is_quiet_nan(half_to_float(0x7c01)));  // signaling in, quiet out (as F16C)
  EXPECT_TRUE(is_quiet_nan(half_to_float(0xfe00)));
}

TEST(Reduce, HalfToFloatIsExactForEveryBitPattern) {
  for (std::uint32_t h = 0; h <= 0xffff; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const double want = half_value(bits);
    const float got = half_to_float(bits);
    if (std::isnan(want)) {
      ASSERT_TRUE(is_quiet_nan(got)) << std::hex << h;
      ASSERT_EQ(std::signbit(got), (h & 0x8000) != 0) << std::hex << h;
    } else {
      ASSERT_EQ(static_cast<double>(got), want) << std::hex << h;
      ASSERT_EQ(std::signbit(got), std::signbit(want)) << std::hex << h;
      // And back again, unchanged.
      ASSERT_EQ(float_to_half(got), bits) << std::hex << h;
    }
  }
}

TEST(Reduce, FloatToHalfMatchesCorrectRoundingNearEveryHalf) {
  // Each binary16 value, the midpoints to its neighbours and the floats either side of those:
  // where rounding decides. Then random floats.
  std::vector<float> inputs;
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    const double value = half_value(static_cast<std::uint16_t>(h));
    const double next = h == 0x7bff ? 65536.0 : half_value(static_cast<std::uint16_t>(h + 1));
    const auto midpoint = static_cast<float>((value + next) / 2);  // exact in float
    for (float x : {static_cast<float>(value), midpoint, std::nextafter(midpoint, 0.0f),
                    std::nextafter(midpoint, 1e30f)}) {
      inputs.push_back(x);
      inputs.push_back(-x);
    }
  }
  std::mt19937 rng(4242);
  for (int i = 0; i < 200000; ++i) {
    const std::uint32_t bits = rng();
    float x;
    std::memcpy(&x, &bits, sizeof x);
    inputs.push_back(x);
  }
  for (float x : inputs) {
    const std::uint16_t got = float_to_half(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(is_quiet_half_nan(got)) << x;
    } else {
      ASSERT_EQ(got, round_to_half(x)) << std::hexfloat << x;
    }
  }
#ifdef __FLT16_MAX__
  // Cross-check with the compiler's own binary16 conversion where it has one.
  for (float x : inputs) {
    if (std::isnan(x)) continue;
    const auto h = static_cast<_Float16>(x);
    std::uint16_t want;
    std::memcpy(&want, &h, sizeof want);
    ASSERT_EQ(float_to_half(x), want) << std::hexfloat << x;
  }
#endif
}

TEST(Reduce, Bfloat16RoundsToNearestEven) {
  EXPECT_EQ(float_to_bf16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bf16(0x1.01p0f), 0x3f80);               // 1 + 2^-8: tie, 1.0 is even
  EXPECT_EQ(float_to_bf16(0x1.03p0f), 0x3f82);               // 1 + 3 * 2^-8: tie, up to even
  EXPECT_EQ(float_to_bf16(0x1.0100p0f + 0x1p-20f), 0x3f81);  // just over the tie
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::max()), 0x7f80);  // overflow: infinity
  EXPECT_EQ(float_to_bf16(0x1.fep127f), 0x7f7f);                        // largest finite bfloat16
  EXPECT_EQ(float_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(float_to_bf16(0x1p-133f), 0x0001);  // smallest subnormal bfloat16
  EXPECT_EQ(bf16_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_to_float(0x0001), 0x1p-133f);
  EXPECT_EQ(bf16_to_float(0xff80), -std::numeric_limits<float>::infinity());

  std::mt19937 rng(31337);
  for (int i = 0; i < 300000; ++i) {
    std::uint32_t bits = rng();
    if (i % 3 == 0) bits = (bits & 0xffff0000u) | 0x8000u;  // exact ties
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const std::uint16_t got = float_to_bf16(x);
    if (std::isnan(x)) {
      ASSERT_TRUE(is_quiet_bf16_nan(got)) << std::hex << bits;
    } else {
      ASSERT_EQ(got, round_to_bf16(x)) << std::hex << bits;
    }
  }
}

TEST(Reduce, NarrowingKeepsNaNAQuietNaN) {
  // Payloads only in the bits that narrowing drops must not turn into infinity.
  for (std::uint32_t bits : {0x7f800001u, 0x7f801000u, 0xff800001u, 0x7fc00000u, 0x7fffffffu}) {
    float x;
    std::memcpy(&x, &bits, sizeof x);
    const std::uint16_t h = float_to_half(x);
    EXPECT_TRUE(is_quiet_half_nan(h)) << std::hex << bits << " -> " << h;
    EXPECT_EQ((h & 0x8000) != 0, (bits >> 31) != 0);
    const std::uint16_t b = float_to_bf16(x);
    EXPECT_TRUE(is_quiet_bf16_nan(b)) << std::hex << bits << " -> " << b;
    EXPECT_EQ((b & 0x8000) != 0, (bits >> 31) != 0);
  }
  EXPECT_TRUE(is_half_nan(0x7c01));
  EXPECT_TRUE(is_bf16_nan(0x7f81));
}

TEST(Reduce, BitwiseOpsRefuseFloats) {
  for (DataType type : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      const Status status = check_reduction(type, op);
      if (is_bitwise(op) && !is_integer(type)) {
        EXPECT_EQ(status.code(), Code::kInvalidArgument) << label(type, op, 0);
        EXPECT_NE(status.message().find(to_string(type)), std::string::npos) << status.message();
        EXPECT_NE(status.message().find(to_string(op)), std::string::npos) << status.message();
        EXPECT_NE(status.message().find("integer"), std::string::npos) << status.message();
        // A refused pair is a precondition violation; the kernels leave the buffer alone.
        std::vector<unsigned char> out(8 * size_of(type), 0x5a);
        const std::vector<unsigned char> in(8 * size_of(type), 0x33);
        reduce_to(out.data(), in.data(), in.data(), 8, type, op);
        EXPECT_EQ(out, std::vector<unsigned char>(out.size(), 0x5a));
      } else {
        EXPECT_TRUE(status.is_ok()) << label(type, op, 0) << ": " << status.to_string();
      }
    }
  }
}

TEST(Reduce, UnknownEnumValuesAreRefused) {
  const auto bad_type = static_cast<DataType>(12);
  const auto bad_op = static_cast<ReduceOp>(7);
  EXPECT_EQ(check_reduction(bad_type, ReduceOp::kSum).code(), Code::kInvalidArgument);
  EXPECT_EQ(check_reduction(DataType::kInt32, bad_op).code(), Code::kInvalidArgument);
  EXPECT_NE(check_reduction(bad_type, ReduceOp::kSum).message().find("12"), std::string::npos);
  EXPECT_NE(check_reduction(DataType::kInt32, bad_op).message().find("7"), std::string::npos);
  EXPECT_STREQ(to_string(bad_type), "unknown");
  EXPECT_STREQ(to_string(bad_op), "unknown");
  EXPECT_EQ(size_of(bad_type), 0u);
  std::int32_t out = 5;
  const std::int32_t in = 7;
  reduce_to(&out, &in, &in, 1, bad_type, ReduceOp::kSum);
  reduce_to(&out, &in, &in, 1, DataType::kInt32, bad_op);
  EXPECT_EQ(out, 5);
}

TEST(Reduce, TypesHaveTheirNamesAndSizes) {
  const char* names[] = {"int8",   "int16",  "int32",   "int64",    "uint8",   "uint16",
                         "uint32", "uint64", "float16", "bfloat16", "float32", "float64"};
  const std::size_t sizes[] = {1, 2, 4, 8, 1, 2, 4, 8, 2, 2, 4, 8};
  for (std::size_t i = 0; i < std::size(kAllTypes); ++i) {
    EXPECT_STREQ(to_string(kAllTypes[i]), names[i]);
    EXPECT_EQ(size_of(kAllTypes[i]), sizes[i]);
  }
  const char* op_names[] = {"sum", "prod", "min", "max", "band", "bor", "bxor"};
  for (std::size_t i = 0; i < std::size(kAllOps); ++i) {
    EXPECT_STREQ(to_string(kAllOps[i]), op_names[i]);
  }
}

}  // namespace
}  // namespace ferry::coll
