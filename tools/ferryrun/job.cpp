// ferryrun's job: fork+exec of the ranks in one process group, an event loop over the store, a
// signalfd and a pipe for the signals other threads catch, failure handling (first failure wins,
// SIGTERM then SIGKILL) and cleanup on exit.
#include "job.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <memory>
#include <optional>

#include "bootstrap/single.hpp"
#include "bootstrap/store_server.hpp"
#include "ferry/status.hpp"
#include "housekeeping.hpp"
#include "util/fd.hpp"
#include "util/log.hpp"
#include "util/wait_board.hpp"

extern char** environ;

namespace ferry::tools {
namespace {

using Clock = std::chrono::steady_clock;

void info(const char* format, ...) __attribute__((format(printf, 1, 2)));
void info(const char* format, ...) {
  if (!util::log_enabled(util::LogLevel::kInfo)) return;
  char text[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(text, sizeof(text), format, args);
  va_end(args);
  std::fprintf(stderr, "ferryrun: %s\n", text);
}

// The write end of Job's signal pipe, for forward_signal (a handler can reach nothing else).
int g_signal_pipe = -1;

// The handler for the signals ferryrun waits for, run only in a thread that does not block them:
// ferryrun's own thread blocks them and reads them from its signalfd, but a thread started by a
// preloaded library or a tool's injection (compute-sanitizer's is one) blocks nothing, and the
// kernel hands a process-directed signal to such a thread. Left at the default action there,
// SIGCHLD was discarded (the job's end went unseen until --timeout) and SIGTERM ended ferryrun
// without forwarding it. The signal goes on through the pipe to the event loop.
void forward_signal(int signal) {
  const int saved = errno;
  const auto byte = static_cast<unsigned char>(signal);
  const ssize_t ignored = ::write(g_signal_pipe, &byte, 1);
  (void)ignored;
  errno = saved;
}

const char* signal_text(int signal) {
  const char* text = ::strsignal(signal);
  return text != nullptr ? text : "unknown signal";
}

class Job {
 public:
  explicit Job(const JobOptions& options) : options_(options) {}
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;
  ~Job() {
    g_signal_pipe = -1;
    server_.reset();
    if (!job_id_.empty()) {
      int swept = sweep_shm(job_id_);
      if (swept > 0)
        info("removed %d shared-memory segment(s) left by job %s", swept, job_id_.c_str());
    }
  }

  int run() {
    if (!start()) {
      stop_all();
      return failure_.value_or(kExitSetupFailed);
    }
    loop();
    return failure_.value_or(0);
  }

 private:
  struct Rank {
    pid_t pid = -1;
    bool running = false;
    std::string ended;  // "was killed by signal 9 (Killed)", once reaped
  };

  bool start();
  bool block_signals();
  std::vector<std::string> child_environment(int rank) const;
  bool spawn(int rank, int stdin_fd);
  void loop();
  void read_signals();
  // The signals other threads caught (forward_signal), in the order they came.
  void read_signal_pipe();
  void on_signal(int signal);
  void reap();
  void on_exit(int rank, int status);
  // A rank still running (not reaped) whose store connection has closed, other than `rank`, or -1.
  [[nodiscard]] int departed_unreaped(int rank) const;
  // Reports the failure held back by on_exit (see there), or logs it if another one came first.
  void report_deferred();
  void on_abort(int rank, int pid, int code, const std::string& reason);
  void on_timeout();
  // Prints what the ranks wait for (the job's wait board, util/wait_board.hpp): every rank, or
  // only those waiting in ferry.
  void print_board(const char* when, bool waiting_only);
  // Records the first failure's exit status and ends the job; later failures only log.
  bool fail(int status);
  // Sends `signal` to the whole job and arms SIGKILL after the grace period.
  void terminate(int signal);
  void signal_job(int signal);
  // ferryrun itself failed (set-up, poll): kill the ranks already started and wait for them.
  void stop_all();

  const JobOptions& options_;
  // A rank's failing exit held back while a rank that left the store first is not reaped yet.
  struct Deferred {
    int rank = -1;
    int code = 0;
    std::string text;
  };
  std::optional<Deferred> deferred_;
  std::optional<Clock::time_point> deferred_at_;
  std::string job_id_;
  util::WaitBoard board_;
  ScratchDir dir_;
  std::unique_ptr<bootstrap::StoreServer> server_;
  util::Fd signal_fd_;
  util::Fd signal_pipe_[2];  // read, write
  static constexpr int kSignals[] = {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1};
  struct sigaction old_actions_[std::size(kSignals)]{};
  sigset_t old_mask_{};
  rlimit old_files_{};
  std::vector<Rank> ranks_;
  int running_ = 0;
  pid_t pgid_ = 0;
  std::optional<int> failure_;
  bool terminating_ = false;
  std::optional<Clock::time_point> kill_at_;
  std::optional<Clock::time_point> timeout_at_;
};

bool Job::start() {
  job_id_ = bootstrap::new_job_id();
  std::string error;
  if (!board_.create(options_.ranks, &error)) {
    info("%s: the job runs without it", error.c_str());
    error.clear();
  }
  if (!dir_.create(&error)) {
    std::fprintf(stderr, "ferryrun: %s\n", error.c_str());
    return false;
  }
  try {
    server_ = std::make_unique<bootstrap::StoreServer>(
        dir_.socket_path(), options_.ranks,
        [this](int rank, int pid, int code, const std::string& reason) {
          on_abort(rank, pid, code, reason);
        });
  } catch (const Error& e) {
    std::fprintf(stderr, "ferryrun: %s\n", e.what());
    return false;
  }
  if (!block_signals()) return false;
  // Every rank holds a socket to the store here: make room for large jobs.
  ::getrlimit(RLIMIT_NOFILE, &old_files_);
  rlimit raised = old_files_;
  raised.rlim_cur = raised.rlim_max;
  ::setrlimit(RLIMIT_NOFILE, &raised);

  util::Fd dev_null(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  // Ranks run in their own process group, which is never the terminal's foreground group: one
  // reading a terminal would stop on SIGTTIN, so only a non-terminal stdin reaches rank 0.
  int rank0_stdin = ::isatty(STDIN_FILENO) != 0 ? dev_null.get() : STDIN_FILENO;
  ranks_.resize(static_cast<std::size_t>(options_.ranks));
  if (options_.timeout_s > 0) {
    timeout_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                     std::chrono::duration<double>(options_.timeout_s));
  }
  for (int rank = 0; rank < options_.ranks; ++rank) {
    if (!spawn(rank, rank == 0 ? rank0_stdin : dev_null.get())) return false;
  }
  info("job %s: started %d rank(s) of '%s', store at unix:%s", job_id_.c_str(), options_.ranks,
       options_.command[0].c_str(), dir_.socket_path().c_str());
  return true;
}

bool Job::block_signals() {
  // Blocked before the first fork, so no signal is lost or handled by default in between; the
  // children restore the old mask before exec.
  sigset_t mask;
  sigemptyset(&mask);
  for (int s : kSignals) sigaddset(&mask, s);
  if (::sigprocmask(SIG_BLOCK, &mask, &old_mask_) != 0) {
    std::fprintf(stderr, "ferryrun: sigprocmask() failed: %s\n", std::strerror(errno));
    return false;
  }
  signal_fd_.reset(::signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd_.valid()) {
    std::fprintf(stderr, "ferryrun: signalfd() failed: %s\n", std::strerror(errno));
    return false;
  }
  // For the signals another thread takes (forward_signal).
  int ends[2];
  if (::pipe2(ends, O_NONBLOCK | O_CLOEXEC) != 0) {
    std::fprintf(stderr, "ferryrun: pipe2() failed: %s\n", std::strerror(errno));
    return false;
  }
  signal_pipe_[0].reset(ends[0]);
  signal_pipe_[1].reset(ends[1]);
  g_signal_pipe = ends[1];
  struct sigaction action {};
  action.sa_handler = forward_signal;
  action.sa_mask = mask;
  action.sa_flags = SA_RESTART;
  for (std::size_t i = 0; i < std::size(kSignals); ++i) {
    if (::sigaction(kSignals[i], &action, &old_actions_[i]) != 0) {
      std::fprintf(stderr, "ferryrun: sigaction() failed: %s\n", std::strerror(errno));
      return false;
    }
  }
  return true;
}

std::vector<std::string> Job::child_environment(int rank) const {
  static const char* const kOwned[] = {
      "FERRY_RANK=",  "FERRY_SIZE=",   "FERRY_LOCAL_RANK=", "FERRY_LOCAL_SIZE=",
      "FERRY_STORE=", "FERRY_JOB_ID=", "FERRY_BOARD_FD=",   "LOCAL_RANK="};
  std::vector<std::string> env;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    bool owned = false;
    for (const char* prefix : kOwned)
      owned = owned || std::strncmp(*e, prefix, std::strlen(prefix)) == 0;
    if (!owned) env.emplace_back(*e);
  }
  // One node: local numbering is the global one.
  env.push_back("FERRY_RANK=" + std::to_string(rank));
  env.push_back("FERRY_SIZE=" + std::to_string(options_.ranks));
  env.push_back("FERRY_LOCAL_RANK=" + std::to_string(rank));
  env.push_back("FERRY_LOCAL_SIZE=" + std::to_string(options_.ranks));
  // The name other launchers' programs pick a GPU by (torchrun's; the OSU benchmarks' -d cuda).
  env.push_back("LOCAL_RANK=" + std::to_string(rank));
  env.push_back("FERRY_STORE=unix:" + dir_.socket_path());
  env.push_back("FERRY_JOB_ID=" + job_id_);
  if (board_.usable()) env.push_back("FERRY_BOARD_FD=" + std::to_string(board_.fd()));
  return env;
}

bool Job::spawn(int rank, int stdin_fd) {
  // Everything the child needs is built before fork: between fork and exec only
  // async-signal-safe calls are allowed.
  std::vector<std::string> env = child_environment(rank);
  std::vector<std::string> args = options_.command;
  // Null-terminated pointer arrays for execvpe.
  auto pointers = [](std::vector<std::string>& strings) {
    std::vector<char*> out;
    out.reserve(strings.size() + 1);
    for (auto& s : strings) out.push_back(s.data());
    out.push_back(nullptr);
    return out;
  };
  std::vector<char*> envp = pointers(env);
  std::vector<char*> argv = pointers(args);
  std::string cannot_run =
      "ferryrun: rank " + std::to_string(rank) + ": cannot run '" + args[0] + "': ";
  pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "ferryrun: fork() for rank %d failed: %s\n", rank, std::strerror(errno));
    return false;
  }
  if (pid == 0) {
    ::setpgid(0, pgid_);  // pgid_ 0 for rank 0: a new group named after it
    // If ferryrun dies (even by SIGKILL) the job must not outlive it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) ::_exit(kExitCannotRun);
    if (stdin_fd != STDIN_FILENO) ::dup2(stdin_fd, STDIN_FILENO);
    if (board_.usable()) ::fcntl(board_.fd(), F_SETFD, 0);  // the rank maps it, then closes it
    ::setrlimit(RLIMIT_NOFILE, &old_files_);
    // The dispositions ferryrun found (a signal ignored under nohup stays ignored in the ranks),
    // before the signals are unblocked: none may reach ferryrun's pipe from here.
    for (std::size_t i = 0; i < std::size(kSignals); ++i) {
      ::sigaction(kSignals[i], &old_actions_[i], nullptr);
    }
    ::sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
    ::execvpe(argv[0], argv.data(), envp.data());
    int error = errno;
    const char* reason = std::strerror(error);
    ssize_t ignored = ::write(STDERR_FILENO, cannot_run.data(), cannot_run.size());
    ignored = ::write(STDERR_FILENO, reason, std::strlen(reason));
    ignored = ::write(STDERR_FILENO, "\n", 1);
    (void)ignored;
    ::_exit(kExitCannotRun);
  }
  // Also set here, so the group exists before ferryrun might signal it (the usual race with the
  // child's own setpgid).
  if (pgid_ == 0) pgid_ = pid;
  ::setpgid(pid, pgid_);
  ranks_[static_cast<std::size_t>(rank)] = {pid, true};
  ++running_;
  return true;
}

