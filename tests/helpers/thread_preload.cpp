// Preloaded into ferryrun by tests/scripts/ferryrun_test.sh: starts a thread that blocks no signal
// and sleeps, as the library a tool injects may (compute-sanitizer's does). The kernel then hands
// a process-directed signal that ferryrun's own thread blocks (SIGCHLD, SIGTERM) to this thread.
#include <pthread.h>
#include <unistd.h>

namespace {

void* sleep_forever(void*) {
  for (;;) ::pause();
}

[[gnu::constructor]] void start_sleeper() {
  pthread_t thread;
  if (::pthread_create(&thread, nullptr, sleep_forever, nullptr) == 0) ::pthread_detach(thread);
}

}  // namespace
