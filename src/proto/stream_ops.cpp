// Stream-ordered operations (see stream_ops.hpp).
#include "proto/stream_ops.hpp"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>

#include "cuda/cuda.hpp"
#include "proto/engine.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace ferry::proto {
namespace {

using util::Clock;

// A hand-off's four words, 16 bytes of host memory the GPUs reach: [0] the stream's "ready"
// (its value), [2] the proxy's "done" (the same value), [3] nonzero releases every wait for good.
constexpr std::size_t kPairBytes = 16;
constexpr std::size_t kPageBytes = 64 * 1024;
constexpr std::uint32_t kPairsPerPage = kPageBytes / kPairBytes;
// After this long without work the proxy polls every kPoll instead of spinning.
constexpr auto kSpin = std::chrono::milliseconds(2);
constexpr useconds_t kPollUs = 20;
// Hand-offs of operations not captured in graphs that may wait at once (see submit).
constexpr int kDepth = 8;
// Operations that neither start nor end for this long are logged (once per stall).
constexpr auto kStall = std::chrono::seconds(10);
// How often watched work is checked (StreamOps::watch).
constexpr auto kWatchEvery = std::chrono::milliseconds(1);

}  // namespace

struct StreamOps::Slot {
  std::uint32_t index = 0;         // its words
  std::uint32_t* words = nullptr;  // the same, for the proxy (pages_ may grow meanwhile)
  std::uint32_t value = 0;         // what its stream writes to start it (1 for a graph's)
  bool persistent = false;         // captured in a graph: runs at every replay
  bool by_kernel = false;          // a Fuser's kernel writes "ready" or "done" (Release)
  std::atomic<bool> graph_gone{false};
  std::vector<Pending> work;
  std::vector<Request> running;
  bool in_flight = false;
  bool reached = false;  // its stream got to it at least once
  Clock::time_point deadline;
};

StreamOps::StreamOps(proto::Engine& engine)
    : engine_(engine), thread_idle_(engine.config().get_bool(util::Var::kTestStreamThreadIdle)) {}

StreamOps::~StreamOps() { stop(); }

std::uint32_t* StreamOps::word(std::uint32_t index) const {
  const Page& page = pages_[index / kPairsPerPage];
  return reinterpret_cast<std::uint32_t*>(static_cast<std::byte*>(page.host) +
                                          (index % kPairsPerPage) * kPairBytes);
}

Status StreamOps::enqueue(std::uint32_t comm, CudaStream stream, Start start,
                          const std::string& what) {
  return enqueue_pending({comm, stream, std::move(start), what});
}

Status StreamOps::enqueue(std::uint32_t comm, CudaStream stream, Fuser* fuser,
                          std::shared_ptr<DeviceWork> work, const std::string& what) {
  return enqueue_pending({comm, stream, Start(), what, fuser, std::move(work)});
}

Status StreamOps::enqueue_pending(Pending pending) {
  if (failed_.load(std::memory_order_acquire)) {
    if (Status error = async_error(pending.comm); !error) {
      return Status(error.code(), pending.what +
                                      ": not enqueued, an earlier stream operation of this "
                                      "communicator failed: " +
                                      error.message());
    }
  }
  {
    std::lock_guard lock(mutex_);
    if (group_depth_ > 0) {
      group_.push_back(std::move(pending));
      return Status::ok();
    }
  }
  const CudaStream stream = pending.stream;
  std::vector<Pending> one;
  one.push_back(std::move(pending));
  return submit(stream, std::move(one));
}

Status StreamOps::fuse(CudaStream stream, std::vector<Pending>* work, const TakeRelease& take) {
  std::vector<Fuser*> fusers;
  for (const Pending& p : *work) {
    if (p.fuser != nullptr && std::find(fusers.begin(), fusers.end(), p.fuser) == fusers.end()) {
      fusers.push_back(p.fuser);
    }
  }
  for (Fuser* fuser : fusers) {
    std::vector<std::shared_ptr<DeviceWork>> mine;
    for (const Pending& p : *work) {
      if (p.fuser == fuser) mine.push_back(p.device);
    }
    std::vector<Start> thread;
    if (Status s = fuser->enqueue(stream, mine, &thread, take); !s) return s;
    std::size_t next = 0;
    for (Pending& p : *work) {
      if (p.fuser != fuser) continue;
      p.start = std::move(thread[next++]);
      p.fuser = nullptr;
      p.device.reset();
    }
  }
  std::erase_if(*work, [](const Pending& p) { return !p.start; });
  return Status::ok();
}

