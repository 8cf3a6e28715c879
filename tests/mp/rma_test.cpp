// One-sided operations between the ranks of a job (run under ferryrun by CTest over shm, ofi and
// with 1 to 3 ranks): puts and gets of every size, atomics from every rank at once, and keys that
// are wrong in every way the target must catch.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <set>
#include <thread>
#include <vector>

#include "../helpers/ranks_main.hpp"
#include "ferry/ferry.hpp"

namespace ferry {
namespace {

using test::ctx;
using test::me;
using test::nranks;
int next() { return (me() + 1) % nranks(); }
int prev() { return (me() + nranks() - 1) % nranks(); }

// RMA_TEST_ALLOCATE=1: every window comes from allocate_memory (ranks of one node then access it
// directly); otherwise the test's own memory is registered.
bool g_allocate = false;
// RMA_TEST_NATIVE=1: the job runs over ofi with native one-sided access, and puts and gets
// between ranks must be able to go by the provider's own one-sided calls.
bool g_native = false;

// Whether puts and gets to `peer` may go by the network transport's one-sided calls (once the
// owner has granted the key).
bool native_to(int peer) {
  return ctx().describe_peer(peer).find("puts and gets by fi_write/fi_read") != std::string::npos;
}
// The same for the job (every rank is configured alike): asked of a rank other than this one.
bool native_job() { return nranks() > 1 && native_to(me() == 0 ? 1 : 0); }

struct Window {
  std::vector<std::byte> own;
  MemoryRegion region;
  std::byte* data = nullptr;
};
void make_window(std::size_t bytes, std::byte fill, Window* w) {
  if (g_allocate) {
    ASSERT_TRUE(ctx().allocate_memory(bytes, &w->region).is_ok());
    w->data = static_cast<std::byte*>(w->region.address());
    for (std::size_t i = 0; i < bytes; ++i) {
      ASSERT_EQ(w->data[i], std::byte{0}) << "allocated memory not zeroed at " << i;
    }
  } else {
    w->own.resize(bytes);
    ASSERT_TRUE(ctx().register_memory(w->own.data(), bytes, &w->region).is_ok());
    w->data = w->own.data();
  }
  std::fill_n(w->data, bytes, fill);
}

std::byte pattern(std::size_t i, int rank, std::size_t seq) {
  return static_cast<std::byte>((i * 11 + static_cast<std::size_t>(rank) * 29 + seq * 5) & 0xff);
}

// Every rank's key for its region, by rank.
std::vector<RemoteKey> exchange_keys(const MemoryRegion& region) {
  const std::vector<std::byte> mine = region.remote_key();
  std::vector<std::byte> all(mine.size() * static_cast<std::size_t>(nranks()));
  EXPECT_TRUE(
      ctx().world().allgather(mine.data(), all.data(), mine.size(), DataType::kUint8).is_ok());
  std::vector<RemoteKey> keys(static_cast<std::size_t>(nranks()));
  for (int r = 0; r < nranks(); ++r) {
    const std::span<const std::byte> packed(all.data() + r * mine.size(), mine.size());
    EXPECT_TRUE(RemoteKey::unpack(packed, &keys[static_cast<std::size_t>(r)]).is_ok());
    EXPECT_EQ(keys[static_cast<std::size_t>(r)].rank(), r);
  }
  return keys;
}

TEST(OneSided, PutThenGetEverySizeWithoutTheTargetPosting) {
  if (g_native && nranks() > 1) {
    ASSERT_TRUE(native_to(next())) << ctx().describe_peer(next());
  }
  const std::vector<std::size_t> sizes = {1, 7, 64, 4095, 65536, 100003, (1u << 20) + 3, 4u << 20};
  const std::size_t total = std::accumulate(sizes.begin(), sizes.end(), std::size_t{0}) + 64;
  Window w;
  ASSERT_NO_FATAL_FAILURE(make_window(total, std::byte{0xee}, &w));
  std::byte* window = w.data;
  auto keys = exchange_keys(w.region);
  const RemoteKey& target = keys[static_cast<std::size_t>(next())];
  EXPECT_EQ(target.size(), total);

  // Puts into the next rank's window, back to back with one byte left between them.
  std::vector<std::vector<std::byte>> outs;
  std::vector<Request> puts;
  std::size_t offset = 0;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    outs.emplace_back(sizes[s]);
    for (std::size_t i = 0; i < sizes[s]; ++i) outs.back()[i] = pattern(i, me(), s);
    puts.push_back(ctx().iput(outs.back().data(), sizes[s], target, offset));
    offset += sizes[s] + 1;
  }
  ASSERT_TRUE(Request::wait_all(puts).is_ok());
  ASSERT_TRUE(ctx().flush(next()).is_ok());
  ASSERT_TRUE(ctx().barrier().is_ok());
  // What the previous rank put here, and nothing between.
  offset = 0;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    for (std::size_t i = 0; i < sizes[s]; ++i) {
      ASSERT_EQ(window[offset + i], pattern(i, prev(), s))
          << "put of " << sizes[s] << " byte " << i;
    }
    ASSERT_EQ(window[offset + sizes[s]], std::byte{0xee}) << "wrote past a put of " << sizes[s];
    offset += sizes[s] + 1;
  }
  // Gets of the same ranges back from the next rank: what this rank put there.
  offset = 0;
  for (std::size_t s = 0; s < sizes.size(); ++s) {
    std::vector<std::byte> in(sizes[s] + 1, std::byte{0x11});
    Request get = ctx().iget(in.data(), sizes[s], target, offset);
    ASSERT_TRUE(get.wait().is_ok()) << get.status().to_string();
    ASSERT_EQ(std::memcmp(in.data(), outs[s].data(), sizes[s]), 0) << "get of " << sizes[s];
    ASSERT_EQ(in[sizes[s]], std::byte{0x11}) << "a get of " << sizes[s] << " wrote past it";
    offset += sizes[s] + 1;
  }
  ASSERT_TRUE(ctx().barrier().is_ok());  // nobody deregisters while others still get
}

