// FERRY_OFI_PASSTHRU: tcp;ofi_rxm handing every call to the tcp provider's own connected
// endpoints. It is taken by default and refused on request; messages of every size and tagged
// direct transfers cross it; ranks whose endpoints speak different wire protocols refuse each
// other instead of exchanging garbage.
#if FERRY_HAVE_OFI
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "transport/ofi/transport.hpp"
#include "util/config.hpp"

namespace ferry::transport::ofi {
namespace {

class Arrivals final : public AmHandler {
 public:
  void on_am(std::uint8_t /*id*/, int /*source*/, std::span<const std::byte> data) override {
    got.emplace_back(data.begin(), data.end());
  }
  void on_direct(std::uint64_t /*cookie*/, Status status) override {
    directs.push_back(std::move(status));
  }
  std::vector<std::vector<std::byte>> got;
  std::vector<Status> directs;
};

std::unique_ptr<OfiTransport> open(const std::string& passthru, AmHandler* handler, int rank) {
  const std::map<std::string, std::string> settings{
      {"FERRY_OFI_PROVIDER", "tcp"}, {"FERRY_KEEPALIVE", "0"}, {"FERRY_OFI_PASSTHRU", passthru}};
  return std::make_unique<OfiTransport>(util::Config::load(settings), rank, 2, handler);
}

class OfiPassthru : public ::testing::Test {
 protected:
  void SetUp() override {
    try {
      auto probe = open("auto", &handlers_[0], 0);
      if (!probe->passthru()) GTEST_SKIP() << "no pass-through offered: " << probe->provider();
    } catch (const Error& e) {
      GTEST_SKIP() << "no tcp endpoint: " << e.what();
    }
  }
  Arrivals handlers_[2];
};

TEST_F(OfiPassthru, IsTakenByDefaultWithEverythingElseAndRefusedOnRequest) {
  auto through = open("auto", &handlers_[0], 0);
  EXPECT_TRUE(through->passthru());
  EXPECT_NE(through->provider().find("passed through"), std::string::npos);
  EXPECT_TRUE(through->has_read());        // fi_read rendezvous
  EXPECT_TRUE(through->has_native_rma());  // fi_write / fi_read puts and gets
  EXPECT_TRUE(open("on", &handlers_[1], 1)->passthru());
  auto rxm = open("off", &handlers_[1], 1);
  EXPECT_FALSE(rxm->passthru());
  EXPECT_EQ(rxm->provider().find("passed through"), std::string::npos);
  EXPECT_TRUE(rxm->has_read());
}

TEST_F(OfiPassthru, RanksWhoseEndpointsSpeakDifferentProtocolsRefuseEachOther) {
  auto through = open("auto", &handlers_[0], 0);
  auto tagged = open("off", &handlers_[1], 1);
  const std::vector<std::byte> through_address = through->address();
  const std::vector<std::byte> tagged_address = tagged->address();
  PeerInfo to_tagged{1, false, -1, tagged_address};
  PeerInfo to_through{0, false, -1, through_address};
  const Reachability a = through->reach(to_tagged);
  const Reachability b = tagged->reach(to_through);
  EXPECT_FALSE(a.reachable);
  EXPECT_FALSE(b.reachable);
  EXPECT_NE(a.reason.find("FERRY_OFI_PASSTHRU"), std::string::npos) << a.reason;
  EXPECT_NE(b.reason.find("wire protocol"), std::string::npos) << b.reason;

  // Alike, they reach each other.
  auto other = open("auto", &handlers_[1], 1);
  const std::vector<std::byte> other_address = other->address();
  EXPECT_TRUE(through->reach(PeerInfo{1, false, -1, other_address}).reachable);
}

TEST_F(OfiPassthru, MessagesOfEverySizeArriveInOrderAndTaggedTransfersCross) {
  std::unique_ptr<OfiTransport> transports[2] = {open("auto", &handlers_[0], 0),
                                                 open("auto", &handlers_[1], 1)};
  const std::vector<std::byte> addresses[2] = {transports[0]->address(), transports[1]->address()};
  auto to_one = transports[0]->connect(PeerInfo{1, false, -1, addresses[1]});
  auto to_zero = transports[1]->connect(PeerInfo{0, false, -1, addresses[0]});
  ASSERT_NE(to_one->direct(), nullptr);

  // Sizes around the inject size and up to the largest active message, each filled by its index.
  const std::size_t sizes[] = {1, 8, 100, 4000, 16384, 40000, 65000};
  std::size_t sent = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (handlers_[1].got.size() < std::size(sizes) &&
         std::chrono::steady_clock::now() < deadline) {
    if (sent < std::size(sizes)) {
      std::vector<std::byte> payload(sizes[sent], static_cast<std::byte>(sent + 1));
      const Status status = to_one->am_send(3, {}, payload, AmHint::kNone);
      if (status) {
        ++sent;
      } else {
        ASSERT_EQ(status.code(), Code::kWouldBlock) << status.message();
      }
    }
    transports[0]->progress();
    transports[1]->progress();
  }
  ASSERT_EQ(handlers_[1].got.size(), std::size(sizes));
  for (std::size_t i = 0; i < std::size(sizes); ++i) {
    const std::vector<std::byte>& got = handlers_[1].got[i];
    ASSERT_EQ(got.size(), sizes[i]) << "message " << i;
    EXPECT_EQ(std::count(got.begin(), got.end(), static_cast<std::byte>(i + 1)),
              static_cast<std::ptrdiff_t>(sizes[i]))
        << "message " << i;
  }

  // A tagged transfer of 1 MiB into a receive posted with its key (the engine's direct
  // rendezvous), beside one posted with another key that must stay untouched.
  std::vector<std::byte> source(1 << 20);
  for (std::size_t i = 0; i < source.size(); ++i) source[i] = static_cast<std::byte>(i * 7 + 1);
  std::vector<std::byte> target(source.size()), other(64, std::byte{0x5a});
  ASSERT_TRUE(to_zero->direct()->recv_direct(other.data(), other.size(), -1, 8, 108));
  ASSERT_TRUE(to_zero->direct()->recv_direct(target.data(), target.size(), -1, 7, 107));
  ASSERT_TRUE(to_one->direct()->send_direct(source.data(), source.size(), -1, 7, 207));
  while ((handlers_[0].directs.empty() || handlers_[1].directs.empty()) &&
         std::chrono::steady_clock::now() < deadline + std::chrono::seconds(20)) {
    transports[0]->progress();
    transports[1]->progress();
  }
  ASSERT_EQ(handlers_[0].directs.size(), 1u);
  ASSERT_EQ(handlers_[1].directs.size(), 1u);
  EXPECT_TRUE(handlers_[0].directs[0]) << handlers_[0].directs[0].message();
  EXPECT_TRUE(handlers_[1].directs[0]) << handlers_[1].directs[0].message();
  EXPECT_EQ(target, source);
  EXPECT_EQ(std::count(other.begin(), other.end(), std::byte{0x5a}), 64);
  to_zero->direct()->cancel_direct(108);
  while (handlers_[1].directs.size() < 2 &&
         std::chrono::steady_clock::now() < deadline + std::chrono::seconds(30)) {
    transports[1]->progress();
  }
  ASSERT_EQ(handlers_[1].directs.size(), 2u);  // the canceled receive reports, with an error
  EXPECT_FALSE(handlers_[1].directs[1]);
}

}  // namespace
}  // namespace ferry::transport::ofi
#endif
