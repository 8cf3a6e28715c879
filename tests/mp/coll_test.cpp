// The collectives, run by every rank under ferryrun (1 to 8 ranks; CTest also forces each
// algorithm). Every result is compared with a reference computed here element by element from
// inputs that every rank can generate. Value checks are EXPECTs so that a wrong value on one rank
// never leaves the others waiting in the next collective.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "../helpers/ranks_main.hpp"
#include "coll/reduce.hpp"  // the 16-bit float conversions (tested on their own in the unit tests)
#include "ferry/ferry.hpp"

namespace ferry {
namespace {

Communicator& world() {
  static Communicator w = test::ctx().world();
  return w;
}
int me() { return world().rank(); }
int nranks() { return world().size(); }

constexpr DataType kTypes[] = {DataType::kInt8,     DataType::kInt16,   DataType::kInt32,
                               DataType::kInt64,    DataType::kUint8,   DataType::kUint16,
                               DataType::kUint32,   DataType::kUint64,  DataType::kFloat16,
                               DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum,    ReduceOp::kProd,  ReduceOp::kMin,   ReduceOp::kMax,
                             ReduceOp::kBitAnd, ReduceOp::kBitOr, ReduceOp::kBitXor};
constexpr std::size_t kCounts[] = {0, 1, 7, 1031, 20011};

bool is_float(DataType t) { return t >= DataType::kFloat16; }
bool is_signed(DataType t) { return t <= DataType::kInt64; }
bool valid(DataType t, ReduceOp op) { return !is_float(t) || op <= ReduceOp::kMax; }

// Element i of `rank`'s input for (type, op): small integers, so that every float type holds
// every partial result exactly and the reference needs no tolerance.
std::int64_t input(ReduceOp op, int rank, std::size_t i, int seed) {
  const auto r = static_cast<std::int64_t>(rank);
  const auto x = static_cast<std::int64_t>(i);
  switch (op) {
    case ReduceOp::kSum:
      return (r * 7 + x * 3 + seed) % 9 - 4;
    case ReduceOp::kProd: {
      static constexpr std::int64_t kFactors[] = {1, -1, 2, 1, -2, 1, 1, -1};
      return kFactors[(r * 3 + x + seed) % 8];
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return (r * 37 + x * 11 + seed * 5) % 201 - 100;
    default:
      return static_cast<std::int64_t>((static_cast<std::uint64_t>(r + 1) * 0x9e3779b97f4a7c15ull) ^
                                       (static_cast<std::uint64_t>(x) * 0x85ebca6bull) ^
                                       static_cast<std::uint64_t>(seed));
  }
}

// Stores v (an integer value) as element i of a buffer of `type`.
void store(DataType type, std::byte* buffer, std::size_t i, std::int64_t v) {
  const std::size_t size = size_of(type);
  std::byte* at = buffer + i * size;
  switch (type) {
    case DataType::kFloat16: {
      const std::uint16_t h = coll::float_to_half(static_cast<float>(v));
      std::memcpy(at, &h, 2);
      return;
    }
    case DataType::kBfloat16: {
      const std::uint16_t h = coll::float_to_bf16(static_cast<float>(v));
      std::memcpy(at, &h, 2);
      return;
    }
    case DataType::kFloat32: {
      const auto f = static_cast<float>(v);
      std::memcpy(at, &f, 4);
      return;
    }
    case DataType::kFloat64: {
      const auto d = static_cast<double>(v);
      std::memcpy(at, &d, 8);
      return;
    }
    default:
      std::memcpy(at, &v, size);  // little endian: the low bytes, i.e. the value modulo 2^bits
  }
}

// The value an integer type holds after store(), widened back (sign- or zero-extended).
std::int64_t narrow(DataType type, std::int64_t v) {
  const std::size_t bits = size_of(type) * 8;
  if (bits == 64) return v;
  const std::uint64_t mask = (std::uint64_t{1} << bits) - 1;
  std::uint64_t u = static_cast<std::uint64_t>(v) & mask;
  if (is_signed(type) && (u >> (bits - 1)) != 0) u |= ~mask;
  return static_cast<std::int64_t>(u);
}

std::vector<std::byte> make_input(DataType type, ReduceOp op, int rank, std::size_t count,
                                  int seed) {
  std::vector<std::byte> v(count * size_of(type));
  for (std::size_t i = 0; i < count; ++i) store(type, v.data(), i, input(op, rank, i, seed));
  return v;
}

// The reduction over ranks 0..n-1 of element i, folded in rank order in wide arithmetic.
std::int64_t reference(DataType type, ReduceOp op, int n, std::size_t i, int seed) {
  if (is_float(type)) {
    double acc = static_cast<double>(input(op, 0, i, seed));
    for (int r = 1; r < n; ++r) {
      const auto v = static_cast<double>(input(op, r, i, seed));
      acc = op == ReduceOp::kSum    ? acc + v
            : op == ReduceOp::kProd ? acc * v
            : op == ReduceOp::kMin  ? std::min(acc, v)
                                    : std::max(acc, v);
    }
    return static_cast<std::int64_t>(acc);
  }
  std::int64_t acc = narrow(type, input(op, 0, i, seed));
  for (int r = 1; r < n; ++r) {
    const std::int64_t v = narrow(type, input(op, r, i, seed));
    const auto ua = static_cast<std::uint64_t>(acc);
    const auto uv = static_cast<std::uint64_t>(v);
    switch (op) {
      case ReduceOp::kSum:
        acc = narrow(type, static_cast<std::int64_t>(ua + uv));
        break;
      case ReduceOp::kProd:
        acc = narrow(type, static_cast<std::int64_t>(ua * uv));
        break;
      case ReduceOp::kMin:
        acc = is_signed(type) || size_of(type) < 8 ? std::min(acc, v)
                                                   : static_cast<std::int64_t>(std::min(ua, uv));
        break;
      case ReduceOp::kMax:
        acc = is_signed(type) || size_of(type) < 8 ? std::max(acc, v)
                                                   : static_cast<std::int64_t>(std::max(ua, uv));
        break;
      case ReduceOp::kBitAnd:
        acc = static_cast<std::int64_t>(ua & uv);
        break;
      case ReduceOp::kBitOr:
        acc = static_cast<std::int64_t>(ua | uv);
        break;
      case ReduceOp::kBitXor:
        acc = static_cast<std::int64_t>(ua ^ uv);
        break;
    }
  }
  return acc;
}

// The reference for elements [first, first + count) in the bytes of `type`.
std::vector<std::byte> expected(DataType type, ReduceOp op, std::size_t first, std::size_t count,
                                int seed) {
  std::vector<std::byte> v(count * size_of(type));
  for (std::size_t i = 0; i < count; ++i) {
    store(type, v.data(), i, reference(type, op, nranks(), first + i, seed));
  }
  return v;
}

std::string name(DataType type, ReduceOp op, std::size_t count) {
  return std::string(to_string(type)) + " " + to_string(op) + " x" + std::to_string(count);
}

// Index of the first differing element, or -1.
long mismatch(const std::vector<std::byte>& got, const std::vector<std::byte>& want,
              std::size_t element) {
  for (std::size_t i = 0; i < want.size(); ++i) {
    if (got[i] != want[i]) return static_cast<long>(i / element);
  }
  return -1;
}

TEST(Collectives, AllreduceEveryTypeOpAndSize) {
  int seed = 0;
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      if (!valid(type, op)) continue;
      for (std::size_t count : kCounts) {
        ++seed;
        const std::vector<std::byte> in = make_input(type, op, me(), count, seed);
        std::vector<std::byte> out(in.size() + 1, std::byte{0x5a});
        ASSERT_TRUE(world().allreduce(in.data(), out.data(), count, type, op).is_ok())
            << name(type, op, count);
        EXPECT_EQ(mismatch(out, expected(type, op, 0, count, seed), size_of(type)), -1)
            << name(type, op, count);
        EXPECT_EQ(out.back(), std::byte{0x5a}) << "wrote past the end: " << name(type, op, count);
        // In place.
        std::vector<std::byte> inout = in;
        ASSERT_TRUE(world().allreduce(inout.data(), inout.data(), count, type, op).is_ok());
        EXPECT_EQ(mismatch(inout, expected(type, op, 0, count, seed), size_of(type)), -1)
            << "in place: " << name(type, op, count);
      }
    }
  }
}

TEST(Collectives, ReduceToEveryRoot) {
  int seed = 1000;
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      if (!valid(type, op)) continue;
      for (std::size_t count : kCounts) {
        ++seed;
        const int root = seed % nranks();
        const std::vector<std::byte> in = make_input(type, op, me(), count, seed);
        std::vector<std::byte> out(in.size(), std::byte{0x5a});
        ASSERT_TRUE(world().reduce(in.data(), out.data(), count, type, op, root).is_ok());
        if (me() == root) {
          EXPECT_EQ(mismatch(out, expected(type, op, 0, count, seed), size_of(type)), -1)
              << name(type, op, count) << " root " << root;
        } else {
          EXPECT_EQ(out, std::vector<std::byte>(in.size(), std::byte{0x5a}))
              << "a non-root's receive buffer was written";
        }
      }
    }
  }
}

