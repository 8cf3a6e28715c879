// Fault-tolerant communicators (Communicator::revoke, agree, shrink) under
// `ferryrun --keep-going -n 4`, one scenario per run (resilience_test.sh): ranks die before,
// during (FERRY_TEST_CRASH_AT=mid-revoke|mid-agree|mid-decide) and after each call, or end their
// Context without joining, and the survivors must fail what waits, agree alike, shrink alike and
// go on with correct results.
// Each survivor prints "rank R: SCENARIO, N failures"; the exit status is the failure count.
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

using Clock = std::chrono::steady_clock;
int failures = 0;
int me = -1;

void expect(bool ok, const std::string& what) {
  if (!ok) {
    ++failures;
    std::fprintf(stderr, "rank %d: FAIL: %s\n", me, what.c_str());
  }
}

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

void die() { ::kill(::getpid(), SIGKILL); }

// An allreduce (sum of each member's rank + 1) that must give the right answer on `comm`.
void expect_working(ferry::Communicator& comm, const std::string& where, std::size_t count = 1) {
  std::vector<std::int64_t> in(count, comm.rank() + 1), out(count, -1);
  const ferry::Status s =
      comm.allreduce(in.data(), out.data(), count, ferry::DataType::kInt64, ferry::ReduceOp::kSum);
  const std::int64_t n = comm.size();
  expect(s.is_ok() && out.front() == n * (n + 1) / 2 && out.back() == out.front(),
         where + ": allreduce on " + std::to_string(n) + " members: " + s.to_string() + ", got " +
             std::to_string(out.front()));
}

// Every survivor must have decided alike: the flag and the failed set (as a bit mask, here on
// at most 64 members) are the same everywhere, checked by a min and a max over `comm`.
void expect_same_everywhere(ferry::Communicator& comm, std::uint64_t flag,
                            const std::vector<int>& failed, const std::string& where) {
  std::uint64_t mask = 0;
  for (int m : failed) mask |= std::uint64_t{1} << m;
  std::uint64_t mine[2] = {flag, mask}, low[2] = {0, 0}, high[2] = {0, 0};
  ferry::Status a = comm.allreduce(mine, low, 2, ferry::DataType::kUint64, ferry::ReduceOp::kMin);
  ferry::Status b = comm.allreduce(mine, high, 2, ferry::DataType::kUint64, ferry::ReduceOp::kMax);
  expect(
      a.is_ok() && b.is_ok() && low[0] == high[0] && low[1] == high[1],
      where + ": the survivors decided differently (" + a.to_string() + ", " + b.to_string() + ")");
}

// Waits (progressing) until `comm` is known revoked here, at most `seconds`.
bool learns_revoked(ferry::Communicator& comm, double seconds) {
  const auto start = Clock::now();
  while (!comm.revoked()) {
    if (ms_since(start) > seconds * 1000) return false;
    ::usleep(1000);
  }
  return true;
}

// A collective on `comm` that is blocked (rank 0 never joins it) fails with kRevoked once rank 0
// revokes it; `large` takes the message algorithms, small ones go through the node's area.
void blocked_collective_is_revoked(ferry::Context& ctx, ferry::Communicator comm, bool large,
                                   const char* what) {
  const std::size_t count = large ? (1u << 18) : 1;
  std::vector<std::int64_t> in(count, 1), out(count, 0);
  if (ctx.rank() == 0) {
    ::usleep(200000);
    expect(comm.revoke().is_ok(), std::string(what) + ": revoke");
  } else {
    const auto start = Clock::now();
    const ferry::Status s = comm.allreduce(in.data(), out.data(), count, ferry::DataType::kInt64,
                                           ferry::ReduceOp::kSum);
    const double waited = ms_since(start);
    expect(s.code() == ferry::Code::kRevoked &&
               s.message().find("revoked by rank 0") != std::string::npos,
           std::string(what) + ": blocked allreduce gave " + s.to_string());
    expect(waited < 2000, std::string(what) + ": the revoke took " + std::to_string(waited) +
                              " ms to end the allreduce");
  }
  // Every member knows it now; every call fails at once, blocking and non-blocking.
  expect(learns_revoked(comm, 2), std::string(what) + ": revoked() stays false");
  expect(comm.barrier().code() == ferry::Code::kRevoked,
         std::string(what) + ": a barrier after the revoke");
  ferry::Request r =
      comm.iallreduce(in.data(), out.data(), 1, ferry::DataType::kInt64, ferry::ReduceOp::kSum);
  expect(r.wait().code() == ferry::Code::kRevoked,
         std::string(what) + ": an iallreduce after the revoke");
}

