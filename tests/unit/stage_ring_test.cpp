// The host-staging ring (src/cuda/stage_ring.hpp) without a GPU: made, opened by the peer, its
// name gone from /dev/shm as soon as both have it, and sizes from the peer checked before use.
#include "cuda/stage_ring.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "ferry/status.hpp"

namespace ferry::cuda {
namespace {

bool exists(const std::string& name) {
  struct stat st {};
  return ::stat(("/dev/shm" + name).c_str(), &st) == 0;
}

std::string job() { return "ringtest" + std::to_string(::getpid()); }

TEST(StageRing, NameSaysJobSenderAndReceiver) {
  EXPECT_EQ(StageRing::name("a/b c", 3, 7), "/ferry-a_b_c-3-stage-7");
}

TEST(StageRing, PeerSeesTheSenderBytesAndTheNameGoesOnceBothHaveIt) {
  const std::string name = StageRing::name(job(), 0, 1);
  {
    auto sender = StageRing::create(nullptr, name, 1 << 20);
    ASSERT_TRUE(exists(name));
    std::memset(sender->data(), 0x5a, sender->size());
    auto receiver = StageRing::open(nullptr, name, 64 << 20);
    receiver->unlink();
    EXPECT_FALSE(exists(name)) << "the receiver removes the name once it has mapped the ring";
    ASSERT_EQ(receiver->size(), std::size_t{1} << 20);
    EXPECT_EQ(receiver->data()[12345], std::byte{0x5a});
    sender->data()[7] = std::byte{1};
    EXPECT_EQ(receiver->data()[7], std::byte{1}) << "one shared mapping";
  }
  EXPECT_FALSE(exists(name));
}

TEST(StageRing, SenderRemovesTheNameIfTheReceiverNeverCame) {
  const std::string name = StageRing::name(job(), 2, 3);
  { auto sender = StageRing::create(nullptr, name, 4096); }
  EXPECT_FALSE(exists(name));
}

TEST(StageRing, RingsLargerThanAllowedOrMissingAreRefused) {
  const std::string name = StageRing::name(job(), 4, 5);
  auto sender = StageRing::create(nullptr, name, 1 << 20);
  try {
    StageRing::open(nullptr, name, 4096);
    FAIL() << "a ring larger than the receiver allows was mapped";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kProtocolError);
    EXPECT_NE(std::string(e.what()).find("1048576 bytes"), std::string::npos) << e.what();
  }
  try {
    StageRing::open(nullptr, StageRing::name(job(), 9, 9), 4096);
    FAIL() << "a ring that does not exist was opened";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("opening the sender's ring failed"), std::string::npos);
  }
}

}  // namespace
}  // namespace ferry::cuda
