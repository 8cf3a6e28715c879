// The contract every transport keeps with the engine (transport/transport.hpp), checked the same
// way over each: self, shm, and ofi over tcp and over libfabric's shm provider. Two transports
// of one process stand for two ranks (self: one rank talking to itself).
//   - Active messages arrive whole, in order, named by their source; a full transport says
//     kWouldBlock and loses nothing; one larger than max_am is refused, not cut.
//   - Both directions at once.
//   - What an endpoint offers (direct transfers, one-sided reads, zero-copy get) works, and it
//     offers what its transport says.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "transport/self/transport.hpp"
#include "transport/shm/transport.hpp"
#include "util/config.hpp"
#if FERRY_HAVE_OFI
#include "transport/ofi/transport.hpp"
#endif

namespace ferry::transport {
namespace {

struct Arrival {
  std::uint8_t id;
  int source;
  std::vector<std::byte> data;
};

class Recorder final : public AmHandler {
 public:
  void on_am(std::uint8_t id, int source, std::span<const std::byte> data) override {
    arrivals.push_back({id, source, {data.begin(), data.end()}});
  }
  void on_direct(std::uint64_t cookie, Status status) override {
    directs.emplace(cookie, std::move(status));
  }
  std::vector<Arrival> arrivals;
  std::map<std::uint64_t, Status> directs;
};

// Two ranks' ends of one transport kind. For self, rank 0 is both.
class TransportContract : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    const std::string kind = GetParam();
    try {
      if (kind == "self") {
        open_self();
      } else if (kind == "shm") {
        open_shm();
      } else {
        open_ofi(kind == "ofi_tcp" ? "tcp" : "shm");
      }
    } catch (const Error& e) {
      GTEST_SKIP() << "no " << kind << " transport here: " << e.what();
    }
    if (endpoints_[0] == nullptr) GTEST_SKIP() << kind << " is not built in";
  }

  void open_self() {
    transports_.push_back(std::make_unique<self::SelfTransport>(0, &handlers_[0]));
    endpoints_[0] = transports_[0]->connect({0, true, 0, {}});
    endpoints_[1] = transports_[0]->connect({0, true, 0, {}});
    ranks_ = {0, 0};
  }
  void open_shm() {
    // A small FIFO and two bounce buffers, so that a burst finds the transport full.
    const util::Config config = util::Config::load({{"FERRY_SHM_FIFO_SIZE", "16"},
                                                    {"FERRY_SHM_RELEASE_BATCH", "2"},
                                                    {"FERRY_SHM_BOUNCE_COUNT", "2"}});
    const std::string job = "contract" + std::to_string(::getpid());
    for (int rank = 0; rank < 2; ++rank) {
      transports_.push_back(
          std::make_unique<shm::ShmTransport>(config, job, rank, rank, std::vector<int>{0, 1},
                                              &handlers_[static_cast<std::size_t>(rank)]));
    }
    connect_pair(true);
    for (auto& t : transports_) t->on_all_connected();
  }
  void open_ofi([[maybe_unused]] const std::string& provider) {
#if FERRY_HAVE_OFI
    const util::Config config =
        util::Config::load({{"FERRY_OFI_PROVIDER", provider}, {"FERRY_KEEPALIVE", "0"}});
    for (int rank = 0; rank < 2; ++rank) {
      transports_.push_back(std::make_unique<ofi::OfiTransport>(
          config, rank, 2, &handlers_[static_cast<std::size_t>(rank)]));
    }
    connect_pair(false);
#endif
  }
  void connect_pair(bool same_node) {
    const std::vector<std::byte> addresses[2] = {transports_[0]->address(),
                                                 transports_[1]->address()};
    for (int rank = 0; rank < 2; ++rank) {
      const int peer = 1 - rank;
      endpoints_[static_cast<std::size_t>(rank)] =
          transports_[static_cast<std::size_t>(rank)]->connect(
              {peer, same_node, peer, addresses[static_cast<std::size_t>(peer)]});
    }
    ranks_ = {0, 1};
  }

