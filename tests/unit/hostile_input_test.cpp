// Messages a broken or malicious peer could send: each is dropped with a logged protocol error,
// nothing is written out of bounds, and traffic that follows still works.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <vector>

#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "proto/wire.hpp"
#include "transport/shm/transport.hpp"
#include "util/config.hpp"

namespace ferry {
namespace {

template <typename H>
std::vector<std::byte> message(const H& header, std::size_t extra = 0) {
  std::vector<std::byte> v(sizeof(H) + extra, std::byte{0x5a});
  std::memcpy(v.data(), &header, sizeof(H));
  return v;
}

TEST(HostileInput, ProtocolEngineDropsMalformedAndForgedMessages) {
  std::unique_ptr<proto::Engine> engine = proto::Engine::create({});
  std::vector<std::byte> buffer(64, std::byte{0});
  // The engine's first request: index 0, generation 1 on the wire.
  Request posted = engine->messages().irecv(buffer.data(), buffer.size(), 0, 42, kFullMask);
  const std::uint64_t posted_id = (std::uint64_t{1} << 32) | 0;

  std::byte junk[3] = {};
  engine->on_am(99, 0, junk);                                                // unknown id
  engine->on_am(proto::kAmEager, 0, junk);                                   // short eager header
  engine->on_am(proto::kAmRts, 0, junk);                                     // short RTS
  engine->on_am(proto::kAmCts, 0, message(proto::CtsHeader{12345, 1, 10}));  // no such send
  engine->on_am(proto::kAmFin, 0, message(proto::FinHeader{posted_id, 0, 0}));  // not a send
  // A fragment aimed at a receive that is posted but not receiving fragments, and one far past it.
  engine->on_am(proto::kAmFrag, 0, message(proto::FragHeader{posted_id, 0}, 64));
  engine->on_am(proto::kAmFrag, 0, message(proto::FragHeader{posted_id, 1u << 30}, 64));
  engine->on_am(proto::kAmCts, 0, message(proto::CtsHeader{~0ull, ~0ull, ~0ull}));
  // Answers to one-sided operations, several in one message: short, none, more than allowed, a
  // count the length does not match, and well-formed ones aimed at the posted receive (which is
  // no one-sided operation) and at no request.
  const proto::RmaAckHeader ack{posted_id, 8, 0, 0};
  std::vector<std::byte> acks = message(proto::RmaAcksHeader{2, 0}, 2 * sizeof(ack));
  std::memcpy(acks.data() + sizeof(proto::RmaAcksHeader), &ack, sizeof(ack));
  std::memcpy(acks.data() + sizeof(proto::RmaAcksHeader) + sizeof(ack), &ack, sizeof(ack));
  engine->on_am(proto::kAmRmaAcks, 0, junk);
  engine->on_am(proto::kAmRmaAcks, 0, message(proto::RmaAcksHeader{0, 0}));
  engine->on_am(proto::kAmRmaAcks, 0,
                message(proto::RmaAcksHeader{proto::kMaxAcksPerMessage + 1, 0},
                        (proto::kMaxAcksPerMessage + 1) * sizeof(ack)));
  engine->on_am(proto::kAmRmaAcks, 0, message(proto::RmaAcksHeader{3, 0}, 2 * sizeof(ack)));
  engine->on_am(proto::kAmRmaAcks, 0, acks);
  engine->on_am(proto::kAmRmaAcks, 0,
                message(proto::RmaAcksHeader{1, 0}, sizeof(ack)));  // id 0x5a5a...: no request
  // A split's offer for no send and for the posted receive, and "tail written" for a receive
  // that offered none, for no receive, and short (this engine's only peer, itself, has no
  // split copies).
  engine->on_am(proto::kAmCtsSplit, 0,
                message(proto::CtsSplitHeader{12345, posted_id, 0x1000, 8, 64, 1, 0, 0}));
  engine->on_am(proto::kAmCtsSplit, 0,
                message(proto::CtsSplitHeader{posted_id, posted_id, 0x1000, 8, 64, 1, 99, 0}));
  engine->on_am(proto::kAmCtsSplit, 0, junk);
  engine->on_am(proto::kAmTailWritten, 0, message(proto::TailWrittenHeader{posted_id, 0, 0}));
  engine->on_am(proto::kAmTailWritten, 0, message(proto::TailWrittenHeader{~0ull, 0, 0}));
  engine->on_am(proto::kAmTailWritten, 0, junk);
  // "Finalized", short and from this rank itself: the receive from it stays posted.
  engine->on_am(proto::kAmBye, 0, junk);
  engine->on_am(proto::kAmBye, 0, message(proto::ByeHeader{0}));
  for (std::byte b : buffer) ASSERT_EQ(b, std::byte{0}) << "a forged fragment was written";
  EXPECT_FALSE(posted.test());

  // Real traffic still flows.
  int value = 7;
  ASSERT_TRUE(engine->messages().isend(&value, sizeof(value), 0, 42).wait().is_ok());
  ASSERT_TRUE(posted.wait().is_ok());
  EXPECT_EQ(posted.info().bytes, sizeof(value));
}

TEST(HostileInput, NativeAccessGrantsAreGivenOnlyForRealKeys) {
  // The messages that grant and revoke native one-sided access, forged: short ones, grants and
  // answers nobody asked for, asks with a wrong secret or for a region that does not exist. None
  // is acted on, and the region and deregistration still work.
  std::unique_ptr<proto::Engine> engine = proto::Engine::create({});
  std::vector<std::byte> memory(64, std::byte{0x11});
  std::uint64_t id = 0;
  std::uint64_t secret = 0;
  proto::RegionAccess access;
  ASSERT_TRUE(engine->rma().register_memory(memory.data(), memory.size(), &id, &secret, &access));
  std::byte junk[3] = {};
  for (std::uint8_t am : {proto::kAmNativeAsk, proto::kAmNativeGrant, proto::kAmNativeRevoke,
                          proto::kAmNativeRevoked}) {
    engine->on_am(am, 0, junk);  // short
  }
  engine->on_am(proto::kAmNativeGrant, 0,
                message(proto::NativeGrantHeader{id, secret, 0x1000, 7, 1u << 30, 0, 0}));
  engine->on_am(proto::kAmNativeRevoked, 0, message(proto::NativeRevokeHeader{id}));
  engine->on_am(proto::kAmNativeRevoke, 0, message(proto::NativeRevokeHeader{id + 100}));
  // Asks: wrong secret, no such region, and the real key of a region no transport registered
  // (this engine has no network transport); each answer is a refusal, to this same process.
  engine->on_am(proto::kAmNativeAsk, 0, message(proto::NativeAskHeader{id, secret ^ 1}));
  engine->on_am(proto::kAmNativeAsk, 0, message(proto::NativeAskHeader{id + 100, secret}));
  engine->on_am(proto::kAmNativeAsk, 0, message(proto::NativeAskHeader{id, secret}));
  for (int i = 0; i < 100; ++i) engine->progress();
  for (std::byte b : memory) ASSERT_EQ(b, std::byte{0x11});
  EXPECT_EQ(engine->describe_peer(0).find("native access granted"), std::string::npos);
  // The region is still reached through its key, and deregisters at once (nobody was granted).
  proto::RmaTarget target;
  target.rank = 0;
  target.region = id;
  target.secret = secret;
  target.size = memory.size();
  std::vector<std::byte> data(8, std::byte{0x22});
  ASSERT_TRUE(engine->rma().iput(data.data(), data.size(), target).wait().is_ok());
  EXPECT_EQ(memory[7], std::byte{0x22});
  EXPECT_TRUE(engine->rma().deregister(id).is_ok());
}

TEST(HostileInput, DeviceProtocolMessagesAreValidatedBeforeUse) {
  // The staging protocol (device buffers) on a single-process engine: forged rings, slots and
  // keys are dropped; nothing is mapped, written or completed on their word.
  Options options;
  options.config["FERRY_TEST_HOST_STAGING"] = "1";
  std::unique_ptr<proto::Engine> engine = proto::Engine::create(options);
  std::vector<std::byte> buffer(64, std::byte{0});
  Request posted = engine->messages().irecv(buffer.data(), buffer.size(), 0, 43, kFullMask);
  const std::uint64_t posted_id = (std::uint64_t{1} << 32) | 0;
  std::byte junk[3] = {};
  engine->on_am(proto::kAmRtsDev, 0, junk);  // short header
  // A key of the wrong size behind the header.
  engine->on_am(proto::kAmRtsDev, 0,
                message(proto::RtsDevHeader{44, 8, 1, proto::kRtsHasKey, 0}, 17));
  engine->on_am(proto::kAmStageCts, 0, message(proto::StageCtsHeader{12345, 1, 10, 0, 0}));
  // Fragments for a receive that is posted but not staged, and far outside any ring.
  engine->on_am(proto::kAmStageFrag, 0, message(proto::StageFragHeader{posted_id, 0, 0, 64}));
  engine->on_am(proto::kAmStageFrag, 0,
                message(proto::StageFragHeader{posted_id, 1u << 30, ~0ull, ~0ull}));
  // Slots returned that were never lent.
  engine->on_am(proto::kAmStageAck, 0, message(proto::StageAckHeader{0}));
  engine->on_am(proto::kAmStageAck, 0, message(proto::StageAckHeader{~0ull}));
  // "Written into your buffer" for a receive that offered none, for no receive, and short; a
  // clear-to-send offering a key of the wrong size.
  engine->on_am(proto::kAmStageWritten, 0, message(proto::StageWrittenHeader{posted_id, 64}));
  engine->on_am(proto::kAmStageWritten, 0, message(proto::StageWrittenHeader{~0ull, 1}));
  engine->on_am(proto::kAmStageWritten, 0, junk);
  engine->on_am(proto::kAmStageCts, 0,
                message(proto::StageCtsHeader{12345, 1, 10, proto::kStageHasKey, 0}, 7));
  for (std::byte b : buffer) ASSERT_EQ(b, std::byte{0}) << "a forged fragment was written";
  EXPECT_FALSE(posted.test());

  // A real message through the staging ring (FERRY_TEST_HOST_STAGING) still arrives whole.
  std::vector<std::byte> big(1 << 20), got(1 << 20);
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<std::byte>(i * 13);
  Request r = engine->messages().irecv(got.data(), got.size(), 0, 45, kFullMask);
  ASSERT_TRUE(engine->messages().isend(big.data(), big.size(), 0, 45).wait().is_ok());
  ASSERT_TRUE(r.wait().is_ok()) << r.status().to_string();
  EXPECT_EQ(got, big);
  EXPECT_TRUE(engine->messages().cancel(0) || posted.test());
}

class Collector : public transport::AmHandler {
 public:
  void on_am(std::uint8_t id, int source, std::span<const std::byte> data) override {
    ids.push_back(id);
    sources.push_back(source);
    sizes.push_back(data.size());
  }
  std::vector<int> ids, sources;
  std::vector<std::size_t> sizes;
};

// Two shm transports in one process, connected both ways: a 16-element FIFO, 2 bounce buffers.
class ShmPair : public ::testing::Test {
 protected:
  ShmPair()
      : config_(util::Config::load({{"FERRY_SHM_FIFO_SIZE", "16"},
                                    {"FERRY_SHM_RELEASE_BATCH", "2"},
                                    {"FERRY_SHM_BOUNCE_COUNT", "2"}})),
        job_("unittest" + std::to_string(::getpid())),
        t0(config_, job_, 0, 0, {0, 1}, &at0),
        t1(config_, job_, 1, 1, {0, 1}, &at1) {
    auto a0 = t0.address(), a1 = t1.address();
    e01 = t0.connect({1, true, 1, a1});
    e10 = t1.connect({0, true, 0, a0});
    t0.on_all_connected();
    t1.on_all_connected();
  }
  util::Config config_;
  std::string job_;
  Collector at0, at1;
  transport::shm::ShmTransport t0, t1;
  std::unique_ptr<transport::Endpoint> e01, e10;
};

TEST_F(ShmPair, DropsFifoElementsThatFailValidation) {
  // Forge elements straight into rank 1's FIFO, as a hostile rank 0 could.
  const auto& seg = t1.own();
  transport::shm::FifoProducer forger(&seg.header()->fifo, seg.fifo(), seg.layout().fifo_size);
  auto forge = [&](std::uint8_t flags, std::uint16_t source, std::uint32_t length,
                   std::uint32_t bounce) {
    transport::shm::FifoClaim claim = forger.claim();
    ASSERT_NE(claim.elem, nullptr);
    claim.elem->am_id = 1;
    claim.elem->flags = flags;
    claim.elem->source = source;
    claim.elem->length = length;
    claim.elem->bounce = bounce;
    forger.publish(claim);
  };
  forge(transport::shm::kElemInline, 0, 100000, 0);    // inline longer than an element
  forge(transport::shm::kElemBounce, 0, 16, 7);        // bounce slot past the pool
  forge(transport::shm::kElemBounce, 0, 1u << 30, 0);  // bounce length past the buffer
  forge(transport::shm::kElemInline, 9, 8, 0);         // unknown sender
  forge(transport::shm::kElemInline, 1, 8, 0);         // "from" the receiver itself
  forge(0x7f, 0, 8, 0);                                // unknown flags
  EXPECT_EQ(t1.progress(), 6) << "malformed elements are consumed, not left to block the FIFO";
  EXPECT_TRUE(at1.ids.empty()) << "none of them reached the protocol layer";

  // A real message still arrives, inline and through a bounce buffer.
  std::vector<std::byte> payload(5000, std::byte{1});
  std::byte header[8] = {};
  ASSERT_TRUE(e01->am_send(1, header, {}, transport::AmHint::kNone).is_ok());
  ASSERT_TRUE(e01->am_send(1, header, payload, transport::AmHint::kNone).is_ok());
  EXPECT_EQ(t1.progress(), 2);
  ASSERT_EQ(at1.sizes.size(), 2u);
  EXPECT_EQ(at1.sources[0], 0);
  EXPECT_EQ(at1.sizes[1], 5008u);
}

TEST_F(ShmPair, BackPressureRefusesInsteadOfOverwriting) {
  std::byte header[8] = {};
  std::vector<std::byte> big(2000);
  // Two bounce buffers: the third large message must wait until the receiver frees one.
  ASSERT_TRUE(e01->am_send(1, header, big, transport::AmHint::kNone).is_ok());
  ASSERT_TRUE(e01->am_send(1, header, big, transport::AmHint::kNone).is_ok());
  EXPECT_EQ(e01->am_send(1, header, big, transport::AmHint::kNone).code(), Code::kWouldBlock);
  EXPECT_EQ(t1.progress(), 2);
  EXPECT_TRUE(e01->am_send(1, header, big, transport::AmHint::kNone).is_ok());
  // Sixteen elements: the FIFO fills, then refuses.
  int sent = 0;
  while (e01->am_send(1, header, {}, transport::AmHint::kNone).is_ok()) ++sent;
  EXPECT_EQ(sent, 15);
  EXPECT_EQ(t1.progress(), 16);
  EXPECT_EQ(at1.ids.size(), 18u);
}

}  // namespace
}  // namespace ferry
