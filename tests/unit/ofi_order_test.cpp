// One peer's message order over ofi (src/transport/ofi/order.hpp): held messages released in
// order, copies kept until the first acknowledgement and sent again on request, and a gap the
// sender cannot fill taken for a loss once its keepalives arrive behind it.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "transport/ofi/order.hpp"

namespace ferry::transport::ofi {
namespace {

using Clock = PeerOrder::Clock;

// A message from `from`'s side of the link, as the transport builds it (stamp, then sent).
std::vector<std::byte> send(PeerOrder& from, std::uint8_t id = 1) {
  Wire wire{id, 0, kWireMagic, 0, 0, 0, 0, 0};
  from.stamp(&wire);
  std::vector<std::byte> bytes(sizeof wire);
  std::memcpy(bytes.data(), &wire, sizeof wire);
  from.sent(bytes);
  return bytes;
}

Wire header(const std::vector<std::byte>& bytes) {
  Wire wire{};
  std::memcpy(&wire, bytes.data(), sizeof wire);
  return wire;
}

// Offers `bytes` to `to`; returns the sequence numbers delivered, in order.
std::vector<std::uint32_t> arrive(PeerOrder& to, const std::vector<std::byte>& bytes) {
  std::vector<std::uint32_t> delivered;
  if (to.arrive(header(bytes), bytes, Clock::now()) != PeerOrder::Arrival::kNext) return delivered;
  delivered.push_back(header(bytes).seq);
  to.delivered();
  for (auto next = to.take_ready(); !next.empty(); next = to.take_ready()) {
    delivered.push_back(header(next).seq);
    to.delivered();
  }
  return delivered;
}

TEST(OfiOrder, MessagesThatOvertakeAreHeldAndReleasedInOrder) {
  PeerOrder a, b;
  auto m0 = send(a), m1 = send(a), m2 = send(a);
  EXPECT_TRUE(arrive(b, m2).empty());
  EXPECT_TRUE(arrive(b, m1).empty());
  EXPECT_EQ(b.held(), 2u);
  EXPECT_EQ(arrive(b, m0), (std::vector<std::uint32_t>{0, 1, 2}));
  EXPECT_EQ(b.held(), 0u);
  EXPECT_EQ(b.expected(), 3u);
  // A copy of one delivered already is dropped.
  EXPECT_EQ(b.arrive(header(m1), m1, Clock::now()), PeerOrder::Arrival::kDuplicate);
}

TEST(OfiOrder, CopiesAreKeptUntilTheFirstAcknowledgementThenNoMore) {
  PeerOrder a, b;
  auto m0 = send(a), m1 = send(a);
  EXPECT_TRUE(a.keeping());
  EXPECT_EQ(a.kept(), 2u);
  EXPECT_TRUE(header(m0).flags & kWireKeeping);
  arrive(b, m0);
  EXPECT_TRUE(b.ack_due()) << "a keeping sender is acknowledged at once";
  b.ack_sent();
  // b's next message carries ack 1: a drops its copy of message 0, keeps 1, stops keeping.
  arrive(a, send(b));
  EXPECT_FALSE(a.keeping());
  EXPECT_EQ(a.kept(), 1u);
  auto m2 = send(a);
  EXPECT_FALSE(header(m2).flags & kWireKeeping);
  EXPECT_EQ(a.kept(), 1u) << "nothing is kept once the link carried a message";
  arrive(b, m1);
  arrive(a, send(b));
  EXPECT_EQ(a.kept(), 0u);
}

TEST(OfiOrder, AMessageLostWhileKeptIsAskedForAndSentAgain) {
  PeerOrder a, b;
  send(a);  // message 0: lost
  auto m1 = send(a), m2 = send(a);
  const auto now = Clock::now();
  EXPECT_TRUE(arrive(b, m1).empty());
  EXPECT_TRUE(b.resend_due(now, std::chrono::milliseconds(20))) << "a new gap is asked at once";
  EXPECT_FALSE(b.resend_due(now, std::chrono::milliseconds(20))) << "then once an interval";
  auto copies = a.resend_from(b.expected());
  ASSERT_EQ(copies.size(), 3u) << "every kept message from the gap on";
  std::vector<std::byte> again(copies[0].begin(), copies[0].end());
  EXPECT_EQ(header(again).seq, 0u);
  EXPECT_EQ(arrive(b, again), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(arrive(b, m2), (std::vector<std::uint32_t>{2}));
  EXPECT_FALSE(b.lost());
}

TEST(OfiOrder, AGapTheSenderCannotFillIsALossOnceItsKeepalivesPass) {
  PeerOrder a, b;
  arrive(b, send(a));
  arrive(a, send(b));  // acknowledged: a keeps nothing from here
  ASSERT_FALSE(a.keeping());
  send(a);  // lost
  EXPECT_TRUE(arrive(b, send(a)).empty());
  EXPECT_FALSE(b.resend_due(Clock::now(), {})) << "a sender that keeps nothing is not asked";
  for (int i = 0; i < PeerOrder::kLostAfterKeepalives; ++i) {
    EXPECT_FALSE(b.lost());
    arrive(b, send(a, kWireKeepaliveId));
  }
  EXPECT_TRUE(b.lost());
}

TEST(OfiOrder, AnAcknowledgementBeyondWhatWasSentIsIgnored) {
  PeerOrder a;
  send(a);
  Wire forged{1, 0, kWireMagic, 1, 0, 0, 1000, 0};
  std::vector<std::byte> bytes(sizeof forged);
  std::memcpy(bytes.data(), &forged, sizeof forged);
  (void)a.arrive(forged, bytes, Clock::now());
  EXPECT_TRUE(a.keeping());
  EXPECT_EQ(a.kept(), 1u);
}

TEST(OfiOrder, ASenderKeepingItsLimitWaitsForAnAcknowledgement) {
  PeerOrder a;
  for (std::size_t i = 0; i < PeerOrder::kKeepLimit; ++i) send(a);
  EXPECT_FALSE(a.can_send());
}

}  // namespace
}  // namespace ferry::transport::ofi