TEST(Collectives, ReduceScatterGivesEachMemberItsBlock) {
  int seed = 2000;
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      if (!valid(type, op)) continue;
      for (std::size_t count :
           {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{2503}}) {
        ++seed;
        const auto n = static_cast<std::size_t>(nranks());
        const std::vector<std::byte> in = make_input(type, op, me(), count * n, seed);
        std::vector<std::byte> out(count * size_of(type));
        ASSERT_TRUE(world().reduce_scatter(in.data(), out.data(), count, type, op).is_ok());
        EXPECT_EQ(
            mismatch(out, expected(type, op, count * static_cast<std::size_t>(me()), count, seed),
                     size_of(type)),
            -1)
            << name(type, op, count);
      }
    }
  }
}

std::vector<std::byte> pattern(std::size_t bytes, int source, int seed) {
  std::vector<std::byte> v(bytes);
  for (std::size_t i = 0; i < bytes; ++i) {
    v[i] = static_cast<std::byte>((i * 7 + static_cast<std::size_t>(source) * 31 +
                                   static_cast<std::size_t>(seed) * 13 + (i >> 8)) &
                                  0xff);
  }
  return v;
}

TEST(Collectives, BroadcastFromEveryRoot) {
  int seed = 0;
  for (std::size_t count : {0ul, 1ul, 7ul, 1031ul, 300007ul}) {
    for (int root = 0; root < nranks(); ++root) {
      for (DataType type : kTypes) {
        // Every type at the small sizes; the large one with a 1- and an 8-byte type.
        if (count > 1031 && type != DataType::kUint8 && type != DataType::kFloat64) continue;
        ++seed;
        const std::size_t bytes = count * size_of(type);
        std::vector<std::byte> data =
            me() == root ? pattern(bytes, root, seed) : std::vector<std::byte>(bytes);
        ASSERT_TRUE(world().broadcast(data.data(), count, type, root).is_ok());
        EXPECT_EQ(data, pattern(bytes, root, seed))
            << count << " x " << to_string(type) << " from root " << root;
      }
    }
  }
}

TEST(Collectives, AllgatherAndGatherAndScatterPlaceEveryBlock) {
  const auto n = static_cast<std::size_t>(nranks());
  int seed = 0;
  for (std::size_t count : {0ul, 1ul, 7ul, 1031ul, 40009ul}) {
    for (DataType type : kTypes) {
      if (count > 1031 && type != DataType::kUint8 && type != DataType::kFloat16 &&
          type != DataType::kInt32 && type != DataType::kFloat64) {
        continue;
      }
      ++seed;
      const std::size_t bytes = count * size_of(type);
      std::vector<std::byte> all(bytes * n);
      for (std::size_t r = 0; r < n; ++r) {
        const auto block = pattern(bytes, static_cast<int>(r), seed);
        std::copy(block.begin(), block.end(), all.begin() + static_cast<long>(r * bytes));
      }
      const std::vector<std::byte> mine = pattern(bytes, me(), seed);
      std::vector<std::byte> got(bytes * n);
      ASSERT_TRUE(world().allgather(mine.data(), got.data(), count, type).is_ok());
      EXPECT_EQ(got, all) << "allgather " << count << " x " << to_string(type);
      // In place: our block already sits in the receive buffer.
      std::vector<std::byte> inplace(bytes * n);
      std::copy(mine.begin(), mine.end(), inplace.begin() + static_cast<long>(me() * bytes));
      ASSERT_TRUE(
          world().allgather(inplace.data() + me() * bytes, inplace.data(), count, type).is_ok());
      EXPECT_EQ(inplace, all) << "allgather in place " << count;

      const int root = seed % nranks();
      std::vector<std::byte> gathered(me() == root ? bytes * n : 0);
      ASSERT_TRUE(world().gather(mine.data(), gathered.data(), count, type, root).is_ok());
      if (me() == root) {
        EXPECT_EQ(gathered, all) << "gather " << count << " to " << root;
      }

      std::vector<std::byte> piece(bytes);
      ASSERT_TRUE(world()
                      .scatter(me() == root ? all.data() : nullptr, piece.data(), count, type, root)
                      .is_ok());
      EXPECT_EQ(piece, mine) << "scatter " << count << " from " << root;
    }
  }
}

