// GPU buffers between two processes (run by ferryrun -n 2; on one GPU both ranks share it, on
// several rank r uses GPU r). CTest runs it three times: CUDA IPC, IPC refused by injection
// (FERRY_TEST_CUDA_IPC_FAIL=1) and IPC off (FERRY_CUDA_IPC=0), so every rung of the fallback ladder
// moves the same data. Without a GPU it exits 77 (CTest: skipped) and says why.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda.hpp"
#include "cuda/driver.hpp"
#include "ferry/ferry.hpp"

namespace ferry {
namespace {

Context* g_ctx = nullptr;
const cuda::Driver* g_cuda = nullptr;
int g_device = 0;  // this rank's GPU
Context& ctx() { return *g_ctx; }
int me() { return ctx().rank(); }
int other() { return 1 - me(); }

void check(CUresult result, const char* what) {
  if (result != CUDA_SUCCESS) {
    std::fprintf(stderr, "%s: %s\n", what, cuda::error_string(result).c_str());
    std::abort();
  }
}

enum class Mem {
  kHost,
  kPinned,        // host memory from cuMemHostAlloc (page-locked): staged through the GPU
  kDevice,        // cuMemAlloc (cudaMalloc): legacy CUDA IPC
  kCuMem,         // cuMemCreate, shareable as a POSIX file descriptor
  kCuMemPrivate,  // cuMemCreate without a shareable handle type: only staging can move it
};

// A buffer in host or device memory, with helpers to fill and read it through host memory.
class Buffer {
 public:
  Buffer(bool device, std::size_t bytes) : Buffer(device ? Mem::kDevice : Mem::kHost, bytes) {}
  Buffer(Mem mem, std::size_t bytes)
      : device_(mem != Mem::kHost && mem != Mem::kPinned),
        mem_(mem),
        bytes_(std::max<std::size_t>(bytes, 1)) {
    if (mem_ == Mem::kPinned) {
      void* p = nullptr;
      check(g_cuda->cuMemHostAlloc(&p, bytes_, 0), "cuMemHostAlloc");
      data_ = static_cast<std::byte*>(p);
    } else if (mem_ == Mem::kDevice) {
      CUdeviceptr p = 0;
      check(g_cuda->cuMemAlloc(&p, bytes_), "cuMemAlloc");
      data_ = reinterpret_cast<std::byte*>(p);
    } else if (device_) {
      CUmemAllocationProp prop{};
      prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
      prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
      prop.location.id = g_device;
      prop.requestedHandleTypes =
          mem_ == Mem::kCuMem ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
      std::size_t granularity = 0;
      check(g_cuda->cuMemGetAllocationGranularity(&granularity, &prop,
                                                  CU_MEM_ALLOC_GRANULARITY_MINIMUM),
            "cuMemGetAllocationGranularity");
      mapped_ = (bytes_ + granularity - 1) / granularity * granularity;
      check(g_cuda->cuMemCreate(&handle_, mapped_, &prop, 0), "cuMemCreate");
      CUdeviceptr p = 0;
      check(g_cuda->cuMemAddressReserve(&p, mapped_, 0, 0, 0), "cuMemAddressReserve");
      check(g_cuda->cuMemMap(p, mapped_, 0, handle_, 0), "cuMemMap");
      CUmemAccessDesc access{};
      access.location = prop.location;
      access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      check(g_cuda->cuMemSetAccess(p, mapped_, &access, 1), "cuMemSetAccess");
      data_ = reinterpret_cast<std::byte*>(p);
    } else {
      data_ = new std::byte[bytes_];
    }
  }
  ~Buffer() {
    const auto p = reinterpret_cast<CUdeviceptr>(data_);
    if (mem_ == Mem::kPinned) {
      g_cuda->cuMemFreeHost(data_);
    } else if (mem_ == Mem::kDevice) {
      g_cuda->cuMemFree(p);
    } else if (device_) {
      g_cuda->cuMemUnmap(p, mapped_);
      g_cuda->cuMemAddressFree(p, mapped_);
      g_cuda->cuMemRelease(handle_);
    } else {
      delete[] data_;
    }
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  [[nodiscard]] std::byte* data() const { return data_; }

  void write(const std::vector<std::uint8_t>& host) {
    if (device_) {
      check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(data_),
                             reinterpret_cast<CUdeviceptr>(host.data()), host.size()),
            "cuMemcpy to device");
      // A copy from pageable memory may return before its DMA is done: like any user of a
      // device buffer, finish writing it before handing it to ferry.
      check(g_cuda->cuCtxSynchronize(), "cuCtxSynchronize");
    } else {
      std::memcpy(data_, host.data(), host.size());
    }
  }
  std::vector<std::uint8_t> read(std::size_t bytes) const {
    std::vector<std::uint8_t> host(bytes);
    if (device_) {
      check(g_cuda->cuMemcpy(reinterpret_cast<CUdeviceptr>(host.data()),
                             reinterpret_cast<CUdeviceptr>(data_), bytes),
            "cuMemcpy to host");
    } else {
      std::memcpy(host.data(), data_, bytes);
    }
    return host;
  }