void Job::loop() {
  while (running_ > 0) {
    int wait_ms = -1;
    auto now = Clock::now();
    for (const auto& at : {kill_at_, timeout_at_, deferred_at_}) {
      if (!at) continue;
      auto ms = std::chrono::ceil<std::chrono::milliseconds>(*at - now).count();
      ms = std::max<long long>(ms, 0);
      if (wait_ms < 0 || ms < wait_ms) wait_ms = static_cast<int>(std::min<long long>(ms, 1 << 30));
    }
    pollfd fds[3] = {{server_->fd(), POLLIN, 0},
                     {signal_fd_.get(), POLLIN, 0},
                     {signal_pipe_[0].get(), POLLIN, 0}};
    if (::poll(fds, 3, wait_ms) < 0 && errno != EINTR) {
      std::fprintf(stderr, "ferryrun: poll() failed: %s; ending the job\n", std::strerror(errno));
      stop_all();
      return;
    }
    // The store first: an ABORT sent just before a rank exited explains that exit.
    if (fds[0].revents != 0) server_->poll(0);
    if (fds[1].revents != 0) read_signals();
    if (fds[2].revents != 0) read_signal_pipe();
    now = Clock::now();
    if (timeout_at_ && now >= *timeout_at_) {
      timeout_at_.reset();
      on_timeout();
    }
    if (deferred_at_ && now >= *deferred_at_) report_deferred();
    if (kill_at_ && now >= *kill_at_) {
      kill_at_.reset();
      info("ranks still running %d ms after they were signalled; sending SIGKILL", kKillGraceMs);
      signal_job(SIGKILL);
    }
  }
  // Processes the ranks started (a shell's children) may outlive them: a failed job ends them all.
  if (terminating_) signal_job(SIGKILL);
}