TEST(Collectives, UnevenAllgathervAndAlltoallv) {
  const auto n = static_cast<std::size_t>(nranks());
  for (int seed = 0; seed < 3; ++seed) {
    // Member r contributes (r * 5 + seed * 3) % 11 elements (some none), packed with a gap.
    std::vector<std::size_t> counts(n), displacements(n);
    std::size_t at = 0;
    for (std::size_t r = 0; r < n; ++r) {
      counts[r] = (r * 5 + static_cast<std::size_t>(seed) * 3) % 11;
      displacements[r] = at;
      at += counts[r] + 2;
    }
    const auto element = size_of(DataType::kInt32);
    std::vector<std::byte> want(at * element, std::byte{0});
    for (std::size_t r = 0; r < n; ++r) {
      const auto block = pattern(counts[r] * element, static_cast<int>(r), seed);
      std::copy(block.begin(), block.end(),
                want.begin() + static_cast<long>(displacements[r] * element));
    }
    const auto mine = pattern(counts[static_cast<std::size_t>(me())] * element, me(), seed);
    std::vector<std::byte> got(at * element, std::byte{0});
    ASSERT_TRUE(world()
                    .allgatherv(mine.data(), got.data(), counts, displacements, DataType::kInt32)
                    .is_ok());
    EXPECT_EQ(got, want) << "allgatherv, seed " << seed;

    // alltoallv: member s sends (s + d + seed) % 4 bytes-patterned elements to member d.
    auto amount = [&](std::size_t s, std::size_t d) { return (s + 2 * d + seed) % 5; };
    const auto self = static_cast<std::size_t>(me());
    std::vector<std::size_t> sc(n), sd(n), rc(n), rd(n);
    std::size_t out_at = 0, in_at = 0;
    for (std::size_t d = 0; d < n; ++d) {
      sc[d] = amount(self, d);
      sd[d] = out_at;
      out_at += sc[d];
      rc[d] = amount(d, self);
      rd[d] = in_at;
      in_at += rc[d] + 1;
    }
    std::vector<std::byte> out(out_at * element);
    for (std::size_t d = 0; d < n; ++d) {
      const auto block = pattern(sc[d] * element, me() * 100 + static_cast<int>(d), seed);
      std::copy(block.begin(), block.end(), out.begin() + static_cast<long>(sd[d] * element));
    }
    std::vector<std::byte> in(in_at * element, std::byte{0});
    ASSERT_TRUE(world().alltoallv(out.data(), sc, sd, in.data(), rc, rd, DataType::kInt32).is_ok());
    for (std::size_t s = 0; s < n; ++s) {
      const auto block = pattern(rc[s] * element, static_cast<int>(s) * 100 + me(), seed);
      EXPECT_TRUE(
          std::equal(block.begin(), block.end(), in.begin() + static_cast<long>(rd[s] * element)))
          << "alltoallv block from " << s << ", seed " << seed;
    }
  }
}

TEST(Collectives, AlltoallSendsBlockRToMemberR) {
  const auto n = static_cast<std::size_t>(nranks());
  for (std::size_t count : {0ul, 1ul, 513ul, 20000ul}) {
    for (DataType type : kTypes) {
      if (count > 513 && type != DataType::kFloat64) continue;
      const std::size_t bytes = count * size_of(type);
      std::vector<std::byte> out(bytes * n), in(bytes * n);
      for (std::size_t d = 0; d < n; ++d) {
        const auto block = pattern(bytes, me() * 100 + static_cast<int>(d), 1);
        std::copy(block.begin(), block.end(), out.begin() + static_cast<long>(d * bytes));
      }
      ASSERT_TRUE(world().alltoall(out.data(), in.data(), count, type).is_ok());
      for (std::size_t s = 0; s < n; ++s) {
        const auto block = pattern(bytes, static_cast<int>(s) * 100 + me(), 1);
        EXPECT_TRUE(
            std::equal(block.begin(), block.end(), in.begin() + static_cast<long>(s * bytes)))
            << "alltoall block from " << s << ", " << count << " x " << to_string(type);
      }
    }
  }
}

TEST(Collectives, BarrierWaitsForTheLastMember) {
  using Clock = std::chrono::steady_clock;
  for (int late = 0; late < nranks(); late += std::max(1, nranks() - 1)) {
    ASSERT_TRUE(world().barrier().is_ok());  // everyone starts together, then `late` dawdles
    if (me() == late) ::usleep(300000);
    const auto start = Clock::now();
    ASSERT_TRUE(world().barrier().is_ok());
    const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    if (me() != late) {
      EXPECT_GT(ms, 150) << "left the barrier before rank " << late << " came";
    }
  }
}

