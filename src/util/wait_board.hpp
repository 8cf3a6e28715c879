// The job's wait board: a small shared memory that ferryrun makes for a job (a memfd, one
// 256-byte slot per rank, passed to the ranks as FERRY_BOARD_FD: it has no name, so nothing is
// ever left behind, however ferryrun ends), where each rank writes, once a
// blocking call has waited a while, what it waits for ("allreduce #4 on communicator 0 (...):
// not arrived: member 3 (rank 3)") and clears it when the wait ends. ferryrun prints the board
// when the job times out, on SIGUSR1 and when a rank dies; Context::wait_report gives it to the
// program. Under other launchers there is no board, and a rank reports its own wait only.
//
// A slot is a seqlock: its writer (its rank's engine, under the engine's lock) makes the
// sequence odd, writes, and makes it even; a reader retries while it is odd or changed.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "util/fd.hpp"

namespace ferry::util {

class WaitBoard {
 public:
  static constexpr std::size_t kSlotBytes = 256;
  struct Slot {
    std::atomic<std::uint32_t> sequence;
    std::int32_t pid;
    std::int64_t since_ns;  // CLOCK_MONOTONIC when the wait began; 0: not waiting
    char text[kSlotBytes - 16];
  };
  static_assert(sizeof(Slot) == kSlotBytes);

  WaitBoard() = default;
  ~WaitBoard();
  WaitBoard(const WaitBoard&) = delete;
  WaitBoard& operator=(const WaitBoard&) = delete;

  // ferryrun: makes the job's board for `ranks` ranks; false (and *error) when it cannot.
  bool create(int ranks, std::string* error);
  // The descriptor to pass to the ranks (close-on-exec: clear it in the child).
  [[nodiscard]] int fd() const { return fd_.get(); }
  // A rank: maps the board behind descriptor `fd` (FERRY_BOARD_FD) and closes it; false, leaving
  // the descriptor alone, when it is not a board for `ranks` ranks.
  bool adopt(int fd, int ranks);
  [[nodiscard]] bool usable() const { return slots_ != nullptr; }

  // This rank's slot: waiting since `since_ns` for `text` (cut to fit), or not waiting.
  void post(int rank, std::int64_t since_ns, const std::string& text);
  void clear(int rank);

  struct Entry {
    int pid = 0;
    double waited_s = 0;  // 0: not waiting in ferry
    std::string text;
  };
  // Every rank's slot as it is now.
  [[nodiscard]] std::vector<Entry> read() const;
  static std::int64_t now_ns();

 private:
  Slot* slots_ = nullptr;
  int ranks_ = 0;
  Fd fd_;  // ferryrun's
};

}  // namespace ferry::util