// No deaths: revoke ends blocked collectives on every path, then agree and shrink still work.
void revoke_scenario(ferry::Context& ctx) {
  ferry::Communicator world = ctx.world();
  expect_working(world, "before");
  blocked_collective_is_revoked(ctx, world.split(0, ctx.rank()), false, "small (node area)");
  blocked_collective_is_revoked(ctx, world.split(0, ctx.rank()), true, "large (messages)");

  // A pending non-blocking collective fails too; the revoke comes from the last rank.
  ferry::Communicator comm = world.split(0, ctx.rank());
  std::int64_t one = 1, sum = 0;
  ferry::Request pending;
  if (ctx.rank() != 0) {
    pending = comm.iallreduce(&one, &sum, 1, ferry::DataType::kInt64, ferry::ReduceOp::kSum);
  }
  world.barrier();
  if (ctx.rank() == ctx.size() - 1) comm.revoke();
  if (ctx.rank() != 0) {
    const ferry::Status s = pending.wait();
    expect(s.code() == ferry::Code::kRevoked, "pending iallreduce gave " + s.to_string());
  }

  // agree and shrink work on the revoked communicator; nobody failed.
  std::uint64_t flag = ~(std::uint64_t{1} << ctx.rank());
  std::vector<int> failed = {42};
  const ferry::Status a = comm.agree(&flag, &failed);
  const std::uint64_t all = (std::uint64_t{1} << ctx.size()) - 1;
  expect(a.is_ok() && flag == ~all && failed.empty(),
         "agree on a revoked communicator: " + a.to_string() + ", flag " + std::to_string(flag));
  ferry::Communicator shrunk = comm.shrink();
  expect(shrunk.size() == ctx.size() && shrunk.rank() == ctx.rank(), "shrink with no deaths");
  expect_working(shrunk, "after shrink", 4096);
  expect_working(world, "world after revoking others");
}

// `next`, the result of a shrink without rank `victim`: every other rank is a member, and
// allreduce, split and barrier work on it.
void expect_shrunk_without(const ferry::Context& ctx, ferry::Communicator& next, int victim) {
  expect(next.size() == ctx.size() - 1, "shrink: " + std::to_string(next.size()) + " members");
  for (int m = 0; m < next.size(); ++m) {
    expect(next.world_rank(m) != victim, "the victim is a member after shrink");
  }
  expect_working(next, "after shrink", 4096);
  const ferry::Communicator half = next.split(next.rank() % 2, next.rank());
  expect(half.valid() && half.size() >= 1, "split after shrink");
  expect(next.barrier().is_ok(), "barrier after shrink");
}