 private:
  bool device_;
  Mem mem_;
  std::size_t bytes_;
  std::size_t mapped_ = 0;  // cuMem: the mapped size (a multiple of the granularity)
  CUmemGenericAllocationHandle handle_ = 0;
  std::byte* data_ = nullptr;
};

// Message `seq`'s bytes: differ per byte and message; 64-bit words keep 1 GiB fills quick.
std::vector<std::uint8_t> pattern(std::size_t bytes, std::uint64_t seq) {
  std::vector<std::uint8_t> v(bytes);
  std::uint64_t x = seq * 0x9e3779b97f4a7c15ULL + 1;
  std::size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    std::memcpy(v.data() + i, &x, 8);
  }
  for (; i < bytes; ++i) v[i] = static_cast<std::uint8_t>(seq + i);
  return v;
}

std::size_t first_difference(const std::vector<std::uint8_t>& a, const std::vector<std::uint8_t>& b,
                             std::size_t bytes) {
  if (std::memcmp(a.data(), b.data(), bytes) == 0) return SIZE_MAX;
  for (std::size_t i = 0; i < bytes; ++i) {
    if (a[i] != b[i]) return i;
  }
  return SIZE_MAX;
}

std::vector<std::size_t> sizes_up_to_1GiB() {
  std::vector<std::size_t> sizes;
  for (std::size_t s = 1; s <= (std::size_t{1} << 30); s *= 2) {
    sizes.push_back(s);
    // Odd sizes: tails of copies and of ring slots (4 MiB slots: 4m+3 spans two).
    if (s >= 4 && s <= (std::size_t{64} << 20)) sizes.push_back(s + 3);
  }
  return sizes;
}

// One message from rank 0 to rank 1 in the given memory kinds, checked byte for byte, including
// that nothing past the message was written.
void transfer(Mem mem0, Mem mem1, std::size_t bytes, std::uint64_t seq) {
  constexpr std::size_t kGuard = 64;
  const bool device0 = mem0 != Mem::kHost && mem0 != Mem::kPinned;
  const bool device1 = mem1 != Mem::kHost && mem1 != Mem::kPinned;
  if (me() == 0) {
    Buffer out(mem0, bytes);
    out.write(pattern(bytes, seq));
    ASSERT_TRUE(ctx().send(out.data(), bytes, 1, seq).is_ok());
  } else {
    Buffer in(mem1, bytes + kGuard);
    in.write(std::vector<std::uint8_t>(bytes + kGuard, 0xee));
    Request r = ctx().irecv(in.data(), bytes + kGuard, 0, seq);
    ASSERT_TRUE(r.wait().is_ok()) << r.status().to_string();
    ASSERT_EQ(r.info().bytes, bytes);
    std::vector<std::uint8_t> got = in.read(bytes + kGuard);
    ASSERT_EQ(first_difference(got, pattern(bytes, seq), bytes), SIZE_MAX)
        << bytes << " bytes, " << (device0 ? "cuda" : "host") << " -> "
        << (device1 ? "cuda" : "host");
    for (std::size_t i = bytes; i < bytes + kGuard; ++i) {
      ASSERT_EQ(got[i], 0xee) << "wrote past a " << bytes << "-byte message";
    }
  }
}