void Job::read_signals() {
  signalfd_siginfo siginfo;
  while (::read(signal_fd_.get(), &siginfo, sizeof(siginfo)) == sizeof(siginfo)) {
    on_signal(static_cast<int>(siginfo.ssi_signo));
  }
}

void Job::read_signal_pipe() {
  unsigned char signals[64];
  ssize_t got;
  while ((got = ::read(signal_pipe_[0].get(), signals, sizeof(signals))) > 0) {
    for (ssize_t i = 0; i < got; ++i) on_signal(signals[i]);
  }
}

void Job::on_signal(int signal) {
  // SIGCHLDs merge: reap() collects every exited child, whatever signal woke us.
  if (signal == SIGCHLD) {
    reap();
    return;
  }
  if (signal == SIGUSR1) {
    print_board("(SIGUSR1)", false);
    return;
  }
  const char* name = sigabbrev_np(signal) != nullptr ? sigabbrev_np(signal) : "?";
  if (terminating_) {
    // A second interrupt (or one during a failure's grace period): no more waiting.
    std::fprintf(stderr, "ferryrun: got SIG%s while ending the job; killing it\n", name);
    signal_job(SIGKILL);
    kill_at_.reset();
    return;
  }
  std::fprintf(stderr, "ferryrun: got SIG%s; forwarding it to the job\n", name);
  fail(128 + signal);
  terminate(signal);
}

