// Rendezvous by one-sided read over ofi, between two endpoints of this process: the sender exposes
// its buffer (registered through the cache), the receiver reads it; a revoked buffer can no
// longer be read; a read of a key nobody registered fails, and says so. Over tcp (keys chosen by
// ferry, offsets into the registration) and shm (virtual addresses), so both kinds of mr_mode run.
// With FERRY_OFI_RMA=native, writes and reads of a registered region under the key asked for.
#if FERRY_HAVE_OFI
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "transport/ofi/transport.hpp"
#include "util/config.hpp"

namespace ferry::transport::ofi {
namespace {

class Completions final : public AmHandler {
 public:
  void on_am(std::uint8_t /*id*/, int /*source*/, std::span<const std::byte> /*data*/) override {}
  void on_direct(std::uint64_t cookie, Status status) override {
    done_.emplace(cookie, std::move(status));
  }
  std::map<std::uint64_t, Status> done_;
};

class OfiRma : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    open({});
    if (!transports_[0]) GTEST_SKIP() << "no " << GetParam() << " endpoint: " << why_;
    if (!transports_[0]->has_read()) GTEST_SKIP() << transports_[0]->rma();
  }
  void open(std::map<std::string, std::string> settings) {
    settings["FERRY_OFI_PROVIDER"] = GetParam();
    settings["FERRY_KEEPALIVE"] = "0";
    endpoints_.clear();
    transports_.clear();
    try {
      for (int rank = 0; rank < 2; ++rank) {
        transports_.push_back(std::make_unique<OfiTransport>(util::Config::load(settings), rank, 2,
                                                             &handlers_[rank]));
      }
    } catch (const Error& e) {
      why_ = e.what();
      transports_.clear();
      transports_.resize(1);
      return;
    }
    std::vector<std::byte> addresses[2] = {transports_[0]->address(), transports_[1]->address()};
    for (int rank = 0; rank < 2; ++rank) {
      PeerInfo peer;
      peer.rank = 1 - rank;
      peer.address = addresses[1 - rank];
      endpoints_.push_back(transports_[static_cast<std::size_t>(rank)]->connect(peer));
    }
  }
  // Progresses both until rank `rank`'s direct transfer `cookie` completes.
  Status wait_done(int rank, std::uint64_t cookie) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (handlers_[rank].done_.count(cookie) == 0) {
      transports_[0]->progress();
      transports_[1]->progress();
      if (std::chrono::steady_clock::now() > deadline) return Status(Code::kTimeout, "no end");
    }
    return handlers_[rank].done_[cookie];
  }
  // The same for the receiver's read.
  Status wait_read(std::uint64_t cookie) { return wait_done(1, cookie); }
  Completions handlers_[2];
  std::vector<std::unique_ptr<OfiTransport>> transports_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;  // [0]: rank 0's to rank 1, [1]: back
  std::string why_;
};

TEST_P(OfiRma, TheReceiverReadsTheExposedBufferAndTheRegistrationIsReused) {
  std::vector<std::uint32_t> source(1 << 20);  // 4 MiB
  std::iota(source.begin(), source.end(), 7u);
  for (std::uint64_t round = 1; round <= 3; ++round) {
    std::vector<std::uint32_t> target(source.size(), 0);
    Endpoint::RemoteRegion region;
    ASSERT_TRUE(endpoints_[0]->reads()->expose(source.data(), source.size() * 4, round, &region));
    // Half of it, from an offset: the region names the buffer, not its registration.
    ASSERT_TRUE(
        endpoints_[1]->reads()->read_direct(target.data(), source.size() * 2, region, 100 + round));
    const Status status = wait_read(100 + round);
    ASSERT_TRUE(status) << status.to_string();
    endpoints_[0]->reads()->unexpose(round, false);
    EXPECT_TRUE(std::equal(source.begin(), source.begin() + source.size() / 2, target.begin()));
    EXPECT_EQ(target[source.size() / 2], 0u) << "read past the length asked for";
  }
  const auto& stats = transports_[0]->registrations();
  if (transports_[0]->rma().find("cache off") == std::string::npos) {
    EXPECT_EQ(stats.misses, 1u);
    EXPECT_EQ(stats.hits, 2u);
  }
  EXPECT_NE(endpoints_[0]->describe().find("fi_read rendezvous"), std::string::npos)
      << endpoints_[0]->describe();
}

TEST_P(OfiRma, ARevokedBufferCannotBeReadAndTheReadSaysSo) {
  if (std::string(GetParam()) == "shm") {
    GTEST_SKIP() << "libfabric's shm provider reads by virtual address without checking keys";
  }
  std::vector<std::byte> source(1 << 20, std::byte{9});
  std::vector<std::byte> target(source.size());
  Endpoint::RemoteRegion region;
  ASSERT_TRUE(endpoints_[0]->reads()->expose(source.data(), source.size(), 1, &region));
  endpoints_[0]->reads()->unexpose(1, true);  // withdrawn: the registration is closed, cache or not
  ASSERT_TRUE(endpoints_[1]->reads()->read_direct(target.data(), target.size(), region, 2));
  const Status status = wait_read(2);
  EXPECT_FALSE(status);
  EXPECT_NE(status.message().find("read from rank 0 failed"), std::string::npos)
      << status.to_string();
  EXPECT_EQ(transports_[0]->registrations().entries, 0u);
}

