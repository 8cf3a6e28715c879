// Stream-ordered operations: a communication call ordered on an application's CUDA stream after
// the work already there, with the work enqueued after it waiting for its result, and the host
// call returning at once. Also what a stream captures into a CUDA graph, run again by every replay
// with no call into ferry.
//
// How: the call enqueues a hand-off on the stream (stream memory operations, which hold no SM): a
// write of a host word that says "the buffers are ready", then a wait until another host word
// says "done". ferry's proxy thread watches the words, starts the operations (the Context's own
// non-blocking calls, so every path and fallback of the host-synchronous ones applies), advances
// them and writes "done" when they end, failed or not: the stream is always released. (A group of
// kernels whose thread work depends on what they find writes "ready" or "done" itself: Release.)
// A failure becomes its communicator's asynchronous error (Communicator::async_error, and that
// communicator's next stream call; Context::async_error is the first of any). A captured hand-off
// keeps its words as long as its graph lives (a CUDA user object tells when it goes), and each
// replay starts its operations again with the arguments of the capture.
//
// Order: the proxy starts the operations in the order their streams reach them, so the stream
// calls of one communicator go on one stream (or streams ordered among themselves), the same
// order on every member, as with NCCL. They run on a twin of the communicator (Group::stream_twin),
// so they never interleave with its host-synchronous collectives.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "ferry/ferry.hpp"

namespace ferry::proto {

class Engine;

// Starts one operation on the engine (taking its lock itself) and returns its Request.
using Start = std::function<Request()>;

// A stream operation that may run as a kernel on the stream (coll/stream_p2p.hpp), made into one
// when its group is enqueued, by its Fuser.
class DeviceWork {
 public:
  virtual ~DeviceWork() = default;
};
// A hand-off whose ready or done word the Fuser's last kernel writes itself: "ready" where ferry's
// thread must still run (what the kernel found says so), else "done", so that the stream goes on
// with no host round trip. The words are device views of host memory.
struct Release {
  void* ready = nullptr;
  void* done = nullptr;
  std::uint32_t value = 0;
  bool reset = false;  // a graph's: the kernel clears done's low word before anything else
};
// Takes the hand-off's words for a Release (StreamOps offers one where a group is all one Fuser's).
using TakeRelease = std::function<Status(Release*)>;
class Fuser {
 public:
  virtual ~Fuser() = default;
  // Enqueues on `stream` the kernels of `work` (this Fuser's operations of one group, in their
  // order), with no lock held, and sets (*thread)[i] to what ferry's thread must still start for
  // work[i] after them (empty: nothing). Where `take` is given and the thread may have nothing to
  // do, the Fuser may call it once, before its last kernel, and let that kernel release the
  // stream (Release): then ferry's thread runs the starts only when the kernel says so.
  virtual Status enqueue(CudaStream stream, std::span<const std::shared_ptr<DeviceWork>> work,
                         std::vector<Start>* thread, const TakeRelease& take) = 0;
};

class StreamOps {
 public:
  explicit StreamOps(proto::Engine& engine);
  ~StreamOps();
  StreamOps(const StreamOps&) = delete;
  StreamOps& operator=(const StreamOps&) = delete;

  // Enqueues `start` on `stream` (or, between group_start and group_end, keeps it for the
  // group). `what` names the call in errors ("allreduce"). Fails, enqueueing nothing, where
  // stream operations cannot run here (no CUDA, FERRY_THREADS=single), the stream is not
  // usable, or an earlier stream operation failed (the asynchronous error).
  // `comm` is the communicator's id (Group::base_id), whose asynchronous error a failure becomes.
  Status enqueue(std::uint32_t comm, CudaStream stream, Start start, const std::string& what);
  // The same for an operation that `fuser` makes into kernels on the stream (and maybe a part
  // for ferry's thread), together with the others of its group.
  Status enqueue(std::uint32_t comm, CudaStream stream, Fuser* fuser,
                 std::shared_ptr<DeviceWork> work, const std::string& what);
  // Operations enqueued between group_start and the matching group_end start together, after
  // the work before the group on its stream, so that a member's sends and receives to and from
  // each other cannot wait for one another. Groups nest; the outermost group_end enqueues. Every
  // operation of a group names the same stream.
  void group_start();
  Status group_end();
  // The first failure of a stream operation of this Context, or ok. It stays.
  [[nodiscard]] Status async_error() const;
  // The first failure of a stream operation of communicator `comm` (or of a watch of it), or ok.
  // It stays, and refuses that communicator's later stream calls; other communicators (one
  // shrunk without a dead member) go on.
  [[nodiscard]] Status async_error(std::uint32_t comm) const;
  // Stops the proxy thread and releases every stream waiting for it, now and in later graph
  // replays (the Context's end).
  void stop();
  // Work on the streams that the proxy does not run (the kernels coll/ enqueues there, which wait
  // for their peers by themselves) is watched: the proxy calls `check` about every millisecond,
  // after a pass of the engine's progress, with the engine's lock held; a failure it returns
  // becomes communicator `comm`'s asynchronous error. watch starts the proxy. Both are called
  // with the engine's lock held.
  using Watch = std::function<Status()>;
  int watch(std::uint32_t comm, Watch check);
  void unwatch(int id);
  // Runs `release` (frees of CUDA memory, which wait until the GPU's work has ended) where no
  // stream can be waiting for this proxy: at once where no hand-off holds words, else in the
  // proxy once none does (a graph's hold them until it goes), or in stop after every wait was
  // released. Called with the engine's lock held; `release` runs with it held.
  void release_when_idle(std::function<void()> release);

