// Collectives on device buffers (run by ferryrun -n N; rank r uses GPU r mod the GPU count).
// Each case runs the same collective on host buffers and on device buffers and compares the
// results bit for bit: the algorithms are the same, and the device kernels do the host kernels'
// arithmetic (NaN payloads aside, which only need to be NaN). The host results themselves are
// checked against a per-element reference in CI (tests/mp/coll_test.cpp). Without a GPU it exits
// 77 (CTest: skipped) and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "coll/reduce.hpp"
#include "cuda/driver.hpp"
#include "ferry/ferry.hpp"

namespace ferry {
namespace {

Context* g_ctx = nullptr;
const cuda::Driver* g_cuda = nullptr;
int g_device = 0;

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, cuda::error_string(result).c_str());
    std::abort();
  }
}

// Device memory allocated once and reused by every case, so peers map it once.
class DeviceArena {
 public:
  explicit DeviceArena(std::size_t bytes) : bytes_(bytes) {
    CUdeviceptr p = 0;
    check(g_cuda->cuMemAlloc(&p, bytes), "cuMemAlloc");
    data_ = reinterpret_cast<std::byte*>(p);
  }
  ~DeviceArena() { g_cuda->cuMemFree(reinterpret_cast<CUdeviceptr>(data_)); }
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;
  [[nodiscard]] std::byte* data() const { return data_; }
  [[nodiscard]] std::size_t bytes() const { return bytes_; }

 private:
  std::size_t bytes_;
  std::byte* data_ = nullptr;
};

void to_device(std::byte* device, const std::vector<std::byte>& host) {
  if (!host.empty()) {
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(device),
                           reinterpret_cast<CUdeviceptr>(host.data()), host.size()),
          "cuMemcpy to device");
    // From pageable memory cuMemcpy may return before the data is on the device: a collective
    // takes device buffers that are ready, as a CUDA-aware MPI does.
    check(g_cuda->cuCtxSynchronize(), "cuCtxSynchronize");
  }
}

std::vector<std::byte> from_device(const std::byte* device, std::size_t bytes) {
  std::vector<std::byte> host(bytes);
  if (bytes > 0) {
    check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()),
                           reinterpret_cast<CUdeviceptr>(device), bytes),
          "cuMemcpy to host");
  }
  return host;
}

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  return x ^ (x >> 33);
}

// Element i of rank r's input: random bits for integers; for floats small values with fractions
// (so that sums round), and a few signed zeros and one NaN, which min and max must order and
// propagate.
std::vector<std::byte> input(DataType type, std::size_t count, int rank, std::uint64_t salt) {
  const std::size_t size = size_of(type);
  std::vector<std::byte> out(count * size);
  for (std::size_t i = 0; i < count; ++i) {
    const std::uint64_t h = mix(salt * 1000003 + i * 131 + static_cast<std::uint64_t>(rank));
    const bool is_float = type == DataType::kFloat16 || type == DataType::kBfloat16 ||
                          type == DataType::kFloat32 || type == DataType::kFloat64;
    if (!is_float) {
      std::memcpy(out.data() + i * size, &h, size);
      continue;
    }
    double v = static_cast<double>(static_cast<std::int64_t>(h % 2001) - 1000) / 64.0;
    if (i % 97 == 5) v = (rank % 2 == 0) ? 0.0 : -0.0;
    if (i == 11 && rank == 0) v = std::nan("");
    const auto f = static_cast<float>(v);
    std::byte* at = out.data() + i * size;
    if (type == DataType::kFloat64) {
      std::memcpy(at, &v, 8);
    } else if (type == DataType::kFloat32) {
      std::memcpy(at, &f, 4);
    } else {
      const std::uint16_t bits =
          type == DataType::kFloat16 ? coll::float_to_half(f) : coll::float_to_bf16(f);
      std::memcpy(at, &bits, 2);
    }
  }
  return out;
}

bool is_nan(DataType type, const std::byte* p) {
  switch (type) {
    case DataType::kFloat16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return std::isnan(coll::half_to_float(b));
    }
    case DataType::kBfloat16: {
      std::uint16_t b;
      std::memcpy(&b, p, 2);
      return std::isnan(coll::bf16_to_float(b));
    }
    case DataType::kFloat32: {
      float f;
      std::memcpy(&f, p, 4);
      return std::isnan(f);
    }
    case DataType::kFloat64: {
      double d;
      std::memcpy(&d, p, 8);
      return std::isnan(d);
    }
    default:
      return false;
  }
}

