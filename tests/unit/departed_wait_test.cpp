// DepartedWait: when the word that stream kernels write while they wait names a member that
// finalized, over the grace, the calls must stop; a member that is merely late, a departed member
// seen only once, or sightings with long pauses between them must not stop them.
#include "coll/departed_wait.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

namespace ferry::coll {
namespace {

using std::chrono::milliseconds;

class DepartedWaitTest : public ::testing::Test {
 protected:
  // One look `at` ms after the start, the word naming member `m` (-1: the word is 0).
  int look(int at, int m) {
    const unsigned word = m < 0 ? 0u : static_cast<unsigned>(m) + 1;
    return wait.observe(word, start + milliseconds(at),
                        [&](int j) { return departed.count(j) != 0; });
  }
  DepartedWait wait;
  std::set<int> departed;
  util::Clock::time_point start = util::Clock::now();
};

TEST_F(DepartedWaitTest, ADepartedMemberWaitedForOverTheGraceStopsTheCalls) {
  departed.insert(2);
  int found = -1;
  int at = 0;
  // A sighting every 5 ms, with empty looks between (the kernel writes every few milliseconds).
  for (; at <= 400 && found < 0; at += 1) found = look(at, at % 5 == 0 ? 2 : -1);
  EXPECT_EQ(found, 2);
  EXPECT_GE(at - 1, DepartedWait::kGrace.count());
  EXPECT_LE(at - 1, DepartedWait::kGrace.count() + 5);
}

TEST_F(DepartedWaitTest, ALiveMemberWaitedForNeverStops) {
  departed.insert(2);
  for (int at = 0; at <= 5000; at += 5) ASSERT_EQ(look(at, 1), -1) << at;
}

TEST_F(DepartedWaitTest, WaitsForALiveMemberBetweenDoNotHideTheDepartedOne) {
  // Blocks of one call wait for different members at once: the word alternates.
  departed.insert(0);
  int found = -1;
  int at = 0;
  for (; at <= 400 && found < 0; at += 2) found = look(at, (at / 2) % 2 == 0 ? 0 : 3);
  EXPECT_EQ(found, 0);
}

TEST_F(DepartedWaitTest, SightingsWithLongPausesBetweenStartTheCountAgain) {
  // A departed member seen now and then (calls that end between), never for the grace in a row.
  departed.insert(1);
  const int pause = static_cast<int>(DepartedWait::kGap.count()) + 20;
  for (int at = 0; at <= 20 * pause; at += pause) ASSERT_EQ(look(at, 1), -1) << at;
}

TEST_F(DepartedWaitTest, AMemberThatDepartsLaterIsCountedFromItsNotice) {
  // Waited for while alive (a slow member), then its finalize notice comes: the grace counts
  // from the first sighting after the notice.
  for (int at = 0; at < 1000; at += 5) ASSERT_EQ(look(at, 1), -1);
  departed.insert(1);
  const int grace = static_cast<int>(DepartedWait::kGrace.count());
  for (int at = 1000; at < 1000 + grace; at += 5) ASSERT_EQ(look(at, 1), -1) << at;
  EXPECT_EQ(look(1000 + grace, 1), 1);
}

// look(): the same on the word itself, for the members of a group (members 0..2 are ranks
// 10..12; rank 12 finalized).
struct FakeGroup {
  struct Liveness {
    bool departed(int rank) const { return rank == 12; }
  };
  struct Engine {
    Liveness live;
    const Liveness& liveness() const { return live; }
  };
  int size() const { return 3; }
  int member(int j) const { return 10 + j; }
  Engine* engine() const { return &e; }
  mutable Engine e;
};

TEST(DepartedWaitLook, TakesTheWordAndNamesTheDepartedMemberAfterTheGrace) {
  DepartedWait wait;
  FakeGroup group;
  unsigned word = 2;  // member 1, alive
  EXPECT_EQ(wait.look(&word, group), -1);
  EXPECT_EQ(word, 0u) << "the word is cleared for the kernels' next write";
  word = 4;  // member 3: no such member in this group
  EXPECT_EQ(wait.look(&word, group), -1);
  const auto start = util::Clock::now();
  int found = -1;
  while (found < 0 && util::Clock::now() - start < std::chrono::seconds(2)) {
    word = 3;  // member 2, rank 12, which finalized
    found = wait.look(&word, group);
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_EQ(found, 2);
  EXPECT_GE(util::Clock::now() - start, DepartedWait::kGrace);
}

}  // namespace
}  // namespace ferry::coll
