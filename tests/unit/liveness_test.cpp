// Liveness: who died, in which order, and whether a receive from any source can still be matched.
#include "proto/liveness.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace ferry::proto {
namespace {

// Links of a job of `size` ranks, every one reachable but those in `unreachable`. Liveness only
// asks whether a link has an endpoint, so a stand-in address does for the reachable ones.
std::vector<Link> links(int size, std::initializer_list<int> unreachable = {}) {
  static char stand_in;
  std::vector<Link> made(static_cast<std::size_t>(size));
  for (int r = 0; r < size; ++r) {
    if (std::find(unreachable.begin(), unreachable.end(), r) != unreachable.end()) {
      made[static_cast<std::size_t>(r)].why = "no transport reaches rank " + std::to_string(r);
      continue;
    }
    made[static_cast<std::size_t>(r)].endpoint = reinterpret_cast<transport::Endpoint*>(&stand_in);
  }
  return made;
}

TEST(Liveness, DeathsAreRecordedOnceInTheOrderSeen) {
  std::vector<Link> job = links(4);
  Liveness liveness(job);
  liveness.connected(0);
  EXPECT_EQ(liveness.failure(2), nullptr);
  EXPECT_EQ(liveness.failure_order(2), 0u);
  EXPECT_TRUE(liveness.record_failure(&job[2], 2, "rank 2 exited"));
  EXPECT_TRUE(liveness.record_failure(&job[1], 1, "rank 1 was killed"));
  EXPECT_FALSE(liveness.record_failure(&job[2], 2, "rank 2 again"));
  ASSERT_NE(liveness.failure(2), nullptr);
  EXPECT_EQ(*liveness.failure(2), "rank 2 exited");  // the first word stands
  EXPECT_EQ(liveness.failure_order(2), 1u);
  EXPECT_EQ(liveness.failure_order(1), 2u);
  EXPECT_EQ(liveness.failure_order(3), 0u);
}

TEST(Liveness, NoneCanComeFromTheDeadTheUnreachableOrNoRank) {
  std::vector<Link> job = links(4, {3});
  Liveness liveness(job);
  liveness.connected(0);
  EXPECT_FALSE(liveness.none_can_come(1));
  EXPECT_TRUE(liveness.none_can_come(3));   // unreachable
  EXPECT_TRUE(liveness.none_can_come(4));   // no such rank
  EXPECT_TRUE(liveness.none_can_come(-5));  // nor this
  EXPECT_FALSE(liveness.none_can_come(0));  // this rank can always send itself a message
  ASSERT_TRUE(liveness.record_failure(&job[1], 1, "rank 1 exited"));
  EXPECT_TRUE(liveness.none_can_come(1));
  EXPECT_FALSE(liveness.none_can_come(kAnySource));  // rank 2 is left
}

TEST(Liveness, AReceiveFromAnySourceFailsOnceNoOtherRankIsLeftAndSaysWhy) {
  std::vector<Link> job = links(4, {3});
  Liveness liveness(job);
  liveness.connected(0);
  ASSERT_TRUE(liveness.record_failure(&job[2], 2, "rank 2 (pid 7) exited with code 1"));
  EXPECT_FALSE(liveness.none_can_come(kAnySource));
  ASSERT_TRUE(liveness.record_failure(&job[1], 1, "rank 1 (pid 6) was killed by signal 9"));
  EXPECT_TRUE(liveness.none_can_come(kAnySource));
  const Status why = liveness.no_one_left();
  EXPECT_EQ(why.code(), Code::kPeerFailed);
  EXPECT_NE(why.message().find("2 failed, 1 unreachable"), std::string::npos) << why.message();
  // The last death seen is named.
  EXPECT_NE(why.message().find("rank 1 (pid 6) was killed"), std::string::npos) << why.message();
}

TEST(Liveness, AFinalizedRankSendsNothingMoreAndDyingAfterCountsOnce) {
  std::vector<Link> job = links(3);
  Liveness liveness(job);
  liveness.connected(0);
  EXPECT_FALSE(liveness.record_departure(&job[0], 0));  // never this rank
  ASSERT_TRUE(liveness.record_departure(&job[1], 1));
  EXPECT_FALSE(liveness.record_departure(&job[1], 1));
  EXPECT_TRUE(liveness.none_can_come(1));
  EXPECT_EQ(liveness.failure(1), nullptr);  // alive: not a failure
  const Status from_one = liveness.cannot_come(1);
  EXPECT_EQ(from_one.code(), Code::kCanceled);
  EXPECT_NE(from_one.message().find("rank 1 finalized"), std::string::npos) << from_one.message();
  EXPECT_FALSE(liveness.none_can_come(kAnySource));  // rank 2 may still send
  // Rank 1 dies after finalizing: a failure now, and not one more rank gone.
  ASSERT_TRUE(liveness.record_failure(&job[1], 1, "rank 1 exited"));
  EXPECT_EQ(liveness.cannot_come(1).code(), Code::kPeerFailed);
  EXPECT_FALSE(liveness.none_can_come(kAnySource));
  ASSERT_TRUE(liveness.record_departure(&job[2], 2));
  EXPECT_TRUE(liveness.none_can_come(kAnySource));
  const Status why = liveness.no_one_left();
  EXPECT_EQ(why.code(), Code::kPeerFailed);
  EXPECT_NE(why.message().find("1 failed, 1 finalized, 0 unreachable"), std::string::npos)
      << why.message();
}

TEST(Liveness, WithOnlyUnreachableRanksTheReceiveIsUnsupported) {
  std::vector<Link> job = links(3, {1, 2});
  Liveness liveness(job);
  liveness.connected(0);
  EXPECT_TRUE(liveness.none_can_come(kAnySource));
  const Status why = liveness.no_one_left();
  EXPECT_EQ(why.code(), Code::kUnsupported);
  EXPECT_NE(why.message().find("no transport reaches rank 1"), std::string::npos) << why.message();
}

TEST(Liveness, ASingleRankJobAlwaysHasItself) {
  std::vector<Link> job = links(1);
  Liveness liveness(job);
  liveness.connected(0);
  EXPECT_FALSE(liveness.none_can_come(kAnySource));
  EXPECT_FALSE(liveness.none_can_come(0));
}

}  // namespace
}  // namespace ferry::proto