void StreamOps::group_start() {
  std::lock_guard lock(mutex_);
  ++group_depth_;
}

Status StreamOps::group_end() {
  std::vector<Pending> work;
  {
    std::lock_guard lock(mutex_);
    if (group_depth_ == 0) {
      return Status(Code::kInvalidArgument, "group_end without a group_start");
    }
    if (--group_depth_ > 0) return Status::ok();
    work.swap(group_);
  }
  if (work.empty()) return Status::ok();
  for (const Pending& p : work) {
    if (p.stream != work.front().stream) {
      return Status(Code::kInvalidArgument,
                    "group_end: the group's " + work.front().what + " and " + p.what +
                        " name different streams; every operation of a group names the same "
                        "stream (nothing of the group was enqueued)");
    }
  }
  const CudaStream stream = work.front().stream;
  return submit(stream, std::move(work));
}

Status StreamOps::async_error() const {
  std::lock_guard lock(error_mutex_);
  return error_;
}

Status StreamOps::async_error(std::uint32_t comm) const {
  std::lock_guard lock(error_mutex_);
  const auto found = comm_errors_.find(comm);
  return found == comm_errors_.end() ? Status::ok() : found->second;
}

void StreamOps::fail(std::uint32_t comm, const Status& status) {
  std::lock_guard lock(error_mutex_);
  const bool first_of_comm = comm_errors_.emplace(comm, status).second;
  if (!first_of_comm) {
    FERRY_LOG(kDebug, "%s", status.message().c_str());
    return;
  }
  const bool first = error_.is_ok();
  if (first) error_ = status;
  failed_.store(true, std::memory_order_release);
  FERRY_LOG(kWarn, "%s (communicator %u's asynchronous error now%s)", status.message().c_str(),
            comm, first ? ", and the Context's" : "");
}

void StreamOps::keep_for_good(std::vector<Page> pages) {
  static std::mutex mutex;
  static auto* kept = new std::vector<Page>();  // never destroyed, never freed
  std::lock_guard lock(mutex);
  kept->insert(kept->end(), pages.begin(), pages.end());
}

Status StreamOps::take_words(int device, Slot& slot, std::byte** view) {
  std::unique_lock lock(mutex_);
  if (stopped_) return Status(Code::kInvalidArgument, "the Context is finalized");
  while (free_words_.empty()) {
    // A page is made outside the lock: the proxy takes it on every pass.
    lock.unlock();
    Page page;
    page.device = device;
    if (Status s = engine_.cuda()->map_host(device, kPageBytes, &page.host, &page.view); !s) {
      return Status(s.code(), "host words for the stream's hand-off: " + s.message());
    }
    lock.lock();
    const auto first = static_cast<std::uint32_t>(pages_.size()) * kPairsPerPage;
    pages_.push_back(page);
    generation_.resize(generation_.size() + kPairsPerPage, 0);
    for (std::uint32_t i = kPairsPerPage; i-- > 0;) free_words_.push_back(first + i);
  }
  slot.index = free_words_.back();
  free_words_.pop_back();
  std::uint32_t& generation = generation_[slot.index];
  // A graph's words say 1 at every replay; another hand-off's a value above the last one's, so
  // that a stream still waiting on an earlier use of the words is released by this one's "done".
  generation = slot.persistent ? 1 : (generation + 1 == 0 ? 2 : generation + 1);
  slot.value = generation;
  slot.words = word(slot.index);
  // A graph's value is always 1, which an earlier hand-off on these words may have left in
  // "ready": the proxy would start the captured call before any replay reached it (found with a
  // collective captured after a stream call of the same stream: every replay reduced the wrong
  // data). No stream writes "ready" of words that are free.
  if (slot.persistent) __atomic_store_n(&slot.words[0], 0u, __ATOMIC_RELAXED);
  const Page& page = pages_[slot.index / kPairsPerPage];
  *view = static_cast<std::byte*>(page.view) + (slot.index % kPairsPerPage) * kPairBytes;
  return Status::ok();
}