// Bit-for-bit equality, except that two NaNs are equal whatever their payloads.
::testing::AssertionResult same(const std::vector<std::byte>& host,
                                const std::vector<std::byte>& device, DataType type) {
  if (host.size() != device.size()) {
    return ::testing::AssertionFailure() << "sizes " << host.size() << " vs " << device.size();
  }
  const std::size_t size = size_of(type);
  for (std::size_t i = 0; i * size < host.size(); ++i) {
    const std::byte* h = host.data() + i * size;
    const std::byte* d = device.data() + i * size;
    if (std::memcmp(h, d, size) == 0 || (is_nan(type, h) && is_nan(type, d))) continue;
    std::uint64_t hv = 0;
    std::uint64_t dv = 0;
    std::memcpy(&hv, h, size);
    std::memcpy(&dv, d, size);
    char text[96];
    std::snprintf(text, sizeof text, "element %zu: host bits 0x%llx, device bits 0x%llx", i,
                  static_cast<unsigned long long>(hv), static_cast<unsigned long long>(dv));
    return ::testing::AssertionFailure() << text;
  }
  return ::testing::AssertionSuccess();
}

constexpr DataType kTypes[] = {DataType::kInt8,     DataType::kInt16,   DataType::kInt32,
                               DataType::kInt64,    DataType::kUint8,   DataType::kUint16,
                               DataType::kUint32,   DataType::kUint64,  DataType::kFloat16,
                               DataType::kBfloat16, DataType::kFloat32, DataType::kFloat64};
constexpr ReduceOp kOps[] = {ReduceOp::kSum,    ReduceOp::kProd,  ReduceOp::kMin,   ReduceOp::kMax,
                             ReduceOp::kBitAnd, ReduceOp::kBitOr, ReduceOp::kBitXor};
constexpr std::size_t kCounts[] = {0, 1, 7, 1031, 20011};

bool bitwise(ReduceOp op) {
  return op == ReduceOp::kBitAnd || op == ReduceOp::kBitOr || op == ReduceOp::kBitXor;
}
bool floating(DataType t) {
  return t == DataType::kFloat16 || t == DataType::kBfloat16 || t == DataType::kFloat32 ||
         t == DataType::kFloat64;
}

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string(v) == value;
}

// Small device allreduces go by the one-shot kernel unless the configuration rules it out (or
// members share a GPU: rank r uses GPU r mod the GPU count).
bool oneshot_expected(int members) {
  int devices = 0;
  check(g_cuda->cuDeviceGetCount(&devices), "cuDeviceGetCount");
  return !env_is("FERRY_CUDA_IPC", "0") && !env_is("FERRY_TEST_CUDA_IPC_FAIL", "1") &&
         !env_is("FERRY_COLL_DEVICE_ONESHOT", "0") && !env_is("FERRY_COLL_ALLREDUCE", "ring") &&
         (devices >= members || env_is("FERRY_COLL_DEVICE_SHARED_GPU", "1"));
}

class GpuColl : public ::testing::Test {
 protected:
  static constexpr std::size_t kArena = 96 << 20;
  GpuColl() : world_(g_ctx->world()), send_(kArena), recv_(kArena) {}

  Communicator world_;
  DeviceArena send_;
  DeviceArena recv_;
};

TEST_F(GpuColl, AllreduceMatchesHostForEveryTypeOpAndCount) {
  std::uint64_t salt = 1;
  for (DataType type : kTypes) {
    for (ReduceOp op : kOps) {
      if (bitwise(op) && floating(type)) continue;
      for (std::size_t count : kCounts) {
        ++salt;
        const std::vector<std::byte> in = input(type, count, world_.rank(), salt);
        std::vector<std::byte> host(in.size());
        ASSERT_TRUE(world_.allreduce(in.data(), host.data(), count, type, op).is_ok());
        to_device(send_.data(), in);
        Status s = world_.allreduce(send_.data(), recv_.data(), count, type, op);
        ASSERT_TRUE(s.is_ok()) << s.message();
        EXPECT_TRUE(same(host, from_device(recv_.data(), in.size()), type))
            << to_string(type) << " " << to_string(op) << " count " << count;
        // In place.
        to_device(recv_.data(), in);
        s = world_.allreduce(recv_.data(), recv_.data(), count, type, op);
        ASSERT_TRUE(s.is_ok()) << s.message();
        EXPECT_TRUE(same(host, from_device(recv_.data(), in.size()), type))
            << "in place: " << to_string(type) << " " << to_string(op) << " count " << count;
      }
    }
  }
}