TEST(OneSided, AtomicsFromEveryRankAtOnce) {
  // Rank 0's words: [0] 64-bit counter, [1] 32-bit counter (and 32 bits of zero), [2] a word
  // every rank compare-swaps from 0, [3] bits every rank sets with or, [4] xor, [5] and.
  Window w;
  ASSERT_NO_FATAL_FAILURE(make_window(48, std::byte{0}, &w));
  auto* words = reinterpret_cast<std::uint64_t*>(w.data);
  words[5] = ~std::uint64_t{0};
  auto keys = exchange_keys(w.region);
  const RemoteKey& zero = keys[0];
  constexpr int kRounds = 100;
  std::vector<std::uint64_t> tickets(kRounds);
  std::vector<std::uint32_t> tickets32(kRounds);
  std::vector<Request> requests;
  for (int i = 0; i < kRounds; ++i) {
    requests.push_back(ctx().iatomic(AtomicOp::kAdd, 8, zero, 0, 1, &tickets[i]));
    requests.push_back(ctx().iatomic(AtomicOp::kAdd, 4, zero, 8, 1, &tickets32[i]));
  }
  std::uint64_t swapped = 99;
  requests.push_back(ctx().iatomic(AtomicOp::kCompareSwap, 8, zero, 16,
                                   static_cast<std::uint64_t>(me()) + 1, &swapped, 0));
  requests.push_back(ctx().iatomic(AtomicOp::kOr, 8, zero, 24, std::uint64_t{1} << me()));
  requests.push_back(ctx().iatomic(AtomicOp::kXor, 8, zero, 32, std::uint64_t{3} << (2 * me())));
  requests.push_back(ctx().iatomic(AtomicOp::kAnd, 8, zero, 40, ~(std::uint64_t{1} << me())));
  ASSERT_TRUE(Request::wait_all(requests).is_ok());
  // Each fetched value is a ticket: distinct across all ranks, 0 .. ranks*kRounds-1.
  std::vector<std::uint64_t> all(tickets.size() * static_cast<std::size_t>(nranks()));
  ASSERT_TRUE(ctx()
                  .world()
                  .allgather(tickets.data(), all.data(), tickets.size(), DataType::kUint64)
                  .is_ok());
  std::set<std::uint64_t> distinct(all.begin(), all.end());
  EXPECT_EQ(distinct.size(), all.size()) << "two fetch-adds returned the same value";
  EXPECT_EQ(*distinct.rbegin(), all.size() - 1);
  // Exactly one compare-swap found 0; the others saw its value.
  std::vector<std::uint64_t> seen(static_cast<std::size_t>(nranks()));
  ASSERT_TRUE(ctx().world().allgather(&swapped, seen.data(), 1, DataType::kUint64).is_ok());
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 0) {
    const std::uint64_t n = static_cast<std::uint64_t>(nranks());
    EXPECT_EQ(words[0], n * kRounds);
    EXPECT_EQ(words[1], n * kRounds) << "the 32-bit adds touched the upper half";
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 0u), 1);
    EXPECT_GE(words[2], 1u);
    EXPECT_LE(words[2], n);
    for (std::uint64_t s : seen) EXPECT_TRUE(s == 0 || s == words[2]);
    EXPECT_EQ(words[3], (std::uint64_t{1} << n) - 1);
    EXPECT_EQ(words[4], (std::uint64_t{1} << (2 * n)) - 1);
    EXPECT_EQ(words[5], ~((std::uint64_t{1} << n) - 1));
  }
  // A swap returns what was there.
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == nranks() - 1) {
    std::uint64_t old = 0;
    ASSERT_TRUE(ctx().iatomic(AtomicOp::kSwap, 8, zero, 0, 7, &old).wait().is_ok());
    EXPECT_EQ(old, static_cast<std::uint64_t>(nranks()) * kRounds);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 0) {
    EXPECT_EQ(words[0], 7u);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

// What this rank has answered `peer`'s one-sided operations with so far: answers and messages.
std::pair<long, long> answers_to(int peer) {
  const std::string text = ctx().describe_peer(peer);
  const std::string lead = "answers to its one-sided operations: ";
  const std::size_t at = text.find(lead);
  long answers = 0;
  long messages = 0;
  if (at != std::string::npos) {
    EXPECT_EQ(std::sscanf(text.c_str() + at + lead.size(), "%ld in %ld", &answers, &messages), 2)
        << text;
  }
  return {answers, messages};
}

TEST(OneSided, AnswersToAWindowOfAtomicsGoTogether) {
  // Where atomics go through the owner (over ofi; to registered memory of a peer on this node),
  // the answers to those handled in one pass go to their initiator as one message. Rank 0 sends
  // a window of fetch-adds while rank 1 sleeps; rank 1 then answers all of them in fewer
  // messages than answers, and each fetched value (a ticket) reaches its own request.
  if (nranks() < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr int kWindow = 64;
  Window w;
  ASSERT_NO_FATAL_FAILURE(make_window(8, std::byte{0}, &w));
  auto keys = exchange_keys(w.region);
  const std::pair<long, long> before = me() == 1 ? answers_to(0) : std::pair<long, long>{};
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 0) {
    std::vector<std::uint64_t> tickets(kWindow, ~std::uint64_t{0});
    std::vector<Request> requests;
    for (int i = 0; i < kWindow; ++i) {
      requests.push_back(ctx().iatomic(AtomicOp::kAdd, 8, keys[1], 0, 1, &tickets[i]));
    }
    ASSERT_TRUE(Request::wait_all(requests).is_ok());
    std::sort(tickets.begin(), tickets.end());
    for (int i = 0; i < kWindow; ++i) ASSERT_EQ(tickets[i], static_cast<std::uint64_t>(i));
  } else if (me() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the window arrives meanwhile
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() != 1) return;
  std::uint64_t total = 0;
  std::memcpy(&total, w.data, 8);
  EXPECT_EQ(total, static_cast<std::uint64_t>(kWindow));
  const std::pair<long, long> after = answers_to(0);
  const long answers = after.first - before.first;
  const long messages = after.second - before.second;
  std::printf("rank 1 answered %ld one-sided operations of rank 0 in %ld messages\n", answers,
              messages);
  if (answers == 0) GTEST_SKIP() << "rank 0's atomics reached this rank's memory without it";
  EXPECT_EQ(answers, kWindow);
  // A progress thread of rank 1's own answers the atomics as they come, while its main thread
  // sleeps: then only the count is checked.
  const char* thread = std::getenv("FERRY_PROGRESS_THREAD");
  if (thread != nullptr && std::strcmp(thread, "1") == 0) return;
  EXPECT_LT(messages, answers) << ctx().describe_peer(0);
}

TEST(OneSided, WrongKeysAndRangesFailAndWriteNothing) {
  Window w;
  Window gone;  // registered, then deregistered: its key goes stale
  ASSERT_NO_FATAL_FAILURE(make_window(4096, std::byte{0x5a}, &w));
  ASSERT_NO_FATAL_FAILURE(make_window(4096, std::byte{0x5a}, &gone));
  std::vector<std::byte> spare(gone.data, gone.data + 4096);  // what it held
  MemoryRegion& region = w.region;
  MemoryRegion& other = gone.region;
  const std::vector<std::byte> stale_packed = other.remote_key();
  ASSERT_TRUE(other.deregister().is_ok());
  EXPECT_FALSE(other.valid());
  const std::byte* window = w.data;
  // Keys travel to the previous rank, which aims them back here.
  auto keys = exchange_keys(region);
  const RemoteKey& good = keys[static_cast<std::size_t>(next())];
  std::vector<std::byte> stale_all(stale_packed.size() * static_cast<std::size_t>(nranks()));
  ASSERT_TRUE(
      ctx()
          .world()
          .allgather(stale_packed.data(), stale_all.data(), stale_packed.size(), DataType::kUint8)
          .is_ok());
  RemoteKey stale;
  ASSERT_TRUE(
      RemoteKey::unpack(std::span<const std::byte>(stale_all.data() + next() * stale_packed.size(),
                                                   stale_packed.size()),
                        &stale)
          .is_ok());
  // Forged keys for the next rank's region: a bigger size than registered, another secret.
  const std::vector<std::byte> mine = region.remote_key();
  const std::size_t n = mine.size();
  std::vector<std::byte> all(n * static_cast<std::size_t>(nranks()));
  ASSERT_TRUE(ctx().world().allgather(mine.data(), all.data(), n, DataType::kUint8).is_ok());
  auto forge = [&](std::size_t field, std::uint64_t value) {
    std::vector<std::byte> packed(all.begin() + next() * n, all.begin() + (next() + 1) * n);
    std::memcpy(packed.data() + field, &value, sizeof(value));
    RemoteKey key;
    EXPECT_TRUE(RemoteKey::unpack(packed, &key).is_ok());
    return key;
  };
  const RemoteKey too_big = forge(32, 1u << 20);    // size field
  const RemoteKey wrong_secret = forge(24, 12345);  // secret field
  std::vector<std::byte> data(8192, std::byte{0x77});
  std::uint64_t result = 0;

  auto expect_fails = [](Request r, Code code, const char* what, const char* needle) {
    Status s = r.wait();
    EXPECT_EQ(s.code(), code) << what << ": " << s.to_string();
    EXPECT_NE(s.to_string().find(needle), std::string::npos) << what << ": " << s.to_string();
  };
  // Caught before anything is sent (the key's own size).
  expect_fails(ctx().iput(data.data(), 16, good, 4090), Code::kInvalidArgument, "past the end",
               "outside");
  expect_fails(ctx().iget(data.data(), 4097, good, 0), Code::kInvalidArgument, "too long",
               "outside");
  expect_fails(ctx().iatomic(AtomicOp::kAdd, 8, good, 4, 1), Code::kInvalidArgument, "misaligned",
               "aligned");
  expect_fails(ctx().iatomic(AtomicOp::kAdd, 2, good, 0, 1), Code::kInvalidArgument, "width",
               "width");
  expect_fails(ctx().iput(data.data(), 8, RemoteKey(), 0), Code::kInvalidArgument, "empty key",
               "rank -1");
  // The good key still works (once every rank has looked at its window).
  auto good_key_works = [&] {
    ASSERT_TRUE(ctx().barrier().is_ok());
    ASSERT_TRUE(ctx().iput(data.data(), 4096, good, 0).wait().is_ok());
    ASSERT_TRUE(ctx().barrier().is_ok());
    EXPECT_EQ(window[0], std::byte{0x77});
    EXPECT_EQ(window[4095], std::byte{0x77});
    ASSERT_TRUE(ctx().barrier().is_ok());
  };
  // Caught by the target. (Over native one-sided access too: a key the owner has not granted
  // goes by messages.)
  if (native_to(next())) {
    std::uint64_t first = 0;  // asks for the grant
    ASSERT_TRUE(ctx().iget(&first, 8, good, 0).wait().is_ok());
  }
  expect_fails(ctx().iput(data.data(), 8192, too_big, 0), Code::kInvalidArgument, "forged size",
               "outside the region");
  expect_fails(ctx().iget(data.data(), 16, too_big, 5000), Code::kInvalidArgument,
               "forged size get", "outside the region");
  expect_fails(ctx().iatomic(AtomicOp::kSwap, 8, too_big, 8192, 1, &result), Code::kInvalidArgument,
               "forged size atomic", "outside the region");
  expect_fails(ctx().iput(data.data(), 8, wrong_secret, 0), Code::kInvalidArgument, "wrong secret",
               "does not match");
  expect_fails(ctx().iget(data.data(), 8, wrong_secret, 0), Code::kInvalidArgument,
               "wrong secret get", "does not match");
  expect_fails(ctx().iput(data.data(), 8, stale, 0), Code::kInvalidArgument, "stale key",
               "no such memory region");
  expect_fails(ctx().iatomic(AtomicOp::kAdd, 4, stale, 0, 1), Code::kInvalidArgument,
               "stale key atomic", "no such memory region");

  // Each failure above is also flush's to report (the first of them), once.
  EXPECT_EQ(ctx().flush(next()).code(), Code::kInvalidArgument);
  EXPECT_TRUE(ctx().flush(next()).is_ok());
  // A put whose request was dropped: its failure comes out of flush, once.
  { Request dropped = ctx().iput(data.data(), 8, wrong_secret, 0); }
  Status flushed = ctx().flush(next());
  EXPECT_EQ(flushed.code(), Code::kInvalidArgument) << flushed.to_string();
  EXPECT_TRUE(ctx().flush(next()).is_ok());
  EXPECT_TRUE(ctx().flush_all().is_ok());
  EXPECT_EQ(ctx().flush(nranks()).code(), Code::kInvalidArgument);

  ASSERT_TRUE(ctx().barrier().is_ok());
  for (std::size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(window[i], std::byte{0x5a}) << "a refused access wrote byte " << i;
  }
  if (!g_allocate) {  // (allocated memory is gone once deregistered)
    for (std::size_t i = 0; i < 4096; ++i) {
      ASSERT_EQ(gone.own[i], std::byte{0x5a}) << "a stale key wrote byte " << i;
    }
  }
  EXPECT_EQ(spare[0], std::byte{0x5a});
  good_key_works();  // after all that

  // The same refusals right after an access through the good key succeeded: on this node a later
  // access to the region accessed last takes a shorter path (Context::iput, direct_again), which
  // must refuse them as well, write nothing and leave the good key working.
  std::vector<std::byte> other_bytes(8192, std::byte{0x11});
  ASSERT_TRUE(ctx().iput(data.data(), 8, good, 0).wait().is_ok());
  ASSERT_TRUE(ctx().iget(&result, 8, good, 8).wait().is_ok());
  expect_fails(ctx().iput(other_bytes.data(), 16, good, 4090), Code::kInvalidArgument,
               "past the end, after a good access", "outside");
  expect_fails(ctx().iget(other_bytes.data(), 4097, good, 0), Code::kInvalidArgument,
               "too long, after a good access", "outside");
  expect_fails(ctx().iput(other_bytes.data(), 8192, too_big, 0), Code::kInvalidArgument,
               "forged size, after a good access", "outside the region");
  expect_fails(ctx().iget(other_bytes.data(), 16, too_big, 5000), Code::kInvalidArgument,
               "forged size get, after a good access", "outside the region");
  expect_fails(ctx().iput(other_bytes.data(), 8, wrong_secret, 0), Code::kInvalidArgument,
               "wrong secret, after a good access", "does not match");
  expect_fails(ctx().iget(other_bytes.data(), 8, wrong_secret, 0), Code::kInvalidArgument,
               "wrong secret get, after a good access", "does not match");
  expect_fails(ctx().iatomic(AtomicOp::kAdd, 8, good, 4, 1), Code::kInvalidArgument,
               "misaligned, after a good access", "aligned");
  expect_fails(ctx().iatomic(AtomicOp::kAdd, 2, good, 0, 1), Code::kInvalidArgument,
               "width, after a good access", "width");
  expect_fails(ctx().iatomic(AtomicOp::kSwap, 8, too_big, 8192, 1, &result), Code::kInvalidArgument,
               "forged size atomic, after a good access", "outside the region");
  expect_fails(ctx().iatomic(AtomicOp::kAdd, 8, wrong_secret, 0, 1), Code::kInvalidArgument,
               "wrong secret atomic, after a good access", "does not match");
  EXPECT_EQ(ctx().flush(next()).code(), Code::kInvalidArgument);
  EXPECT_TRUE(ctx().flush(next()).is_ok());
  EXPECT_EQ(other_bytes, std::vector<std::byte>(8192, std::byte{0x11})) << "a refused get wrote";
  ASSERT_TRUE(ctx().barrier().is_ok());
  for (std::size_t i = 0; i < 4096; ++i) {
    ASSERT_EQ(window[i], std::byte{0x77}) << "a refused access wrote byte " << i;
  }
  good_key_works();
}

TEST(OneSided, AllocatedMemoryOfThisNodeNeedsNoProgressFromItsOwner) {
  // Each rank allocates a window; rank 1 then sleeps without calling ferry while rank 0 puts,
  // gets and adds there. On one node (shm) that completes at once; through messages (ofi) it
  // waits for rank 1 to wake up.
  if (nranks() < 2) GTEST_SKIP() << "needs 2 ranks";
  MemoryRegion region;
  ASSERT_TRUE(ctx().allocate_memory(8192, &region).is_ok());
  EXPECT_EQ(ctx().allocate_memory(0, &region).code(), Code::kInvalidArgument);
  auto keys = exchange_keys(region);
  const bool direct = ctx().describe_peer(1).rfind("shm", 0) == 0;
  if (me() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  } else if (me() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::byte> data(4096, std::byte{0x3c});
    std::uint64_t old = 1;
    ASSERT_TRUE(ctx().iput(data.data(), 4096, keys[1], 100).wait().is_ok());
    ASSERT_TRUE(ctx().iatomic(AtomicOp::kAdd, 8, keys[1], 8000, 9, &old).wait().is_ok());
    std::vector<std::byte> back(4096);
    Request get = ctx().iget(back.data(), 4096, keys[1], 100);
    if (direct) {
      // Done when it returns: the handle answers without progress, like any completed request.
      EXPECT_TRUE(get.test());
      EXPECT_TRUE(get.status().is_ok()) << get.status().to_string();
      EXPECT_FALSE(get.cancel());
      std::vector<Request> one;
      one.push_back(std::move(get));
      EXPECT_EQ(Request::wait_any(one), 0u);
      get = std::move(one[0]);
    }
    ASSERT_TRUE(get.wait().is_ok());
    ASSERT_TRUE(get.wait_for(0.001).is_ok());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(back, data);
    EXPECT_EQ(old, 0u);
    if (direct) {
      EXPECT_LT(ms, 150) << "rank 1's progress was needed";
    }
    ASSERT_TRUE(ctx().flush(1).is_ok());
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 1) {
    const auto* bytes = static_cast<const std::byte*>(region.address());
    EXPECT_EQ(bytes[99], std::byte{0});
    EXPECT_EQ(bytes[100], std::byte{0x3c});
    EXPECT_EQ(bytes[4195], std::byte{0x3c});
    EXPECT_EQ(bytes[4196], std::byte{0});
    std::uint64_t word = 0;
    std::memcpy(&word, bytes + 8000, 8);
    EXPECT_EQ(word, 9u);
    ASSERT_TRUE(region.deregister().is_ok());
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 0) {
    // Mapped or granted here, deregistered there: refused, and nothing is written.
    std::uint64_t v = 5;
    Status s = ctx().iput(&v, 8, keys[1], 0).wait();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.to_string().find("no such memory region"), std::string::npos) << s.to_string();
    EXPECT_EQ(ctx().iatomic(AtomicOp::kAdd, 8, keys[1], 0, 1).wait().code(),
              Code::kInvalidArgument);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

// Whether rank `peer`'s registered host memory is reached here without its owner: on its node,
// with CMA allowed (describe_peer names the zero-copy get the same probe enables).
bool registered_direct(int peer) {
  const std::string path = ctx().describe_peer(peer);
  return path.rfind("shm", 0) == 0 && path.find("zero-copy get") != std::string::npos;
}

TEST(OneSided, RegisteredMemoryOfThisNodeNeedsNoProgressFromItsOwner) {
  // Rank 1 registers and deregisters more regions than its guard table has slots (each slot must
  // come back), then registers a window and sleeps without calling ferry while rank 0 puts and
  // gets there: by CMA on one node, through rank 1's progress otherwise.
  if (nranks() < 2) GTEST_SKIP() << "needs 2 ranks";
  std::vector<std::byte> memory(8192, std::byte{0});
  if (me() == 1) {
    for (int i = 0; i < 1100; ++i) {
      MemoryRegion passing;
      ASSERT_TRUE(ctx().register_memory(memory.data() + i % 64, 64, &passing).is_ok());
      ASSERT_TRUE(passing.deregister().is_ok());
    }
  }
  MemoryRegion region;
  ASSERT_TRUE(ctx().register_memory(memory.data(), memory.size(), &region).is_ok());
  auto keys = exchange_keys(region);
  const bool direct = registered_direct(1);
  if (me() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
  } else if (me() == 0) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::byte> data(4096, std::byte{0x5a});
    ASSERT_TRUE(ctx().iput(data.data(), 4096, keys[1], 100).wait().is_ok());
    std::vector<std::byte> back(4096);
    ASSERT_TRUE(ctx().iget(back.data(), 4096, keys[1], 100).wait().is_ok());
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(back, data);
    if (direct) {
      EXPECT_LT(ms, 150) << "rank 1's progress was needed";
    }
    // Out of range and a wrong secret are still refused by the slot's check, then the owner.
    EXPECT_EQ(ctx().iput(data.data(), 4096, keys[1], 8192 - 4095).wait().code(),
              Code::kInvalidArgument);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 1) {
    EXPECT_EQ(memory[99], std::byte{0});
    EXPECT_EQ(memory[100], std::byte{0x5a});
    EXPECT_EQ(memory[4195], std::byte{0x5a});
    EXPECT_EQ(memory[4196], std::byte{0});
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(OneSided, NoPutLandsAfterDeregisterReturns) {
  // Rank 0 puts into rank 1's registered memory without pause; rank 1 deregisters meanwhile and
  // at once fills the memory with a marker. Every put after that fails, and the marker stays.
  if (nranks() < 2) GTEST_SKIP() << "needs 2 ranks";
  constexpr std::size_t kBytes = 65536;
  std::vector<std::byte> memory(kBytes, std::byte{0});
  MemoryRegion region;
  ASSERT_TRUE(ctx().register_memory(memory.data(), kBytes, &region).is_ok());
  auto keys = exchange_keys(region);
  if (me() == 1) {
    std::this_thread::sleep_for(std::chrono::milliseconds(30));
    ASSERT_TRUE(region.deregister().is_ok());
    std::fill(memory.begin(), memory.end(), std::byte{0x77});
  } else if (me() == 0) {
    std::vector<std::byte> data(kBytes, std::byte{0x11});
    int refused = 0, done = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (refused < 50 && std::chrono::steady_clock::now() < until) {
      Status s = ctx().iput(data.data(), kBytes, keys[1], 0).wait();
      if (s.is_ok()) {
        ASSERT_EQ(refused, 0) << "a put succeeded after one was refused";
        ++done;
      } else {
        ASSERT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
        ++refused;
      }
    }
    EXPECT_EQ(refused, 50);
    std::printf("%d puts before the deregistration, then %d refused\n", done, refused);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 1) {
    for (std::size_t i = 0; i < kBytes; ++i) {
      ASSERT_EQ(memory[i], std::byte{0x77}) << "a put landed after deregister at byte " << i;
    }
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

// The number after `lead` in what this rank says of `peer`, or -1.
int described(int peer, const std::string& lead) {
  const std::string text = ctx().describe_peer(peer);
  const std::size_t at = text.find(lead);
  return at == std::string::npos ? -1 : std::atoi(text.c_str() + at + lead.size());
}
// How many of `peer`'s regions this rank has been granted native access to.
int native_grants(int peer) { return described(peer, "native access granted to "); }
// How many of `peer`'s regions this rank holds a refusal of native access for (a key that was
// refused is not asked about again while its region lives).
int native_refusals(int peer) { return described(peer, " and refused for "); }
// How many of this rank's regions are registered with the network transport (when a rank first
// asks for one).
int native_registered() {
  return described(me() == 0 ? 1 : 0, "this rank's regions registered for it: ");
}

TEST(OneSided, NativeAccessIsGrantedByTheOwnerAndBadKeysLeaveThePeerUsable) {
  // Over ofi with native one-sided access: the first access through a key goes by messages and
  // asks the owner, later ones go by fi_write / fi_read. A key with a forged secret (used first,
  // and again once the real key is granted) and a stale key are never granted: they fail by
  // messages, write nothing, and the connection stays (over tcp a key the provider refuses would
  // close it).
  if (!native_job()) GTEST_SKIP() << "needs 2 ranks joined by native one-sided access";
  const int registered = native_registered();
  ASSERT_GE(registered, 0) << ctx().describe_peer(me() == 0 ? 1 : 0);
  Window w;
  Window gone;
  ASSERT_NO_FATAL_FAILURE(make_window(4096, std::byte{0x5a}, &w));
  ASSERT_NO_FATAL_FAILURE(make_window(4096, std::byte{0x5a}, &gone));
  // Registered with the network when a rank first asks, not before.
  EXPECT_EQ(native_registered(), registered);
  auto keys = exchange_keys(w.region);
  auto stale_keys = exchange_keys(gone.region);
  // Rank 1's key with its secret changed (what the provider would take as its key).
  const std::vector<std::byte> mine = w.region.remote_key();
  std::vector<std::byte> from1(mine.size());
  if (me() == 1) {
    ASSERT_TRUE(ctx().send(mine.data(), mine.size(), 0, 78).is_ok());
    ASSERT_TRUE(gone.region.deregister().is_ok());
  } else if (me() == 0) {
    ASSERT_TRUE(ctx().recv(from1.data(), from1.size(), 1, 78).is_ok());
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 0) {
    std::uint64_t secret = 0;
    std::memcpy(&secret, from1.data() + 24, 8);
    secret ^= 0x10000;
    std::memcpy(from1.data() + 24, &secret, 8);
    RemoteKey forged;
    ASSERT_TRUE(RemoteKey::unpack(from1, &forged).is_ok());
    std::vector<std::byte> data(64, std::byte{0x66});
    auto bad_keys_fail = [&](const char* when) {
      for (int i = 0; i < 4; ++i) {
        Status s = i == 0   ? ctx().iput(data.data(), 64, forged, 0).wait()
                   : i == 1 ? ctx().iget(data.data(), 64, forged, 0).wait()
                   : i == 2 ? ctx().iput(data.data(), 64, forged, 0).wait()
                            : ctx().iput(data.data(), 64, stale_keys[1], 0).wait();
        EXPECT_EQ(s.code(), Code::kInvalidArgument)
            << when << ", access " << i << ": " << s.to_string();
        std::printf("bad key %s, access %d: %s\n", when, i, s.to_string().c_str());
      }
      EXPECT_EQ(data[0], std::byte{0x66}) << "a refused get wrote here";
      EXPECT_EQ(ctx().flush(1).code(), Code::kInvalidArgument);
    };
    const int before = native_grants(1);
    ASSERT_GE(before, 0) << ctx().describe_peer(1);
    const int refusals = native_refusals(1);
    ASSERT_GE(refusals, 0) << ctx().describe_peer(1);
    bad_keys_fail("before the real key");
    EXPECT_EQ(native_grants(1), before) << ctx().describe_peer(1);
    // The forged key's refusal is kept (its region lives); the stale key's is dropped once an
    // access through it finds the region gone.
    EXPECT_EQ(native_refusals(1), refusals + 1) << ctx().describe_peer(1);
    std::vector<std::byte> good(64, std::byte{0x77});
    ASSERT_TRUE(ctx().iput(good.data(), 64, keys[1], 64).wait().is_ok());  // asks
    for (int i = 0; i < 100 && native_grants(1) == before; ++i) {
      ASSERT_TRUE(ctx().iput(good.data(), 64, keys[1], 64).wait().is_ok());
    }
    EXPECT_EQ(native_grants(1), before + 1) << ctx().describe_peer(1);
    ASSERT_TRUE(ctx().iput(good.data(), 64, keys[1], 128).wait().is_ok());  // natively
    bad_keys_fail("after");
    EXPECT_EQ(native_refusals(1), refusals) << ctx().describe_peer(1);
    // The peer is still there, and still reached natively through the good key.
    std::vector<std::byte> back(64);
    ASSERT_TRUE(ctx().iget(back.data(), 64, keys[1], 128).wait().is_ok());
    EXPECT_EQ(back[0], std::byte{0x77});
    EXPECT_EQ(native_grants(1), before + 1) << ctx().describe_peer(1);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 1) {
    EXPECT_EQ(native_registered(), registered + 1);  // w, asked for by rank 0
    for (std::size_t i = 0; i < 4096; ++i) {
      const std::byte expected = i >= 64 && i < 192 ? std::byte{0x77} : std::byte{0x5a};
      ASSERT_EQ(w.data[i], expected) << "byte " << i;
      if (!g_allocate) {
        ASSERT_EQ(gone.data[i], std::byte{0x5a}) << "a stale key wrote byte " << i;
      }
    }
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(OneSided, DeregisterWaitsForTheRanksGrantedNativeAccess) {
  // The owner's deregister revokes the grants and returns only once each granted rank has
  // answered that none of its accesses to the region is in flight; a rank that does not call
  // ferry answers when it next does. Afterwards the key fails by messages.
  if (!native_job()) GTEST_SKIP() << "needs 2 ranks joined by native one-sided access";
  Window w;
  ASSERT_NO_FATAL_FAILURE(make_window(4096, std::byte{0}, &w));
  auto keys = exchange_keys(w.region);
  std::uint64_t v = 42;
  int before = 0;
  if (me() == 0) {
    before = native_grants(1);
    for (int i = 0; i < 100 && native_grants(1) == before; ++i) {
      ASSERT_TRUE(ctx().iput(&v, 8, keys[1], 0).wait().is_ok());
    }
    ASSERT_EQ(native_grants(1), before + 1) << ctx().describe_peer(1);
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
  if (me() == 1) {
    // Once rank 0 has left the barrier (it may still be in it when this rank leaves).
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_TRUE(w.region.deregister().is_ok());
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::printf("deregister returned after %.3f s\n", s);
    EXPECT_GT(s, 0.3) << "deregister did not wait for rank 0's answer";
  } else if (me() == 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1000));  // no call into ferry
  }
  ASSERT_TRUE(ctx().barrier().is_ok());  // rank 0 answers the revoke in here
  if (me() == 0) {
    EXPECT_EQ(native_grants(1), before) << ctx().describe_peer(1);
    Status s = ctx().iput(&v, 8, keys[1], 0).wait();
    EXPECT_EQ(s.code(), Code::kInvalidArgument) << s.to_string();
    EXPECT_NE(s.to_string().find("no such memory region"), std::string::npos) << s.to_string();
  }
  ASSERT_TRUE(ctx().barrier().is_ok());
}

TEST(OneSided, ZeroBytesAndBadPackedKeys) {
  std::uint64_t word = 0;
  MemoryRegion region;
  ASSERT_TRUE(ctx().register_memory(&word, sizeof(word), &region).is_ok());
  auto keys = exchange_keys(region);
  EXPECT_TRUE(ctx().iput(nullptr, 0, keys[static_cast<std::size_t>(next())], 8).wait().is_ok());
  EXPECT_TRUE(ctx().iget(nullptr, 0, keys[static_cast<std::size_t>(next())], 0).wait().is_ok());
  std::vector<std::byte> packed = region.remote_key();
  RemoteKey key;
  EXPECT_EQ(RemoteKey::unpack(std::span(packed).first(packed.size() - 1), &key).code(),
            Code::kInvalidArgument);
  packed[0] ^= std::byte{1};
  EXPECT_EQ(RemoteKey::unpack(packed, &key).code(), Code::kInvalidArgument);
  MemoryRegion none;
  EXPECT_EQ(ctx().register_memory(nullptr, 8, &none).code(), Code::kInvalidArgument);
  EXPECT_EQ(ctx().register_memory(&word, 0, &none).code(), Code::kInvalidArgument);
  EXPECT_FALSE(none.valid());
  ASSERT_TRUE(ctx().barrier().is_ok());
}

}  // namespace
}  // namespace ferry

int main(int argc, char** argv) {
  return ferry::test::run_on_every_rank(argc, argv, "rma_test", 1, [](ferry::Context&) {
    const char* allocate = std::getenv("RMA_TEST_ALLOCATE");
    ferry::g_allocate = allocate != nullptr && std::string(allocate) == "1";
    const char* native = std::getenv("RMA_TEST_NATIVE");
    ferry::g_native = native != nullptr && std::string(native) == "1";
  });
}
