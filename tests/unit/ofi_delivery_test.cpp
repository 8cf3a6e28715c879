// Finalize's question to the ofi transport, delivered(), between two endpoints of this process:
// once it says yes, the sender may close its endpoint at once and the peer still gets every
// message, eager ones (fi_inject, no completion of their own) and bounce-buffer ones (also those
// the provider sends by its own rendezvous), in order,
// without the keepalive that asked; a message sent after a yes needs another.
#if FERRY_HAVE_OFI
#include <gtest/gtest.h>

#include <chrono>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "transport/ofi/transport.hpp"
#include "util/config.hpp"

namespace ferry::transport::ofi {
namespace {

class Arrivals final : public AmHandler {
 public:
  void on_am(std::uint8_t id, int source, std::span<const std::byte> data) override {
    got.push_back({id, source, data.size()});
  }
  struct Message {
    std::uint8_t id;
    int source;
    std::size_t length;
  };
  std::vector<Message> got;
};

class OfiDelivery : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    std::map<std::string, std::string> settings{{"FERRY_OFI_PROVIDER", GetParam()},
                                                {"FERRY_KEEPALIVE", "0"}};
    try {
      for (int rank = 0; rank < 2; ++rank) {
        transports_.push_back(std::make_unique<OfiTransport>(util::Config::load(settings), rank, 2,
                                                             &handlers_[rank]));
      }
    } catch (const Error& e) {
      GTEST_SKIP() << "no " << GetParam() << " endpoint: " << e.what();
    }
    addresses_[0] = transports_[0]->address();
    addresses_[1] = transports_[1]->address();
    for (int rank = 0; rank < 2; ++rank) {
      PeerInfo peer;
      peer.rank = 1 - rank;
      peer.address = addresses_[1 - rank];  // a view
      endpoints_.push_back(transports_[static_cast<std::size_t>(rank)]->connect(peer));
    }
  }
  // Rank 0's send, retried on back-pressure (the provider connecting) with progress on both.
  Status send(std::uint8_t id, std::span<const std::byte> payload) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      Status status = endpoints_[0]->am_send(id, {}, payload, AmHint::kNone);
      if (status.code() != Code::kWouldBlock) return status;
      if (std::chrono::steady_clock::now() > deadline) return Status(Code::kTimeout, "refused");
      transports_[0]->progress();
      transports_[1]->progress();
    }
  }
  Arrivals handlers_[2];
  std::vector<std::byte> addresses_[2];
  std::vector<std::unique_ptr<OfiTransport>> transports_;
  std::vector<std::unique_ptr<Endpoint>> endpoints_;  // [0]: rank 0's to rank 1
};

TEST_P(OfiDelivery, ASenderThatClosesOnceToldOfDeliveryLosesNothing) {
  const std::vector<std::byte> small(8, std::byte{1});
  const std::vector<std::byte> large(4096, std::byte{2});  // above the inject size: a bounce buffer
  // Above tcp;ofi_rxm's eager size (16 KiB): its own rendezvous, which completes once the peer
  // has fetched it, possibly after later messages.
  const std::vector<std::byte> larger(40000, std::byte{3});
  // A rank that sent nothing has nothing to confirm.
  EXPECT_TRUE(transports_[0]->delivered());
  ASSERT_TRUE(send(5, small).is_ok());
  ASSERT_TRUE(send(6, large).is_ok());
  ASSERT_TRUE(send(8, larger).is_ok());
  ASSERT_TRUE(send(7, small).is_ok());
  EXPECT_TRUE(transports_[1]->delivered());  // rank 1 sent nothing

  // The sender's progress alone for up to a second (what the peer's provider does by itself is
  // up to it), then both.
  const auto start = std::chrono::steady_clock::now();
  bool confirmed = false;
  while (!confirmed && std::chrono::steady_clock::now() < start + std::chrono::seconds(20)) {
    transports_[0]->progress();
    if (std::chrono::steady_clock::now() > start + std::chrono::seconds(1)) {
      transports_[1]->progress();
    }
    confirmed = transports_[0]->delivered();
  }
  ASSERT_TRUE(confirmed);

  // The sender closes at once, as finalize does then; the peer still gets all four, in order,
  // and not the keepalive that asked.
  endpoints_[0].reset();
  transports_[0].reset();
  for (int i = 0; i < 100000 && handlers_[1].got.size() < 4; ++i) transports_[1]->progress();
  ASSERT_EQ(handlers_[1].got.size(), 4u);
  EXPECT_EQ(handlers_[1].got[0].id, 5);
  EXPECT_EQ(handlers_[1].got[0].length, small.size());
  EXPECT_EQ(handlers_[1].got[1].id, 6);
  EXPECT_EQ(handlers_[1].got[1].length, large.size());
  EXPECT_EQ(handlers_[1].got[2].id, 8);
  EXPECT_EQ(handlers_[1].got[2].length, larger.size());
  EXPECT_EQ(handlers_[1].got[3].id, 7);
  for (int i = 0; i < 1000; ++i) transports_[1]->progress();
  EXPECT_EQ(handlers_[1].got.size(), 4u) << "the keepalive that asked was handed up";
}

TEST_P(OfiDelivery, AMessageSentAfterTheConfirmationNeedsAnother) {
  const std::vector<std::byte> small(8, std::byte{1});
  auto confirm = [&] {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < deadline) {
      transports_[0]->progress();
      transports_[1]->progress();
      if (transports_[0]->delivered()) return true;
    }
    return false;
  };
  ASSERT_TRUE(send(5, small).is_ok());
  ASSERT_TRUE(confirm());
  ASSERT_TRUE(send(6, small).is_ok());
  EXPECT_FALSE(transports_[0]->delivered()) << "confirmed before a keepalive asked for it";
  ASSERT_TRUE(confirm());
  endpoints_[0].reset();
  transports_[0].reset();
  for (int i = 0; i < 100000 && handlers_[1].got.size() < 2; ++i) transports_[1]->progress();
  ASSERT_EQ(handlers_[1].got.size(), 2u);
  EXPECT_EQ(handlers_[1].got[1].id, 6);
}

INSTANTIATE_TEST_SUITE_P(Providers, OfiDelivery, ::testing::Values("tcp", "net", "shm"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace ferry::transport::ofi
#endif