// Rank `victim` dies at `when` ("before" the call, "after" a first agreement), or ("departs")
// ends its Context, alive, and stays so until the others are done; the survivors agree, shrink
// and go on.
void death_scenario(ferry::Context& ctx, const std::string& call, const std::string& when,
                    int victim) {
  ferry::Communicator world = ctx.world();
  expect_working(world, "before");
  std::uint64_t flag = ~(std::uint64_t{1} << ctx.rank());
  std::vector<int> failed;
  if (when == "after") {
    const ferry::Status s = world.agree(&flag, &failed);
    expect(s.is_ok() && failed.empty(), "agree before the death: " + s.to_string());
    flag = ~(std::uint64_t{1} << ctx.rank());
  }
  const bool departs = when == "departs";
  if (departs && ctx.rank() == victim) {
    world = ferry::Communicator();
    { ferry::Context gone = std::move(ctx); }
    ::sleep(4);
    return;
  }
  if (when != "during" && ctx.rank() == victim) die();  // "during": FERRY_TEST_CRASH_AT kills it
  if (when != "during") {
    // The survivors see it fail a collective first, as an application would.
    std::int64_t x = 1, y = 0;
    const ferry::Status s =
        world.allreduce(&x, &y, 1, ferry::DataType::kInt64, ferry::ReduceOp::kSum);
    // kRevoked where a faster survivor revoked it first; kCanceled from one that finalized.
    expect(s.code() == (departs ? ferry::Code::kCanceled : ferry::Code::kPeerFailed) ||
               s.code() == ferry::Code::kRevoked,
           "allreduce without a member: " + s.to_string());
    world.revoke();
  }
  const auto start = Clock::now();
  ferry::Communicator next;
  if (call == "agree") {
    const ferry::Status s = world.agree(&flag, &failed);
    expect(s.is_ok(), "agree: " + s.to_string());
    // A victim that dies during the call may be decided alive (it died after the decision was
    // made, if not yet known); before the call it is failed for every survivor.
    const bool named = failed.size() == 1 && failed[0] == victim;
    expect(named || (when == "during" && failed.empty()),
           "agree: failed has " + std::to_string(failed.size()) + " members, not rank " +
               std::to_string(victim));
    // Every survivor's bit is clear; the victim's is clear when its contribution got out.
    for (int r = 0; r < ctx.size(); ++r) {
      if (r != victim) expect((flag >> r & 1) == 0, "agree: rank " + std::to_string(r) + "'s flag");
    }
    next = world.shrink();
    expect_same_everywhere(next, flag, failed, "agree");
  } else {
    next = world.shrink();
  }
  const double took = ms_since(start);
  expect_shrunk_without(ctx, next, victim);
  std::printf("rank %d: %s %s took %.1f ms\n", ctx.rank(), call.c_str(), when.c_str(), took);
}

// FERRY_TEST_CRASH_AT=mid-revoke on rank 0: it revokes and dies having told one member; the
// others learn it from that one.
void revoke_death_scenario(ferry::Context& ctx) {
  ferry::Communicator world = ctx.world();
  ferry::Communicator comm = world.split(0, ctx.rank());
  expect_working(comm, "before");
  if (ctx.rank() == 0) comm.revoke();  // dies inside
  expect(learns_revoked(comm, 2), "the revoke did not reach this rank");
  ferry::Communicator next = comm.shrink();
  expect(next.size() == ctx.size() - 1, "shrink after the revoker died");
  expect_working(next, "after shrink");
}

// FERRY_TIMEOUT=1: the last rank never joins two collectives; the others' errors say which
// call of which communicator timed out and who had not arrived.
void never_arrives_scenario(ferry::Context& ctx) {
  ferry::Communicator world = ctx.world();
  ferry::Communicator comm = world.split(0, ctx.rank());
  expect_working(world, "before");
  const int late = ctx.size() - 1;
  if (ctx.rank() != late) {
    std::int64_t x = 1, y = 0;
    ferry::Status s = world.allreduce(&x, &y, 1, ferry::DataType::kInt64, ferry::ReduceOp::kSum);
    const std::string rank = "rank " + std::to_string(late) + ")";
    expect(s.code() == ferry::Code::kTimeout &&
               s.message().find("on communicator 0") != std::string::npos &&
               s.message().find("not arrived: member " + std::to_string(late) + " (" + rank) !=
                   std::string::npos,
           "small allreduce: " + s.to_string());
    std::vector<std::int64_t> big(1 << 17, 1), out(1 << 17);
    s = comm.allreduce(big.data(), out.data(), big.size(), ferry::DataType::kInt64,
                       ferry::ReduceOp::kSum);
    // A member that timed out first withdraws, which another may see before its own timeout.
    expect(!s.is_ok() && s.message().find("allreduce #0 on communicator ") == 0 &&
               (s.code() != ferry::Code::kTimeout ||
                s.message().find("not arrived: ") != std::string::npos),
           "large allreduce: " + s.to_string());
  } else {
    ::sleep(3);
  }
  expect(ctx.barrier().is_ok(), "barrier at the end");
}