void Job::reap() {
  std::vector<std::pair<int, int>> exited;  // (rank, status)
  for (;;) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, WNOHANG);
    if (pid <= 0) break;
    for (std::size_t rank = 0; rank < ranks_.size(); ++rank) {
      if (ranks_[rank].pid != pid || !ranks_[rank].running) continue;
      ranks_[rank].running = false;
      --running_;
      exited.emplace_back(static_cast<int>(rank), status);
    }
  }
  // A rank killed by a signal is reported before ranks that exited in the same batch: those are
  // usually its victims (a killed rank's store connection closes before its SIGCHLD arrives, and a
  // peer that learns of it first may exit with an error first), and the report must name the cause.
  std::stable_partition(exited.begin(), exited.end(),
                        [](const auto& e) { return WIFSIGNALED(e.second); });
  for (const auto& [rank, status] : exited) on_exit(rank, status);
  if (deferred_ && (failure_ || departed_unreaped(deferred_->rank) < 0)) report_deferred();
}

int Job::departed_unreaped(int rank) const {
  for (std::size_t r = 0; r < ranks_.size(); ++r) {
    if (static_cast<int>(r) != rank && ranks_[r].running && server_ != nullptr &&
        server_->departed(static_cast<int>(r))) {
      return static_cast<int>(r);
    }
  }
  return -1;
}

