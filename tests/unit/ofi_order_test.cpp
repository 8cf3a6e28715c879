// One peer's message order over ofi (src/transport/ofi/order.hpp): held messages released in
// order, copies kept until acknowledged and sent again on request, and a gap they do not fill
// taken for a loss once the sender's keepalives arrive behind it.
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

TEST(OfiOrder, CopiesAreKeptUntilAcknowledged) {
  PeerOrder a, b;
  auto m0 = send(a), m1 = send(a);
  EXPECT_EQ(a.kept(), 2u);
  EXPECT_TRUE(header(m0).flags & kWireAckMe) << "asked for until the link carried a message";
  arrive(b, m0);
  EXPECT_TRUE(b.ack_due());
  b.ack_sent();
  // b's next message carries ack 1: a drops its copy of message 0 and keeps 1.
  arrive(a, send(b));
  EXPECT_TRUE(a.acknowledged());
  EXPECT_EQ(a.kept(), 1u);
  auto m2 = send(a);
  EXPECT_FALSE(header(m2).flags & kWireAckMe) << "then only from a quarter of the limit";
  EXPECT_EQ(a.kept(), 2u);
  arrive(b, m1);
  arrive(b, m2);
  arrive(a, send(b));
  EXPECT_EQ(a.kept(), 0u);
}

TEST(OfiOrder, AnAcknowledgementIsAskedForBeforeTheLimitStopsTheSender) {
  PeerOrder a, b;
  arrive(b, send(a));
  arrive(a, send(b));
  ASSERT_EQ(a.kept(), 0u);
  std::size_t asked_at = 0;
  for (std::size_t i = 1; i <= PeerOrder::kKeepLimit; ++i) {
    ASSERT_TRUE(a.can_send(sizeof(Wire)));
    if ((header(send(a)).flags & kWireAckMe) != 0 && asked_at == 0) asked_at = i;
  }
  EXPECT_EQ(asked_at, PeerOrder::kKeepLimit / 4) << "by the message that makes a quarter";
  EXPECT_FALSE(a.can_send(sizeof(Wire))) << "at the limit it waits";
  EXPECT_FALSE(PeerOrder().can_send(PeerOrder::kKeepBytes + 1)) << "a byte limit too";
}

TEST(OfiOrder, AMessageLostWhileKeptIsAskedForAndSentAgain) {
  PeerOrder a, b;
  send(a);  // message 0: lost
  auto m1 = send(a), m2 = send(a);
  EXPECT_TRUE(arrive(b, m1).empty());
  const auto now = Clock::now();  // the gap opened just before
  EXPECT_FALSE(b.resend_due(now)) << "a gap is not asked at once (it may be an overtaking)";
  EXPECT_TRUE(b.resend_due(now + PeerOrder::kAskAfter)) << "but once it is kAskAfter old";
  // (not asked again within kAskEvery; then again)
  EXPECT_FALSE(b.resend_due(now + PeerOrder::kAskAfter + std::chrono::milliseconds(1)))
      << "then once every kAskEvery";
  EXPECT_TRUE(b.resend_due(now + PeerOrder::kAskAfter + PeerOrder::kAskEvery));
  ASSERT_EQ(b.first_held(), 1u);
  auto copies = a.resend(b.expected(), b.first_held());
  ASSERT_EQ(copies.size(), 1u) << "the messages of the gap, not those held";
  std::vector<std::byte> again(copies[0].begin(), copies[0].end());
  EXPECT_EQ(header(again).seq, 0u);
  EXPECT_EQ(arrive(b, again), (std::vector<std::uint32_t>{0, 1}));
  EXPECT_EQ(arrive(b, m2), (std::vector<std::uint32_t>{2}));
  EXPECT_FALSE(b.lost());
}

TEST(OfiOrder, AGapCopiesDoNotFillIsALossOnceTheSendersKeepalivesPass) {
  PeerOrder a, b;
  arrive(b, send(a));
  arrive(a, send(b));
  send(a);  // lost, and so are the copies sent again
  EXPECT_TRUE(arrive(b, send(a)).empty());
  for (int i = 0; i < 10; ++i) arrive(b, send(a, kWireAckId));
  EXPECT_FALSE(b.lost()) << "acknowledgements are no sign of time passing";
  for (int i = 0; i < PeerOrder::kLostAfterKeepalives; ++i) {
    EXPECT_FALSE(b.lost());
    arrive(b, send(a, kWireKeepaliveId));
  }
  EXPECT_TRUE(b.lost());
}

TEST(OfiOrder, AMessageFurtherAheadThanAnySenderRunsIsRefusedNotHeld) {
  PeerOrder b;
  Wire forged{1, 0, kWireMagic, 1, 0, 1u << 30, 0, 0};
  std::vector<std::byte> bytes(sizeof forged);
  std::memcpy(bytes.data(), &forged, sizeof forged);
  EXPECT_EQ(b.arrive(forged, bytes, Clock::now()), PeerOrder::Arrival::kRefused);
  EXPECT_EQ(b.held(), 0u) << "a peer cannot make this rank hold without bound";
  forged.seq = PeerOrder::kKeepLimit;
  EXPECT_EQ(b.arrive(forged, bytes, Clock::now()), PeerOrder::Arrival::kHeld);
}

TEST(OfiOrder, AnAcknowledgementBeyondWhatWasSentIsIgnored) {
  PeerOrder a;
  send(a);
  Wire forged{1, 0, kWireMagic, 1, 0, 0, 1000, 0};
  std::vector<std::byte> bytes(sizeof forged);
  std::memcpy(bytes.data(), &forged, sizeof forged);
  (void)a.arrive(forged, bytes, Clock::now());
  EXPECT_FALSE(a.acknowledged());
  EXPECT_EQ(a.kept(), 1u);
}

}  // namespace
}  // namespace ferry::transport::ofi
