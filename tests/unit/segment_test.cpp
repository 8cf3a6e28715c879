// shm segments: layout validation, attach checks, and names removed from /dev/shm.
#include "transport/shm/segment.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "ferry/status.hpp"
#include "transport/shm/address.hpp"

namespace ferry::transport::shm {
namespace {

std::string unique_name() { return "/ferry-unittest-" + std::to_string(::getpid()); }
bool exists(const std::string& name) {
  struct stat st {};
  return ::stat(("/dev/shm" + name).c_str(), &st) == 0;
}

TEST(ShmSegment, LayoutRejectsBadNumbers) {
  Layout layout;
  EXPECT_NE(Layout::compute(1000, 4, 4096, &layout), "");
  EXPECT_NE(Layout::compute(1024, 0, 4096, &layout), "");
  EXPECT_NE(Layout::compute(1024, 4, 100, &layout), "");
  EXPECT_NE(Layout::compute(1024, 4, 1u << 25, &layout), "");
  EXPECT_EQ(Layout::compute(1024, 4, 4096, &layout), "");
  EXPECT_GE(layout.total_size, 1024 * kFifoElemSize + 4 * 4096);
}

TEST(ShmSegment, AttachSeesTheCreatorsFifoAndUnlinkRemovesTheName) {
  Layout layout;
  ASSERT_EQ(Layout::compute(64, 4, 4096, &layout), "");
  std::string name = unique_name();
  {
    Segment own = Segment::create(name, layout);
    EXPECT_TRUE(exists(name));
    Segment peer = Segment::attach(name, layout);
    own.header()->fifo.head.store(5);
    EXPECT_EQ(peer.header()->fifo.head.load(), 5u) << "both map the same memory";
    own.unlink();
    EXPECT_FALSE(exists(name));
    EXPECT_EQ(peer.header()->fifo.head.load(), 5u) << "mappings outlive the name";
  }
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, DestructorRemovesTheNameOfAnUnlinkedSegment) {
  Layout layout;
  ASSERT_EQ(Layout::compute(64, 4, 4096, &layout), "");
  std::string name = unique_name();
  { Segment own = Segment::create(name, layout); }
  EXPECT_FALSE(exists(name));
}

TEST(ShmSegment, AttachRejectsAHeaderThatDisagreesWithTheAddress) {
  Layout layout, other;
  ASSERT_EQ(Layout::compute(64, 4, 4096, &layout), "");
  ASSERT_EQ(Layout::compute(64, 8, 4096, &other), "");
  std::string name = unique_name();
  Segment own = Segment::create(name, layout);
  EXPECT_THROW(Segment::attach(name, other), Error);
  own.header()->magic = 0;
  EXPECT_THROW(Segment::attach(name, layout), Error);
}

TEST(ShmAddress, DecodeRejectsTruncatedAndHostileBlobs) {
  Address a;
  a.name = "/ferry-x-1";
  a.pid = 42;
  a.fifo_size = 64;
  auto bytes = a.encode();
  Address out;
  EXPECT_TRUE(Address::decode(bytes, &out).is_ok());
  EXPECT_EQ(out.name, a.name);
  for (std::size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(Address::decode(std::span(bytes).first(cut), &out).is_ok()) << cut;
  }
  a.name = "/../etc/passwd";
  EXPECT_FALSE(Address::decode(a.encode(), &out).is_ok());
}

}  // namespace
}  // namespace ferry::transport::shm