  // The handler of the rank that endpoint `from`'s messages reach.
  Recorder& receiver(int from) { return handlers_[static_cast<std::size_t>(ranks_[1 - from])]; }
  void progress() {
    for (auto& t : transports_) t->progress();
  }
  // Progresses until `done` holds (false after 20 s).
  template <typename Done>
  bool progress_until(Done done) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done()) {
      if (std::chrono::steady_clock::now() > deadline) return false;
      progress();
    }
    return true;
  }
  // Sends message `seq` of `size` payload bytes from endpoint `from`, retrying while the
  // transport is full; the number of kWouldBlock answers met.
  int send(int from, std::uint64_t seq, std::size_t size) {
    std::vector<std::byte> payload(size);
    for (std::size_t i = 0; i < size; ++i) payload[i] = static_cast<std::byte>(seq * 31 + i);
    int blocked = 0;
    for (;;) {
      const Status status = endpoints_[static_cast<std::size_t>(from)]->am_send(
          7, as_header(seq), payload, AmHint::kNone);
      if (status) return blocked;
      EXPECT_EQ(status.code(), Code::kWouldBlock) << status.to_string();
      if (status.code() != Code::kWouldBlock) return blocked;
      ++blocked;
      progress();
    }
  }
  static std::span<const std::byte> as_header(const std::uint64_t& seq) {
    return {reinterpret_cast<const std::byte*>(&seq), sizeof seq};
  }
  // Checks that arrivals [first, first + sizes.size()) are the messages sent, in order.
  void expect_in_order(const Recorder& at, std::size_t first, int source,
                       const std::vector<std::size_t>& sizes) {
    ASSERT_EQ(at.arrivals.size(), first + sizes.size());
    for (std::uint64_t seq = 0; seq < sizes.size(); ++seq) {
      const Arrival& a = at.arrivals[first + seq];
      ASSERT_EQ(a.id, 7);
      EXPECT_EQ(a.source, source);
      ASSERT_EQ(a.data.size(), sizeof(seq) + sizes[seq]) << "message " << seq;
      std::uint64_t got = 0;
      std::memcpy(&got, a.data.data(), sizeof got);
      ASSERT_EQ(got, seq) << "out of order";
      for (std::size_t i = 0; i < sizes[seq]; ++i) {
        ASSERT_EQ(a.data[sizeof(seq) + i], static_cast<std::byte>(seq * 31 + i))
            << "message " << seq << " byte " << i;
      }
    }
  }
  // Payload sizes that cross every boundary the transport names: inline, bounce, its largest.
  std::vector<std::size_t> sizes(std::size_t count) const {
    const Capabilities& caps = transports_[0]->capabilities();
    const std::size_t header = sizeof(std::uint64_t);
    const std::size_t largest = std::min<std::size_t>(caps.max_am, 1 << 20) - header;
    std::vector<std::size_t> edges = {0, 1, 100, 4096, largest};
    if (caps.max_inline > header && caps.max_inline < largest) {
      edges.push_back(caps.max_inline - header);
      edges.push_back(caps.max_inline - header + 1);
    }
    std::vector<std::size_t> out(count);
    for (std::size_t i = 0; i < count; ++i) out[i] = edges[i % edges.size()];
    return out;
  }

  Recorder handlers_[2];
  std::vector<std::unique_ptr<Transport>> transports_;
  std::unique_ptr<Endpoint> endpoints_[2];  // [0]: rank 0's to rank 1; [1]: back
  std::array<int, 2> ranks_{};
};

TEST_P(TransportContract, MessagesArriveWholeInOrderFromTheirSource) {
  const std::vector<std::size_t> plan = sizes(300);
  // The receiver is not progressed until the transport says it is full.
  for (std::uint64_t seq = 0; seq < plan.size(); ++seq) send(0, seq, plan[seq]);
  ASSERT_TRUE(progress_until([&] { return receiver(0).arrivals.size() >= plan.size(); }));
  progress();
  expect_in_order(receiver(0), 0, ranks_[0], plan);
}

TEST_P(TransportContract, AFullTransportSaysWouldBlockAndLosesNothing) {
  if (std::string(GetParam()) == "self") GTEST_SKIP() << "self queues without bound";
  std::vector<std::size_t> plan(2000, 2000);
  int blocked = 0;
  for (std::uint64_t seq = 0; seq < plan.size(); ++seq) {
    // Only the sender progresses (the receiver must drain for room to come back).
    const int before = blocked;
    blocked += send(0, seq, plan[seq]);
    if (blocked > before) progress();
  }
  ASSERT_TRUE(progress_until([&] { return receiver(0).arrivals.size() >= plan.size(); }));
  expect_in_order(receiver(0), 0, ranks_[0], plan);
  // shm's 16-element FIFO fills; ofi's providers may queue the whole burst themselves.
  if (std::string(GetParam()) == "shm") {
    EXPECT_GT(blocked, 0);
  }
}