TEST(Collectives, SplitOrdersByKeyAndKeepsCommunicatorsApart) {
  // Two colors (even and odd ranks), ordered by descending rank; rank 0 (if alone in its color it
  // would still get a communicator) sits out with kUndefined when there are 3 or more ranks.
  const bool out = nranks() >= 3 && me() == 0;
  Communicator sub = world().split(out ? Communicator::kUndefined : me() % 2, -me());
  if (out) {
    EXPECT_FALSE(sub.valid());
    EXPECT_EQ(sub.allreduce(nullptr, nullptr, 0, DataType::kInt32, ReduceOp::kSum).code(),
              Code::kInvalidArgument);
  } else {
    std::vector<int> members;
    for (int r = nranks() - 1; r >= 0; --r) {
      if (r % 2 == me() % 2 && !(nranks() >= 3 && r == 0)) members.push_back(r);
    }
    EXPECT_EQ(sub.size(), static_cast<int>(members.size()));
    for (int m = 0; m < sub.size() && m < static_cast<int>(members.size()); ++m) {
      EXPECT_EQ(sub.world_rank(m), members[static_cast<std::size_t>(m)]);
    }
    EXPECT_EQ(sub.world_rank(sub.rank()), me());
  }
  // A collective on the sub-communicator and one on the world in flight together.
  std::int64_t mine = me() + 1, in_sub = 0, in_world = 0;
  Request a;
  if (sub.valid()) a = sub.iallreduce(&mine, &in_sub, 1, DataType::kInt64, ReduceOp::kSum);
  Request b = world().iallreduce(&mine, &in_world, 1, DataType::kInt64, ReduceOp::kSum);
  ASSERT_TRUE(b.wait().is_ok());
  if (sub.valid()) {
    ASSERT_TRUE(a.wait().is_ok());
    std::int64_t want = 0;
    for (int m = 0; m < sub.size(); ++m) want += sub.world_rank(m) + 1;
    EXPECT_EQ(in_sub, want);
    // A split of the split.
    Communicator pairs = sub.split(sub.rank() / 2, sub.rank());
    std::int64_t got = 0;
    ASSERT_TRUE(pairs.allreduce(&mine, &got, 1, DataType::kInt64, ReduceOp::kMax).is_ok());
    std::int64_t most = 0;
    for (int m = 0; m < pairs.size(); ++m)
      most = std::max<std::int64_t>(most, pairs.world_rank(m) + 1);
    EXPECT_EQ(got, most);
  }
  EXPECT_EQ(in_world, static_cast<std::int64_t>(nranks()) * (nranks() + 1) / 2);
}

TEST(Collectives, NonBlockingCollectivesCompleteInAnyOrder) {
  constexpr int kOps = 6;
  std::vector<std::vector<float>> in(kOps), out(kOps);
  std::vector<Request> requests;
  for (int k = 0; k < kOps; ++k) {
    const std::size_t count = k % 2 == 0 ? 3 : 50000;  // latency and bandwidth algorithms
    in[k].assign(count, static_cast<float>(me() + k));
    out[k].assign(count, -1);
    requests.push_back(
        world().iallreduce(in[k].data(), out[k].data(), count, DataType::kFloat32, ReduceOp::kSum));
  }
  std::vector<std::uint8_t> data(1000);
  if (me() == 0) std::iota(data.begin(), data.end(), 0);
  requests.push_back(world().ibroadcast(data.data(), data.size(), DataType::kUint8, 0));
  // A blocking collective while those are in flight moves them forward as it waits.
  std::int32_t one = 1, members = 0;
  ASSERT_TRUE(world().allreduce(&one, &members, 1, DataType::kInt32, ReduceOp::kSum).is_ok());
  EXPECT_EQ(members, nranks());
  for (int k = static_cast<int>(requests.size()) - 1; k >= 0; --k) {
    ASSERT_TRUE(requests[static_cast<std::size_t>(k)].wait().is_ok()) << k;
  }
  const float n = static_cast<float>(nranks());
  for (int k = 0; k < kOps; ++k) {
    const float want = n * (n - 1) / 2 + n * static_cast<float>(k);
    EXPECT_EQ(std::count(out[k].begin(), out[k].end(), want), static_cast<long>(out[k].size()))
        << "operation " << k;
  }
  for (std::size_t i = 0; i < data.size(); ++i) ASSERT_EQ(data[i], static_cast<std::uint8_t>(i));
}

TEST(Collectives, ApplicationReceivesNeverTakeCollectiveMessages) {
  // A receive from anyone with any tag stays posted across collectives.
  char sink[64];
  Request any = test::ctx().irecv(sink, sizeof(sink), kAnySource, 0, 0);
  std::int32_t one = 1, sum = 0;
  ASSERT_TRUE(world().allreduce(&one, &sum, 1, DataType::kInt32, ReduceOp::kSum).is_ok());
  EXPECT_EQ(sum, nranks());
  ASSERT_TRUE(world().barrier().is_ok());
  EXPECT_FALSE(any.test());
  EXPECT_TRUE(any.cancel());
  EXPECT_FALSE(test::ctx().iprobe(kAnySource, 0, 0).has_value());
  // Tags with the reserved bit are refused.
  Status s = test::ctx().send(&one, 4, me(), kReservedTagBit | 5);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("reserve"), std::string::npos) << s.message();
  EXPECT_EQ(test::ctx().recv(&one, 4, me(), kReservedTagBit).code(), Code::kInvalidArgument);
}

TEST(Collectives, BadArgumentsFailOnEveryMemberWithAReason) {
  float x = 1, y = 0;
  Status s = world().allreduce(&x, &y, 1, DataType::kFloat32, ReduceOp::kBitXor);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("float32"), std::string::npos) << s.message();
  s = world().broadcast(&x, 1, DataType::kFloat32, nranks());
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("root"), std::string::npos) << s.message();
  s = world().allreduce(nullptr, &y, 4, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("null"), std::string::npos) << s.message();
  s = world().allreduce(&x, &y, 1, static_cast<DataType>(99), ReduceOp::kSum);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  std::vector<std::size_t> short_counts(static_cast<std::size_t>(nranks()) + 1, 1);
  s = world().allgatherv(&x, &y, short_counts, short_counts, DataType::kFloat32);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_THROW(world().split(-5, 0), Error);
  // The communicator still works after refused calls.
  ASSERT_TRUE(world().allreduce(&x, &y, 1, DataType::kFloat32, ReduceOp::kSum).is_ok());
  EXPECT_EQ(y, static_cast<float>(nranks()));
}

TEST(Collectives, MismatchedCountsAreAnErrorNotAHang) {
  if (nranks() != 2) GTEST_SKIP() << "needs exactly 2 ranks (pairs detect it on both sides)";
  std::vector<std::int32_t> in(16, 1), out(16);
  const std::size_t count = me() == 0 ? 8 : 16;
  Status s = world().allreduce(in.data(), out.data(), count, DataType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.message().find("same counts"), std::string::npos) << s.message();
}

