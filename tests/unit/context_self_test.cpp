// A job of one process: the API's semantics over the self transport (eager and rendezvous).
#include <gtest/gtest.h>

#include <chrono>
#include <numeric>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry {
namespace {

Context& ctx() {
  static Context context = Context::init();
  return context;
}

std::vector<int> iota(std::size_t n, int start) {
  std::vector<int> v(n);
  std::iota(v.begin(), v.end(), start);
  return v;
}

TEST(ContextSelf, SingleProcessJob) {
  EXPECT_EQ(ctx().rank(), 0);
  EXPECT_EQ(ctx().size(), 1);
  EXPECT_EQ(ctx().local_size(), 1);
  EXPECT_NE(ctx().describe_peer(0).find("self"), std::string::npos);
}

TEST(ContextSelf, SmallAndLargeMessagesArriveIntact) {
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{100}, std::size_t{5000},
                        std::size_t{1} << 20}) {
    auto out = iota(n, 3);
    std::vector<int> in(n + 1, -1);
    Request r = ctx().irecv(in.data(), in.size() * sizeof(int), 0, 11);
    ASSERT_TRUE(ctx().send(out.data(), n * sizeof(int), 0, 11).is_ok());
    ASSERT_TRUE(r.wait().is_ok());
    EXPECT_EQ(r.info().bytes, n * sizeof(int));
    EXPECT_EQ(r.info().source, 0);
    EXPECT_EQ(r.info().tag, 11u);
    EXPECT_TRUE(std::equal(out.begin(), out.end(), in.begin()));
    EXPECT_EQ(in[n], -1) << "nothing written past the message";
  }
}

TEST(ContextSelf, UnexpectedMessagesKeepTheirOrder) {
  // A rendezvous-sized message between two eager ones, all with the same tag, sent first.
  std::vector<char> big(1 << 20, 'b');
  std::vector<Request> sends;
  sends.push_back(ctx().isend("first", 6, 0, 5));
  sends.push_back(ctx().isend(big.data(), big.size(), 0, 5));
  sends.push_back(ctx().isend("third", 6, 0, 5));
  std::vector<char> in(big.size());
  MessageInfo info;
  ASSERT_TRUE(ctx().recv(in.data(), in.size(), kAnySource, 5, &info).is_ok());
  EXPECT_STREQ(in.data(), "first");
  ASSERT_TRUE(ctx().recv(in.data(), in.size(), 0, 5, &info).is_ok());
  EXPECT_EQ(info.bytes, big.size());
  EXPECT_EQ(in, big);
  ASSERT_TRUE(ctx().recv(in.data(), in.size(), 0, 5, &info).is_ok());
  EXPECT_STREQ(in.data(), "third");
  EXPECT_TRUE(Request::wait_all(sends).is_ok());
}

TEST(ContextSelf, TruncationDeliversTheBytesThatFit) {
  for (std::size_t n : {std::size_t{64}, std::size_t{1} << 20}) {
    auto out = iota(n, 1);
    std::vector<int> in(10, -1);
    Request r = ctx().irecv(in.data(), 8 * sizeof(int), 0, 12);
    Request s = ctx().isend(out.data(), n * sizeof(int), 0, 12);
    Status status = r.wait();
    EXPECT_EQ(status.code(), Code::kTruncated) << status.to_string();
    EXPECT_NE(status.message().find("truncated"), std::string::npos);
    EXPECT_EQ(r.info().bytes, 8 * sizeof(int));
    EXPECT_TRUE(std::equal(in.begin(), in.begin() + 8, out.begin()));
    EXPECT_EQ(in[8], -1);
    EXPECT_TRUE(s.wait().is_ok());
  }
}

TEST(ContextSelf, CancelWorksOnlyBeforeAMatch) {
  int x = 0;
  Request r = ctx().irecv(&x, sizeof(x), 0, 99);
  EXPECT_FALSE(r.test());
  EXPECT_TRUE(r.cancel());
  EXPECT_EQ(r.status().code(), Code::kCanceled);
  int y = 4;
  Request r2 = ctx().irecv(&x, sizeof(x), 0, 98);
  ASSERT_TRUE(ctx().send(&y, sizeof(y), 0, 98).is_ok());
  ASSERT_TRUE(r2.wait().is_ok());
  EXPECT_FALSE(r2.cancel());
  EXPECT_EQ(x, 4);
  Request s = ctx().isend(&y, sizeof(y), 0, 97);
  EXPECT_FALSE(s.cancel()) << "sends cannot be canceled";
  ASSERT_TRUE(ctx().recv(&x, sizeof(x), 0, 97).is_ok());
}

TEST(ContextSelf, ProbeSeesSizeWithoutReceiving) {
  EXPECT_FALSE(ctx().iprobe(kAnySource, 77).has_value());
  std::vector<char> out(3000, 'p');
  Request s = ctx().isend(out.data(), out.size(), 0, 77);
  MessageInfo info = ctx().probe(kAnySource, 77);
  EXPECT_EQ(info.bytes, 3000u);
  EXPECT_EQ(info.source, 0);
  std::vector<char> in(info.bytes);
  ASSERT_TRUE(ctx().recv(in.data(), in.size(), 0, 77).is_ok());
  EXPECT_EQ(in, out);
  EXPECT_FALSE(ctx().iprobe(kAnySource, 77).has_value());
}

