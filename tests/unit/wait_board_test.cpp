// The job's wait board (util/wait_board.hpp): what ferryrun makes and a rank adopts, what a
// rank posts and everyone reads, and descriptors that are not a board left alone.
#include "util/wait_board.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <string>

namespace ferry::util {
namespace {

TEST(WaitBoard, ARankPostsWhatItWaitsForAndEveryoneReadsIt) {
  WaitBoard launcher;
  std::string error;
  ASSERT_TRUE(launcher.create(3, &error)) << error;
  // A rank gets its own descriptor to the board (as after fork and exec) and adopts it.
  const int passed = ::fcntl(launcher.fd(), F_DUPFD_CLOEXEC, 3);
  ASSERT_GE(passed, 0);
  WaitBoard rank;
  ASSERT_TRUE(rank.adopt(passed, 3));
  EXPECT_EQ(::fcntl(passed, F_GETFD), -1) << "adopt closes the descriptor (the mapping stays)";

  rank.post(1, WaitBoard::now_ns() - 2'000'000'000, "allreduce #4 on communicator 0");
  std::vector<WaitBoard::Entry> seen = launcher.read();
  ASSERT_EQ(seen.size(), 3u);
  EXPECT_EQ(seen[1].text, "allreduce #4 on communicator 0");
  EXPECT_GE(seen[1].waited_s, 2.0);
  EXPECT_LT(seen[1].waited_s, 60.0);
  EXPECT_EQ(seen[1].pid, ::getpid());
  EXPECT_EQ(seen[0].waited_s, 0.0);
  EXPECT_EQ(seen[2].waited_s, 0.0);

  // A text longer than the slot is cut, not spilled into the next rank's slot.
  rank.post(0, WaitBoard::now_ns(), std::string(1000, 'x'));
  seen = launcher.read();
  EXPECT_EQ(seen[0].text.size(), sizeof(WaitBoard::Slot::text) - 1);
  EXPECT_EQ(seen[1].text, "allreduce #4 on communicator 0");

  rank.clear(1);
  seen = launcher.read();
  EXPECT_EQ(seen[1].waited_s, 0.0);
  EXPECT_EQ(seen[1].text, "");
  // Ranks outside the board are ignored.
  rank.post(3, WaitBoard::now_ns(), "nowhere");
  rank.post(-1, WaitBoard::now_ns(), "nowhere");
  for (const WaitBoard::Entry& e : launcher.read()) EXPECT_NE(e.text, "nowhere");
}

TEST(WaitBoard, ADescriptorThatIsNotABoardIsLeftAlone) {
  WaitBoard rank;
  // The program's own file: never mapped, never closed.
  const int file = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  ASSERT_GE(file, 0);
  EXPECT_FALSE(rank.adopt(file, 2));
  EXPECT_NE(::fcntl(file, F_GETFD), -1) << "a descriptor of the program's was closed";
  ::close(file);
  // Another memfd: not ours either.
  const int other = ::memfd_create("not-a-board", MFD_CLOEXEC);
  ASSERT_GE(other, 0);
  EXPECT_FALSE(rank.adopt(other, 2));
  EXPECT_NE(::fcntl(other, F_GETFD), -1);
  ::close(other);
  EXPECT_FALSE(rank.adopt(-1, 2));
  EXPECT_FALSE(rank.usable());

  // A board made for another number of ranks is refused (and, being ferryrun's, closed).
  WaitBoard launcher;
  std::string error;
  ASSERT_TRUE(launcher.create(4, &error)) << error;
  const int passed = ::fcntl(launcher.fd(), F_DUPFD_CLOEXEC, 3);
  EXPECT_FALSE(rank.adopt(passed, 2));
  EXPECT_EQ(::fcntl(passed, F_GETFD), -1);
  EXPECT_FALSE(rank.usable());
}

}  // namespace
}  // namespace ferry::util
