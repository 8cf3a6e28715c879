// The NCCL API tests' ranks: each a forked process that counts the checks that did not hold.
#pragma once

#include <nccl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

namespace ferry::test {

// Inside a forked rank: counts what did not hold, saying which.
struct Checks {
  int rank;
  int failures = 0;
  void expect(bool ok, const std::string& what) {
    if (ok) return;
    ++failures;
    std::fprintf(stderr, "rank %d: FAIL: %s (last error: %s)\n", rank, what.c_str(),
                 ncclGetLastError(nullptr));
  }
};

// Runs `body` in `n` forked processes, rank 0 to n - 1; true when every one exits 0 within 60 s
// (rank `killed`: is killed by SIGKILL). A rank exits 1 where a check failed.
inline bool fork_ranks(int n, const std::function<void(Checks&)>& body, int killed = -1) {
  std::fflush(nullptr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::alarm(60);  // a hang ends the rank (and fails the test), not the suite
      Checks checks{r};
      body(checks);
      std::fflush(nullptr);
      ::_exit(checks.failures == 0 ? 0 : 1);
    }
    pids.push_back(pid);
  }
  bool all = true;
  for (int r = 0; r < n; ++r) {
    int status = 0;
    ::waitpid(pids[static_cast<std::size_t>(r)], &status, 0);
    const bool ok = r == killed ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                                : WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!ok) std::fprintf(stderr, "rank %d ended with status 0x%x\n", r, status);
    all = all && ok;
  }
  return all;
}

inline bool last_error_says(const char* words) {
  return std::strstr(ncclGetLastError(nullptr), words) != nullptr;
}

}  // namespace ferry::test
