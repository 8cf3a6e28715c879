// ferry-soak: every rank exchanges random traffic with random peers for a bounded time (random
// sizes across the inline, eager and rendezvous ranges, random tags, wildcard and specific
// receives, cancels) and checks every byte. Rank 0 prints messages sent, received, lost and
// corrupted; the exit status is non-zero if any was lost or corrupted.
//   ferryrun -n 8 ferry-soak [--seconds S] [--max-size BYTES] [--seed N]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

using Clock = std::chrono::steady_clock;

// Tag layout: kind in the top byte, round in the next two, then the sender and a sequence number.
constexpr ferry::Tag kData = 1, kEnd = 2, kControl = 3, kStats = 4, kNever = 5;
ferry::Tag tag(ferry::Tag kind, std::uint64_t round, std::uint64_t low = 0) {
  return (kind << 56) | ((round & 0xffff) << 40) | (low & 0xffffffffffULL);
}
constexpr ferry::Tag kRoundMask = (ferry::Tag{0xff} << 56) | (ferry::Tag{0xffff} << 40);

struct Header {
  std::uint32_t source, destination, round, seq;
  std::uint64_t size;
};

std::byte pattern(std::size_t i, const Header& h) {
  return static_cast<std::byte>(
      (i * 2654435761u + h.source * 97 + h.destination * 31 + h.round * 7 + h.seq * 13) >> 3);
}

struct Stats {
  std::uint64_t sent = 0, received = 0, lost = 0, corrupted = 0, cancels = 0, bytes = 0;
};