TEST(Collectives, MismatchedRootsThroughTheAreaAreAnErrorNotAHang) {
  if (nranks() != 2) GTEST_SKIP() << "needs exactly 2 ranks";
  const char* node = std::getenv("FERRY_COLL_NODE");
  if (node != nullptr && std::string(node) == "0") GTEST_SKIP() << "by messages: not detected";
  // Each member names itself the root. Read by address (from 16 KiB, or 128 KiB where the
  // kernel's copy is slow; below 256 KiB for a reduce), a broadcast's root waits until its
  // readers have read, and between two members a reduce's root reads the other's input: each
  // would wait for the other; each sees the other's call differ instead.
  for (int kind = 0; kind < 2; ++kind) {
    Communicator comm = world().split(0, me());
    std::vector<float> data(40000, 1.0f), out(40000);
    Status s = kind == 0 ? comm.broadcast(data.data(), data.size(), DataType::kFloat32, me())
                         : comm.reduce(data.data(), out.data(), data.size(), DataType::kFloat32,
                                       ReduceOp::kSum, me());
    EXPECT_EQ(s.code(), Code::kInvalidArgument)
        << (kind == 0 ? "broadcast: " : "reduce: ") << s.to_string();
    EXPECT_NE(s.message().find("same c"), std::string::npos) << s.message();
    std::int64_t one = 1, sum = 0;
    ASSERT_TRUE(comm.allreduce(&one, &sum, 1, DataType::kInt64, ReduceOp::kSum).is_ok());
    EXPECT_EQ(sum, 2);
  }
}

TEST(Collectives, TimeoutWithdrawsABlockingCollective) {
  // Run by CTest with FERRY_TIMEOUT=0.5 (coll.timeout). Rank 0 enters an allreduce that rank 1
  // joins only after 1.5 s: rank 0 gets kTimeout after about 0.5 s with its transfers withdrawn,
  // and rank 1's allreduce then fails at once (rank 0 withdrew what it sends), and neither waits.
  const char* timeout = std::getenv("FERRY_TIMEOUT");
  if (timeout == nullptr || std::string(timeout) != "0.5" || nranks() != 2) {
    GTEST_SKIP() << "needs FERRY_TIMEOUT=0.5 and 2 ranks (ctest -R coll.timeout)";
  }
  using Clock = std::chrono::steady_clock;
  std::vector<float> in(1 << 20, 1.0f), out(in.size(), -1.0f);
  if (me() == 1) ::usleep(1500000);
  const auto start = Clock::now();
  Status s =
      world().allreduce(in.data(), out.data(), in.size(), DataType::kFloat32, ReduceOp::kSum);
  const double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  if (me() == 0) {
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
    EXPECT_NE(s.message().find("withdrawn"), std::string::npos) << s.message();
    EXPECT_GT(ms, 400);
    ::usleep(1200000);  // until rank 1 has come and gone
  } else {
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("rank 0"), std::string::npos) << s.message();
  }
  EXPECT_LT(ms, 5000);
  // What is left of the withdrawn collective does not disturb the next one.
  std::int64_t one = 1, sum = 0;
  ASSERT_TRUE(world().barrier().is_ok());
  ASSERT_TRUE(world().allreduce(&one, &sum, 1, DataType::kInt64, ReduceOp::kSum).is_ok());
  EXPECT_EQ(sum, 2);
}

TEST(Collectives, SharedAreaTimeoutLeavesTheCommunicatorUsable) {
  // Run by CTest with FERRY_TIMEOUT=0.5 (coll.timeout). An 8-byte allreduce goes through the
  // node's shared area: rank 0 gives up after 0.5 s, rank 1 comes 1.5 s late and gives up too
  // (rank 0 left the area, so rank 1's call goes by messages that nobody answers); after that both
  // use messages, in step.
  const char* timeout = std::getenv("FERRY_TIMEOUT");
  if (timeout == nullptr || std::string(timeout) != "0.5" || nranks() != 2) {
    GTEST_SKIP() << "needs FERRY_TIMEOUT=0.5 and 2 ranks (ctest -R coll.timeout)";
  }
  std::int64_t mine = me() + 1, sum = 0;
  if (me() == 1) ::usleep(1500000);
  Status s = world().allreduce(&mine, &sum, 1, DataType::kInt64, ReduceOp::kSum);
  if (me() == 0) {
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
    ::usleep(1400000);  // until rank 1 is about to give up too
  } else {
    EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
  }
  ASSERT_TRUE(world().barrier().is_ok());
  for (int i = 0; i < 100; ++i) {
    ASSERT_TRUE(world().allreduce(&mine, &sum, 1, DataType::kInt64, ReduceOp::kSum).is_ok());
    ASSERT_EQ(sum, 3);
  }
}

TEST(Collectives, LargeBroadcastsStreamThroughTheAreaFromEveryRoot) {
  // Blocking broadcasts above the area's slots (3 or more members) or from 2 MiB (2 members)
  // stream through the area's ring of 8 pieces: 3 MiB + 5 bytes is 12 pieces of 256 KiB, so the
  // ring wraps and the root waits for its readers; 300 KiB + 7 is 8 pieces of 40 KiB. Roots
  // change every three calls, with small collectives between, so a root that reuses the ring
  // while a reader still copies the last call's pieces shows up as wrong bytes.
  const int n = nranks();
  for (std::size_t bytes : {std::size_t{300 << 10} + 7, std::size_t{3 << 20} + 5}) {
    for (int i = 0; i < 3 * n; ++i) {
      const int root = (i / 3) % n;  // three calls in a row from each: the ring's next call
      std::vector<std::uint8_t> data(bytes, 0);
      // Differs from piece to piece (a period of 256 bytes would hide a piece in the wrong place).
      auto expect = [&](std::size_t k) {
        return static_cast<std::uint8_t>(k + (k >> 12) * 31 + (k >> 18) * 7 +
                                         static_cast<std::size_t>(i) * 13);
      };
      if (me() == root) {
        for (std::size_t k = 0; k < bytes; ++k) data[k] = expect(k);
      }
      // Late readers: a root that did not wait for them would overwrite pieces they have not
      // copied yet.
      if (me() != root && i % 2 == 1) ::usleep(20000);
      ASSERT_TRUE(world().broadcast(data.data(), bytes, DataType::kUint8, root).is_ok());
      for (std::size_t k = 0; k < bytes; ++k) {
        ASSERT_EQ(data[k], expect(k)) << bytes << " bytes from rank " << root << ", byte " << k;
      }
      if (i % 3 == 2) {
        std::int64_t one = 1, sum = 0;
        ASSERT_TRUE(world().allreduce(&one, &sum, 1, DataType::kInt64, ReduceOp::kSum).is_ok());
        ASSERT_EQ(sum, n);
      }
    }
  }
}

