// How calls wait on the engine and share it between threads (see waiting.hpp).
#include "proto/waiting.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "proto/engine.hpp"
#include "transport/transport.hpp"

namespace ferry::proto {
using util::Clock;

void Waiting::configure(const util::Config& config, std::size_t local_ranks) {
  spin_count_ = static_cast<int>(config.get_int(util::Var::kSpinCount));
  auto_spin_ = spin_count_ < 0;
  cpu_set_t cpus;
  usable_cpus_ = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                     ? CPU_COUNT(&cpus)
                     : static_cast<int>(::sysconf(_SC_NPROCESSORS_ONLN));
  // Until the ranks' CPUs are known (placed()): every rank of the node may share ours.
  if (auto_spin_) placed(static_cast<int>(local_ranks));
  mode_ = static_cast<Mode>(config.get_int(util::Var::kWaitMode));
  timeout_ = config.get_seconds(util::Var::kTimeout);
}

bool Waiting::test(std::uint32_t index) {
  RequestPool& requests = engine_.requests();
  if (requests.done(index)) return true;
  engine_.progress();
  return requests.done(index);
}

namespace {

// "receive from rank 3 (tag 0x7)", for the board.
std::string describe_request(const void* engine, std::uintptr_t index) {
  auto* owner = const_cast<Engine*>(static_cast<const Engine*>(engine));
  const RequestSlot& slot = owner->requests()[static_cast<std::uint32_t>(index)];
  char text[96];
  if (slot.kind == RequestKind::kSend) {
    std::snprintf(text, sizeof(text), "send to rank %d (tag 0x%llx)", slot.peer,
                  static_cast<unsigned long long>(slot.tag));
  } else if (slot.kind == RequestKind::kRecv && slot.info.source < 0) {
    std::snprintf(text, sizeof(text), "receive from any rank (tag 0x%llx)",
                  static_cast<unsigned long long>(slot.tag));
  } else if (slot.kind == RequestKind::kRecv) {
    std::snprintf(text, sizeof(text), "receive from rank %d (tag 0x%llx)", slot.info.source,
                  static_cast<unsigned long long>(slot.tag));
  } else {
    std::snprintf(text, sizeof(text), "a non-blocking operation's request");
  }
  return text;
}

}  // namespace

Status Waiting::wait(std::uint32_t index) {
  if (timeout_ > 0) return wait_for(index, timeout_);
  RequestPool& requests = engine_.requests();
  const Note note = this->note(describe_request, &engine_, index);
  int idle = 0;
  while (!requests.done(index)) step(&idle);
  return requests[index].status;
}

Status Waiting::wait_for(std::uint32_t index, double seconds) {
  if (std::isnan(seconds)) {
    return Status(Code::kInvalidArgument, "wait_for: NaN seconds (INFINITY waits without a limit)");
  }
  RequestPool& requests = engine_.requests();
  const auto deadline = util::deadline_after(seconds);
  const Note note = this->note(describe_request, &engine_, index);
  int idle = 0;
  while (!requests.done(index)) {
    step(&idle);
    // A request that completed in this very step (however late) is not a timeout. The clock is
    // read every step: one may sleep 32 ms (FERRY_WAIT_MODE=block), and reading it every 256th
    // ended wait_for(0.01) after 8 s.
    if (!requests.done(index) && Clock::now() >= deadline) {
      char text[64];
      std::snprintf(text, sizeof(text), "request not complete after %g s", seconds);
      return Status(Code::kTimeout, text);
    }
  }
  return requests[index].status;
}

void Waiting::start_threads(const util::Config& config) {
  const bool progress_thread = config.get_bool(util::Var::kProgressThread);
  threaded_ = progress_thread || config.get_string(util::Var::kThreads) == "multi";
  if (progress_thread) progress_thread_ = std::thread([this] { progress_loop(); });
}

void Waiting::stop_progress_thread() {
  if (!progress_thread_.joinable()) return;
  stop_progress_.store(true, std::memory_order_release);
  progress_thread_.join();
}

void Waiting::placed(int sharers) {
  if (!auto_spin_) return;
  sharers_ = sharers;
  oversubscribed_ = sharers > usable_cpus_;
  spin_count_ = oversubscribed_ ? 0 : 2000;
}

std::string Waiting::describe() const {
  return "waiting: " + std::to_string(spin_count_) + " empty polls, then yield the CPU" +
         (oversubscribed_ ? " (" + std::to_string(sharers_) + " ranks of this node share the " +
                                std::to_string(usable_cpus_) + " CPU(s) this process may use)"
                          : "");
}

// FERRY_PROGRESS_THREAD: polls while there is work, taking the lock like any caller (so an
// application thread in a call waits for at most one progress pass); when idle, sleeps as
// FERRY_WAIT_MODE says a blocked call would (spin: every 50 us or so).
void Waiting::progress_loop() {
  int idle = 0;
  while (!stop_progress_.load(std::memory_order_acquire)) {
    lock();
    const int events = engine_.progress();
    const bool sleep = events == 0 && mode_ != Mode::kSpin &&
                       (mode_ == Mode::kBlock || idle > spin_count_) &&
                       engine_.only_a_message_can_end_a_wait();
    if (sleep) sleep_until_work(true);
    unlock();
    if (events > 0 || sleep) {
      idle = events > 0 ? 0 : idle;
    } else if (++idle > spin_count_) {
      ::usleep(50);
    } else {
      ::sched_yield();
    }
  }
}

void Waiting::step(int* idle_polls) {
  bool pause = false;
  if (engine_.progress() > 0) {
    *idle_polls = 0;
    sleep_ms_ = 1;
  } else if (++*idle_polls > spin_count_) {
    pause = true;
  }
  if (mode_ != Mode::kSpin && *idle_polls > 0 && (mode_ == Mode::kBlock || pause) &&
      engine_.only_a_message_can_end_a_wait()) {
    sleep_until_work(held_here());
    *idle_polls = 0;
    return;
  }
  if (pause) check_peers_before_yield();
  // Let a thread that waits for the lock in between polls (what this wait needs may be its next
  // call), and the others when this wait yields. Otherwise the lock stays held: letting go and
  // taking it again on every poll cost an atomic exchange and two reads of the thread's id.
  if ((pause || waiting_.load(std::memory_order_relaxed) > 0) && held_here()) {
    unlock();
    ::sched_yield();
    lock();
  } else if (pause) {
    ::sched_yield();
  }
}

void Waiting::check_peers_before_yield() {
  const auto now = Clock::now();
  if (now < next_yield_check_) return;
  next_yield_check_ = now + std::chrono::milliseconds(10);
  engine_.look_for_failures();
  if (note_.describe != nullptr) post_note(util::WaitBoard::now_ns());
}

void Waiting::post_note(std::int64_t now_ns) {
  constexpr std::int64_t kFirstPostNs = 100'000'000;  // a wait that yielded this long is posted
  constexpr std::int64_t kRepostNs = 1'000'000'000;   // and again each second (who is late
                                                      // changes)
  if (note_.since_ns == 0) {
    note_.since_ns = now_ns;
    note_.next_post_ns = now_ns + kFirstPostNs;
    return;
  }
  if (board_ == nullptr || !board_->usable() || now_ns < note_.next_post_ns) return;
  board_->post(rank_, note_.since_ns, note_.describe(note_.subject, note_.detail));
  note_.posted = true;
  note_.next_post_ns = now_ns + kRepostNs;
}

void Waiting::end_note(const Note::Current& outer) {
  if (note_.posted && board_ != nullptr) board_->clear(rank_);
  note_ = outer;
  note_.posted = false;  // the outer call's wait is posted again at its next yield
  note_.next_post_ns = 0;
}

std::string Waiting::current_wait() const {
  return note_.describe != nullptr ? note_.describe(note_.subject, note_.detail) : std::string();
}

void Waiting::spin_step(int* idle_polls) {
  if (engine_.progress() > 0) {
    *idle_polls = 0;
    return;
  }
  constexpr int kYields = 2000;  // before the first nap
  const int idle = ++*idle_polls;
  const bool locked = held_here();
  if (idle > spin_count_) check_peers_before_yield();
  if (locked) unlock();
  if (idle > spin_count_ + kYields) {
    const long nap_us = std::min(2000L, 4L * (idle - spin_count_ - kYields));
    const timespec nap{0, nap_us * 1000};
    ::nanosleep(&nap, nullptr);
  } else if (idle > spin_count_ || (locked && waiting_.load(std::memory_order_relaxed) > 0)) {
    ::sched_yield();
  }
  if (locked) lock();
}

void Waiting::sleep_until_work(bool locked) {
  std::array<pollfd, 4> fds{};
  nfds_t count = 0;
  bool ready = false;
  for (transport::Transport* t : polled_) {
    if (!t->arm()) ready = true;
    if (t->wait_fd() >= 0 && count < fds.size()) fds[count++] = pollfd{t->wait_fd(), POLLIN, 0};
  }
  // A message that came while arming is handled now instead of slept on.
  if (!ready && engine_.progress() == 0) {
    const int sleep_ms = sleep_ms_;  // read under the lock
    if (locked) unlock();
    const int rang = ::poll(fds.data(), count, sleep_ms);
    if (locked) lock();
    sleep_ms_ = rang > 0 ? 1 : std::min(2 * sleep_ms_, kMaxSleepMs);
    // A dead peer rings nothing: look after every sleep, not every few thousand polls.
    engine_.look_for_failures();
  }
  for (transport::Transport* t : polled_) t->disarm();
}

int Waiting::event_fd() const {
  for (const transport::Transport* t : polled_) {
    if (t->wait_fd() >= 0) return t->wait_fd();
  }
  return -1;
}

bool Waiting::arm() {
  // The application sleeps next, and a dead peer rings nothing: look now, as a blocked call does
  // after each sleep (progress() alone looks every 4096 calls: 41 s at a 10 ms poll a call).
  engine_.look_for_failures();
  bool ready = false;
  for (transport::Transport* t : polled_) {
    if (!t->arm()) ready = true;
  }
  if (ready || engine_.progress() > 0) {
    for (transport::Transport* t : polled_) t->disarm();
    return false;
  }
  armed_ = true;
  return true;
}

void Waiting::disarm() {
  armed_ = false;
  for (transport::Transport* t : polled_) t->disarm();
}

}  // namespace ferry::proto
