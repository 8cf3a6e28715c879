// What tag matching costs with long queues, through the public API in a job of one process:
// N eager messages sent to this rank with tags 0..N-1 and received in reverse tag order (each
// receive's match is the last of the unexpected queue), then N receives posted in order and met
// by messages in reverse order (each message's match is the last posted receive).
// Run: build/bench/matching_cost [N] (default 100000). Prints seconds for each half.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ferry/ferry.hpp"

int main(int argc, char** argv) {
  const long n = argc > 1 ? std::atol(argv[1]) : 100000;
  ferry::Context ctx = ferry::Context::init();
  using Clock = std::chrono::steady_clock;
  std::uint64_t value = 0;
  auto start = Clock::now();
  for (long i = 0; i < n; ++i) {
    if (!ctx.send(&value, sizeof(value), 0, static_cast<ferry::Tag>(i))) return 1;
  }
  for (long i = n - 1; i >= 0; --i) {
    if (!ctx.recv(&value, sizeof(value), 0, static_cast<ferry::Tag>(i))) return 1;
  }
  const double unexpected = std::chrono::duration<double>(Clock::now() - start).count();
  start = Clock::now();
  std::vector<ferry::Request> receives;
  std::vector<std::uint64_t> values(static_cast<std::size_t>(n));
  for (long i = 0; i < n; ++i) {
    receives.push_back(ctx.irecv(&values[static_cast<std::size_t>(i)], sizeof(value), 0,
                                 static_cast<ferry::Tag>(i)));
  }
  for (long i = n - 1; i >= 0; --i) {
    if (!ctx.send(&value, sizeof(value), 0, static_cast<ferry::Tag>(i))) return 1;
  }
  if (!ferry::Request::wait_all(receives)) return 1;
  const double posted = std::chrono::duration<double>(Clock::now() - start).count();
  std::printf(
      "%ld messages: unexpected, taken in reverse tag order %.3f s; posted, met in "
      "reverse order %.3f s\n",
      n, unexpected, posted);
  return 0;
}
