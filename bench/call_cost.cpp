// What one call into ferry costs its caller, in a loop of many: an idle progress(), and 8-byte
// iput, iget and iatomic on a peer's memory from allocate_memory (direct access on one node).
// Rank 0 measures while rank 1 waits in a barrier. Run: ferryrun -n 2 build/bench/call_cost
// [CALLS] (FERRY_THREADS=single for the calls without the lock). Best of three passes, ns per call.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

void require(const ferry::Status& status, const char* what) {
  if (!status) {
    std::fprintf(stderr, "call_cost: %s: %s\n", what, status.to_string().c_str());
    std::exit(1);
  }
}

template <typename Call>
double best_ns(long calls, Call&& call) {
  double best = 1e30;
  for (int pass = 0; pass < 3; ++pass) {
    const auto start = std::chrono::steady_clock::now();
    for (long i = 0; i < calls; ++i) call(i);
    const double ns =
        std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - start).count();
    best = std::min(best, ns / static_cast<double>(calls));
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  const long calls = argc > 1 ? std::atol(argv[1]) : 10000000;
  ferry::Context ctx = ferry::Context::init();
  if (ctx.size() != 2) {
    std::fprintf(stderr, "call_cost: run it as 2 ranks (ferryrun -n 2)\n");
    return 2;
  }
  const int peer = 1 - ctx.rank();
  ferry::MemoryRegion region;
  require(ctx.allocate_memory(4096, &region), "allocate_memory");
  std::vector<std::byte> mine = region.remote_key(), theirs(mine.size());
  require(ctx.send(mine.data(), mine.size(), peer, 1), "key send");
  require(ctx.recv(theirs.data(), theirs.size(), peer, 1), "key recv");
  ferry::RemoteKey key;
  require(ferry::RemoteKey::unpack(theirs, &key), "unpack");
  require(ctx.barrier(), "barrier");
  if (ctx.rank() == 0) {
    std::uint64_t word = 0;
    const double progress = best_ns(calls, [&](long) { ctx.progress(); });
    const double put = best_ns(calls, [&](long i) {
      word = static_cast<std::uint64_t>(i);
      ctx.iput(&word, sizeof word, key, 64);
    });
    const double get = best_ns(calls, [&](long) { ctx.iget(&word, sizeof word, key, 64); });
    const double add =
        best_ns(calls, [&](long) { ctx.iatomic(ferry::AtomicOp::kAdd, 8, key, 128, 1); });
    std::printf(
        "ns per call (best of 3 x %ld): progress %.2f, iput 8 B %.2f, iget 8 B %.2f, "
        "iatomic add %.2f\n",
        calls, progress, put, get, add);
  }
  require(ctx.barrier(), "barrier");
  return 0;
}