void StreamOps::release_words(Slot& slot) {
  if (!slot.persistent) outstanding_.fetch_sub(1);
  std::lock_guard lock(mutex_);
  if (slot.persistent) {
    // No replay uses them any more: clean for the next hand-off.
    std::uint32_t* w = word(slot.index);
    __atomic_store_n(&w[0], 0u, __ATOMIC_RELAXED);
    __atomic_store_n(&w[2], 0u, __ATOMIC_RELAXED);
    generation_[slot.index] = 0;
  }
  free_words_.push_back(slot.index);
}

void StreamOps::graph_released(void* arg) {
  auto* slot = static_cast<std::shared_ptr<Slot>*>(arg);
  (*slot)->graph_gone.store(true, std::memory_order_release);
  delete slot;
}

Status StreamOps::hold_words(int device, Slot& slot, std::byte** view) {
  // At most kDepth hand-offs wait at once. A thread that enqueues on a full stream blocks in
  // CUDA holding the driver's lock, which the proxy's own CUDA calls then wait for (two H100s:
  // 10,000 allreduces enqueued back to back stopped at the first); this thread waits here
  // instead, holding nothing. Nor does a hand-off start while the proxy closes deferred IPC
  // mappings (flush_unmaps), which it does only when none is known. A graph's counts until the
  // proxy knows it.
  for (;;) {
    while ((outstanding_.load() >= kDepth || flushing_.load()) && !stopping_.load()) {
      ::sched_yield();
    }
    outstanding_.fetch_add(1);
    if (!flushing_.load()) break;
    outstanding_.fetch_sub(1);
  }
  cuda::Cuda* gpu = engine_.cuda();
  Status taken;
  {
    // The engine's lock keeps the CUDA module's state whole (the proxy uses it too). From the
    // first hand-off on, the IPC cache's closes wait for flush_unmaps; the kernels a device
    // operation may launch are loaded before any of its hand-offs is on a stream (loading one
    // later, in the proxy, may wait for the streams to drain).
    auto entry = engine_.enter();
    if (!deferring_.exchange(true)) gpu->defer_unmaps(true);
    static_cast<void>(gpu->kernels_missing(device));
    taken = take_words(device, slot, view);
  }
  if (!taken) outstanding_.fetch_sub(1);
  return taken;
}

void StreamOps::drop_words(Slot& slot) {
  // release_words counts a graph's slot as the proxy's: this one never got there.
  if (slot.persistent) outstanding_.fetch_sub(1);
  release_words(slot);
}

Status StreamOps::open_slot(CudaStream stream, bool by_kernel, void** graph,
                            std::shared_ptr<Slot>* slot, std::byte** view) {
  cuda::Cuda::StreamInfo info;
  if (Status s = engine_.cuda()->stream_info(stream, &info); !s) {
    return Status(s.code(), "its CUDA stream: " + s.message());
  }
  auto fresh = std::make_shared<Slot>();
  fresh->persistent = info.graph != nullptr;
  fresh->by_kernel = by_kernel;
  if (Status s = hold_words(info.device, *fresh, view); !s) return s;
  *graph = info.graph;
  *slot = std::move(fresh);
  return Status::ok();
}

