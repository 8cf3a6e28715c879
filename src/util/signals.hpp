// Keeps what a library does to this process's fatal-signal handlers while it loads or starts out
// of the application's way. libfabric's PSM providers (libpsm2, libpsm_infinipath, linked into
// Debian's libfabric) install SIGSEGV, SIGBUS, SIGILL and SIGABRT handlers from their
// constructors that write "<host>-<pid>.btr" backtrace files into the working directory and end
// the process with exit code 1: a crashing rank is then reported as "exited with code 1", not as
// killed by its signal, and its files litter the application's directory. ferry uses neither
// provider's handler, so it puts back what was there before.
#pragma once

#include <csignal>
#include <cstddef>

namespace ferry::util {

class FatalSignalGuard {
 public:
  FatalSignalGuard() {
    for (std::size_t i = 0; i < kCount; ++i) ::sigaction(kSignals[i], nullptr, &saved_[i]);
  }
  // Restores each handler that changed while the guard lived (and only those: one the
  // application set from another thread meanwhile would be the same as saved, or not ours).
  ~FatalSignalGuard() {
    for (std::size_t i = 0; i < kCount; ++i) {
      struct sigaction now {};
      ::sigaction(kSignals[i], nullptr, &now);
      if (now.sa_handler != saved_[i].sa_handler) ::sigaction(kSignals[i], &saved_[i], nullptr);
    }
  }
  FatalSignalGuard(const FatalSignalGuard&) = delete;
  FatalSignalGuard& operator=(const FatalSignalGuard&) = delete;

 private:
  static constexpr int kSignals[] = {SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGABRT};
  static constexpr std::size_t kCount = sizeof(kSignals) / sizeof(kSignals[0]);
  struct sigaction saved_[kCount] {};
};

}  // namespace ferry::util
