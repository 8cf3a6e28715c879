// The descriptor mailbox that carries cuMem POSIX file descriptors between local ranks.
#include "util/fd_mailbox.hpp"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <random>

namespace ferry::util {
namespace {

std::string fresh_job() {
  return "mbtest" + std::to_string(getpid()) + "x" + std::to_string(std::random_device{}());
}

TEST(FdMailbox, CarriesADescriptorWithTagRankAndTheKernelsPid) {
  const std::string job = fresh_job();
  FdMailbox a(job, 0), b(job, 1);
  int pipe_fds[2];
  ASSERT_EQ(pipe(pipe_fds), 0);
  Fd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  ASSERT_TRUE(a.send(1, 0xfeedULL, write_end.get()));
  write_end.reset();  // the letter holds its own copy
  std::vector<FdMailbox::Letter> letters;
  std::size_t rejected = 0;
  b.receive(&letters, &rejected);
  ASSERT_EQ(letters.size(), 1u);
  EXPECT_EQ(rejected, 0u);
  EXPECT_EQ(letters[0].sender_rank, 0);
  EXPECT_EQ(letters[0].sender_pid, getpid());
  EXPECT_EQ(letters[0].tag, 0xfeedULL);
  ASSERT_EQ(write(letters[0].fd.get(), "ok", 2), 2);  // the same pipe, through the passed fd
  char got[2];
  ASSERT_EQ(read(read_end.get(), got, 2), 2);
  EXPECT_EQ(std::memcmp(got, "ok", 2), 0);
  letters.clear();
  b.receive(&letters);
  EXPECT_TRUE(letters.empty());
}

TEST(FdMailbox, MessagesWithoutOneDescriptorAreRejected) {
  const std::string job = fresh_job();
  FdMailbox b(job, 1);
  // A hostile local process writes straight to the socket: no descriptor, then a short message.
  Fd raw(socket(AF_UNIX, SOCK_DGRAM, 0));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  const std::string name = "ferry-" + job + "-fds-1";
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  const char message[16] = {'F', 'd', 'D', 'm'};
  ASSERT_EQ(
      sendto(raw.get(), message, sizeof message, 0, reinterpret_cast<sockaddr*>(&address), length),
      16);
  ASSERT_EQ(sendto(raw.get(), message, 3, 0, reinterpret_cast<sockaddr*>(&address), length), 3);
  std::vector<FdMailbox::Letter> letters;
  std::size_t rejected = 0;
  b.receive(&letters, &rejected);
  EXPECT_TRUE(letters.empty());
  EXPECT_EQ(rejected, 2u);
}

TEST(FdMailbox, SendingToAMissingPeerFailsAtOnceAndSaysWhere) {
  const std::string job = fresh_job();
  FdMailbox a(job, 0);
  Status status = a.send(7, 1, 0);
  ASSERT_FALSE(status);
  EXPECT_NE(status.message().find("rank 7"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("-fds-7"), std::string::npos) << status.message();
}

TEST(FdMailbox, ASecondMailboxForTheSameRankIsRefused) {
  const std::string job = fresh_job();
  FdMailbox a(job, 0);
  EXPECT_THROW(FdMailbox(job, 0), Error);
}

}  // namespace
}  // namespace ferry::util
