// How a blocking call waits on the engine, and how several threads share it: the engine's call
// lock (FERRY_THREADS), the progress thread (FERRY_PROGRESS_THREAD), the spin-then-yield policy
// (FERRY_SPIN_COUNT), sleeping on the transports' wake-ups (FERRY_WAIT_MODE) and the
// application's own event loop (Context::event_fd / arm). The engine owns one; the waits of every
// part (messages, one-sided, collectives, finalize) take their steps here.
#pragma once

#include <sched.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "ferry/status.hpp"
#include "util/clock.hpp"
#include "util/config.hpp"
#include "util/wait_board.hpp"

namespace ferry::transport {
class Transport;
}

namespace ferry::proto {

class Engine;

class Waiting {
 public:
  // `polled`: the engine's transports that progress polls (filled in after this is made).
  Waiting(Engine& engine, const std::vector<transport::Transport*>& polled)
      : engine_(engine), polled_(polled) {}
  ~Waiting() { stop_progress_thread(); }
  Waiting(const Waiting&) = delete;
  Waiting& operator=(const Waiting&) = delete;

  // Reads FERRY_SPIN_COUNT and FERRY_WAIT_MODE; `local_ranks`: the ranks on this node, which
  // with fewer CPUs than that makes waits yield at once (until placed() knows better).
  void configure(const util::Config& config, std::size_t local_ranks);
  // Reads FERRY_THREADS and FERRY_PROGRESS_THREAD, and starts the thread if asked (once the
  // engine can progress).
  void start_threads(const util::Config& config);
  // Once the ranks' CPUs are known: `sharers` ranks of this node (this one included) may run on
  // the CPUs this process may use. More of them than those CPUs: waits yield at once (where
  // FERRY_SPIN_COUNT is not set). Ranks bound to a CPU each (mpirun's, srun's binding) spin.
  void placed(int sharers);
  void stop_progress_thread();
  // The policy in words (ferry-info).
  [[nodiscard]] std::string describe() const;

  // ---- The call lock ----
  // A spin lock: uncontended, one atomic exchange and a plain store (a mutex costs a second
  // atomic operation to let go). Waiters spin a little, then yield: the holder is polling, not
  // sleeping, and lets go between polls.
  void lock() {
    if (locked_.exchange(true, std::memory_order_acquire)) {
      waiting_.fetch_add(1, std::memory_order_relaxed);
      for (int spins = 0; locked_.exchange(true, std::memory_order_acquire); ++spins) {
        while (locked_.load(std::memory_order_relaxed)) {
          if (++spins > 64) ::sched_yield();
        }
      }
      waiting_.fetch_sub(1, std::memory_order_relaxed);
    }
    owner_.store(std::this_thread::get_id(), std::memory_order_relaxed);
  }
  void unlock() {
    owner_.store(std::thread::id(), std::memory_order_relaxed);
    locked_.store(false, std::memory_order_release);
  }
  // Whether calls lock (FERRY_THREADS=multi or a progress thread); fixed for the engine's life.
  [[nodiscard]] bool threaded() const { return threaded_; }
  // Whether this thread holds the lock (false in single mode, where nobody takes it).
  [[nodiscard]] bool held_here() const {
    return threaded_ && owner_.load(std::memory_order_relaxed) == std::this_thread::get_id();
  }

  // ---- Waiting ----
  // FERRY_TIMEOUT in seconds (0: none): how long a blocking call waits.
  [[nodiscard]] double timeout() const { return timeout_; }
  // A request of the engine: done, after one progress if not at first.
  bool test(std::uint32_t index);
  // Until the request is done (kTimeout after FERRY_TIMEOUT), or `seconds`.
  Status wait(std::uint32_t index);
  Status wait_for(std::uint32_t index, double seconds);
  // Steps until done() holds (asked before each step, with the lock held); false if
  // FERRY_TIMEOUT ran out first.
  template <typename Done>
  bool wait_until(Done done) {
    return wait_until(
        done, timeout_ > 0 ? util::deadline_after(timeout_) : util::Clock::time_point::max());
  }
  // The same with a deadline of the caller's (time_point::max(): none), for a call whose one
  // deadline covers several waits.
  template <typename Done>
  bool wait_until(Done done, util::Clock::time_point deadline) {
    int idle = 0;
    while (!done()) {
      if (util::Clock::now() >= deadline) return false;
      step(&idle);
    }
    return true;
  }
  // One step of a blocking wait: progress, and yield the CPU after FERRY_SPIN_COUNT empty polls.
  // With several threads, the lock is let go and taken again (yielding to a waiting thread).
  void step(int* idle_polls);
  // One step of a wait that only another process's store into shared memory can end, which rings
  // no doorbell: progress, yield after FERRY_SPIN_COUNT empty polls, and after a few thousand more
  // nap (growing to 2 ms) instead of sleeping on the doorbell, so a long wait costs little CPU.
  void spin_step(int* idle_polls);
  // Whether a wait yields the CPU at its first empty poll (FERRY_SPIN_COUNT 0, the choice where
  // the node's ranks outnumber the CPUs): a poll that finds nothing only delays the process
  // that would write the word, if it shares this CPU.
  [[nodiscard]] bool yields_at_once() const { return spin_count_ == 0; }