TEST(Collectives, MismatchedStreamedBroadcastIsAnErrorNotAHang) {
  if (nranks() != 2) GTEST_SKIP() << "needs exactly 2 ranks";
  // A communicator of its own, whose area no earlier failure has turned off. Rank 1 expects 8
  // bytes more than rank 0 sends: it sees the root's call differ, and the root, waiting for room
  // in the ring, sees rank 1 leave the area (by messages, FERRY_COLL_NODE=0, only the receiver
  // can tell).
  Communicator comm = world().split(0, me());
  const char* node = std::getenv("FERRY_COLL_NODE");
  const bool area = node == nullptr || std::string(node) != "0";
  const std::size_t bytes = (3 << 20) + (me() == 1 ? 8 : 0);
  std::vector<std::uint8_t> data(bytes, 1);
  Status s = comm.broadcast(data.data(), bytes, DataType::kUint8, 0);
  if (me() == 1) {
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("same c"), std::string::npos) << s.message();
    if (area) {
      EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
    }
  } else if (area) {
    EXPECT_FALSE(s.is_ok());
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
  }
  // Both go on, by messages.
  std::int64_t one = 1, sum = 0;
  ASSERT_TRUE(comm.barrier().is_ok());
  ASSERT_TRUE(comm.allreduce(&one, &sum, 1, DataType::kInt64, ReduceOp::kSum).is_ok());
  EXPECT_EQ(sum, 2);
  std::vector<std::uint8_t> again(3 << 20, me() == 0 ? 9 : 0);
  ASSERT_TRUE(comm.broadcast(again.data(), again.size(), DataType::kUint8, 0).is_ok());
  EXPECT_EQ(std::count(again.begin(), again.end(), 9), static_cast<long>(again.size()));
}

TEST(Collectives, StreamedBroadcastTimeoutLeavesTheCommunicatorUsable) {
  // Run by CTest with FERRY_TIMEOUT=0.5 (coll.timeout), on a communicator of its own (a fresh
  // area). Rank 0 streams 3 MiB (12 pieces), fills the ring of 8 and waits for rank 1, which
  // comes 1.5 s late: rank 0 gives up after 0.5 s and leaves the area; rank 1's call then goes by
  // messages that nobody answers and times out too; after that both use messages, in step.
  const char* timeout = std::getenv("FERRY_TIMEOUT");
  if (timeout == nullptr || std::string(timeout) != "0.5" || nranks() != 2) {
    GTEST_SKIP() << "needs FERRY_TIMEOUT=0.5 and 2 ranks (ctest -R coll.timeout)";
  }
  Communicator comm = world().split(0, me());
  ASSERT_TRUE(comm.barrier().is_ok());  // sets the area up (collectively, on the first call)
  std::vector<std::uint8_t> data(3 << 20, me() == 0 ? 5 : 0);
  if (me() == 1) ::usleep(1500000);
  Status s = comm.broadcast(data.data(), data.size(), DataType::kUint8, 0);
  EXPECT_EQ(s.code(), Code::kTimeout) << s.to_string();
  if (me() == 0) {
    EXPECT_NE(s.message().find("rank 1"), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("shared area"), std::string::npos) << s.message();
    ::usleep(1400000);  // until rank 1 is about to give up too
  }
  ASSERT_TRUE(comm.barrier().is_ok());
  std::fill(data.begin(), data.end(), me() == 0 ? 6 : 0);
  ASSERT_TRUE(comm.broadcast(data.data(), data.size(), DataType::kUint8, 0).is_ok());
  EXPECT_EQ(std::count(data.begin(), data.end(), 6), static_cast<long>(data.size()));
}

TEST(Collectives, LongMixedSequencesOfSmallCollectivesKeepTheirData) {
  // Small blocking collectives go through the node's shared area, whose lines and slots are
  // reused every 64 and 4 calls: hundreds of calls of every kind, roots and sizes (inline and
  // in slots), each checked, find a reader that saw a later call's data or a writer that
  // overwrote data still being read.
  const int n = nranks();
  // A root far ahead of its readers: it must wait for them before reusing a line or a slot.
  if (me() != 0) ::usleep(20000);
  for (int j = 0; j < 200; ++j) {
    std::vector<std::uint8_t> data(j % 2 == 0 ? 16 : 1000, 0);
    if (me() == 0) std::fill(data.begin(), data.end(), static_cast<std::uint8_t>(j));
    ASSERT_TRUE(world().broadcast(data.data(), data.size(), DataType::kUint8, 0).is_ok());
    ASSERT_EQ(std::count(data.begin(), data.end(), static_cast<std::uint8_t>(j)),
              static_cast<long>(data.size()))
        << "broadcast " << j;
  }
  for (int i = 0; i < 600; ++i) {
    const bool large = (i / 3) % 2 == 1;  // 8 or 40 B in the line; 1000 B or more in a slot
    switch (i % 4) {
      case 0: {
        const int root = (i / 4) % n;
        std::vector<std::uint8_t> data(large ? 1000 : 8, 0);
        if (me() == root) {
          for (std::size_t k = 0; k < data.size(); ++k) data[k] = static_cast<std::uint8_t>(i + k);
        }
        ASSERT_TRUE(world().broadcast(data.data(), data.size(), DataType::kUint8, root).is_ok());
        for (std::size_t k = 0; k < data.size(); ++k) {
          ASSERT_EQ(data[k], static_cast<std::uint8_t>(i + k)) << "call " << i << " byte " << k;
        }
        break;
      }
      case 1: {
        const std::size_t count = large ? 300 : 5;
        std::vector<std::int64_t> in(count), out(count, -1);
        for (std::size_t k = 0; k < count; ++k) in[k] = (me() + 1) * 1000 + i + k;
        ASSERT_TRUE(world()
                        .allreduce(in.data(), out.data(), count, DataType::kInt64, ReduceOp::kSum)
                        .is_ok());
        for (std::size_t k = 0; k < count; ++k) {
          const std::int64_t want = 1000 * n * (n + 1) / 2 + n * (i + static_cast<std::int64_t>(k));
          ASSERT_EQ(out[k], want) << "call " << i << " element " << k;
        }
        break;
      }
      case 2: {
        const std::size_t count = large ? 200 : 3;
        std::vector<std::int32_t> in(count), out(count * static_cast<std::size_t>(n), -1);
        for (std::size_t k = 0; k < count; ++k)
          in[k] = me() * 100000 + i * 10 + static_cast<int>(k);
        ASSERT_TRUE(world().allgather(in.data(), out.data(), count, DataType::kInt32).is_ok());
        for (int m = 0; m < n; ++m) {
          for (std::size_t k = 0; k < count; ++k) {
            ASSERT_EQ(out[static_cast<std::size_t>(m) * count + k],
                      m * 100000 + i * 10 + static_cast<int>(k))
                << "call " << i << " member " << m;
          }
        }
        break;
      }
      default:
        ASSERT_TRUE(world().barrier().is_ok());
    }
  }
}

