// Tag matching: order, wildcards, masks, cancel.
#include "proto/matching.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <random>
#include <vector>

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

// The matcher against the plain definition (first match in arrival order, by linear search),
// under random traffic that grows its queues past the index threshold and empties them again:
// exact and wildcard receives, cancels, probes, rendezvous drops.
TEST(Matching, AgreesWithArrivalOrderUnderRandomTraffic) {
  struct Model {
    std::vector<PostedRecv> posted;
    std::vector<Unexpected> unexpected;
  };
  std::mt19937 random(12345);
  auto pick = [&](int n) { return static_cast<int>(random() % static_cast<unsigned>(n)); };
  for (int trial = 0; trial < 20; ++trial) {
    Matcher m;
    Model model;
    std::uint32_t next_request = 1;
    std::uint64_t next_size = 1;
    const int ops = 4000;
    for (int op = 0; op < ops; ++op) {
      const bool grow = (op / 500) % 2 == 0;  // phases that fill the queues, then drain them
      const int source = pick(3);
      const Tag tag = static_cast<Tag>(pick(6));
      const int what = pick(10);
      if (what < (grow ? 3 : 1)) {  // post a receive
        PostedRecv r{pick(4) == 0 ? kAnySource : source, tag, pick(5) == 0 ? Tag{0x6} : kFullMask,
                     next_request++};
        m.post(r);
        model.posted.push_back(r);
      } else if (what < (grow ? 6 : 3)) {  // a message arrives
        auto it = std::find_if(model.posted.begin(), model.posted.end(), [&](const PostedRecv& r) {
          return tag_matches(r.source, r.tag, r.mask, source, tag);
        });
        const std::optional<std::uint32_t> got = m.match_posted(source, tag);
        if (it == model.posted.end()) {
          ASSERT_FALSE(got.has_value()) << "op " << op;
          Unexpected u;
          u.source = source;
          u.tag = tag;
          u.size = next_size++;
          u.rendezvous = pick(3) == 0;
          u.sreq = u.size;
          model.unexpected.push_back(u);
          m.add_unexpected(Unexpected(u));
        } else {
          ASSERT_TRUE(got.has_value()) << "op " << op;
          ASSERT_EQ(*got, it->request) << "op " << op;
          model.posted.erase(it);
        }
      } else if (what < 8) {  // a receive takes (or probes) an unexpected message
        const int want = pick(4) == 0 ? kAnySource : source;
        const Tag mask = pick(5) == 0 ? Tag{0x6} : kFullMask;
        auto it = std::find_if(
            model.unexpected.begin(), model.unexpected.end(),
            [&](const Unexpected& u) { return tag_matches(want, tag, mask, u.source, u.tag); });
        if (pick(4) == 0) {
          const Unexpected* peek = m.find_unexpected(want, tag, mask);
          ASSERT_EQ(peek == nullptr, it == model.unexpected.end()) << "op " << op;
          if (peek != nullptr) {
            ASSERT_EQ(peek->size, it->size) << "op " << op;
          }
          continue;
        }
        std::optional<Unexpected> got = m.take_unexpected(want, tag, mask);
        ASSERT_EQ(got.has_value(), it != model.unexpected.end()) << "op " << op;
        if (got) {
          ASSERT_EQ(got->size, it->size) << "op " << op;
          model.unexpected.erase(it);
        }
      } else if (what < 9 && !model.posted.empty()) {  // cancel a receive
        const std::size_t i = static_cast<std::size_t>(pick(static_cast<int>(model.posted.size())));
        ASSERT_TRUE(m.remove_posted(model.posted[i].request));
        model.posted.erase(model.posted.begin() + static_cast<std::ptrdiff_t>(i));
      } else if (!model.unexpected.empty()) {  // a sender withdraws an announcement
        const Unexpected& u = model.unexpected[static_cast<std::size_t>(
            pick(static_cast<int>(model.unexpected.size())))];
        const bool here = u.rendezvous;
        const int from = u.source;
        const std::uint64_t sreq = u.sreq;
        ASSERT_EQ(m.drop_rendezvous(from, sreq), here);
        std::erase_if(model.unexpected, [&](const Unexpected& x) {
          return x.rendezvous && x.source == from && x.sreq == sreq;
        });
      }
      ASSERT_EQ(m.posted_count(), model.posted.size());
      ASSERT_EQ(m.unexpected_count(), model.unexpected.size());
    }
  }
}

TEST(Matching, ExactReceivesOfManyMessagesCostALookupEach) {
  // 20,000 unexpected messages taken in reverse tag order, then 20,000 posted receives met in
  // reverse order: without an index each would scan the rest (200 million entries looked at).
  constexpr int kMessages = 20000;
  Matcher m;
  for (int i = 0; i < kMessages; ++i) m.add_unexpected(eager(1, static_cast<Tag>(i), 8));
  for (int i = kMessages - 1; i >= 0; --i) {
    auto got = m.take_unexpected(1, static_cast<Tag>(i), kFullMask);
    ASSERT_TRUE(got);
    ASSERT_EQ(got->tag, static_cast<Tag>(i));
  }
  for (int i = 0; i < kMessages; ++i) {
    m.post({2, static_cast<Tag>(i), kFullMask, static_cast<std::uint32_t>(i)});
  }
  for (int i = kMessages - 1; i >= 0; --i) {
    ASSERT_EQ(m.match_posted(2, static_cast<Tag>(i)), static_cast<std::uint32_t>(i));
  }
  EXPECT_LT(m.examined(), 4u * Matcher::kIndexFrom * Matcher::kIndexFrom)
      << "entries scanned: matching is not a lookup";
  EXPECT_EQ(m.unexpected_count(), 0u);
  EXPECT_EQ(m.posted_count(), 0u);
}

}  // namespace
}  // namespace ferry::proto