TEST_F(GpuColl, LargeAllreduceReduceAndReduceScatterMatchHost) {
  // Past FERRY_COLL_SMALL: ring reduce-scatter + allgather, pipelined pieces.
  const int n = world_.size();
  for (std::size_t count : {std::size_t{1} << 20 | 3, std::size_t{9} << 20}) {
    for (DataType type : {DataType::kFloat32, DataType::kBfloat16, DataType::kInt64}) {
      const std::size_t bytes = count * size_of(type);
      const std::vector<std::byte> in = input(type, count, world_.rank(), count + 7);
      std::vector<std::byte> host(bytes);
      ASSERT_TRUE(world_.allreduce(in.data(), host.data(), count, type, ReduceOp::kSum).is_ok());
      to_device(send_.data(), in);
      Status s = world_.allreduce(send_.data(), recv_.data(), count, type, ReduceOp::kSum);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(same(host, from_device(recv_.data(), bytes), type)) << to_string(type) << count;

      const int root = n - 1;
      ASSERT_TRUE(world_.reduce(in.data(), host.data(), count, type, ReduceOp::kMax, root).is_ok());
      s = world_.reduce(send_.data(), recv_.data(), count, type, ReduceOp::kMax, root);
      ASSERT_TRUE(s.is_ok()) << s.message();
      if (world_.rank() == root) {
        EXPECT_TRUE(same(host, from_device(recv_.data(), bytes), type)) << "reduce " << count;
      }

      const std::size_t block = count / static_cast<std::size_t>(n);
      std::vector<std::byte> part(block * size_of(type));
      ASSERT_TRUE(
          world_.reduce_scatter(in.data(), part.data(), block, type, ReduceOp::kSum).is_ok());
      s = world_.reduce_scatter(send_.data(), recv_.data(), block, type, ReduceOp::kSum);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(same(part, from_device(recv_.data(), part.size()), type)) << "reduce_scatter";
    }
  }
}

TEST_F(GpuColl, DataMovementCollectivesMatchHost) {
  const int n = world_.size();
  const auto un = static_cast<std::size_t>(n);
  for (std::size_t count : {std::size_t{1}, std::size_t{1031}, std::size_t{300000}}) {
    const DataType type = DataType::kUint16;
    const std::size_t bytes = count * 2;
    const std::vector<std::byte> in = input(type, count * un, world_.rank(), count);
    to_device(send_.data(), in);
    for (int root = 0; root < n; ++root) {
      std::vector<std::byte> host(in.begin(), in.begin() + static_cast<std::ptrdiff_t>(bytes));
      ASSERT_TRUE(world_.broadcast(host.data(), count, type, root).is_ok());
      to_device(recv_.data(), in);
      Status s = world_.broadcast(recv_.data(), count, type, root);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(same(host, from_device(recv_.data(), bytes), type)) << "broadcast " << root;

      std::vector<std::byte> gathered(bytes * un);
      ASSERT_TRUE(world_.gather(in.data(), gathered.data(), count, type, root).is_ok());
      s = world_.gather(send_.data(), recv_.data(), count, type, root);
      ASSERT_TRUE(s.is_ok()) << s.message();
      if (world_.rank() == root) {
        EXPECT_TRUE(same(gathered, from_device(recv_.data(), gathered.size()), type)) << "gather";
      }
      std::vector<std::byte> piece(bytes);
      ASSERT_TRUE(world_.scatter(in.data(), piece.data(), count, type, root).is_ok());
      s = world_.scatter(send_.data(), recv_.data(), count, type, root);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(same(piece, from_device(recv_.data(), bytes), type)) << "scatter";
    }
    std::vector<std::byte> all(bytes * un);
    ASSERT_TRUE(world_.allgather(in.data(), all.data(), count, type).is_ok());
    Status s = world_.allgather(send_.data(), recv_.data(), count, type);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(same(all, from_device(recv_.data(), all.size()), type)) << "allgather";

    ASSERT_TRUE(world_.alltoall(in.data(), all.data(), count, type).is_ok());
    s = world_.alltoall(send_.data(), recv_.data(), count, type);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(same(all, from_device(recv_.data(), all.size()), type)) << "alltoall";

    // Uneven: member m contributes m + 1 pieces of `count / n + 1` elements.
    std::vector<std::size_t> counts(un);
    std::vector<std::size_t> displacements(un);
    std::size_t total = 0;
    for (std::size_t m = 0; m < un; ++m) {
      counts[m] = (m + 1) * (count / un + 1);
      displacements[m] = total;
      total += counts[m];
    }
    std::vector<std::byte> uneven(total * 2);
    ASSERT_TRUE(world_.allgatherv(in.data(), uneven.data(), counts, displacements, type).is_ok());
    s = world_.allgatherv(send_.data(), recv_.data(), counts, displacements, type);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(same(uneven, from_device(recv_.data(), uneven.size()), type)) << "allgatherv";
  }
  EXPECT_TRUE(world_.barrier().is_ok());
}