TEST(Collectives, LargeCollectivesThroughTheAreaKeepTheirData) {
  // Up to 2 MiB / members (1 MiB at most) per member goes through the area's slots, reused every
  // 4 calls: a root running ahead of its readers, then allreduces split into blocks with 3 or
  // more members, then reduces, reduce_scatters and allgathers, each checked, find a slot
  // overwritten while it was read or a block copied from the wrong place.
  const int n = nranks();
  const std::size_t bytes = n == 2 ? std::size_t{1} << 20 : std::size_t{256} << 10;
  if (me() != 0) ::usleep(20000);
  for (int j = 0; j < 12; ++j) {
    const int root = j % n;
    std::vector<std::uint8_t> data(bytes - static_cast<std::size_t>(j), 0);
    if (me() == root) {
      for (std::size_t k = 0; k < data.size(); ++k)
        data[k] = static_cast<std::uint8_t>(j + k / 4096);
    }
    ASSERT_TRUE(world().broadcast(data.data(), data.size(), DataType::kUint8, root).is_ok());
    for (std::size_t k = 0; k < data.size(); k += 4095) {
      ASSERT_EQ(data[k], static_cast<std::uint8_t>(j + k / 4096))
          << "broadcast " << j << " byte " << k;
    }
    ASSERT_EQ(data.back(), static_cast<std::uint8_t>(j + (data.size() - 1) / 4096)) << j;
  }
  const std::size_t count = bytes / sizeof(std::int64_t);
  std::vector<std::int64_t> in(count), out(count);
  for (int j = 0; j < 12; ++j) {
    for (std::size_t k = 0; k < count; ++k)
      in[k] = (me() + 1) * 1000003 + j * 7 + static_cast<std::int64_t>(k);
    std::fill(out.begin(), out.end(), -1);
    ASSERT_TRUE(
        world().allreduce(in.data(), out.data(), count, DataType::kInt64, ReduceOp::kSum).is_ok());
    for (std::size_t k = 0; k < count; ++k) {
      const std::int64_t want =
          1000003LL * n * (n + 1) / 2 + n * (j * 7 + static_cast<std::int64_t>(k));
      ASSERT_EQ(out[k], want) << "allreduce " << j << " element " << k;
    }
  }
  // reduce to each member in turn.
  for (int j = 0; j < 8; ++j) {
    const int root = j % n;
    for (std::size_t k = 0; k < count; ++k)
      in[k] = (me() + 1) * 1000003 + j * 7 + static_cast<std::int64_t>(k);
    std::fill(out.begin(), out.end(), -1);
    ASSERT_TRUE(world()
                    .reduce(in.data(), out.data(), count, DataType::kInt64, ReduceOp::kSum, root)
                    .is_ok());
    if (me() != root) {
      ASSERT_EQ(out[0], -1) << "reduce " << j << ": written on a rank that is not the root";
      continue;
    }
    for (std::size_t k = 0; k < count; ++k) {
      ASSERT_EQ(out[k], 1000003LL * n * (n + 1) / 2 + n * (j * 7 + static_cast<std::int64_t>(k)))
          << "reduce " << j << " element " << k;
    }
  }
  // reduce_scatter of the whole input size: each member's block of everyone's input.
  const std::size_t each = count / static_cast<std::size_t>(n);
  std::vector<std::int64_t> part(each);
  for (int j = 0; j < 8; ++j) {
    for (std::size_t k = 0; k < count; ++k)
      in[k] = (me() + 1) * 1000003 + j * 7 + static_cast<std::int64_t>(k);
    std::fill(part.begin(), part.end(), -1);
    ASSERT_TRUE(world()
                    .reduce_scatter(in.data(), part.data(), each, DataType::kInt64, ReduceOp::kSum)
                    .is_ok());
    for (std::size_t k = 0; k < each; ++k) {
      const std::int64_t at = static_cast<std::int64_t>(static_cast<std::size_t>(me()) * each + k);
      ASSERT_EQ(part[k], 1000003LL * n * (n + 1) / 2 + n * (j * 7 + at))
          << "reduce_scatter " << j << " element " << k;
    }
  }
  std::vector<std::int64_t> all(count * static_cast<std::size_t>(n));
  for (int j = 0; j < 8; ++j) {
    for (std::size_t k = 0; k < count; ++k)
      in[k] = me() * 1000003 + j * 7 + static_cast<std::int64_t>(k);
    std::fill(all.begin(), all.end(), -1);
    ASSERT_TRUE(world().allgather(in.data(), all.data(), count, DataType::kInt64).is_ok());
    for (int m = 0; m < n; ++m) {
      for (std::size_t k = 0; k < count; ++k) {
        ASSERT_EQ(all[static_cast<std::size_t>(m) * count + k],
                  m * 1000003 + j * 7 + static_cast<std::int64_t>(k))
            << "allgather " << j << " member " << m << " element " << k;
      }
    }
  }
}

TEST(Collectives, TheFirstCallOfACommunicatorMayBeItsLargest) {
  // The first call sets the area up; where /dev/shm had room only for the smaller one
  // (shm_full_test.sh runs this in 10 MiB), a call larger than its slots must take messages.
  Communicator comm = world().split(0, me());
  const std::size_t count = nranks() == 2 ? (1u << 20) / 8 : (256u << 10) / 8;
  std::vector<std::int64_t> in(count), out(count, -1);
  for (std::size_t k = 0; k < count; ++k)
    in[k] = (me() + 1) * 1000003 + static_cast<std::int64_t>(k);
  ASSERT_TRUE(
      comm.allreduce(in.data(), out.data(), count, DataType::kInt64, ReduceOp::kSum).is_ok());
  const std::int64_t n = nranks();
  for (std::size_t k = 0; k < count; ++k) {
    ASSERT_EQ(out[k], 1000003LL * n * (n + 1) / 2 + n * static_cast<std::int64_t>(k)) << k;
  }
}