TEST_P(TransportContract, BothDirectionsAtOnce) {
  const std::vector<std::size_t> plan = sizes(200);
  for (std::uint64_t seq = 0; seq < plan.size(); ++seq) {
    send(0, seq, plan[seq]);
    send(1, seq, plan[seq]);
  }
  if (ranks_[0] == ranks_[1]) {
    // self: one rank, two streams interleaved in the order sent.
    ASSERT_TRUE(progress_until([&] { return handlers_[0].arrivals.size() >= 2 * plan.size(); }));
    for (std::size_t i = 0; i < handlers_[0].arrivals.size(); ++i) {
      std::uint64_t got = 0;
      std::memcpy(&got, handlers_[0].arrivals[i].data.data(), sizeof got);
      EXPECT_EQ(got, i / 2);
    }
    return;
  }
  ASSERT_TRUE(progress_until([&] {
    return handlers_[0].arrivals.size() >= plan.size() &&
           handlers_[1].arrivals.size() >= plan.size();
  }));
  expect_in_order(handlers_[1], 0, 0, plan);
  expect_in_order(handlers_[0], 0, 1, plan);
}

TEST_P(TransportContract, AMessageLargerThanMaxAmIsRefusedNotCut) {
  const Capabilities& caps = transports_[0]->capabilities();
  if (caps.max_am == SIZE_MAX) GTEST_SKIP() << caps.name << " has no largest message";
  std::vector<std::byte> payload(caps.max_am + 1 - sizeof(std::uint64_t));
  const std::uint64_t seq = 0;
  const Status status = endpoints_[0]->am_send(7, as_header(seq), payload, AmHint::kNone);
  EXPECT_EQ(status.code(), Code::kInvalidArgument) << status.to_string();
  EXPECT_NE(status.message().find(std::to_string(caps.max_am + 1)), std::string::npos)
      << "the error should give the size: " << status.to_string();
  for (int i = 0; i < 1000; ++i) progress();
  EXPECT_TRUE(receiver(0).arrivals.empty());
}

TEST_P(TransportContract, DirectTransfersWorkWhereOffered) {
  DirectTransfers* sender = endpoints_[0]->direct();
  DirectTransfers* receiver = endpoints_[1]->direct();
  ASSERT_EQ(sender == nullptr, receiver == nullptr) << "offered one way only";
  if (sender == nullptr) GTEST_SKIP() << GetParam() << " offers no direct transfers";
  std::vector<std::uint32_t> out(1 << 18), in(out.size(), 0);  // 1 MiB
  std::iota(out.begin(), out.end(), 5u);
  const std::size_t bytes = out.size() * sizeof(out[0]);
  ASSERT_TRUE(receiver->recv_direct(in.data(), bytes, -1, 77, 2));
  ASSERT_TRUE(sender->send_direct(out.data(), bytes, -1, 77, 1));
  ASSERT_TRUE(progress_until(
      [&] { return handlers_[0].directs.count(1) > 0 && handlers_[1].directs.count(2) > 0; }));
  EXPECT_TRUE(handlers_[0].directs[1]) << handlers_[0].directs[1].to_string();
  EXPECT_TRUE(handlers_[1].directs[2]) << handlers_[1].directs[2].to_string();
  EXPECT_EQ(in, out);
}

TEST_P(TransportContract, OneSidedReadsWorkWhereOffered) {
  OneSidedReads* owner = endpoints_[0]->reads();
  OneSidedReads* reader = endpoints_[1]->reads();
  ASSERT_EQ(owner == nullptr, reader == nullptr) << "offered one way only";
  if (owner == nullptr) GTEST_SKIP() << GetParam() << " offers no one-sided reads";
  std::vector<std::uint32_t> out(1 << 18), in(out.size(), 0);
  std::iota(out.begin(), out.end(), 9u);
  const std::size_t bytes = out.size() * sizeof(out[0]);
  RemoteRegion region;
  ASSERT_TRUE(owner->expose(out.data(), bytes, 1, &region));
  ASSERT_TRUE(reader->read_direct(in.data(), bytes, region, 2));
  const int rank = ranks_[1];
  ASSERT_TRUE(progress_until([&] { return handlers_[rank].directs.count(2) > 0; }));
  EXPECT_TRUE(handlers_[rank].directs[2]) << handlers_[rank].directs[2].to_string();
  owner->unexpose(1, false);
  EXPECT_EQ(in, out);
}

TEST_P(TransportContract, ZeroCopyGetWorksWhereOffered) {
  ZeroCopyGet* getter = endpoints_[1]->zero_copy_get();
  if (getter == nullptr) GTEST_SKIP() << GetParam() << " offers no zero-copy get here";
  std::vector<std::uint32_t> out(1 << 16), in(out.size(), 0);
  std::iota(out.begin(), out.end(), 3u);
  const std::size_t bytes = out.size() * sizeof(out[0]);
  const Status status = getter->get(in.data(), reinterpret_cast<std::uint64_t>(out.data()), bytes);
  ASSERT_TRUE(status) << status.to_string();
  EXPECT_EQ(in, out);
}

