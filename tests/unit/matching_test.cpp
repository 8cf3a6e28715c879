// Tag matching: order, wildcards, masks, cancel.
#include "proto/matching.hpp"

#include <gtest/gtest.h>

namespace ferry::proto {
namespace {

Unexpected eager(int source, Tag tag, std::size_t size) {
  Unexpected m;
  m.source = source;
  m.tag = tag;
  m.size = size;
  return m;
}

TEST(Matching, PostedReceivesMatchInPostingOrder) {
  Matcher m;
  m.post({kAnySource, 7, kFullMask, 1});
  m.post({2, 7, kFullMask, 2});
  EXPECT_EQ(m.match_posted(2, 7), 1u) << "the first posted matching receive wins";
  EXPECT_EQ(m.match_posted(2, 7), 2u);
  EXPECT_FALSE(m.match_posted(2, 7).has_value());
}

TEST(Matching, SourceAndTagMustBothMatch) {
  Matcher m;
  m.post({1, 5, kFullMask, 10});
  EXPECT_FALSE(m.match_posted(2, 5).has_value());
  EXPECT_FALSE(m.match_posted(1, 6).has_value());
  EXPECT_EQ(m.match_posted(1, 5), 10u);
}

TEST(Matching, MaskIgnoresTheBitsItClears) {
  Matcher m;
  m.post({kAnySource, 0xab00, 0xff00, 3});
  EXPECT_FALSE(m.match_posted(0, 0xac01).has_value());
  EXPECT_EQ(m.match_posted(0, 0xab42), 3u);
  m.post({kAnySource, 0, 0, 4});  // mask 0: any tag
  EXPECT_EQ(m.match_posted(5, 0xdeadbeef), 4u);
}

TEST(Matching, UnexpectedMessagesAreTakenInArrivalOrder) {
  Matcher m;
  m.add_unexpected(eager(1, 9, 10));
  m.add_unexpected(eager(2, 9, 20));
  m.add_unexpected(eager(1, 9, 30));
  auto first = m.take_unexpected(1, 9, kFullMask);
  ASSERT_TRUE(first);
  EXPECT_EQ(first->size, 10u);
  auto any = m.take_unexpected(kAnySource, 9, kFullMask);
  ASSERT_TRUE(any);
  EXPECT_EQ(any->source, 2);
  const Unexpected* peek = m.find_unexpected(kAnySource, 9, kFullMask);
  ASSERT_NE(peek, nullptr);
  EXPECT_EQ(peek->size, 30u);
  EXPECT_EQ(m.unexpected_count(), 1u) << "find must not remove";
}

TEST(Matching, RemovePostedCancelsOnlyThatReceive) {
  Matcher m;
  m.post({0, 1, kFullMask, 1});
  m.post({0, 1, kFullMask, 2});
  EXPECT_TRUE(m.remove_posted(1));
  EXPECT_FALSE(m.remove_posted(1));
  EXPECT_EQ(m.match_posted(0, 1), 2u);
}

}  // namespace
}  // namespace ferry::proto