Status StreamOps::submit(CudaStream stream, std::vector<Pending> work) {
  const std::string what = work.front().what;  // work moves into the slot
  if (!engine_.waiting().threaded()) {
    return Status(Code::kUnsupported,
                  what +
                      " on a CUDA stream: stream operations are run by a thread of ferry's, "
                      "which FERRY_THREADS=single rules out (use multi)");
  }
  cuda::Cuda* gpu = engine_.cuda();
  if (gpu == nullptr) {
    return Status(Code::kUnsupported,
                  what + " on a CUDA stream: this process has no CUDA (ferry-info says why)");
  }
  // ferry's own CUDA calls here (host memory for the words) are legal while this thread
  // captures.
  cuda::RelaxedCapture relaxed(gpu);
  void* graph = nullptr;  // the graph the stream captures into, if it does
  std::shared_ptr<Slot> slot;
  std::byte* view = nullptr;
  // A group all of one Fuser's may leave its hand-off to the Fuser's last kernel, which releases
  // the stream itself where ferry's thread has nothing to do (Release).
  TakeRelease take;
  if (std::all_of(work.begin(), work.end(), [&](const Pending& p) {
        return p.fuser != nullptr && p.fuser == work.front().fuser;
      })) {
    take = [&](Release* release) -> Status {
      if (slot != nullptr) return Status(Code::kInvalidArgument, "a second release taken");
      if (Status s = open_slot(stream, /*by_kernel=*/true, &graph, &slot, &view); !s) return s;
      release->ready = view;
      release->done = view + 8;
      release->value = slot->value;
      release->reset = slot->persistent;
      return Status::ok();
    };
  }
  // Kernels first (a group's sends and receives between GPUs), then ferry's thread for the rest.
  if (Status s = fuse(stream, &work, take); !s) {
    // A Fuser takes the words just before its last launch, which is what failed if anything
    // after it did: no kernel writes them.
    if (slot != nullptr) drop_words(*slot);
    return Status(s.code(), what + ": " + s.message());
  }
  if (work.empty()) {
    if (slot != nullptr) drop_words(*slot);
    return Status::ok();
  }
  if (slot == nullptr) {
    if (Status s = open_slot(stream, /*by_kernel=*/false, &graph, &slot, &view); !s) {
      return Status(s.code(), what + ": " + s.message());
    }
  }
  slot->work = std::move(work);
  // No lock is held while calling CUDA on the application's stream: a full stream blocks the
  // call until the work before it, this Context's hand-offs included, has drained.
  if (slot->persistent) {
    auto* held = new std::shared_ptr<Slot>(slot);
    if (Status s = gpu->retain_with_graph(graph, &StreamOps::graph_released, held); !s) {
      if (slot->by_kernel) {
        // The captured kernel writes the words at every replay: they stay taken, and no stream
        // waits on them (release_when_idle counts them as free).
        outstanding_.fetch_sub(1);
        {
          std::lock_guard lock(mutex_);
          ++abandoned_words_;
        }
        FERRY_LOG(kWarn, "%s: its graph's hand-off words stay taken", s.message().c_str());
      } else {
        drop_words(*slot);
      }
      return Status(s.code(), what + " captured in a graph: " + s.message());
    }
  }
  Status handed = slot->by_kernel
                      ? gpu->enqueue_wait(stream, view + 8, slot->value)
                      : gpu->enqueue_handoff(stream, view, view + 8, slot->value, slot->persistent);
  if (!handed && !slot->persistent && !slot->by_kernel) {
    release_words(*slot);
    return Status(handed.code(), what + ": " + handed.message());
  }
  // A graph's slot stays with the proxy until the graph goes, even where its hand-off failed;
  // so does one whose kernel writes its words.
  std::lock_guard lock(mutex_);
  if (slot->persistent) outstanding_.fetch_sub(1);
  submitted_.push_back(std::move(slot));
  start_proxy();
  return handed.is_ok() ? Status::ok() : Status(handed.code(), what + ": " + handed.message());
}

bool StreamOps::start_if_reached(Slot& slot) {
  std::uint32_t* w = slot.words;
  if (thread_idle_ || __atomic_load_n(&w[0], __ATOMIC_ACQUIRE) != slot.value) return false;
  // A replay writes 1 again only after this one's "done", so clearing it here loses nothing.
  if (slot.persistent) __atomic_store_n(&w[0], 0u, __ATOMIC_RELAXED);
  slot.reached = true;
  slot.running.clear();
  for (Pending& p : slot.work) slot.running.push_back(p.start());
  slot.in_flight = true;
  const double timeout = engine_.waiting().timeout();
  slot.deadline = timeout > 0 ? util::deadline_after(timeout) : Clock::time_point::max();
  return true;
}

bool StreamOps::advance(Slot& slot) {
  bool done = true;
  for (Request& r : slot.running) done = r.test() && done;
  if (!done && Clock::now() < slot.deadline) return false;
  // Each operation that failed becomes its communicator's error. Under FERRY_TIMEOUT the stream
  // goes on: a receive that has not matched is withdrawn, and a collective's kernels stop
  // waiting for their peers.
  for (std::size_t i = 0; i < slot.running.size(); ++i) {
    Request& r = slot.running[i];
    if (!r.test()) {
      r.cancel();
      {
        auto entry = engine_.enter();
        engine_.operations().abandon(Engine::index_of(r));
      }
      fail(slot.work[i].comm,
           Status(Code::kTimeout, "stream " + slot.work[i].what +
                                      " not complete within FERRY_TIMEOUT (" +
                                      std::to_string(engine_.waiting().timeout()) + " s)"));
    } else if (Status s = r.status(); !s) {
      fail(slot.work[i].comm, Status(s.code(), "stream " + slot.work[i].what + ": " + s.message()));
    }
  }
  slot.running.clear();
  slot.in_flight = false;
  __atomic_store_n(&slot.words[2], slot.value, __ATOMIC_RELEASE);
  return true;
}