TEST(Gpu, EveryMemoryPairAndSizeFromOneByteTo1GiB) {
  std::uint64_t seq = 1000;
  const bool pairs[3][2] = {{true, true}, {true, false}, {false, true}};
  for (const auto& pair : pairs) {
    for (std::size_t bytes : sizes_up_to_1GiB()) {
      transfer(pair[0] ? Mem::kDevice : Mem::kHost, pair[1] ? Mem::kDevice : Mem::kHost, bytes,
               seq++);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(Gpu, PinnedHostMemoryToAndFromDevicesAtEverySize) {
  // Page-locked host memory is staged through its process's GPU (Cuda::copy_through_device_async)
  // where the CPU would copy pageable memory: every pair with a pinned end, past the ring's slots.
  std::uint64_t seq = 5000;
  const Mem pairs[4][2] = {{Mem::kPinned, Mem::kDevice},
                           {Mem::kDevice, Mem::kPinned},
                           {Mem::kPinned, Mem::kPinned},
                           {Mem::kPinned, Mem::kHost}};
  for (const auto& pair : pairs) {
    for (std::size_t bytes :
         {std::size_t{1}, std::size_t{4097}, std::size_t{1} << 20, (std::size_t{4} << 20) + 3,
          std::size_t{64} << 20, (std::size_t{100} << 20) + 5}) {
      transfer(pair[0], pair[1], bytes, seq++);
      if (::testing::Test::HasFatalFailure()) return;
    }
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(Gpu, CompletedDeviceReceivesAreVisibleToEveryStream) {
  // A completed receive into device memory is there for work on any stream, not only for the
  // legacy default stream that cuMemcpy uses: small host -> device messages are copied in
  // synchronously, and a cuMemcpy from pageable memory returns before its DMA is done.
  const std::size_t sizes[] = {1, 8, 1000, 32000};
  std::uint64_t seq = 9000;
  if (me() == 0) {
    for (int round = 0; round < 100; ++round) {
      for (std::size_t bytes : sizes) {
        const std::vector<std::uint8_t> data = pattern(bytes, seq);
        ASSERT_TRUE(ctx().send(data.data(), bytes, 1, seq++).is_ok());
      }
    }
  } else {
    CUstream stream = nullptr;
    check(g_cuda->cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING), "cuStreamCreate");
    void* pinned = nullptr;
    check(g_cuda->cuMemHostAlloc(&pinned, 32000, 0), "cuMemHostAlloc");
    Buffer in(Mem::kDevice, 32000);
    for (int round = 0; round < 100; ++round) {
      for (std::size_t bytes : sizes) {
        ASSERT_TRUE(ctx().recv(in.data(), bytes, 0, seq).is_ok());
        check(g_cuda->cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(pinned),
                                    reinterpret_cast<CUdeviceptr>(in.data()), bytes, stream),
              "cuMemcpyAsync");
        check(g_cuda->cuStreamSynchronize(stream), "cuStreamSynchronize");
        const std::vector<std::uint8_t> want = pattern(bytes, seq++);
        ASSERT_EQ(std::memcmp(pinned, want.data(), bytes), 0)
            << bytes << " bytes, round " << round << ": a non-blocking stream saw old data";
      }
    }
    g_cuda->cuMemFreeHost(pinned);
    g_cuda->cuStreamDestroy(stream);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(Gpu, UnexpectedDeviceMessagesMatchInOrder) {
  // Rank 0's sends arrive before rank 1 posts anything: RTS_DEV waits in the unexpected queue.
  const std::size_t sizes[] = {8, 65536, 8 << 20};
  if (me() == 0) {
    std::vector<std::unique_ptr<Buffer>> buffers;
    std::vector<Request> sends;
    for (std::size_t i = 0; i < 3; ++i) {
      buffers.push_back(std::make_unique<Buffer>(true, sizes[i]));
      buffers.back()->write(pattern(sizes[i], 50 + i));
      sends.push_back(ctx().isend(buffers.back()->data(), sizes[i], 1, 7));
    }
    ASSERT_TRUE(ctx().barrier().is_ok());
    ASSERT_TRUE(Request::wait_all(sends).is_ok());
  } else {
    ASSERT_TRUE(ctx().barrier().is_ok());
    for (std::size_t i = 0; i < 3; ++i) {
      Buffer in(true, sizes[i]);
      ASSERT_TRUE(ctx().recv(in.data(), sizes[i], 0, 7).is_ok());
      EXPECT_EQ(first_difference(in.read(sizes[i]), pattern(sizes[i], 50 + i), sizes[i]), SIZE_MAX);
    }
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(Gpu, TruncatedDeviceReceiveKeepsWhatFits) {
  const std::size_t sent = 1 << 20, room = 1 << 19;
  if (me() == 0) {
    Buffer out(true, sent);
    out.write(pattern(sent, 77));
    ASSERT_TRUE(ctx().send(out.data(), sent, 1, 8).is_ok());
  } else {
    Buffer in(true, room);
    Status status = ctx().recv(in.data(), room, 0, 8);
    EXPECT_EQ(status.code(), Code::kTruncated) << status.to_string();
    EXPECT_EQ(first_difference(in.read(room), pattern(sent, 77), room), SIZE_MAX);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(Gpu, TenThousandFreedBuffersKeepGpuMemoryFlat) {
  // Rank 0 allocates, sends and frees a buffer 10,000 times. The receiver's IPC cache must close
  // mappings of freed allocations (or the GPU memory they hold is never released).
  const std::size_t bytes = 2 << 20;
  const int rounds = 10000;
  std::size_t free_at_start = 0, free_now = 0, total = 0;
  Buffer in(true, bytes);
  for (int i = 0; i < rounds; ++i) {
    if (me() == 0) {
      Buffer out(true, bytes);
      check(g_cuda->cuMemsetD8(reinterpret_cast<CUdeviceptr>(out.data()),
                               static_cast<unsigned char>(i), bytes),
            "cuMemsetD8");
      ASSERT_TRUE(ctx().send(out.data(), bytes, 1, 9).is_ok());
    } else {
      ASSERT_TRUE(ctx().recv(in.data(), bytes, 0, 9).is_ok());
      if (i % 1000 == 999) {
        std::vector<std::uint8_t> got = in.read(bytes);
        ASSERT_EQ(got[0], static_cast<std::uint8_t>(i));
        ASSERT_EQ(got[bytes - 1], static_cast<std::uint8_t>(i));
      }
    }
    if (i == 100) check(g_cuda->cuMemGetInfo(&free_at_start, &total), "cuMemGetInfo");
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  check(g_cuda->cuMemGetInfo(&free_now, &total), "cuMemGetInfo");
  const double grown_mib =
      (static_cast<double>(free_at_start) - static_cast<double>(free_now)) / (1 << 20);
  std::printf("rank %d: GPU memory in use grew by %.0f MiB over %d allocate/send/free rounds\n",
              me(), grown_mib, rounds);
  EXPECT_LT(grown_mib, 512.0) << "freed buffers stay mapped by the peer";
}

// FERRY_TRANSPORTS without shm: the ranks talk over ofi as if on two nodes, and device data is
// moved through pinned host memory (or registered with the NIC where it can be).
bool shm_used() {
  const char* transports = std::getenv("FERRY_TRANSPORTS");
  return transports == nullptr || std::string(transports).find("shm") != std::string::npos;
}

bool ipc_expected() {
  const char* ipc = std::getenv("FERRY_CUDA_IPC");
  const char* fail = std::getenv("FERRY_TEST_CUDA_IPC_FAIL");
  return shm_used() && !(ipc != nullptr && std::string(ipc) == "0") &&
         !(fail != nullptr && std::string(fail) == "1");
}

TEST(Gpu, CuMemAllocationsMoveWithTheirDescriptors) {
  // cuMem (VMM) allocations, as PyTorch's expandable segments make them: no legacy IPC handle,
  // mapped by the receiver from a POSIX descriptor passed over the node's socket.
  {
    // ferry sees them as such (so no verdict below could come from a send that never tried).
    std::string why;
    std::unique_ptr<cuda::Cuda> module = cuda::Cuda::create(util::Config::load(), &why);
    ASSERT_TRUE(module) << why;
    Buffer probe(Mem::kCuMem, 3 << 20);
    const mem::MemoryInfo info = module->classify(probe.data() + 5);
    EXPECT_EQ(info.kind, mem::MemoryKind::kCudaDevice);
    EXPECT_EQ(info.ipc, mem::IpcKind::kPosixFd) << mem::to_string(info);
    EXPECT_EQ(info.base, reinterpret_cast<std::uint64_t>(probe.data()));
    EXPECT_GE(info.extent, std::uint64_t{3} << 20);
    Buffer plain(Mem::kCuMemPrivate, 1);
    EXPECT_EQ(module->classify(plain.data()).ipc, mem::IpcKind::kNone);
    Buffer legacy(Mem::kDevice, 1);
    EXPECT_EQ(module->classify(legacy.data()).ipc, mem::IpcKind::kLegacy);
  }
  std::uint64_t seq = 5000;
  const std::size_t sizes[] = {1, 4096, (1 << 20) + 3, 8 << 20, 64 << 20};
  for (std::size_t bytes : sizes) {
    transfer(Mem::kCuMem, Mem::kDevice, bytes, seq++);
    transfer(Mem::kCuMem, Mem::kCuMem, bytes, seq++);
    transfer(Mem::kDevice, Mem::kCuMem, bytes, seq++);
    transfer(Mem::kCuMem, Mem::kHost, bytes, seq++);
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  const std::string path = ctx().describe_peer(other());
  if (ipc_expected()) {
    EXPECT_NE(path.find("cuMem allocations by descriptor passing"), std::string::npos) << path;
  }
}

TEST(Gpu, UnshareableCuMemIsStagedWithoutGivingUpIpc) {
  // An allocation that cannot be exported is moved by staging; the peer's IPC verdict stays.
  std::uint64_t seq = 6000;
  for (std::size_t bytes : {std::size_t{8}, std::size_t{3} << 20}) {
    transfer(Mem::kCuMemPrivate, Mem::kDevice, bytes, seq++);
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  const std::string path = ctx().describe_peer(other());
  if (ipc_expected()) {
    EXPECT_NE(path.find("device buffers: CUDA IPC (host-staged if refused)"), std::string::npos)
        << path;
    EXPECT_EQ(path.find("cuMem allocations host-staged"), std::string::npos) << path;
  }
}

TEST(Gpu, FreedCuMemAllocationsKeepGpuMemoryFlat) {
  // As TenThousandFreedBuffersKeepGpuMemoryFlat, for mappings made from descriptors: each round
  // is a new allocation, often at the address of the last one.
  const std::size_t bytes = 2 << 20;
  const int rounds = 2000;
  std::size_t free_at_start = 0, free_now = 0, total = 0;
  Buffer in(true, bytes);
  for (int i = 0; i < rounds; ++i) {
    if (me() == 0) {
      Buffer out(Mem::kCuMem, bytes);
      check(g_cuda->cuMemsetD8(reinterpret_cast<CUdeviceptr>(out.data()),
                               static_cast<unsigned char>(i), bytes),
            "cuMemsetD8");
      check(g_cuda->cuCtxSynchronize(), "cuCtxSynchronize");
      ASSERT_TRUE(ctx().send(out.data(), bytes, 1, 10).is_ok());
    } else {
      ASSERT_TRUE(ctx().recv(in.data(), bytes, 0, 10).is_ok());
      std::vector<std::uint8_t> got = in.read(bytes);
      ASSERT_EQ(got[0], static_cast<std::uint8_t>(i)) << "round " << i;
      ASSERT_EQ(got[bytes - 1], static_cast<std::uint8_t>(i)) << "round " << i;
    }
    if (i == 100) check(g_cuda->cuMemGetInfo(&free_at_start, &total), "cuMemGetInfo");
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  check(g_cuda->cuMemGetInfo(&free_now, &total), "cuMemGetInfo");
  const double grown_mib =
      (static_cast<double>(free_at_start) - static_cast<double>(free_now)) / (1 << 20);
  std::printf(
      "rank %d: GPU memory in use grew by %.0f MiB over %d cuMem allocate/send/free rounds\n", me(),
      grown_mib, rounds);
  EXPECT_LT(grown_mib, 512.0) << "freed cuMem allocations stay mapped by the peer";
}

// Every rank's key for `region`, by rank.
std::vector<RemoteKey> exchange_keys(const MemoryRegion& region) {
  const std::vector<std::byte> mine = region.remote_key();
  std::vector<std::byte> all(mine.size() * 2);
  EXPECT_TRUE(
      ctx().world().allgather(mine.data(), all.data(), mine.size(), DataType::kUint8).is_ok());
  std::vector<RemoteKey> keys(2);
  for (int r = 0; r < 2; ++r) {
    const std::span<const std::byte> packed(all.data() + r * mine.size(), mine.size());
    EXPECT_TRUE(RemoteKey::unpack(packed, &keys[static_cast<std::size_t>(r)]).is_ok());
  }
  return keys;
}

// Puts and gets between every pair of local and region memory (host, cuMemAlloc, cuMem), to the
// other rank's region (through its owner) and to this rank's own, at sizes across the fragment
// size; every byte checked, and nothing written around the range.
TEST(Gpu, OneSidedPutAndGetOnDeviceMemory) {
  const std::vector<std::size_t> sizes = {1, 8, 4095, 65536 + 3, (std::size_t{1} << 20) + 7};
  constexpr std::size_t kGuard = 64;
  const std::size_t window = (std::size_t{1} << 20) + 7 + 2 * kGuard;
  std::uint64_t seq = 5000;
  for (Mem region_mem : {Mem::kDevice, Mem::kCuMem, Mem::kHost}) {
    Buffer memory(region_mem, window);
    MemoryRegion region;
    ASSERT_TRUE(ctx().register_memory(memory.data(), window, &region).is_ok());
    const auto keys = exchange_keys(region);
    for (Mem local_mem : {Mem::kHost, Mem::kDevice}) {
      for (int target : {other(), me()}) {
        for (std::size_t bytes : sizes) {
          ++seq;
          // The target's owner clears its window; the initiator puts, reads back by get, and
          // the owner checks what landed.
          const int initiator = (target == me()) ? me() : 0;  // to another: rank 0 writes
          ASSERT_TRUE(ctx().barrier().is_ok());
          memory.write(std::vector<std::uint8_t>(window, 0xee));
          ASSERT_TRUE(ctx().barrier().is_ok());
          const std::string what = std::to_string(bytes) + " bytes from " +
                                   (local_mem == Mem::kHost ? "host" : "cuda") + " to rank " +
                                   std::to_string(target) + "'s " +
                                   (region_mem == Mem::kHost ? "host" : "cuda") + " region";
          if (target == me() || me() == initiator) {
            Buffer out(local_mem, bytes);
            out.write(pattern(bytes, seq));
            Request put = ctx().iput(out.data(), bytes, keys[target], kGuard);
            ASSERT_TRUE(put.wait().is_ok()) << what << ": " << put.status().to_string();
            Buffer back(local_mem, bytes);
            back.write(std::vector<std::uint8_t>(bytes, 0));
            Request get = ctx().iget(back.data(), bytes, keys[target], kGuard);
            ASSERT_TRUE(get.wait().is_ok()) << what << ": " << get.status().to_string();
            ASSERT_EQ(first_difference(back.read(bytes), pattern(bytes, seq), bytes), SIZE_MAX)
                << what << ": the get";
          }
          ASSERT_TRUE(ctx().barrier().is_ok());  // progress for the owner, then it looks
          if (target == me() || me() != initiator) {
            const std::vector<std::uint8_t> got = memory.read(window);
            std::vector<std::uint8_t> expected(window, 0xee);
            std::memcpy(expected.data() + kGuard, pattern(bytes, seq).data(), bytes);
            ASSERT_EQ(first_difference(got, expected, window), SIZE_MAX) << what;
          }
        }
      }
    }
    ASSERT_TRUE(ctx().barrier().is_ok());
  }
}

// With CUDA IPC, a peer on the node puts to and gets from a registered device region without its
// owner: rank 1 sleeps without calling ferry meanwhile. Otherwise rank 1's progress does it.
TEST(Gpu, OneSidedDeviceMemoryNeedsNoProgressFromItsOwnerWithIpc) {
  for (Mem mem : {Mem::kDevice, Mem::kCuMem}) {
    constexpr std::size_t kBytes = (std::size_t{1} << 20) + 5;
    Buffer memory(mem, kBytes);
    memory.write(std::vector<std::uint8_t>(kBytes, 0));
    MemoryRegion region;
    ASSERT_TRUE(ctx().register_memory(memory.data(), kBytes, &region).is_ok());
    const auto keys = exchange_keys(region);
    if (me() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(400));
    } else {
      const auto t0 = std::chrono::steady_clock::now();
      for (Mem local : {Mem::kHost, Mem::kDevice}) {
        Buffer out(local, kBytes - 1);
        out.write(pattern(kBytes - 1, 77));
        ASSERT_TRUE(ctx().iput(out.data(), kBytes - 1, keys[1], 1).wait().is_ok());
        Buffer back(local, kBytes - 1);
        Request get = ctx().iget(back.data(), kBytes - 1, keys[1], 1);
        ASSERT_TRUE(get.wait().is_ok()) << get.status().to_string();
        ASSERT_EQ(first_difference(back.read(kBytes - 1), pattern(kBytes - 1, 77), kBytes - 1),
                  SIZE_MAX);
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      std::printf("rank 0: puts and gets on rank 1's %s region took %.1f ms\n",
                  mem == Mem::kDevice ? "cuMemAlloc" : "cuMem", ms);
      if (ipc_expected()) {
        EXPECT_LT(ms, 300) << "rank 1's progress was needed";
      }
    }
    ASSERT_TRUE(ctx().barrier().is_ok());
    if (me() == 1) {
      std::vector<std::uint8_t> expected(kBytes, 0);
      std::memcpy(expected.data() + 1, pattern(kBytes - 1, 77).data(), kBytes - 1);
      ASSERT_EQ(first_difference(memory.read(kBytes), expected, kBytes), SIZE_MAX);
      ASSERT_TRUE(region.deregister().is_ok());
    }
    ASSERT_TRUE(ctx().barrier().is_ok());
  }
}

// Device puts by CUDA IPC are copies in flight until the initiator's progress sees them done: a
// window of them overlaps, and the owner's deregister waits for every one begun, so once it
// returns all of them are in its memory (rank 0 tells rank 1 to deregister before it waits).
TEST(Gpu, OneSidedDevicePutsInFlightEndBeforeDeregisterReturns) {
  constexpr std::size_t kPiece = 65536;
  constexpr int kPieces = 64;
  Buffer memory(Mem::kDevice, kPiece * kPieces);
  memory.write(std::vector<std::uint8_t>(kPiece * kPieces, 0));
  MemoryRegion region;
  ASSERT_TRUE(ctx().register_memory(memory.data(), kPiece * kPieces, &region).is_ok());
  const auto keys = exchange_keys(region);
  const std::vector<std::uint8_t> expected = pattern(kPiece * kPieces, 91);
  int go = 1;
  if (me() == 0) {
    Buffer out(Mem::kDevice, kPiece * kPieces);
    out.write(expected);
    std::vector<Request> puts;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPieces; ++i) {
      puts.push_back(ctx().iput(static_cast<std::byte*>(out.data()) + i * kPiece, kPiece, keys[1],
                                i * kPiece));
    }
    const double issued_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(ctx().send(&go, sizeof go, 1, 5).is_ok());
    ASSERT_TRUE(Request::wait_all(puts).is_ok());
    ASSERT_TRUE(ctx().flush(1).is_ok());
    const double all_us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    std::printf("rank 0: %d device puts of %zu bytes issued in %.0f us, done in %.0f us\n", kPieces,
                kPiece, issued_us, all_us);
  } else if (me() == 1) {
    ASSERT_TRUE(ctx().recv(&go, sizeof go, 0, 5).is_ok());
    ASSERT_TRUE(region.deregister().is_ok());
    ASSERT_EQ(first_difference(memory.read(kPiece * kPieces), expected, kPiece * kPieces), SIZE_MAX)
        << "deregister returned before every put begun had landed";
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

// Atomics on a device region are applied by its owner one at a time: both ranks adding to one
// word lose no update, and every old value is seen exactly once.
TEST(Gpu, OneSidedAtomicsOnDeviceMemoryLoseNoUpdate) {
  Buffer memory(Mem::kDevice, 64);
  memory.write(std::vector<std::uint8_t>(64, 0));
  MemoryRegion region;
  ASSERT_TRUE(ctx().register_memory(memory.data(), 64, &region).is_ok());
  const auto keys = exchange_keys(region);
  constexpr int kRounds = 300;
  std::vector<std::uint64_t> old(kRounds);
  std::vector<std::uint32_t> old32(kRounds);
  std::vector<Request> requests;
  for (int i = 0; i < kRounds; ++i) {
    requests.push_back(ctx().iatomic(AtomicOp::kAdd, 8, keys[0], 0, 1, &old[i]));
    requests.push_back(ctx().iatomic(AtomicOp::kAdd, 4, keys[0], 8, 1, &old32[i]));
  }
  for (Request& r : requests) ASSERT_TRUE(r.wait().is_ok()) << r.status().to_string();
  // A result in device memory is refused, not written by the CPU.
  Buffer device_result(Mem::kDevice, 8);
  Request refused = ctx().iatomic(AtomicOp::kAdd, 8, keys[0], 16, 1, device_result.data());
  EXPECT_EQ(refused.wait().code(), Code::kInvalidArgument) << refused.status().to_string();
  // Old values from both ranks: each of 0 .. 2 * kRounds - 1 exactly once.
  std::vector<std::uint64_t> all(2 * kRounds), all32(2 * kRounds);
  ASSERT_TRUE(ctx().world().allgather(old.data(), all.data(), kRounds, DataType::kUint64).is_ok());
  std::vector<std::uint32_t> gathered32(2 * kRounds);
  ASSERT_TRUE(
      ctx().world().allgather(old32.data(), gathered32.data(), kRounds, DataType::kUint32).is_ok());
  std::sort(all.begin(), all.end());
  std::sort(gathered32.begin(), gathered32.end());
  for (int i = 0; i < 2 * kRounds; ++i) {
    ASSERT_EQ(all[i], static_cast<std::uint64_t>(i));
    ASSERT_EQ(gathered32[i], static_cast<std::uint32_t>(i));
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 0) {
    std::vector<std::uint8_t> words = memory.read(24);
    std::uint64_t sum = 0, untouched = 0;
    std::uint32_t sum32 = 0;
    std::memcpy(&sum, words.data(), 8);
    std::memcpy(&sum32, words.data() + 8, 4);
    std::memcpy(&untouched, words.data() + 16, 8);
    EXPECT_EQ(sum, 2u * kRounds);
    EXPECT_EQ(sum32, 2u * kRounds);
    EXPECT_EQ(untouched, 0u) << "the refused atomic was applied";
  }
  // A device range past its allocation's end cannot be registered.
  MemoryRegion too_long;
  EXPECT_EQ(ctx().register_memory(memory.data(), 1 << 30, &too_long).code(),
            Code::kInvalidArgument);
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(Gpu, PeerPathIsReported) {
  ASSERT_TRUE(ctx().barrier().is_ok());
  const std::string path = ctx().describe_peer(other());
  std::printf("rank %d -> rank %d: %s\n", me(), other(), path.c_str());
  const char* ipc = std::getenv("FERRY_CUDA_IPC");
  const char* fail = std::getenv("FERRY_TEST_CUDA_IPC_FAIL");
  if (!shm_used()) {
    EXPECT_NE(path.find("ofi ("), std::string::npos) << path;
    EXPECT_NE(path.find("device buffers: no shared memory with this peer"), std::string::npos)
        << path;
    // Where FI_HMEM is offered (or assumed), the earlier transfers tried this GPU's memory for
    // real; Debian's libfabric refuses it, FERRY_TEST_OFI_HMEM=fail refuses it with -22.
    const char* hmem = std::getenv("FERRY_TEST_OFI_HMEM");
    const std::string test = hmem != nullptr ? hmem : "none";
    if (test == "fail") {
      EXPECT_NE(path.find("memory with the NIC failed (Invalid argument (-22)): staged"),
                std::string::npos)
          << path;
    } else if (test == "assume") {
      EXPECT_TRUE(path.find("memory with the NIC failed (") != std::string::npos ||
                  path.find("memory registered with the NIC") != std::string::npos)
          << path;
    } else if (path.find("FI_HMEM offered") == std::string::npos) {
      EXPECT_NE(path.find("no FI_HMEM"), std::string::npos) << path;
    }
  } else if (ipc != nullptr && std::string(ipc) == "0") {
    EXPECT_NE(path.find("host-staged (FERRY_CUDA_IPC=0)"), std::string::npos) << path;
  } else if (fail != nullptr && std::string(fail) == "1") {
    // Both sides learned of the refusal from the first device transfer.
    EXPECT_NE(path.find("CUDA IPC refused"), std::string::npos) << path;
  } else {
    EXPECT_NE(path.find("device buffers: CUDA IPC"), std::string::npos) << path;
  }
  // Rank 0's page-locked sends into rank 1's device buffers (PinnedHostMemoryToAndFromDevices...)
  // were written by rank 0's GPU into the mapped receive buffers where IPC stands; staged else.
  const bool ipc_stands = shm_used() && (ipc == nullptr || std::string(ipc) != "0") &&
                          (fail == nullptr || std::string(fail) != "1");
  const bool wrote =
      path.find("page-locked host memory written into its device buffers") != std::string::npos;
  EXPECT_EQ(wrote, ipc_stands && me() == 0) << path;
  // The tests before moved data through this rank's GPU. Its copies report completion by a
  // stream write to a host flag (one load to poll), where the driver takes one: every CUDA 12+
  // driver does; events (a driver call each) only where forced.
  const char* events = std::getenv("FERRY_TEST_CUDA_EVENTS");
  const bool forced = events != nullptr && std::string(events) == "1";
  EXPECT_NE(path.find(forced ? " by events" : " by a flag the GPU writes"), std::string::npos)
      << path;
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
    if (ctx.size() != 2) {
      std::fprintf(stderr, "run with ferryrun -n 2\n");
      return 2;
    }
    // One GPU per rank where there are several; both ranks on GPU 0 otherwise.
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
    std::fprintf(stderr, "gpu_test: %s\n", e.what());
    return 1;
  }
}