TEST(Collectives, TheSharedAreaGivesTheBitsOfTheMessages) {
  // A blocking allreduce among the members of one node goes through the shared area (each member
  // reducing a block of it from 16 KiB with 3 or more members); the non-blocking one always
  // goes by messages. Both must combine the same operands in the same order: recursive doubling's
  // below FERRY_COLL_SMALL, the ring's from there (64 KiB here, which still fits the area, as do
  // 256 KiB with up to 8 members and 1 MiB with two).
  std::vector<std::size_t> counts = {3, 1000, 6000, 16384, 65536};
  if (nranks() == 2) counts.push_back(262144);
  for (std::size_t count : counts) {
    std::vector<float> in(count);
    std::uint64_t state = 0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(me() + 1) + count;
    for (float& v : in) {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      v = static_cast<float>(static_cast<double>(state >> 11) * 0x1p-53 * 2 - 1) * 1000.0f;
    }
    std::vector<float> area(count, -1), messages(count, -2);
    ASSERT_TRUE(world()
                    .allreduce(in.data(), area.data(), count, DataType::kFloat32, ReduceOp::kSum)
                    .is_ok());
    Request r =
        world().iallreduce(in.data(), messages.data(), count, DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(r.wait().is_ok());
    EXPECT_EQ(std::memcmp(area.data(), messages.data(), count * sizeof(float)), 0)
        << count << " floats";
    // In place through the area too.
    std::vector<float> inout = in;
    ASSERT_TRUE(
        world()
            .allreduce(inout.data(), inout.data(), count, DataType::kFloat32, ReduceOp::kSum)
            .is_ok());
    EXPECT_EQ(std::memcmp(inout.data(), messages.data(), count * sizeof(float)), 0)
        << count << " floats in place";
    // reduce to the last rank (the binomial tree's order below FERRY_COLL_SMALL, the ring's
    // from there with 3 or more members): the area's result against the messages'.
    const int root = nranks() - 1;
    std::vector<float> reduced(count, -1), by_messages(count, -2);
    ASSERT_TRUE(
        world()
            .reduce(in.data(), reduced.data(), count, DataType::kFloat32, ReduceOp::kSum, root)
            .is_ok());
    Request rr = world().ireduce(in.data(), by_messages.data(), count, DataType::kFloat32,
                                 ReduceOp::kSum, root);
    ASSERT_TRUE(rr.wait().is_ok());
    if (me() == root) {
      EXPECT_EQ(std::memcmp(reduced.data(), by_messages.data(), count * sizeof(float)), 0)
          << count << " floats, reduce";
    }
    // In place at the root (from 16 KiB the root reduces piece by piece as the others' pieces
    // come, and must not read its input where the result has already gone).
    std::vector<float> own = in;
    ASSERT_TRUE(world()
                    .reduce(own.data(), me() == root ? own.data() : nullptr, count,
                            DataType::kFloat32, ReduceOp::kSum, root)
                    .is_ok());
    if (me() == root) {
      EXPECT_EQ(std::memcmp(own.data(), by_messages.data(), count * sizeof(float)), 0)
          << count << " floats, reduce in place";
    }
    // reduce_scatter: the area's block against the ring's, `count` elements of the input each.
    const std::size_t block = count / static_cast<std::size_t>(nranks());
    if (block == 0) continue;
    std::vector<float> mine(block, -1), theirs(block, -2);
    ASSERT_TRUE(
        world()
            .reduce_scatter(in.data(), mine.data(), block, DataType::kFloat32, ReduceOp::kSum)
            .is_ok());
    Request rs = world().ireduce_scatter(in.data(), theirs.data(), block, DataType::kFloat32,
                                         ReduceOp::kSum);
    ASSERT_TRUE(rs.wait().is_ok());
    EXPECT_EQ(std::memcmp(mine.data(), theirs.data(), block * sizeof(float)), 0)
        << block << " floats each, reduce_scatter";
  }
}

TEST(Collectives, FloatResultsAreTheSameBitsEverywhereAndEveryTime) {
  // Inputs that do not add up exactly: the order of the additions shows in the low bits.
  const std::size_t count = 100003;
  std::vector<float> in(count);
  std::uint64_t state = 0x2545f4914f6cdd1dull + static_cast<std::uint64_t>(me());
  for (float& v : in) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    v = static_cast<float>(static_cast<double>(state >> 11) * 0x1p-53 * 2 - 1) * 1000.0f;
  }
  for (std::size_t size_class : {std::size_t{97}, count}) {  // recursive doubling, then ring
    std::vector<float> first(size_class), again(size_class);
    ASSERT_TRUE(
        world()
            .allreduce(in.data(), first.data(), size_class, DataType::kFloat32, ReduceOp::kSum)
            .is_ok());
    ASSERT_TRUE(
        world()
            .allreduce(in.data(), again.data(), size_class, DataType::kFloat32, ReduceOp::kSum)
            .is_ok());
    EXPECT_EQ(std::memcmp(first.data(), again.data(), size_class * 4), 0) << "run to run";
    // Every member's bits, compared with rank 0's.
    std::vector<float> zero = first;
    ASSERT_TRUE(world().broadcast(zero.data(), size_class, DataType::kFloat32, 0).is_ok());
    EXPECT_EQ(std::memcmp(first.data(), zero.data(), size_class * 4), 0) << "member to member";
    // And close to the exact sum: n roundings of values below n * 1000.
    std::vector<double> exact(size_class);
    std::vector<double> wide(in.begin(), in.begin() + static_cast<long>(size_class));
    ASSERT_TRUE(
        world()
            .allreduce(wide.data(), exact.data(), size_class, DataType::kFloat64, ReduceOp::kSum)
            .is_ok());
    std::size_t far = 0;
    for (std::size_t i = 0; i < size_class; ++i) {
      far += std::fabs(first[i] - exact[i]) > nranks() * 1000.0 * nranks() * 0x1p-23 ? 1 : 0;
    }
    EXPECT_EQ(far, 0u) << "elements farther from the exact sum than n roundings allow";
  }
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) { return ferry::test::run_on_every_rank(argc, argv, "coll_test"); }