void StreamOps::loop() {
  engine_.cuda()->relax_capture();  // for good: this thread's calls never break a capture
  auto last_work = Clock::now();
  auto last_change = last_work;
  auto last_watch = last_work;
  bool reported = false;
  while (!stopping_.load(std::memory_order_acquire)) {
    {
      std::lock_guard lock(mutex_);
      for (auto& s : submitted_) slots_.push_back(std::move(s));
      submitted_.clear();
    }
    bool working = false;   // an operation in flight or started: poll at once
    bool watching = false;  // a stream will reach its hand-off soon
    bool changed = false;   // an operation started or ended
    for (auto it = slots_.begin(); it != slots_.end();) {
      Slot& s = **it;
      if (!s.in_flight) {
        if (!start_if_reached(s)) {
          // A kernel that found nothing for ferry's thread released its stream itself (Release).
          const bool released = s.by_kernel && !s.persistent &&
                                __atomic_load_n(&s.words[2], __ATOMIC_ACQUIRE) == s.value;
          if (released || (s.persistent && s.graph_gone.load(std::memory_order_acquire))) {
            release_words(s);
            it = slots_.erase(it);
            continue;
          }
          watching = watching || !s.persistent;
          ++it;
          continue;
        }
        changed = true;
      }
      working = true;
      if (advance(s)) {
        changed = true;
        if (!s.persistent) {
          release_words(s);
          it = slots_.erase(it);
          continue;
        }
      }
      ++it;
    }
    if (slots_.empty()) flush_unmaps();
    const auto now = Clock::now();
    if (watching_.load(std::memory_order_acquire) && now - last_watch >= kWatchEvery) {
      last_watch = now;
      check_watches();
    }
    if (changed || !(working || watching)) {
      last_change = now;
      reported = false;
    } else if (!reported && now - last_change > kStall) {
      FERRY_LOG(kWarn, "%s", describe_stall(now - last_change).c_str());
      reported = true;
    }
    if (working) {
      last_work = now;
    } else if (watching || now - last_work < kSpin) {
      ::sched_yield();
    } else {
      ::usleep(kPollUs);
    }
  }
}

// IPC mappings the cache would have closed are closed here, and release_when_idle's work run,
// where no stream can wait for the proxy: no hand-off is known (graphs' included), and none
// starts until this ends.
void StreamOps::flush_unmaps() {
  cuda::Cuda* gpu = engine_.cuda();
  if (gpu->deferred_unmaps() == 0 && idle_pending_.load() == 0) return;
  flushing_.store(true);
  bool idle = outstanding_.load() == 0;
  std::vector<std::function<void()>> releases;
  if (idle) {
    std::lock_guard lock(mutex_);
    idle = submitted_.empty();
    if (idle) {
      releases.swap(idle_work_);
      idle_pending_.store(0);
    }
  }
  if (idle) {
    auto entry = engine_.enter();
    gpu->close_deferred();
    for (auto& release : releases) release();
  }
  flushing_.store(false);
}

void StreamOps::release_when_idle(std::function<void()> release) {
  {
    std::lock_guard lock(mutex_);
    // Every word pair free: no stream waits on one (a thread about to take one waits for the
    // engine's lock, which the caller holds).
    if (!stopped_ && free_words_.size() + abandoned_words_ != pages_.size() * kPairsPerPage) {
      idle_work_.push_back(std::move(release));
      idle_pending_.fetch_add(1);
      return;
    }
  }
  release();
}

std::string StreamOps::describe_stall(Clock::duration quiet) const {
  std::string out =
      "stream operations: none started or ended for " +
      std::to_string(std::chrono::duration_cast<std::chrono::seconds>(quiet).count()) + " s;";
  int listed = 0;
  for (const auto& s : slots_) {
    if (s->persistent && !s->in_flight) continue;
    if (++listed > 4) {
      out += " ...";
      break;
    }
    out += " " + s->work.front().what + (s->work.size() > 1 ? " (a group)" : "");
    if (s->in_flight) {
      out += " runs;";
    } else {
      out += " waits for its stream to reach it (ready word " +
             std::to_string(__atomic_load_n(&s->words[0], __ATOMIC_ACQUIRE)) + ", wanted " +
             std::to_string(s->value) +
             (s->by_kernel ? ", done word " +
                                 std::to_string(__atomic_load_n(&s->words[2], __ATOMIC_ACQUIRE)) +
                                 " written by its kernel"
                           : std::string()) +
             ");";
    }
  }
  return out;
}