TEST(ContextSelf, TagMaskSelectsByTheMaskedBits) {
  int a = 1, b = 2, got = 0;
  ASSERT_TRUE(ctx().isend(&a, sizeof(a), 0, 0x1001).wait().is_ok());
  ASSERT_TRUE(ctx().isend(&b, sizeof(b), 0, 0x2001).wait().is_ok());
  MessageInfo info;
  ASSERT_TRUE(ctx().recv(&got, sizeof(got), 0, 0x2000, &info, 0xf000).is_ok());
  EXPECT_EQ(got, 2);
  EXPECT_EQ(info.tag, 0x2001u);
  ASSERT_TRUE(ctx().recv(&got, sizeof(got), 0, 0x1000, &info, 0xf000).is_ok());
  EXPECT_EQ(got, 1);
}

TEST(ContextSelf, BadArgumentsFailTheRequestWithAClearStatus) {
  int x = 0;
  Status s = ctx().send(&x, sizeof(x), 3, 1);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("destination rank 3"), std::string::npos) << s.to_string();
  EXPECT_EQ(ctx().recv(&x, sizeof(x), -7, 1).code(), Code::kInvalidArgument);
  EXPECT_EQ(ctx().send(nullptr, 4, 0, 1).code(), Code::kInvalidArgument);
  Request empty;
  EXPECT_EQ(empty.wait().code(), Code::kInvalidArgument);
}

TEST(ContextSelf, WaitAnyReturnsACompletedRequest) {
  int x = 0, y = 5;
  std::vector<Request> rs;
  rs.push_back(ctx().irecv(&x, sizeof(x), 0, 200));
  rs.push_back(ctx().irecv(&x, sizeof(x), 0, 201));
  ASSERT_TRUE(ctx().send(&y, sizeof(y), 0, 201).is_ok());
  EXPECT_EQ(Request::wait_any(rs), 1u);
  EXPECT_TRUE(rs[0].cancel());
  EXPECT_TRUE(ctx().barrier().is_ok());
}

TEST(ContextSelf, InvalidConfigurationFailsInitNamingTheVariable) {
  try {
    Context::init({{{"FERRY_SHM_BOUNCE_COUNT", "many"}}});
    FAIL() << "init accepted a bad value";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("FERRY_SHM_BOUNCE_COUNT"), std::string::npos);
  }
}

}  // namespace
}  // namespace ferry

namespace ferry {
namespace {

TEST(ContextSelf, ACommunicatorThatOutlivesItsContextFailsCleanly) {
  // A Communicator kept after its Context is gone (a global one, say): its calls fail with a
  // status that says why, and dropping it touches nothing of the Context.
  Communicator world;
  Communicator half;
  {
    Context owner = Context::init();
    world = owner.world();
    half = world.split(0, 0);
    int in = 3, out = 0;
    ASSERT_TRUE(world.allreduce(&in, &out, 1, DataType::kInt32, ReduceOp::kSum).is_ok());
    EXPECT_EQ(out, 3);
  }
  int in = 4, out = 0;
  for (Communicator* c : {&world, &half}) {
    const Status s = c->allreduce(&in, &out, 1, DataType::kInt32, ReduceOp::kSum);
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_NE(s.message().find("Context is finalized"), std::string::npos) << s.to_string();
    EXPECT_EQ(c->barrier().code(), Code::kInvalidArgument);
    Request r = c->ibroadcast(&in, 1, DataType::kInt32, 0);
    EXPECT_EQ(r.wait().code(), Code::kInvalidArgument);
    EXPECT_THROW(c->split(0, 0), Error);
    EXPECT_EQ(c->size(), 1) << "what it knew of itself stays";
  }
  EXPECT_EQ(out, 0) << "nothing was reduced";
}

TEST(ContextSelf, RequestsThatOutliveTheirContextEndCleanly) {
  // Requests kept after their Context is gone (declared before it, say): one never matched ends
  // with a status that says why, a completed one keeps its own, and the last to go frees what
  // is left of the Context (ASan's leak check in CI sees that it does).
  std::vector<Request> kept;
  int in = 0, got = 0;
  const int out = 7;
  {
    Context owner = Context::init();
    kept.push_back(owner.irecv(&in, sizeof(in), 0, 77));  // nothing is ever sent with tag 77
    Request r = owner.irecv(&got, sizeof(got), 0, 79);
    ASSERT_TRUE(owner.send(&out, sizeof(out), 0, 79).is_ok());
    ASSERT_TRUE(r.wait().is_ok());
    kept.push_back(std::move(r));
  }
  EXPECT_TRUE(kept[0].test());
  const Status s = kept[0].wait();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("Context was finalized"), std::string::npos) << s.to_string();
  EXPECT_EQ(kept[0].wait_for(0.1).code(), Code::kInvalidArgument);
  EXPECT_FALSE(kept[0].cancel());
  EXPECT_EQ(Request::wait_any(kept), 0u);
  EXPECT_TRUE(kept[1].wait().is_ok());
  EXPECT_EQ(kept[1].info().bytes, sizeof(int));
  EXPECT_EQ(got, out);
  EXPECT_EQ(in, 0) << "nothing was received after the Context went";
  kept.erase(kept.begin());
  kept.clear();  // the last handle
}

TEST(ContextSelf, WaitForTimesOutAndLeavesTheRequestPending) {
  int x = 0, y = 9;
  Request r = ctx().irecv(&x, sizeof(x), 0, 300);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(r.wait_for(0.05).code(), Code::kTimeout);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_GE(waited, 0.05);
  EXPECT_LT(waited, 2.0);
  ASSERT_TRUE(ctx().send(&y, sizeof(y), 0, 300).is_ok());
  EXPECT_TRUE(r.wait_for(5).is_ok()) << "still pending after the timeout, then completed";
  EXPECT_EQ(x, 9);
}

}  // namespace
}  // namespace ferry