void Job::report_deferred() {
  deferred_at_.reset();
  if (!deferred_) return;
  Deferred deferred = std::move(*deferred_);
  deferred_.reset();
  if (fail(deferred.code)) {
    std::fprintf(stderr, "ferryrun: %s; ending the job\n", deferred.text.c_str());
    terminate(SIGTERM);
  } else {
    info("%s", deferred.text.c_str());
  }
}

void Job::on_exit(int rank, int status) {
  pid_t pid = ranks_[static_cast<std::size_t>(rank)].pid;
  // What it told the store before it went (a BYE), and what the store now knows of it: rounds
  // waiting for a rank that never joined fail at once, naming it.
  server_->poll(0);
  {
    char how[64];
    if (WIFSIGNALED(status)) {
      std::snprintf(how, sizeof(how), "was killed by signal %d", WTERMSIG(status));
    } else {
      std::snprintf(how, sizeof(how), "exited with code %d", WEXITSTATUS(status));
    }
    server_->rank_exited(rank, pid, how);
    ranks_[static_cast<std::size_t>(rank)].ended = how;
  }
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    if (!server_->joined(rank) || server_->finalized(rank) || terminating_) {
      info("rank %d (pid %d) exited with code 0", rank, pid);
      return;
    }
    // Joined the job and left without ending its Context: the ranks that wait for it get
    // kPeerFailed, and may well exit 0 themselves; the job's status must not.
    char text[256];
    std::snprintf(text, sizeof(text),
                  "rank %d (pid %d) exited with code 0 without finalizing ferry (its Context was "
                  "never destroyed)",
                  rank, pid);
    if (options_.keep_going) {
      fail(kExitUnfinalized);
      std::fprintf(stderr, "ferryrun: %s; the other ranks go on (--keep-going)\n", text);
    } else if (fail(kExitUnfinalized)) {
      std::fprintf(stderr, "ferryrun: %s; ending the job\n", text);
      terminate(SIGTERM);
    } else {
      info("%s", text);
    }
    return;
  }
  if (int removed = remove_provider_regions(pid); removed > 0) {
    info("removed %d libfabric shm region(s) rank %d (pid %d) left in /dev/shm", removed, rank,
         pid);
  }
  char text[256];
  int code = 0;
  if (WIFSIGNALED(status)) {
    code = 128 + WTERMSIG(status);
    std::snprintf(text, sizeof(text), "rank %d (pid %d) was killed by signal %d (%s)", rank, pid,
                  WTERMSIG(status), signal_text(WTERMSIG(status)));
  } else {
    code = WEXITSTATUS(status);
    std::snprintf(text, sizeof(text), "rank %d (pid %d) exited with code %d", rank, pid, code);
  }
  // A rank killed by a signal closes its store connection before its SIGCHLD comes, and a peer
  // that learns of it through the store may exit with an error before that SIGCHLD: the report
  // must name the cause, so an error exit waits (at most kDeferMs) while a rank that left the
  // store is not reaped, and so do later error exits. A death by signal is a cause: never held.
  if (!WIFSIGNALED(status) && !options_.keep_going && !failure_ && !terminating_ &&
      (deferred_ || departed_unreaped(rank) >= 0)) {
    info("%s; waiting for the ranks that left the store to end", text);
    if (!deferred_) {
      deferred_ = Deferred{rank, code, text};
      deferred_at_ = Clock::now() + std::chrono::milliseconds(kDeferMs);
    }
    return;
  }
  if (options_.keep_going && !terminating_) {
    fail(code);
    std::fprintf(stderr, "ferryrun: %s; the other ranks go on (--keep-going)\n", text);
    print_board("when it went", true);
  } else if (fail(code)) {
    std::fprintf(stderr, "ferryrun: %s; ending the job\n", text);
    print_board("when it went", true);
    terminate(SIGTERM);
  } else {
    info("%s", text);  // expected while the job is being ended
  }
}