TEST_P(OfiRma, AReadOfAKeyNobodyRegisteredFails) {
  if (std::string(GetParam()) == "shm") {
    GTEST_SKIP() << "libfabric's shm provider reads by virtual address without checking keys";
  }
  std::vector<std::byte> source(256 << 10, std::byte{3});
  std::vector<std::byte> target(source.size());
  Endpoint::RemoteRegion region;
  ASSERT_TRUE(endpoints_[0]->reads()->expose(source.data(), source.size(), 1, &region));
  region.key ^= 0x5a5a5a5a00000000ULL;
  ASSERT_TRUE(endpoints_[1]->reads()->read_direct(target.data(), target.size(), region, 2));
  const Status status = wait_read(2);
  EXPECT_FALSE(status) << "a read of a key nobody registered succeeded";
  endpoints_[0]->reads()->unexpose(1, false);
}

TEST_P(OfiRma, TheInjectedReadFailureComesAsACompletion) {
  open({{"FERRY_TEST_OFI_READ_FAIL", "1"}});
  std::vector<std::byte> source(256 << 10, std::byte{3});
  std::vector<std::byte> target(source.size());
  Endpoint::RemoteRegion region;
  ASSERT_TRUE(endpoints_[0]->reads()->expose(source.data(), source.size(), 1, &region));
  ASSERT_TRUE(endpoints_[1]->reads()->read_direct(target.data(), target.size(), region, 2));
  const Status status = wait_read(2);
  EXPECT_NE(status.message().find("FERRY_TEST_OFI_READ_FAIL"), std::string::npos)
      << status.to_string();
  endpoints_[0]->reads()->unexpose(1, false);
}

TEST_P(OfiRma, NativeWritesAndReadsReachTheRegisteredRegionUnderItsKey) {
  open({{"FERRY_OFI_RMA", "native"}});
  if (std::string(GetParam()) == "shm") {
    // It writes through any address it is given: native access is refused, and says why.
    EXPECT_FALSE(transports_[0]->has_native_rma());
    EXPECT_NE(endpoints_[0]->describe().find("puts and gets by messages"), std::string::npos)
        << endpoints_[0]->describe();
    std::vector<std::byte> memory(64);
    Endpoint::RemoteRegion region;
    void* handle = nullptr;
    EXPECT_EQ(transports_[0]->register_region(memory.data(), 64, 42, true, &region, &handle).code(),
              Code::kUnsupported);
    return;
  }
  ASSERT_TRUE(transports_[1]->has_native_rma()) << transports_[1]->rma();
  EXPECT_NE(endpoints_[0]->describe().find("puts and gets by fi_write/fi_read"), std::string::npos)
      << endpoints_[0]->describe();
  // Rank 1's region, under the key it asks for; rank 0 writes into it and reads it back.
  std::vector<std::uint32_t> memory(1 << 18, 0);  // 1 MiB
  Endpoint::RemoteRegion region;
  void* handle = nullptr;
  const std::uint64_t key = 0x1234abcd5678ef01ULL;
  ASSERT_TRUE(transports_[1]->register_region(memory.data(), memory.size() * 4, key, true, &region,
                                              &handle));
  EXPECT_EQ(region.key, key) << "tcp takes the key asked for";
  std::vector<std::uint32_t> out(memory.size() / 2);
  std::iota(out.begin(), out.end(), 3u);
  Endpoint::RemoteRegion at = region;
  at.address += 4096;  // from an offset
  ASSERT_TRUE(endpoints_[0]->writes()->write_direct(out.data(), out.size() * 4, at, 7));
  Status status = wait_done(0, 7);
  ASSERT_TRUE(status) << status.to_string();
  // Complete means delivered: the bytes are there without more progress.
  EXPECT_EQ(memory[1023], 0u);
  EXPECT_TRUE(std::equal(out.begin(), out.end(), memory.begin() + 1024));
  EXPECT_EQ(memory[1024 + out.size()], 0u);
  std::vector<std::uint32_t> back(out.size(), 0);
  ASSERT_TRUE(endpoints_[0]->reads()->read_direct(back.data(), back.size() * 4, at, 8));
  status = wait_done(0, 8);
  ASSERT_TRUE(status) << status.to_string();
  EXPECT_EQ(back, out);
  // Released: a write under the old key is refused (and tcp closes the connection, so last).
  transports_[1]->release_region(handle);
  std::fill(memory.begin(), memory.end(), 0u);
  ASSERT_TRUE(endpoints_[0]->writes()->write_direct(out.data(), 4096, region, 9));
  status = wait_done(0, 9);
  EXPECT_FALSE(status) << "a write under a released key succeeded";
  EXPECT_TRUE(std::all_of(memory.begin(), memory.end(), [](std::uint32_t v) { return v == 0; }));
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiRma, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace ferry::transport::ofi
#endif