void StreamOps::start_proxy() {
  if (!proxy_.joinable() && !stopping_.load()) proxy_ = std::thread([this] { loop(); });
}

int StreamOps::watch(std::uint32_t comm, Watch check) {
  const int id = next_watch_++;
  watches_.emplace(id, std::make_pair(comm, std::move(check)));
  watching_.store(true, std::memory_order_release);
  std::lock_guard lock(mutex_);
  start_proxy();
  return id;
}

void StreamOps::unwatch(int id) {
  watches_.erase(id);
  watching_.store(!watches_.empty(), std::memory_order_release);
}

void StreamOps::check_watches() {
  auto entry = engine_.enter();
  engine_.progress();
  engine_.look_for_failures();
  for (auto& [id, watch] : watches_) {
    if (Status s = watch.second(); !s) fail(watch.first, s);
  }
}

void StreamOps::stop() {
  if (stopped_) return;
  stopping_.store(true, std::memory_order_release);
  if (proxy_.joinable()) proxy_.join();
  // The slots go after the lock: an operation may hold the last reference to its communicator,
  // whose end hands its device memory to release_when_idle, which takes the lock (a captured
  // collective whose graph and communicator had both gone waited for ever in the Context's end).
  decltype(slots_) gone;
  std::lock_guard lock(mutex_);
  stopped_ = true;
  for (auto& s : submitted_) slots_.push_back(std::move(s));
  submitted_.clear();
  std::size_t unreached = 0;
  std::size_t graphs = 0;
  std::size_t running = 0;  // streams waiting at a hand-off that the words below release
  for (auto& s : slots_) {
    if (s->in_flight) {
      ++running;
      fail(s->work.front().comm,
           Status(Code::kInvalidArgument,
                  "stream " + s->work.front().what + ": the Context was finalized while it ran"));
    }
    s->running.clear();
    if (s->persistent && !s->graph_gone.load(std::memory_order_acquire)) ++graphs;
    if (!s->persistent && !s->reached &&
        __atomic_load_n(&s->words[0], __ATOMIC_ACQUIRE) != s->value &&
        (!s->by_kernel || __atomic_load_n(&s->words[2], __ATOMIC_ACQUIRE) != s->value)) {
      ++unreached;
    }
  }
  gone.swap(slots_);
  // Every wait on these words passes from now on, so no stream (or replay) waits for a proxy that
  // is gone.
  for (std::uint32_t i = 0; i < pages_.size() * kPairsPerPage; ++i) {
    __atomic_store_n(&word(i)[3], 1u, __ATOMIC_RELEASE);
  }
  if (cuda::Cuda* gpu = engine_.cuda(); gpu != nullptr) {
    gpu->defer_unmaps(false);
    gpu->close_deferred();
  }
  // release_when_idle's work goes with the engine's teardown, which runs once the progress
  // thread stopped, as the communicators' own.
  for (auto& release : std::exchange(idle_work_, {})) {
    auto* held = new std::function<void()>(std::move(release));
    engine_.at_teardown(held, [held] {
      (*held)();
      delete held;
    });
  }
  idle_pending_.store(0);
  if (unreached > 0) {
    FERRY_LOG(kWarn,
              "finalize: %zu stream operation(s) not yet reached by their streams: the streams "
              "will pass them without communicating",
              unreached);
  }
  if (graphs > 0 || unreached > 0 || running > 0 || abandoned_words_ > 0) {
    // Their streams or graphs still write and read the words (a stream released just now may
    // not have read them yet): they stay (a few KiB).
    keep_for_good(std::exchange(pages_, {}));
    if (graphs > 0) {
      FERRY_LOG(kInfo,
                "finalize: %zu captured stream operation(s) outlive the Context: their graphs "
                "replay without communicating",
                graphs);
    }
    return;
  }
  for (const Page& page : pages_) engine_.cuda()->unmap_host(page.device, page.host);
  pages_.clear();
}

}  // namespace ferry::proto