void Job::on_abort(int rank, int pid, int code, const std::string& reason) {
  // Exit statuses are 8 bits; a code that does not fit still has to read as a failure.
  int status = code >= 0 && code <= 255 ? code : 1;
  if (fail(status)) {
    std::fprintf(stderr, "ferryrun: rank %d (pid %d) aborted the job with code %d: %s\n", rank, pid,
                 code, reason.c_str());
    terminate(SIGTERM);
  } else {
    info("rank %d (pid %d) aborted with code %d: %s", rank, pid, code, reason.c_str());
  }
}

void Job::on_timeout() {
  // Whatever failed before (under --keep-going a death leaves the others running), the limit
  // ends the job, with its own status: before, a death first made ferryrun ignore it.
  if (terminating_) return;
  failure_ = kExitTimeout;
  std::fprintf(stderr, "ferryrun: job timed out after %s s\n", options_.timeout_text.c_str());
  print_board("at the timeout", false);
  terminate(SIGTERM);
}

void Job::print_board(const char* when, bool waiting_only) {
  if (!board_.usable()) return;
  const std::vector<util::WaitBoard::Entry> entries = board_.read();
  std::string table;
  char line[96];
  for (std::size_t r = 0; r < entries.size() && r < ranks_.size(); ++r) {
    const util::WaitBoard::Entry& e = entries[r];
    if (!ranks_[r].running) {
      if (waiting_only) continue;
      std::snprintf(line, sizeof(line), "  rank %zu: %s\n", r,
                    ranks_[r].ended.empty() ? "not started" : ranks_[r].ended.c_str());
      table += line;
    } else if (e.waited_s > 0) {
      std::snprintf(line, sizeof(line), "  rank %zu: waiting %.2f s: ", r, e.waited_s);
      table += line + e.text + "\n";
    } else if (!waiting_only) {
      std::snprintf(line, sizeof(line), "  rank %zu: running, not waiting in ferry\n", r);
      table += line;
    }
  }
  if (!table.empty())
    std::fprintf(stderr, "ferryrun: where the ranks were %s:\n%s", when, table.c_str());
}

bool Job::fail(int status) {
  if (failure_) return false;
  failure_ = status;
  return true;
}

void Job::terminate(int signal) {
  if (terminating_) return;
  terminating_ = true;
  signal_job(signal);
  kill_at_ = Clock::now() + std::chrono::milliseconds(kKillGraceMs);
}

void Job::signal_job(int signal) {
  if (pgid_ > 0) ::kill(-pgid_, signal);
}

void Job::stop_all() {
  if (running_ == 0) return;
  fail(kExitSetupFailed);
  signal_job(SIGKILL);
  terminating_ = true;
  while (running_ > 0) {
    int status = 0;
    pid_t pid = ::waitpid(-1, &status, 0);
    if (pid < 0 && errno != EINTR) break;
    for (auto& rank : ranks_) {
      if (rank.pid == pid && rank.running) {
        rank.running = false;
        --running_;
      }
    }
  }
}

}  // namespace

int run_job(const JobOptions& options) {
  Job job(options);
  return job.run();
}

}  // namespace ferry::tools