 private:
  struct Slot;
  struct Page {
    void* host = nullptr;  // kWordsPerPage words, host memory
    void* view = nullptr;  // the same, as the GPUs see it
    int device = -1;
  };
  // Pages of words that streams or graphs may still read after their Context ended: kept for
  // the life of the process, where they stay reachable (a few KiB per such Context).
  static void keep_for_good(std::vector<Page> pages);
  struct Pending {
    std::uint32_t comm;  // the communicator's id (its asynchronous error)
    CudaStream stream;
    Start start;
    std::string what;
    Fuser* fuser = nullptr;  // with `device`, instead of start
    std::shared_ptr<DeviceWork> device;
  };
  // Takes a pair of words for `slot` (its index, value and words; *view is the GPUs' address of
  // them); a page of them is made on `device` where none is free.
  Status take_words(int device, Slot& slot, std::byte** view);
  // Waits until fewer than kDepth hand-offs wait, then takes words for `slot` (persistent
  // already set), counted in outstanding_; gives them back where it fails.
  Status hold_words(int device, Slot& slot, std::byte** view);
  // A new slot for a hand-off on `stream`, its words held (hold_words); *graph is the graph the
  // stream captures into, or null.
  Status open_slot(CudaStream stream, bool by_kernel, void** graph, std::shared_ptr<Slot>* slot,
                   std::byte** view);
  // Gives back the words of a slot that hold_words took and no stream uses.
  void drop_words(Slot& slot);
  // enqueue's part: kept for the group, or submitted.
  Status enqueue_pending(Pending pending);
  Status submit(CudaStream stream, std::vector<Pending> work);
  // Enqueues the Fusers' kernels of `work` and leaves in it what ferry's thread starts.
  Status fuse(CudaStream stream, std::vector<Pending>* work, const TakeRelease& take);
  void fail(std::uint32_t comm, const Status& status);
  void loop();
  // Starts a slot's operations where its stream has reached them; true when it did.
  bool start_if_reached(Slot& slot);
  // Advances a running slot; true when it ended (the stream is released).
  bool advance(Slot& slot);
  void release_words(Slot& slot);
  void flush_unmaps();
  void start_proxy();  // with mutex_ held
  void check_watches();
  // What waits, for the log line of a stall.
  [[nodiscard]] std::string describe_stall(std::chrono::steady_clock::duration quiet) const;
  // A graph's user object went: its slot's words may be reused (a driver thread calls it).
  static void graph_released(void* arg);
  [[nodiscard]] std::uint32_t* word(std::uint32_t index) const;

  proto::Engine& engine_;
  // Slots handed over by enqueueing threads; the proxy moves them to its own list.
  std::mutex mutex_;
  std::vector<std::shared_ptr<Slot>> submitted_;
  std::vector<Page> pages_;                // guarded by mutex_ (the proxy keeps pointers)
  std::vector<std::uint32_t> free_words_;  // guarded by mutex_
  std::vector<std::uint32_t> generation_;  // per word pair, guarded by mutex_
  // Word pairs a graph's kernel writes whose graph ferry could not follow (retain_with_graph
  // failed): never free again, and no stream waits on them. Guarded by mutex_.
  std::size_t abandoned_words_ = 0;
  std::list<std::shared_ptr<Slot>> slots_;  // the proxy's
  std::vector<Pending> group_;              // guarded by mutex_
  int group_depth_ = 0;                     // guarded by mutex_
  mutable std::mutex error_mutex_;
  Status error_;                                  // the first of any communicator's
  std::map<std::uint32_t, Status> comm_errors_;   // the first of each (error_mutex_)
  std::atomic<bool> failed_{false};               // error_ is set
  std::atomic<int> outstanding_{0};               // hand-offs enqueued and not ended, graphs' aside
  std::atomic<bool> flushing_{false};             // flush_unmaps is closing mappings
  std::vector<std::function<void()>> idle_work_;  // release_when_idle's; guarded by mutex_
  std::atomic<std::size_t> idle_pending_{0};      // idle_work_.size()
  std::atomic<bool> deferring_{false};            // the IPC cache defers its closes
  std::atomic<bool> stopping_{false};
  std::thread proxy_;
  bool stopped_ = false;
  bool thread_idle_;                                        // FERRY_TEST_STREAM_THREAD_IDLE
  std::map<int, std::pair<std::uint32_t, Watch>> watches_;  // guarded by the engine's lock
  int next_watch_ = 0;
  std::atomic<bool> watching_{false};
};

}  // namespace ferry::proto
