// An application's own event loop: rank 0 sleeps in poll() on ferry's event_fd() (beside the
// descriptors it already watches) until a peer's message arrives, instead of spinning in
// ferry. The other ranks send after a pause. Run: ferryrun -n 3 build/examples/poll_loop
#include <poll.h>
#include <unistd.h>

#include <cstdio>
#include <vector>

#include "ferry/ferry.hpp"

int main() {
  try {
    ferry::Context ctx = ferry::Context::init();
    if (ctx.rank() != 0) {
      ::usleep(200000 * ctx.rank());
      const int value = ctx.rank();
      return ctx.send(&value, sizeof(value), 0, 7).is_ok() ? 0 : 1;
    }
    std::vector<int> values(ctx.size());
    std::vector<ferry::Request> receives;
    for (int peer = 1; peer < ctx.size(); ++peer) {
      receives.push_back(ctx.irecv(&values[peer], sizeof(int), peer, 7));
    }
    int received = 0, sleeps = 0;
    while (received < ctx.size() - 1) {
      received = 0;
      for (ferry::Request& r : receives) received += r.test() ? 1 : 0;
      if (received == ctx.size() - 1) break;
      // arm(): false if work came meanwhile (progress instead of sleeping). Messages from other
      // nodes ring nothing: the timeout bounds the wait for those.
      if (ctx.arm()) {
        pollfd fds[] = {{ctx.event_fd(), POLLIN, 0}};
        ::poll(fds, 1, /*timeout_ms=*/100);
        ++sleeps;
      }
      ctx.progress();
    }
    for (int peer = 1; peer < ctx.size(); ++peer) {
      if (!receives[peer - 1].status() || values[peer] != peer) return 1;
    }
    std::printf("rank 0: %d messages after %d sleeps in poll()\n", received, sleeps);
    return 0;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "poll_loop: %s\n", e.what());
    return 1;
  }
}