  // ---- What a blocking call waits for (the job's wait board, util/wait_board.hpp) ----
  // A blocking call names what it waits for by a function that describes it on demand, so a
  // call that ends soon costs two stores: a wait that has yielded for 100 ms is written to this
  // rank's slot of the board (again each second), and cleared when the call ends.
  using Describe = std::string (*)(const void* subject, std::uintptr_t detail);
  class [[nodiscard]] Note {
   public:
    Note(Waiting& waiting, Describe describe, const void* subject, std::uintptr_t detail)
        : waiting_(waiting), outer_(waiting.note_) {
      waiting.note_ = Current{describe, subject, detail};
    }
    ~Note() { waiting_.end_note(outer_); }
    Note(const Note&) = delete;
    Note& operator=(const Note&) = delete;

   private:
    friend class Waiting;
    Waiting& waiting_;
    struct Current {
      Describe describe = nullptr;
      const void* subject = nullptr;
      std::uintptr_t detail = 0;
      std::int64_t since_ns = 0;      // when the wait first yielded (0: not yet)
      std::int64_t next_post_ns = 0;  // when the board gets it (again)
      bool posted = false;
    } outer_;
  };
  Note note(Describe describe, const void* subject, std::uintptr_t detail = 0) {
    return Note(*this, describe, subject, detail);
  }
  // The job's board (null: none) and this rank's slot in it.
  void attach_board(util::WaitBoard* board, int rank) {
    board_ = board;
    rank_ = rank;
  }
  // What this rank's blocking call waits for now, or "" when none.
  [[nodiscard]] std::string current_wait() const;

  // ---- The application's event loop ----
  [[nodiscard]] int event_fd() const;
  // Arms the transports' wake-ups; false when something is already there (progress first).
  bool arm();
  // Whether arm() holds; the next progress disarms.
  [[nodiscard]] bool armed() const { return armed_; }
  void disarm();

 private:
  // FERRY_WAIT_MODE: sleep on the transports' wake-ups (with the lock let go) until one rings or
  // a timer ends (1 ms, doubling to kMaxSleepMs while nothing comes: what a wake-up lost to a
  // race, or a message over ofi, which rings nothing, can cost); only where nothing but a message
  // can end the wait (Engine::only_a_message_can_end_a_wait).
  enum class Mode { kSpin, kBlock, kAdaptive };
  static constexpr int kMaxSleepMs = 32;
  void sleep_until_work(bool locked);
  // Before a wait gives up the CPU: look for dead peers at most every 10 ms. When the CPUs are
  // busy a yield may cost a time slice, and the few thousand progress calls between the
  // engine's own checks then take seconds.
  void check_peers_before_yield();
  void progress_loop();

  // A wait that has yielded a while goes to the board; a note that ends clears it.
  void post_note(std::int64_t now_ns);
  void end_note(const Note::Current& outer);

  Engine& engine_;
  const std::vector<transport::Transport*>& polled_;
  Note::Current note_;
  util::WaitBoard* board_ = nullptr;
  int rank_ = 0;
  int spin_count_ = 0;
  bool auto_spin_ = true;  // FERRY_SPIN_COUNT unset (negative): decided by placed()
  int usable_cpus_ = 1;    // in this process's affinity
  int sharers_ = 1;        // placed()'s
  double timeout_ = 0;
  bool oversubscribed_ = false;  // more ranks on this node than CPUs: waits yield at once
  Mode mode_ = Mode::kSpin;
  int sleep_ms_ = 1;
  bool armed_ = false;
  bool threaded_ = true;
  std::atomic<bool> locked_{false};
  std::atomic<std::thread::id> owner_{};  // the thread holding the lock
  std::atomic<int> waiting_{0};           // threads waiting for the lock
  std::atomic<bool> stop_progress_{false};
  std::thread progress_thread_;
  util::Clock::time_point next_yield_check_{};
};

}  // namespace ferry::proto