TEST_F(GpuColl, NonBlockingCollectivesCompleteInAnyOrder) {
  const std::size_t count = 3 << 20;
  const std::size_t bytes = count * 4;
  const std::vector<std::byte> a = input(DataType::kFloat32, count, world_.rank(), 91);
  const std::vector<std::byte> b = input(DataType::kInt32, count, world_.rank(), 92);
  std::vector<std::byte> ha(bytes);
  std::vector<std::byte> hb(bytes);
  ASSERT_TRUE(
      world_.allreduce(a.data(), ha.data(), count, DataType::kFloat32, ReduceOp::kSum).is_ok());
  ASSERT_TRUE(
      world_.allreduce(b.data(), hb.data(), count, DataType::kInt32, ReduceOp::kMax).is_ok());
  to_device(send_.data(), a);
  to_device(send_.data() + bytes, b);
  std::byte* ra = recv_.data();
  std::byte* rb = recv_.data() + bytes;
  Request first = world_.iallreduce(send_.data(), ra, count, DataType::kFloat32, ReduceOp::kSum);
  Request second =
      world_.iallreduce(send_.data() + bytes, rb, count, DataType::kInt32, ReduceOp::kMax);
  Status s = second.wait();
  ASSERT_TRUE(s.is_ok()) << s.message();
  s = first.wait();
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(same(ha, from_device(ra, bytes), DataType::kFloat32));
  EXPECT_TRUE(same(hb, from_device(rb, bytes), DataType::kInt32));
}