[[noreturn]] void usage(const char* error) {
  std::fprintf(stderr,
               "ferry-soak: %s\nusage: ferryrun -n N ferry-soak [--seconds S] "
               "[--max-size BYTES] [--seed N]\n",
               error);
  std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 10;
  std::size_t max_size = 300000;
  unsigned seed = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (i + 1 >= argc) usage(("bad or incomplete argument '" + a + "'").c_str());
    char* end = nullptr;
    double v = std::strtod(argv[++i], &end);
    if (*end != '\0' || v < 0) usage(("bad value for " + a).c_str());
    if (a == "--seconds")
      seconds = v;
    else if (a == "--max-size")
      max_size = static_cast<std::size_t>(v);
    else if (a == "--seed")
      seed = static_cast<unsigned>(v);
    else
      usage(("unknown argument '" + a + "'").c_str());
  }
  if (max_size < sizeof(Header)) max_size = sizeof(Header);
  ferry::Context ctx = ferry::Context::init();
  const int me = ctx.rank(), n = ctx.size();
  std::mt19937_64 rng(seed * 1000003ULL + static_cast<unsigned>(me));
  Stats stats;
  const auto start = Clock::now();
  std::vector<std::byte> in(max_size);
  std::uint32_t round = 0;
  for (;; ++round) {
    // Rank 0 decides whether there is another round, so every rank stops after the same one.
    std::uint8_t go = 0;
    if (me == 0) {
      go = std::chrono::duration<double>(Clock::now() - start).count() < seconds ? 1 : 0;
      for (int r = 1; r < n; ++r) ctx.send(&go, 1, r, tag(kControl, round));
    } else {
      ctx.recv(&go, 1, 0, tag(kControl, round));
    }
    if (go == 0) break;
    // Sends: a random number of messages to each peer (itself included), sizes log-uniform.
    std::vector<std::vector<std::byte>> outs;
    std::vector<ferry::Request> sends;
    std::vector<std::uint32_t> counts(static_cast<std::size_t>(n));
    for (int d = 0; d < n; ++d) {
      counts[static_cast<std::size_t>(d)] = static_cast<std::uint32_t>(rng() % 20);
      for (std::uint32_t s = 0; s < counts[static_cast<std::size_t>(d)]; ++s) {
        double log_size =
            std::uniform_real_distribution<double>(0, std::log2(double(max_size)))(rng);
        std::size_t size = std::max(sizeof(Header), static_cast<std::size_t>(std::exp2(log_size)));
        Header h{static_cast<std::uint32_t>(me), static_cast<std::uint32_t>(d), round, s, size};
        std::vector<std::byte> out(size);
        std::memcpy(out.data(), &h, sizeof(h));
        for (std::size_t i = sizeof(h); i < size; ++i) out[i] = pattern(i, h);
        outs.push_back(std::move(out));
        sends.push_back(ctx.isend(outs.back().data(), size, d, tag(kData, round, rng() % 1000)));
        ++stats.sent;
      }
      sends.push_back(ctx.isend(&counts[static_cast<std::size_t>(d)], 4, d, tag(kEnd, round, me)));
    }
    // A receive that nothing matches, canceled: it must go away without taking a message.
    ferry::Request never = ctx.irecv(in.data(), in.size(), ferry::kAnySource, tag(kNever, round));
    if (never.cancel()) ++stats.cancels;
    // Receives: the end-of-round counts from everyone (specific sources), and data from any source
    // with any tag of this round (the mask ignores the low bits).
    std::vector<std::uint32_t> expected(static_cast<std::size_t>(n), 0),
        got(static_cast<std::size_t>(n), 0);
    for (int s = 0; s < n; ++s) {
      ferry::Status st =
          ctx.recv(&expected[static_cast<std::size_t>(s)], 4, s, tag(kEnd, round, s));
      if (!st) {
        std::fprintf(stderr, "rank %d: %s\n", me, st.to_string().c_str());
        return 1;
      }
    }
    std::uint64_t want = 0;
    for (auto e : expected) want += e;
    while (want > 0) {
      ferry::Request r =
          ctx.irecv(in.data(), in.size(), ferry::kAnySource, tag(kData, round), kRoundMask);
      if (r.wait_for(60).code() == ferry::Code::kTimeout && r.cancel()) {
        stats.lost += want;
        std::fprintf(stderr, "rank %d: round %u: %llu messages never arrived\n", me, round,
                     static_cast<unsigned long long>(want));
        break;
      }
      ferry::MessageInfo info = r.info();
      Header h{};
      bool ok = r.status().is_ok() && info.bytes >= sizeof(h);
      if (ok) std::memcpy(&h, in.data(), sizeof(h));
      ok = ok && h.size == info.bytes && h.destination == static_cast<std::uint32_t>(me) &&
           h.round == round && h.source == static_cast<std::uint32_t>(info.source) &&
           h.seq == got[static_cast<std::size_t>(info.source)];  // per-sender order kept
      for (std::size_t i = sizeof(h); ok && i < info.bytes; ++i) ok = in[i] == pattern(i, h);
      ++got[static_cast<std::size_t>(info.source)];
      ++stats.received;
      stats.bytes += info.bytes;
      if (!ok) ++stats.corrupted;
      --want;
    }
    if (!ferry::Request::wait_all(sends)) ++stats.lost;
  }
  // Totals to rank 0.
  if (me != 0) {
    ctx.send(&stats, sizeof(stats), 0, tag(kStats, 0));
  } else {
    Stats total = stats;
    for (int r = 1; r < n; ++r) {
      Stats s;
      ctx.recv(&s, sizeof(s), r, tag(kStats, 0));
      total.sent += s.sent;
      total.received += s.received;
      total.lost += s.lost;
      total.corrupted += s.corrupted;
      total.cancels += s.cancels;
      total.bytes += s.bytes;
    }
    total.lost += total.sent - std::min(total.sent, total.received);
    double elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    std::printf(
        "ferry-soak: %d ranks, %u rounds in %.1f s: sent %llu, received %llu, lost %llu, "
        "corrupted %llu, cancels %llu, %.1f MB checked\n",
        n, round, elapsed, static_cast<unsigned long long>(total.sent),
        static_cast<unsigned long long>(total.received),
        static_cast<unsigned long long>(total.lost),
        static_cast<unsigned long long>(total.corrupted),
        static_cast<unsigned long long>(total.cancels), total.bytes / 1e6);
    std::fflush(stdout);
    if (total.lost != 0 || total.corrupted != 0) return 1;
  }
  return 0;
}