TEST_P(TransportContract, SplitCopiesGiveTheTailToOneSideOnly) {
  // Rank 1 receives (its claim words), rank 0 sends (claims in rank 1's words, writes).
  SplitCopies* receiver = endpoints_[1]->split_copies();
  SplitCopies* sender = endpoints_[0]->split_copies();
  if (receiver == nullptr) GTEST_SKIP() << GetParam() << " offers no split copies here";
  ASSERT_NE(sender, nullptr);
  // The sender claims first: the receiver's claim fails, and the sender's write lands.
  SplitCopies::Claim first;
  ASSERT_TRUE(receiver->open_claim(&first));
  EXPECT_TRUE(sender->claim_peer_tail(first));
  EXPECT_FALSE(sender->claim_peer_tail(first)) << "claimed twice";
  EXPECT_FALSE(receiver->claim_tail(first));
  std::vector<std::uint32_t> out(1 << 14), in(out.size(), 0);
  std::iota(out.begin(), out.end(), 5u);
  const Status put = sender->put(reinterpret_cast<std::uint64_t>(in.data()), out.data(),
                                 out.size() * sizeof(out[0]));
  ASSERT_TRUE(put) << put.to_string();
  EXPECT_EQ(in, out);
  receiver->close_claim(first);
  // The receiver claims first: the sender's claim fails, now and after the word is reused.
  SplitCopies::Claim second;
  ASSERT_TRUE(receiver->open_claim(&second));
  EXPECT_TRUE(receiver->claim_tail(second));
  EXPECT_FALSE(sender->claim_peer_tail(second));
  receiver->close_claim(second);
  SplitCopies::Claim third;
  ASSERT_TRUE(receiver->open_claim(&third));
  EXPECT_NE(third.ticket, second.ticket);
  EXPECT_FALSE(sender->claim_peer_tail(second)) << "a stale ticket claimed a reused word";
  EXPECT_FALSE(sender->claim_peer_tail({third.slot + 1000, third.ticket})) << "no such word";
  EXPECT_TRUE(sender->claim_peer_tail(third));
  receiver->close_claim(third);
  // Every word in use: the next message is copied by the receiver alone.
  std::vector<SplitCopies::Claim> all;
  SplitCopies::Claim claim;
  while (all.size() < 1000 && receiver->open_claim(&claim)) all.push_back(claim);
  EXPECT_EQ(all.size(), 64u);
  for (const SplitCopies::Claim& c : all) receiver->close_claim(c);
  EXPECT_TRUE(receiver->open_claim(&claim));
  receiver->close_claim(claim);
}

TEST_P(TransportContract, EachTransportOffersWhatItSays) {
  const std::string kind = GetParam();
  // self copies within the process; shm by CMA where its probe passed; ofi moves data by tagged
  // transfers always, by reads where the provider grants FI_RMA, and writes only where the
  // provider checks keys (not libfabric's shm provider).
  EXPECT_EQ(endpoints_[0]->zero_copy_get() != nullptr, kind == "self" || kind == "shm")
      << "(shm: unless CMA is refused on this machine)";
  EXPECT_EQ(endpoints_[0]->split_copies() != nullptr, kind == "shm")
      << "(shm: unless CMA is refused on this machine)";
  EXPECT_EQ(endpoints_[0]->direct() != nullptr, kind.starts_with("ofi"));
  if (kind.starts_with("ofi")) {
    EXPECT_NE(endpoints_[0]->reads(), nullptr) << "tcp and shm grant FI_RMA here";
  } else {
    EXPECT_EQ(endpoints_[0]->reads(), nullptr);
  }
  EXPECT_EQ(endpoints_[0]->writes() != nullptr, kind == "ofi_tcp");
}

TEST_P(TransportContract, EachEndpointSaysWhatItIs) {
  const std::string name = transports_[0]->capabilities().name;
  EXPECT_FALSE(name.empty());
  EXPECT_EQ(endpoints_[0]->describe().rfind(name, 0), 0u) << endpoints_[0]->describe();
  EXPECT_GT(transports_[0]->capabilities().max_am, sizeof(std::uint64_t));
}

INSTANTIATE_TEST_SUITE_P(Transports, TransportContract,
                         ::testing::Values("self", "shm", "ofi_tcp", "ofi_shm"),
                         [](const ::testing::TestParamInfo<const char*>& info) {
                           return std::string(info.param);
                         });

}  // namespace
}  // namespace ferry::transport