// Among members with a GPU each, allreduces from FERRY_COLL_DEVICE_TWOSHOT / (members - 1) up run
// as the two-shot kernel: each member reduces its part and the others take it; two members in one
// round up to twice the one-shot limit (32 MiB), in rounds of 16 MiB past it; more up to a part per
// slot (four: 21 MiB, so 17 and 20 MiB here; larger calls by the ring). Every type, sizes that
// split unevenly and at an element that is not a whole 16-byte unit, one round and three, buffers
// that are not 16-byte aligned (the element path), in place, with two calls in flight, and mixed
// with one-shot calls, all against the host path's bits. Elsewhere (or with other sizes forced) the
// same calls check whichever path takes them.
TEST_F(GpuColl, TwoShotAllreduceMatchesHost) {
  const std::size_t mib = std::size_t{1} << 20;
  std::uint64_t salt = 500;
  for (DataType type : kTypes) {
    const std::size_t size = size_of(type);
    const ReduceOp op = floating(type) ? ReduceOp::kSum : ReduceOp::kBitXor;
    // Odd counts that split inside a 16-byte unit, exactly the one-round limit, and three rounds.
    for (std::size_t count : {(17 * mib) / size + 3, (32 * mib) / size, (40 * mib) / size + 5}) {
      ++salt;
      const std::vector<std::byte> in = input(type, count, world_.rank(), salt);
      std::vector<std::byte> host(in.size());
      ASSERT_TRUE(world_.allreduce(in.data(), host.data(), count, type, op).is_ok());
      // 16-byte aligned, then one element off (where an element is smaller than 16 bytes).
      for (std::size_t shift : {std::size_t{0}, size}) {
        to_device(send_.data() + shift, in);
        Status s = world_.allreduce(send_.data() + shift, recv_.data() + shift, count, type, op);
        ASSERT_TRUE(s.is_ok()) << s.message();
        EXPECT_TRUE(same(host, from_device(recv_.data() + shift, in.size()), type))
            << to_string(type) << " count " << count << " shift " << shift;
      }
      to_device(recv_.data(), in);
      Status s = world_.allreduce(recv_.data(), recv_.data(), count, type, op);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(same(host, from_device(recv_.data(), in.size()), type))
          << "in place: " << to_string(type) << " count " << count;
    }
  }
  // Min and max, where the order of operands shows in the bits of -0 and +0 and of NaNs.
  for (ReduceOp op : {ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProd}) {
    const std::size_t count = (20 * mib) / 2 + 1;
    const std::vector<std::byte> in = input(DataType::kBfloat16, count, world_.rank(), ++salt);
    std::vector<std::byte> host(in.size());
    ASSERT_TRUE(world_.allreduce(in.data(), host.data(), count, DataType::kBfloat16, op).is_ok());
    to_device(send_.data(), in);
    Status s = world_.allreduce(send_.data(), recv_.data(), count, DataType::kBfloat16, op);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(same(host, from_device(recv_.data(), in.size()), DataType::kBfloat16))
        << to_string(op);
  }
  // One-shot, two-shot and rounds of two-shot calls back to back, then two two-shot calls in
  // flight at once, waited for in reverse order.
  const std::size_t counts[] = {(1 * mib) / 4, (24 * mib) / 4 + 1, (40 * mib) / 4, (24 * mib) / 4};
  std::vector<std::vector<std::byte>> inputs;
  std::vector<std::vector<std::byte>> expected;
  for (std::size_t count : counts) {
    inputs.push_back(input(DataType::kFloat32, count, world_.rank(), ++salt));
    expected.emplace_back(inputs.back().size());
    ASSERT_TRUE(world_
                    .allreduce(inputs.back().data(), expected.back().data(), count,
                               DataType::kFloat32, ReduceOp::kSum)
                    .is_ok());
  }
  for (std::size_t k = 0; k < 4; ++k) {
    to_device(send_.data(), inputs[k]);
    Status s =
        world_.allreduce(send_.data(), recv_.data(), counts[k], DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.is_ok()) << s.message();
    EXPECT_TRUE(same(expected[k], from_device(recv_.data(), inputs[k].size()), DataType::kFloat32))
        << "call " << k;
  }
  const std::size_t half = kArena / 2;
  to_device(send_.data(), inputs[1]);
  to_device(send_.data() + half, inputs[3]);
  Request first =
      world_.iallreduce(send_.data(), recv_.data(), counts[1], DataType::kFloat32, ReduceOp::kSum);
  Request second = world_.iallreduce(send_.data() + half, recv_.data() + half, counts[3],
                                     DataType::kFloat32, ReduceOp::kSum);
  Status s = second.wait();
  ASSERT_TRUE(s.is_ok()) << s.message();
  s = first.wait();
  ASSERT_TRUE(s.is_ok()) << s.message();
  EXPECT_TRUE(same(expected[1], from_device(recv_.data(), inputs[1].size()), DataType::kFloat32));
  EXPECT_TRUE(
      same(expected[3], from_device(recv_.data() + half, inputs[3].size()), DataType::kFloat32));
  // Counts that differ by one element fail on every member (the kernels' signatures differ), and
  // the communicator goes on: 16 MiB, which the two-shot kernel takes for 2 to 8 members unless
  // FERRY_COLL_DEVICE_ONESHOT shrinks its limit for more than two (then the ring takes such calls
  // and members whose counts differ wait for FERRY_TIMEOUT, as documented).
  if (oneshot_expected(world_.size()) &&
      (world_.size() == 2 || std::getenv("FERRY_COLL_DEVICE_ONESHOT") == nullptr)) {
    const std::size_t count = (16 * mib) / 4 + static_cast<std::size_t>(world_.rank());
    to_device(send_.data(), input(DataType::kFloat32, count, world_.rank(), ++salt));
    s = world_.allreduce(send_.data(), recv_.data(), count, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_TRUE(s.code() == Code::kInvalidArgument || s.code() == Code::kTimeout) << s.to_string();
    to_device(send_.data(), inputs[1]);
    s = world_.allreduce(send_.data(), recv_.data(), counts[1], DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.is_ok()) << s.to_string();
    EXPECT_TRUE(same(expected[1], from_device(recv_.data(), inputs[1].size()), DataType::kFloat32));
  }
}

TEST_F(GpuColl, MixedHostAndDeviceBuffersAreRefused) {
  std::vector<float> host(16, 1.0f);
  const Status s =
      world_.allreduce(host.data(), recv_.data(), 16, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(s.code(), Code::kUnsupported);
  EXPECT_NE(s.message().find("all be host memory or all be on one GPU"), std::string::npos)
      << s.message();
  // Nothing was sent: the next collective works.
  EXPECT_TRUE(world_.barrier().is_ok());
}

TEST_F(GpuColl, DifferentCountsFailOnEveryMemberInsteadOfHanging) {
  // Small device allreduces among GPUs of one node run as one kernel per GPU; members whose calls
  // differ find out from each other's flags. (Where the members' choices of algorithm differ, the
  // wait is bounded by FERRY_TIMEOUT, as for host buffers.)
  if (!oneshot_expected(world_.size()))
    GTEST_SKIP() << "the one-shot path is off in this configuration";
  // The kernel's grid follows the size: counts 100 and 101 run one block each, counts 100 and
  // 100100 one block and 49.
  for (const std::size_t spread : {std::size_t{1}, std::size_t{100000}}) {
    const std::size_t count = 100 + spread * static_cast<std::size_t>(world_.rank());
    to_device(send_.data(), input(DataType::kFloat32, count, world_.rank(), 3));
    const Status s =
        world_.allreduce(send_.data(), recv_.data(), count, DataType::kFloat32, ReduceOp::kSum);
    EXPECT_FALSE(s.is_ok());
    if (s.code() != Code::kInvalidArgument) {
      std::printf("rank %d: %s\n", world_.rank(), s.to_string().c_str());
    }
    EXPECT_TRUE(s.code() == Code::kInvalidArgument || s.code() == Code::kTimeout)
        << "spread " << spread << ": " << s.to_string();
  }
  // The communicator still works.
  const std::size_t same_count = 100;
  const std::vector<std::byte> in = input(DataType::kFloat32, same_count, world_.rank(), 4);
  std::vector<std::byte> host(in.size());
  ASSERT_TRUE(
      world_.allreduce(in.data(), host.data(), same_count, DataType::kFloat32, ReduceOp::kSum)
          .is_ok());
  to_device(send_.data(), in);
  Status again =
      world_.allreduce(send_.data(), recv_.data(), same_count, DataType::kFloat32, ReduceOp::kSum);
  ASSERT_TRUE(again.is_ok()) << again.to_string();
  EXPECT_TRUE(same(host, from_device(recv_.data(), in.size()), DataType::kFloat32));
}

// Among three or more members, device allgathers, reduce-scatters, broadcasts and reduces that
// fit the one-shot area run as one kernel per GPU (kernels/mesh.cuh): every type and op, counts
// that cut 16-byte units, buffers off 16-byte alignment, every root, the reductions in the host
// path's order (the same bits); and members whose calls differ in kind or root fail instead of
// hanging.
TEST_F(GpuColl, MeshCollectivesMatchHost) {
  const int n = world_.size();
  if (n < 3) GTEST_SKIP() << "the mesh kernels are for three or more members";
  const auto un = static_cast<std::size_t>(n);
  std::uint64_t salt = 500;
  for (DataType type : kTypes) {
    const std::size_t size = size_of(type);
    for (std::size_t count :
         {std::size_t{1}, std::size_t{7}, std::size_t{1031}, std::size_t{65537}}) {
      for (std::size_t shift : {std::size_t{0}, size}) {
        const std::vector<std::byte> in = input(type, count * un, world_.rank(), ++salt);
        std::byte* send = send_.data() + shift;
        std::byte* recv = recv_.data() + shift;
        const std::string what = std::string(to_string(type)) + " count " + std::to_string(count) +
                                 " shift " + std::to_string(shift);
        const std::vector<std::byte> mine(in.begin(),
                                          in.begin() + static_cast<std::ptrdiff_t>(count * size));
        std::vector<std::byte> all(count * size * un);
        ASSERT_TRUE(world_.allgather(mine.data(), all.data(), count, type).is_ok());
        to_device(send, mine);
        Status s = world_.allgather(send, recv, count, type);
        ASSERT_TRUE(s.is_ok()) << s.message();
        EXPECT_TRUE(same(all, from_device(recv, all.size()), type)) << "allgather " << what;
        for (int root = 0; root < n; ++root) {
          std::vector<std::byte> host = mine;
          ASSERT_TRUE(world_.broadcast(host.data(), count, type, root).is_ok());
          to_device(recv, mine);
          s = world_.broadcast(recv, count, type, root);
          ASSERT_TRUE(s.is_ok()) << s.message();
          EXPECT_TRUE(same(host, from_device(recv, host.size()), type))
              << "broadcast from " << root << " " << what;
        }
        to_device(send, in);
        for (ReduceOp op : kOps) {
          if (bitwise(op) && floating(type)) continue;
          std::vector<std::byte> part(count * size);
          ASSERT_TRUE(world_.reduce_scatter(in.data(), part.data(), count, type, op).is_ok());
          s = world_.reduce_scatter(send, recv, count, type, op);
          ASSERT_TRUE(s.is_ok()) << s.message();
          EXPECT_TRUE(same(part, from_device(recv, part.size()), type))
              << "reduce_scatter " << to_string(op) << " " << what;
          // From FERRY_COLL_SMALL (64 KiB) a reduce takes the ring's order, and the kernel too.
          if (count * size < (64u << 10)) continue;
          for (int root = 0; root < n; ++root) {
            std::vector<std::byte> host(count * size);
            ASSERT_TRUE(world_.reduce(in.data(), host.data(), count, type, op, root).is_ok());
            s = world_.reduce(send, recv, count, type, op, root);
            ASSERT_TRUE(s.is_ok()) << s.message();
            if (world_.rank() == root) {
              EXPECT_TRUE(same(host, from_device(recv, host.size()), type))
                  << "reduce to " << root << " " << to_string(op) << " " << what;
            }
          }
        }
      }
    }
  }
  // Broadcasts take the kernel from 2 MiB.
  for (std::size_t shift : {std::size_t{0}, std::size_t{1}}) {
    const std::size_t bytes = (3u << 20) + 5;
    const std::vector<std::byte> data = input(DataType::kUint8, bytes, world_.rank(), 9 + shift);
    for (int root = 0; root < n; ++root) {
      std::vector<std::byte> host = data;
      ASSERT_TRUE(world_.broadcast(host.data(), bytes, DataType::kUint8, root).is_ok());
      to_device(recv_.data() + shift, data);
      const Status s = world_.broadcast(recv_.data() + shift, bytes, DataType::kUint8, root);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(same(host, from_device(recv_.data() + shift, bytes), DataType::kUint8))
          << "broadcast of " << bytes << " B from " << root << " shift " << shift;
    }
  }
  if (!oneshot_expected(n)) return;
  // Member 0 makes an allgather where the others make a reduce-scatter of the same count.
  const std::size_t count = 1000;
  to_device(send_.data(), input(DataType::kFloat32, count * un, world_.rank(), 7));
  const Status s = world_.rank() == 0
                       ? world_.allgather(send_.data(), recv_.data(), count, DataType::kFloat32)
                       : world_.reduce_scatter(send_.data(), recv_.data(), count,
                                               DataType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(s.code() == Code::kInvalidArgument || s.code() == Code::kTimeout) << s.to_string();
  // Broadcasts that name different roots, where the kernel takes 4 MiB (the default one-shot
  // limit; with a smaller one the host path takes it, where such a mismatch is not seen).
  if (std::getenv("FERRY_COLL_DEVICE_ONESHOT") == nullptr) {
    const Status roots = world_.broadcast(recv_.data(), std::size_t{1} << 20, DataType::kFloat32,
                                          world_.rank() == 1 ? 1 : 0);
    EXPECT_TRUE(roots.code() == Code::kInvalidArgument || roots.code() == Code::kTimeout)
        << roots.to_string();
  }
  // The communicator still works.
  const std::vector<std::byte> in = input(DataType::kFloat32, count, world_.rank(), 8);
  std::vector<std::byte> all(count * 4 * un);
  ASSERT_TRUE(world_.allgather(in.data(), all.data(), count, DataType::kFloat32).is_ok());
  to_device(send_.data(), in);
  const Status again = world_.allgather(send_.data(), recv_.data(), count, DataType::kFloat32);
  ASSERT_TRUE(again.is_ok()) << again.to_string();
  EXPECT_TRUE(same(all, from_device(recv_.data(), all.size()), DataType::kFloat32));
}

// Blocking allreduces of up to FERRY_COLL_DEVICE_ONESHOT_SLICE bytes go to a kernel that stays on
// the GPU between calls where every member has a GPU of its own. Chains of calls (each input the
// previous result, so nothing synchronizes the context between them) mixed with launched calls
// (non-blocking, or two blocks) and pauses longer than its idle time (it leaves and comes back),
// checked against the values the chain must reach; then a context synchronization after a call
// waits for it to leave, and only about as long as its idle time.
TEST_F(GpuColl, ResidentKernelTakesSmallBlockingCallsAndLeavesWhenIdle) {
  const bool resident = oneshot_expected(world_.size()) &&
                        !env_is("FERRY_COLL_DEVICE_RESIDENT", "0") &&
                        !env_is("FERRY_COLL_DEVICE_ONESHOT_SLICE", "0") && world_.size() > 1;
  const auto n = static_cast<std::uint32_t>(world_.size());
  // Every member holds y after the first call, so each later call multiplies by n (mod 2^32).
  for (const std::size_t count :
       {std::size_t{1}, std::size_t{7}, std::size_t{2048}, std::size_t{2049}}) {
    std::vector<std::uint32_t> start(count);
    for (std::size_t i = 0; i < count; ++i) {
      start[i] = static_cast<std::uint32_t>((world_.rank() + 1) * (i + 1));
    }
    std::vector<std::byte> bytes(count * 4);
    std::memcpy(bytes.data(), start.data(), bytes.size());
    to_device(send_.data(), bytes);
    std::uint32_t factor = n * (n + 1) / 2;  // after the first call
    std::byte* from = send_.data();
    std::byte* to = recv_.data();
    constexpr int kCalls = 600;
    for (int call = 1; call <= kCalls; ++call) {
      Status s;
      if (call % 50 == 0) {
        s = world_.iallreduce(from, to, count, DataType::kUint32, ReduceOp::kSum).wait();
      } else if (call % 7 == 0) {
        to = from;  // in place
        s = world_.allreduce(from, to, count, DataType::kUint32, ReduceOp::kSum);
      } else {
        s = world_.allreduce(from, to, count, DataType::kUint32, ReduceOp::kSum);
      }
      ASSERT_TRUE(s.is_ok()) << "count " << count << " call " << call << ": " << s.message();
      if (call > 1) factor *= n;
      if (call % 100 == 0 || call == kCalls) {
        std::vector<std::byte> got = from_device(to, count * 4);
        for (std::size_t i = 0; i < count; ++i) {
          std::uint32_t value = 0;
          std::memcpy(&value, got.data() + 4 * i, 4);
          ASSERT_EQ(value, factor * static_cast<std::uint32_t>(i + 1))
              << "count " << count << " call " << call << " element " << i;
        }
      }
      if (call % 150 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
      from = to;  // the next call reduces this result
      to = to == send_.data() ? recv_.data() : send_.data();
    }
  }
  {
    // A communicator of its own gets a kernel of its own, which leaves when it is destroyed.
    Communicator copy = world_.split(0, world_.rank());
    const std::vector<std::byte> in = input(DataType::kInt64, 9, world_.rank(), 77);
    std::vector<std::byte> host(in.size());
    ASSERT_TRUE(
        copy.allreduce(in.data(), host.data(), 9, DataType::kInt64, ReduceOp::kMax).is_ok());
    to_device(send_.data(), in);
    for (int call = 0; call < 20; ++call) {
      Status s = copy.allreduce(send_.data(), recv_.data(), 9, DataType::kInt64, ReduceOp::kMax);
      ASSERT_TRUE(s.is_ok()) << s.message();
      EXPECT_TRUE(same(host, from_device(recv_.data(), in.size()), DataType::kInt64));
    }
  }
  if (!resident) GTEST_SKIP() << "no resident kernel in this configuration (the chains passed)";
  ASSERT_TRUE(
      world_.allreduce(send_.data(), recv_.data(), 2, DataType::kFloat32, ReduceOp::kSum).is_ok());
  const auto before = std::chrono::steady_clock::now();
  check(g_cuda->cuCtxSynchronize(), "cuCtxSynchronize");
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
  std::printf("rank %d: a context synchronization after a small allreduce waited %.0f us\n",
              world_.rank(), waited * 1e6);
  EXPECT_GT(waited, 200e-6) << "no kernel stayed on the GPU after the call";
  EXPECT_LT(waited, 2.0) << "the resident kernel did not leave when idle";
}

TEST_F(GpuColl, RepeatedCollectivesKeepGpuMemoryFlat) {
  // Scratch buffers come back from the CUDA module's cache instead of new allocations (32 MiB:
  // past the one-shot kernel's size, so the ring's scratch).
  const std::size_t count = 8 << 20;
  to_device(send_.data(), input(DataType::kFloat32, count, world_.rank(), 5));
  std::size_t free_before = 0;
  std::size_t total = 0;
  ASSERT_TRUE(
      world_.allreduce(send_.data(), recv_.data(), count, DataType::kFloat32, ReduceOp::kSum)
          .is_ok());
  check(g_cuda->cuMemGetInfo(&free_before, &total), "cuMemGetInfo");
  for (int i = 0; i < 200; ++i) {
    Status s =
        world_.allreduce(send_.data(), recv_.data(), count, DataType::kFloat32, ReduceOp::kSum);
    ASSERT_TRUE(s.is_ok()) << s.message();
  }
  std::size_t free_after = 0;
  check(g_cuda->cuMemGetInfo(&free_after, &total), "cuMemGetInfo");
  const long long grew_mib =
      (static_cast<long long>(free_before) - static_cast<long long>(free_after)) >> 20;
  std::printf("rank %d: GPU memory in use grew by %lld MiB over 200 allreduces of 32 MiB\n",
              world_.rank(), grew_mib);
  // Another process on the same GPU allocates too; allow for one scratch set of it.
  EXPECT_LT(grew_mib, 64);
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  ferry::g_cuda = ferry::cuda::driver(&why);
  if (ferry::g_cuda == nullptr) {
    std::printf("SKIP: GPU tests need a CUDA driver and device: %s\n", why.c_str());
    return 77;
  }
  try {
    ferry::Context ctx = ferry::Context::init();
    ferry::g_ctx = &ctx;
    CUdevice device;
    ferry::g_device = ctx.rank() % ferry::g_cuda->device_count;
    ferry::check(ferry::g_cuda->cuDeviceGet(&device, ferry::g_device), "cuDeviceGet");
    CUcontext context;
    ferry::check(ferry::g_cuda->cuDevicePrimaryCtxRetain(&context, device), "retain");
    ferry::check(ferry::g_cuda->cuCtxSetCurrent(context), "set current");
    int result = RUN_ALL_TESTS();
    ferry::g_ctx = nullptr;
    return result;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "gpu_coll_test: %s\n", e.what());
    return 1;
  }
}