// Run across two nodes (netns_test.sh: ranks 2 and 3 on the second) with FERRY_KEEPALIVE far
// longer than the bound: rank 3 dies, and ranks 0 and 1, which only wait to receive from it,
// must learn it within a second from rank 2, which saw it exit on its node.
void death_notice_scenario(ferry::Context& ctx) {
  expect(ctx.size() == 4, "needs 4 ranks");
  expect(ctx.barrier().is_ok(), "barrier");
  if (ctx.rank() == 3) die();
  char byte = 0;
  if (ctx.rank() == 2) {
    // Sees it by its pid, then waits (progressing, so the notice goes out) for rank 0's word.
    expect(ctx.recv(&byte, 1, 3, 7).code() == ferry::Code::kPeerFailed, "rank 2's receive");
    expect(ctx.recv(&byte, 1, 0, 8).is_ok(), "rank 0's word");
  }
  if (ctx.rank() < 2) {
    const auto start = Clock::now();
    const ferry::Status s = ctx.recv(&byte, 1, 3, 7);
    const double waited = ms_since(start);
    expect(s.code() == ferry::Code::kPeerFailed && waited < 1000,
           "receive from the dead rank: " + s.to_string() + " after " + std::to_string(waited) +
               " ms");
    std::printf("rank %d: death seen in %.1f ms: %s\n", ctx.rank(), waited, s.message().c_str());
    if (ctx.rank() == 0) expect(ctx.send(&byte, 1, 2, 8).is_ok(), "the word to rank 2");
  }
}

// The last rank looks at the job's wait board (Context::wait_report) while the others wait for
// it in a barrier of the world communicator, then joins them. "stuck": it never joins, and
// ferryrun's --timeout prints the board.
void report_scenario(ferry::Context& ctx, bool stuck) {
  ferry::Communicator world = ctx.world();
  expect_working(world, "before");
  const int late = ctx.size() - 1;
  if (ctx.rank() == late) {
    if (stuck) ::sleep(60);
    ::usleep(500000);
    const std::string report = ctx.wait_report();
    for (int r = 0; r < late; ++r) {
      const std::string line = "rank " + std::to_string(r) + ": waiting ";
      const std::size_t at = report.find(line);
      const std::size_t end = report.find('\n', at);
      const std::string text = at == std::string::npos ? "" : report.substr(at, end - at);
      expect(text.find("barrier") != std::string::npos &&
                 text.find("on communicator 0") != std::string::npos &&
                 text.find("rank " + std::to_string(late) + ")") != std::string::npos,
             "the report's line for rank " + std::to_string(r) + ": '" + text + "' in\n" + report);
    }
    expect(
        report.find("rank " + std::to_string(late) + ": not waiting in ferry") != std::string::npos,
        "the report's line for this rank:\n" + report);
  }
  expect(world.barrier().is_ok(), "the barrier");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(
        stderr,
        "usage: %s revoke | revoke-death | never-arrives | death-notice | report | stuck | "
        "agree|shrink "
        "before|during|after|departs "
        "[VICTIM]\n",
        argv[0]);
    return 2;
  }
  const std::string scenario = argv[1];
  try {
    ferry::Context ctx = ferry::Context::init();
    me = ctx.rank();
    if (scenario == "revoke") {
      revoke_scenario(ctx);
    } else if (scenario == "report" || scenario == "stuck") {
      report_scenario(ctx, scenario == "stuck");
    } else if (scenario == "death-notice") {
      death_notice_scenario(ctx);
    } else if (scenario == "never-arrives") {
      never_arrives_scenario(ctx);
    } else if (scenario == "revoke-death") {
      revoke_death_scenario(ctx);
    } else if ((scenario == "agree" || scenario == "shrink") && argc >= 3) {
      death_scenario(ctx, scenario, argv[2], argc >= 4 ? std::atoi(argv[3]) : ctx.size() - 1);
    } else {
      std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
      return 2;
    }
    std::string name = scenario;
    for (int i = 2; i < argc; ++i) name += std::string(" ") + argv[i];
    std::printf("rank %d: %s, %d failures\n", me, name.c_str(), failures);
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "rank %d: FAIL: %s\n", me, e.what());
    return 1;
  }
  return failures;
}
