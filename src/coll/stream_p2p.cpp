// Stream send and receive as kernels on the application's stream (see stream_p2p.hpp).
#include "coll/stream_p2p.hpp"

#include <algorithm>
#include <cstring>
#include <map>
#include <utility>

#include "coll/group.hpp"
#include "proto/device_path.hpp"
#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "util/clock.hpp"
#include "util/log.hpp"

namespace ferry::coll {
namespace {

using OpKind = cuda::Cuda::P2pOp::Kind;
constexpr std::size_t kVerdictBytes = 16;
// A group's receives from one peer that may hand off to ferry's thread, and its sends to it
// through the bulk ring, each keep a verdict until the thread reads it, after the group's last
// launch: kP2pMaxOps of them (receives into host memory of messages that may come inline also
// keep a host bounce: kP2pSlots of them).
constexpr std::size_t kVerdictsBytes = cuda::Cuda::kP2pMaxOps * kVerdictBytes;

struct Work final : proto::DeviceWork {
  std::shared_ptr<Group> twin;  // keeps the StreamP2p alive
  bool sending = false;
  void* buffer = nullptr;
  std::size_t bytes = 0;
  int peer = 0;
};

// The stream p2p messages of ferry's thread: the twin's own tag (no collective's: their low 16
// bits are zero); the set-up's messages another.
Tag message_tag(const Group& twin) { return tag_of(twin.id(), 0) | 1; }
Tag setup_tag(const Group& twin) { return tag_of(twin.id(), 0) | 2; }

proto::Start by_thread(proto::Engine* engine, bool sending, void* buffer, std::size_t bytes,
                       int rank, Tag tag) {
  return [engine, sending, buffer, bytes, rank, tag] {
    auto inner = engine->enter();
    return sending ? engine->messages().isend(buffer, bytes, rank, tag)
                   : engine->messages().irecv(buffer, bytes, rank, tag, kFullMask);
  };
}

// What ferry's thread does after the group's launches for an op that left it a verdict: mode 2,
// the data by the thread; 1, it came (inline into a host buffer: from its bounce, `host_bounce`);
// 0, the op stopped (the watch reports why).
proto::Start after_verdict(proto::Engine* engine, unsigned* verdict, bool sending, bool direct,
                           const std::byte* host_bounce, void* buffer, std::size_t bytes, int rank,
                           Tag tag) {
  return [=]() -> Request {
    const unsigned mode = __atomic_load_n(&verdict[0], __ATOMIC_ACQUIRE);
    const std::size_t size =
        static_cast<std::size_t>(verdict[1]) | static_cast<std::size_t>(verdict[2]) << 32;
    __atomic_store_n(&verdict[0], 0u, __ATOMIC_RELAXED);
    auto inner = engine->enter();
    if (mode == 2) {
      return sending ? engine->messages().isend(buffer, bytes, rank, tag)
                     : engine->messages().irecv(buffer, bytes, rank, tag, kFullMask);
    }
    if (mode == 1 && !sending && !direct && size <= bytes) std::memcpy(buffer, host_bounce, size);
    return engine->completed_request();
  };
}

}  // namespace

struct StreamP2p::Offer {
  std::int64_t ok = 0;
  std::int64_t inline_max = 0;
  cuda::IpcKey key;
};

StreamP2p::StreamP2p(Group& twin, const util::Config& config)
    : twin_(twin),
      inline_max_(config.get_bool(util::Var::kCudaIpc) ? config.get_size(util::Var::kStreamP2p)
                                                       : 0) {
  ring_.chunk = config.get_size(util::Var::kStreamRingChunk) / 4096 * 4096;
  ring_.places = static_cast<int>(config.get_int(util::Var::kStreamRingPlaces));
  ring_.blocks = static_cast<int>(config.get_int(util::Var::kStreamRingBlocks));
}

StreamP2p::~StreamP2p() {
  // Only one with device state touches the engine here, and only while its Context lives (the
  // engine's teardown released that state otherwise).
  if ((device_ < 0 && pairs_.empty()) || twin_.detached()) return;
  proto::Engine* engine = twin_.engine();
  auto entry = engine->enter();
  engine->cancel_teardown(this);
  // Its kernels stop waiting for their peers now. Its memory goes where no stream waits for
  // ferry's thread: a free waits until the GPU's work has ended, and a stream waiting for the
  // thread (of any communicator) ends only once the thread, which needs the engine's lock held
  // here, has run its hand-off.
  stop();
  if (watch_ >= 0) engine->streams().unwatch(watch_);
  watch_ = -1;
  struct Held {
    std::vector<std::pair<int, Pair>> pairs;  // with the peer's rank
    void* scratch;
    unsigned* words;
    int device;
  };
  auto held = std::make_shared<Held>(
      Held{{}, std::exchange(scratch_, nullptr), std::exchange(words_, nullptr), device_});
  for (auto& [peer, pair] : pairs_) held->pairs.emplace_back(twin_.member(peer), pair);
  pairs_.clear();
  cuda::Cuda* gpu = engine->cuda();
  engine->streams().release_when_idle([gpu, held] {
    for (auto& [rank, pair] : held->pairs) free_pair(gpu, rank, pair);
    if (held->scratch != nullptr) gpu->release(held->device, held->scratch);
    // The stop words last: the frees before waited for this communicator's kernels, which read
    // them until they stop (a communicator made and dropped per step held a page of pinned
    // memory each until the process ended).
    if (held->words != nullptr) gpu->unmap_host(held->device, held->words);
  });
}

std::shared_ptr<proto::DeviceWork> StreamP2p::work(std::shared_ptr<Group> twin, bool sending,
                                                   void* buffer, std::size_t bytes, int peer) {
  auto w = std::make_shared<Work>();
  w->twin = std::move(twin);
  w->sending = sending;
  w->buffer = buffer;
  w->bytes = bytes;
  w->peer = peer;
  return w;
}

Status StreamP2p::prepare_common(int device) {
  if (device_ >= 0) {
    if (watch_ < 0) return Status(Code::kUnsupported, "an earlier set-up failed");
    return device_ == device
               ? Status()
               : Status(Code::kInvalidArgument,
                        "this communicator's stream sends and receives run on cuda:" +
                            std::to_string(device_) + ", not cuda:" + std::to_string(device));
  }
  cuda::Cuda* gpu = twin_.engine()->cuda();
  void* host = nullptr;
  Status s = gpu->map_host(device, 64, &host, &words_view_);
  if (!s) return s;
  words_ = static_cast<unsigned*>(host);
  std::memset(words_, 0, 64);
  device_ = device;
  twin_.engine()->at_teardown(this, [this] { release_all(); });
  if (s = gpu->allocate(device, cuda::Cuda::kP2pScratchBytes, &scratch_); !s) {
    scratch_ = nullptr;
    return s;
  }
  if (s = gpu->zero(device, scratch_, cuda::Cuda::kP2pScratchBytes); !s) return s;
  watch_ = twin_.engine()->streams().watch(twin_.base_id(), [this] { return watch(); });
  return Status();
}

bool StreamP2p::prepare(Pair& pair, int device, cuda::IpcKey* key, std::string* why) {
  proto::Engine* engine = twin_.engine();
  cuda::Cuda* gpu = engine->cuda();
  if (inline_max_ == 0) {
    *why = "FERRY_STREAM_P2P=0 or FERRY_CUDA_IPC=0";
    return false;
  }
  if (device < 0) {
    *why = "the stream's GPU is not known";
    return false;
  }
  if (std::string missing = gpu->kernels_missing(device); !missing.empty()) {
    *why = missing;
    return false;
  }
  pair.device = device;
  const std::size_t inbox_bytes = cuda::Cuda::p2p_inbox_bytes(ring_);
  Status s = gpu->allocate(device, inbox_bytes, &pair.inbox);
  if (s) s = gpu->zero(device, pair.inbox, inbox_bytes);
  if (s) s = gpu->allocate(device, cuda::Cuda::kP2pCounterBytes, &pair.counters);
  if (s) s = gpu->zero(device, pair.counters, cuda::Cuda::kP2pCounterBytes);
  if (s) {
    s = gpu->allocate(device, cuda::Cuda::kP2pSlots * cuda::Cuda::kP2pInlineMax, &pair.bounce);
  }
  void* host = nullptr;
  if (s) {
    s = gpu->map_host(device, kVerdictsBytes + cuda::Cuda::kP2pSlots * cuda::Cuda::kP2pInlineMax,
                      &host, &pair.host_view);
  }
  if (s) {
    pair.host = static_cast<unsigned*>(host);
    std::memset(pair.host, 0, kVerdictsBytes);
    const mem::MemoryInfo info = gpu->classify(pair.inbox);
    util::Fd none;
    s = info.ipc == mem::IpcKind::kLegacy
            ? gpu->export_ipc(pair.inbox, info, key, &none)
            : Status(Code::kUnsupported, "its inbox has no CUDA IPC handle");
  }
  if (!s) *why = s.message();
  return s.is_ok();
}

void StreamP2p::release(Pair& pair) {
  const auto it = std::find_if(pairs_.begin(), pairs_.end(),
                               [&](const auto& entry) { return &entry.second == &pair; });
  free_pair(twin_.engine()->cuda(), it != pairs_.end() ? twin_.member(it->first) : -1, pair);
}

void StreamP2p::free_pair(cuda::Cuda* gpu, int rank, Pair& pair) {
  if (pair.peer_inbox != nullptr && rank >= 0) gpu->unpin(rank, pair.device, pair.peer_key);
  pair.peer_inbox = nullptr;
  for (void** p : {&pair.inbox, &pair.counters, &pair.bounce}) {
    if (*p != nullptr) gpu->release(pair.device, *p);
    *p = nullptr;
  }
  if (pair.host != nullptr) gpu->unmap_host(pair.device, pair.host);
  pair.host = nullptr;
  pair.kernel = false;
}

void StreamP2p::release_all() {
  stop();
  for (auto& [peer, pair] : pairs_) release(pair);
  cuda::Cuda* gpu = twin_.engine()->cuda();
  if (watch_ >= 0) twin_.engine()->streams().unwatch(watch_);
  watch_ = -1;
  if (scratch_ != nullptr) gpu->release(device_, scratch_);
  scratch_ = nullptr;
  // The stop words stay raised for kernels still on streams (a few bytes; they go with the
  // process).
}

void StreamP2p::stop() {
  if (words_ != nullptr) __atomic_store_n(&words_[0], 1u, __ATOMIC_RELEASE);
}

// One round of the set-up: out[i] to ranks[i] and in[i] from it, with every rank at once.
template <typename T>
Status StreamP2p::exchange(const std::vector<int>& ranks, const T* out, T* in) {
  proto::Engine* engine = twin_.engine();
  std::vector<Request> requests;
  {
    auto entry = engine->enter();
    for (std::size_t i = 0; i < ranks.size(); ++i) {
      requests.push_back(engine->messages().isend(out + i, sizeof(T), ranks[i], setup_tag(twin_)));
      requests.push_back(
          engine->messages().irecv(in + i, sizeof(T), ranks[i], setup_tag(twin_), kFullMask));
    }
    // Until every one ends (a dead peer's fail), or the communicator is revoked (a member that
    // aborted never makes its side: the call waited for ever) or FERRY_TIMEOUT passes: then they
    // are withdrawn.
    const double timeout = engine->waiting().timeout();
    const util::Clock::time_point deadline =
        timeout > 0 ? util::deadline_after(timeout) : util::Clock::time_point::max();
    int idle = 0;
    for (;;) {
      const bool all = std::all_of(requests.begin(), requests.end(), [&](Request& r) {
        return engine->requests().done(proto::Engine::index_of(r));
      });
      if (all) break;
      Status stop;
      if (twin_.revoked()) {
        stop = twin_.revoked_status("a stream send or receive's first exchange with its peers");
      } else if (util::Clock::now() >= deadline) {
        stop = Status(Code::kTimeout,
                      "a stream send or receive's first exchange with its peers: not complete "
                      "after FERRY_TIMEOUT (" +
                          std::to_string(timeout) + " s)");
      }
      if (!stop.is_ok()) {
        for (std::size_t i = 0; i < requests.size(); ++i) {
          const std::uint32_t index = proto::Engine::index_of(requests[i]);
          if (engine->requests().done(index)) continue;
          if (i % 2 == 0) {
            static_cast<void>(engine->messages().abandon_send(index));
          } else {
            engine->messages().withdraw_recv(index);
          }
        }
        for (Request& r : requests) {
          while (!engine->requests().done(proto::Engine::index_of(r))) {
            engine->waiting().step(&idle);
          }
        }
        return stop;
      }
      engine->waiting().step(&idle);
    }
  }
  return Request::wait_all(requests);
}

Status StreamP2p::connect(const std::vector<int>& peers, int device) {
  proto::Engine* engine = twin_.engine();
  const std::size_t n = peers.size();
  std::vector<Offer> mine(n);
  std::vector<Offer> theirs(n);
  std::vector<std::string> why(n);
  {
    auto entry = engine->enter();
    const std::vector<int> local = engine->job().local_ranks();
    Status common = prepare_common(device);
    for (std::size_t i = 0; i < n; ++i) {
      Pair& pair = pairs_[peers[i]];
      const bool here =
          std::find(local.begin(), local.end(), twin_.member(peers[i])) != local.end();
      if (!common) {
        why[i] = common.message();
      } else if (!here) {
        why[i] = "not on this node";
      } else if (peers[i] == twin_.rank()) {
        why[i] = "itself";
      } else if (prepare(pair, device, &mine[i].key, &why[i])) {
        mine[i].ok = 1;
        mine[i].inline_max = static_cast<std::int64_t>(inline_max_);
      }
    }
  }
  // Two rounds with every peer at once: the offers, then whether each side mapped the other's.
  std::vector<int> ranks(n);
  for (std::size_t i = 0; i < n; ++i) ranks[i] = twin_.member(peers[i]);
  auto fail_all = [&](const Status& s) {
    auto entry = engine->enter();
    for (int peer : peers) {
      release(pairs_[peer]);
      pairs_.erase(peer);
    }
    return Status(s.code(), "setting up stream sends and receives with " +
                                twin_.peer_label(peers.front()) + (n > 1 ? " and others" : "") +
                                ": " + s.message());
  };
  if (Status s = exchange(ranks, mine.data(), theirs.data()); !s) return fail_all(s);
  std::vector<std::int64_t> mapped(n, 0);
  std::vector<std::int64_t> peer_mapped(n, 0);
  {
    auto entry = engine->enter();
    for (std::size_t i = 0; i < n; ++i) {
      Pair& pair = pairs_[peers[i]];
      if (mine[i].ok == 0) continue;
      if (theirs[i].ok == 0) {
        why[i] = "the peer cannot (its log says why)";
        continue;
      }
      // A peer on our GPU takes kernels too. Without MPS the kernels of two processes on one GPU
      // take turns by time slices, and a sender and receiver that wait for each other cost a
      // slice a call; but ferry's thread instead would move device data with CUDA calls while
      // the application's stream waits for it, and an application thread in a blocking CUDA
      // call (a pageable copy) holds the driver's lock those calls wait for (one H100 shared by
      // two PyTorch ranks: hung).
      Status s = engine->cuda()->import_ipc(twin_.member(peers[i]), theirs[i].key, device, nullptr,
                                            &pair.peer_inbox);
      if (!s) {
        pair.peer_inbox = nullptr;
        why[i] = "mapping its inbox: " + s.message();
        continue;
      }
      pair.peer_key = theirs[i].key;
      mapped[i] = 1;
    }
  }
  if (Status s = exchange(ranks, mapped.data(), peer_mapped.data()); !s) {
    return fail_all(s);
  }
  std::vector<int> staged;  // by ferry's thread through shared memory: the ranks
  {
    auto entry = engine->enter();
    for (std::size_t i = 0; i < n; ++i) {
      Pair& pair = pairs_[peers[i]];
      pair.decided = true;
      pair.kernel = mapped[i] != 0 && peer_mapped[i] != 0;
      if (pair.kernel) {
        // The peer's limit is its word: never above ours, which our inbox's slots hold.
        pair.inline_max = static_cast<std::size_t>(
            std::clamp<std::int64_t>(theirs[i].inline_max, 0, mine[i].inline_max));
        FERRY_LOG(kInfo, "stream send/recv with %s: kernels on cuda:%d, inline up to %zu B",
                  twin_.peer_label(peers[i]).c_str(), device, pair.inline_max);
        continue;
      }
      if (mapped[i] != 0) why[i] = "the peer could not map our inbox";
      FERRY_LOG(kInfo, "stream send/recv with %s: by ferry's thread (%s)",
                twin_.peer_label(peers[i]).c_str(), why[i].c_str());
      release(pair);
      const int rank = twin_.member(peers[i]);
      if (rank != engine->rank() && engine->links().link(rank).shares_memory) {
        staged.push_back(rank);
      }
    }
  }
  return prepare_staging(staged, device);
}

// Where device data goes by ferry's thread through shared memory, it is staged through a host
// ring per direction, which its first staged message would make (cuMemHostRegister) or map: on
// ferry's thread, where that call waits for a lock of the driver's that an application thread
// blocked launching onto a full stream or graph holds (one H200 shared by two ranks: 200 graph
// launches of 100 send/recv each, enqueued at once, stopped at the first, ferry's thread in
// cuMemHostRegister). So both sides make theirs here, on the enqueueing thread, and map the
// other's once a round of messages says it is made, and the device bounces that staged copies of
// page-locked memory through our GPU take. Both sides decided the same pairs.
Status StreamP2p::prepare_staging(const std::vector<int>& ranks, int device) {
  if (ranks.empty()) return Status();
  proto::Engine* engine = twin_.engine();
  {
    auto entry = engine->enter();
    engine->device().prepare_copies(device);
  }
  for (int rank : ranks) engine->device().prepare_staging(rank, false);
  std::vector<std::int64_t> made(ranks.size(), 1);
  std::vector<std::int64_t> theirs(ranks.size(), 0);
  if (Status s = exchange(ranks, made.data(), theirs.data()); !s) {
    return Status(s.code(),
                  "setting up stream sends and receives by ferry's thread: " + s.message());
  }
  for (int rank : ranks) engine->device().prepare_staging(rank, true);
  return Status();
}

Status StreamP2p::enqueue(CudaStream stream,
                          std::span<const std::shared_ptr<proto::DeviceWork>> work,
                          std::vector<proto::Start>* thread, const proto::TakeRelease& take) {
  proto::Engine* engine = twin_.engine();
  cuda::Cuda* gpu = engine->cuda();
  // The set-up's CUDA calls are legal while this thread's stream captures a graph.
  cuda::RelaxedCapture relaxed(gpu);
  cuda::Cuda::StreamInfo info;
  if (Status s = gpu->stream_info(stream, &info); !s) return s;
  std::vector<int> fresh;
  {
    auto entry = engine->enter();
    for (const auto& item : work) {
      const auto& w = static_cast<const Work&>(*item);
      const auto it = pairs_.find(w.peer);
      if ((it == pairs_.end() || !it->second.decided) &&
          std::find(fresh.begin(), fresh.end(), w.peer) == fresh.end()) {
        fresh.push_back(w.peer);
      }
    }
  }
  if (!fresh.empty()) {
    if (Status s = connect(fresh, info.device); !s) return s;
  }
  thread->assign(work.size(), proto::Start());
  // The kernels' ops in waves of at most kP2pMaxOps, each wave a launch, and at most kP2pSlots
  // sends to one peer from memory the kernel cannot read (their device bounces), whose copies go
  // before their wave's launch.
  struct Copy {
    void* to;
    const void* from;
    std::size_t bytes;
  };
  std::vector<cuda::Cuda::P2pOp> wave;
  std::vector<std::pair<int, bool>> wave_keys;    // (peer, sending) of each op
  std::map<std::pair<int, bool>, int> wave_bulk;  // the last op of each that may take the ring
  std::map<int, int> wave_bounces;                // per peer
  std::vector<Copy> copies;
  std::map<int, int> verdicts;  // per peer, for the whole group: see kVerdictsBytes
  std::map<int, int> bounces;
  std::uint64_t timeout_ns = 0;
  if (twin_.timeout() > 0) timeout_ns = static_cast<std::uint64_t>(twin_.timeout() * 1e9);
  // Whether the group's one launch may release the stream itself (proto::Release): only verdicts
  // can give ferry's thread work, and there is one.
  bool releasable = static_cast<bool>(take);
  bool verdict_work = false;
  int launched = 0;
  auto flush = [&](bool last) -> Status {
    if (wave.empty()) return Status();
    for (std::size_t i = 0; i < wave.size(); ++i) {
      wave[i].total =
          static_cast<int>(std::count(wave_keys.begin(), wave_keys.end(), wave_keys[i]));
    }
    for (const Copy& c : copies) {
      if (Status s = gpu->copy_on_stream(stream, info.device, c.to, c.from, c.bytes); !s) return s;
    }
    cuda::Cuda::P2pRelease release;
    const bool releasing = last && launched == 0 && releasable && verdict_work;
    if (releasing) {
      proto::Release words;
      if (Status s = take(&words); !s) return s;
      release = cuda::Cuda::P2pRelease{words.ready, words.done, words.value, words.reset};
    }
    ++launched;
    Status s = gpu->p2p_on_stream(stream, info.device, wave, ring_, words_view_, timeout_ns,
                                  scratch_, releasing ? &release : nullptr);
    wave.clear();
    wave_keys.clear();
    wave_bulk.clear();
    wave_bounces.clear();
    copies.clear();
    return s;
  };
  auto reachable = [&](const void* buffer) {
    const mem::MemoryInfo memory = gpu->classify(buffer);
    return memory.kind == mem::MemoryKind::kCudaManaged ||
           (memory.kind == mem::MemoryKind::kCudaDevice && memory.device == info.device);
  };
  // Each op's pair (one lock for the group) and whether its kernel reaches its buffer (one look
  // each); then, before anything is enqueued, whether the group's receives fit their verdicts
  // and bounces.
  std::vector<Pair*> pair_of(work.size());
  {
    auto entry = engine->enter();
    for (std::size_t i = 0; i < work.size(); ++i) {
      pair_of[i] = &pairs_[static_cast<const Work&>(*work[i]).peer];
    }
  }
  std::vector<bool> direct_of(work.size());
  for (std::size_t i = 0; i < work.size(); ++i) {
    const auto& w = static_cast<const Work&>(*work[i]);
    const Pair* pair = pair_of[i];
    if (!pair->kernel) continue;
    const bool direct = w.bytes == 0 || reachable(w.buffer);
    direct_of[i] = direct;
    if (w.sending) {
      // A send through the bulk ring learns from the receiver whether its data goes there.
      if (direct && w.bytes > pair->inline_max && ++verdicts[w.peer] > cuda::Cuda::kP2pMaxOps) {
        return Status(Code::kUnsupported, "a group of stream calls with more than " +
                                              std::to_string(cuda::Cuda::kP2pMaxOps) +
                                              " messages with " + twin_.peer_label(w.peer) +
                                              " larger than " + std::to_string(pair->inline_max) +
                                              " B or into host memory: split the group");
      }
      continue;
    }
    if (!direct && ++bounces[w.peer] > cuda::Cuda::kP2pSlots) {
      return Status(Code::kUnsupported,
                    "a group of stream calls with more than " +
                        std::to_string(cuda::Cuda::kP2pSlots) + " receives from " +
                        twin_.peer_label(w.peer) +
                        " into memory its GPU cannot write (host memory): split the group");
    }
    if ((!direct || w.bytes > pair->inline_max) && ++verdicts[w.peer] > cuda::Cuda::kP2pMaxOps) {
      return Status(Code::kUnsupported, "a group of stream calls with more than " +
                                            std::to_string(cuda::Cuda::kP2pMaxOps) +
                                            " messages with " + twin_.peer_label(w.peer) +
                                            " larger than " + std::to_string(pair->inline_max) +
                                            " B or into host memory: split the group");
    }
  }
  verdicts.clear();  // from here, the next free one of each peer
  bounces.clear();
  // Sends to this member itself meet its receives from itself of the same group in order: each
  // pair is one copy on the stream (NCCL's alltoall, gather and scatter make them), with no
  // hand-off to ferry's thread. One without a partner in the group goes by the thread.
  std::vector<bool> copied(work.size(), false);
  {
    std::vector<std::size_t> sends;
    std::vector<std::size_t> receives;
    for (std::size_t i = 0; i < work.size(); ++i) {
      const auto& w = static_cast<const Work&>(*work[i]);
      if (w.peer == twin_.rank()) (w.sending ? sends : receives).push_back(i);
    }
    for (std::size_t k = 0; k < std::min(sends.size(), receives.size()); ++k) {
      const auto& send = static_cast<const Work&>(*work[sends[k]]);
      const auto& receive = static_cast<const Work&>(*work[receives[k]]);
      if (send.bytes > receive.bytes) {
        return Status(Code::kInvalidArgument,
                      "a stream send of " + std::to_string(send.bytes) +
                          " B to this member itself is larger than its receive (" +
                          std::to_string(receive.bytes) + " B; nothing of the group was enqueued)");
      }
    }
    for (std::size_t k = 0; k < std::min(sends.size(), receives.size()); ++k) {
      const auto& send = static_cast<const Work&>(*work[sends[k]]);
      const auto& receive = static_cast<const Work&>(*work[receives[k]]);
      if (send.bytes > 0 && send.buffer != receive.buffer) {
        if (Status s =
                gpu->copy_on_stream(stream, info.device, receive.buffer, send.buffer, send.bytes);
            !s) {
          return s;
        }
      }
      copied[sends[k]] = true;
      copied[receives[k]] = true;
    }
  }
  // The ops in the order of their places among their peer's and direction's: each wave then takes
  // the next ones of every peer and direction (matching keeps each one's order). In the group's
  // own order, a wave could hold sends to a peer alone whose receives from it wait in a later
  // wave, while the peer's waves do the same: both streams wait for ever.
  std::vector<std::size_t> order(work.size());
  {
    std::map<std::pair<int, bool>, int> seen;
    std::vector<int> place(work.size());
    for (std::size_t i = 0; i < work.size(); ++i) {
      const auto& w = static_cast<const Work&>(*work[i]);
      place[i] = seen[{w.peer, w.sending}]++;
      order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(),
                     [&](std::size_t a, std::size_t b) { return place[a] < place[b]; });
  }
  for (const std::size_t i : order) {
    const auto& w = static_cast<const Work&>(*work[i]);
    if (copied[i]) continue;
    const int rank = twin_.member(w.peer);
    Pair* pair = pair_of[i];
    if (!pair->kernel) {
      (*thread)[i] = by_thread(engine, w.sending, w.buffer, w.bytes, rank, message_tag(twin_));
      releasable = false;
      continue;
    }
    if (pair->device != info.device) {
      return Status(Code::kInvalidArgument,
                    "stream sends and receives with " + twin_.peer_label(w.peer) +
                        " run on cuda:" + std::to_string(pair->device) +
                        ", and this stream is of cuda:" + std::to_string(info.device));
    }
    const bool direct = direct_of[i];
    const bool bounced = w.sending && !direct && w.bytes <= pair->inline_max;
    const std::pair<int, bool> key(w.peer, w.sending);
    if (wave.size() == cuda::Cuda::kP2pMaxOps ||
        (bounced && wave_bounces[w.peer] == cuda::Cuda::kP2pSlots)) {
      if (Status s = flush(false); !s) return s;
    }
    cuda::Cuda::P2pOp op;
    op.peer = w.peer;
    op.index = static_cast<int>(std::count(wave_keys.begin(), wave_keys.end(), key));
    op.bytes = w.bytes;
    // Messages that may take the bulk ring take it in turn, in order.
    if (direct && w.bytes > pair->inline_max) {
      const auto [it, fresh] = wave_bulk.try_emplace(key, static_cast<int>(wave.size()));
      if (!fresh) op.after = std::exchange(it->second, static_cast<int>(wave.size()));
    }
    auto* inbox = static_cast<std::byte*>(pair->inbox);
    auto* peer_inbox = static_cast<std::byte*>(pair->peer_inbox);
    auto* counters = static_cast<std::byte*>(pair->counters);
    if (w.sending) {
      op.slots = peer_inbox + 128;
      op.free = inbox;
      op.counter = counters;
      op.buffer = w.buffer;
      if (w.bytes <= pair->inline_max) {
        op.kind = OpKind::kSendInline;
        if (!direct) {
          const auto k = static_cast<std::size_t>(wave_bounces[w.peer]++);
          op.buffer = static_cast<std::byte*>(pair->bounce) + k * cuda::Cuda::kP2pInlineMax;
          copies.push_back({op.buffer, w.buffer, w.bytes});
        }
      } else if (direct) {
        op.kind = OpKind::kSendBulk;
        op.chunks = counters + cuda::Cuda::kP2pFilledOffset;
        const int v = verdicts[w.peer]++;
        const std::size_t offset = static_cast<std::size_t>(v) * kVerdictBytes;
        op.verdict = static_cast<std::byte*>(pair->host_view) + offset;
        (*thread)[i] = after_verdict(engine, pair->host + offset / sizeof(unsigned), true, true,
                                     nullptr, w.buffer, w.bytes, rank, message_tag(twin_));
        verdict_work = true;
      } else {
        op.kind = OpKind::kSendHeader;
        (*thread)[i] = by_thread(engine, true, w.buffer, w.bytes, rank, message_tag(twin_));
        releasable = false;
      }
    } else {
      op.kind = OpKind::kReceive;
      op.slots = inbox + 128;
      op.free = peer_inbox;
      op.counter = counters + 8;
      op.chunks = counters + cuda::Cuda::kP2pEmptiedOffset;
      op.direct = direct;
      op.buffer = w.buffer;
      std::byte* host_bounce = nullptr;
      if (!direct) {
        const int b = bounces[w.peer]++;
        const std::size_t offset =
            kVerdictsBytes + static_cast<std::size_t>(b) * cuda::Cuda::kP2pInlineMax;
        host_bounce = reinterpret_cast<std::byte*>(pair->host) + offset;
        op.buffer = static_cast<std::byte*>(pair->host_view) + offset;
      }
      if (!direct || w.bytes > pair->inline_max) {
        const int v = verdicts[w.peer]++;
        const std::size_t offset = static_cast<std::size_t>(v) * kVerdictBytes;
        op.verdict = static_cast<std::byte*>(pair->host_view) + offset;
        unsigned* verdict = pair->host + offset / sizeof(unsigned);
        (*thread)[i] = after_verdict(engine, verdict, false, direct, host_bounce, w.buffer, w.bytes,
                                     rank, message_tag(twin_));
        // Into host memory the thread always has work (a copy from the bounce, or the data).
        verdict_work = true;
        releasable = releasable && direct;
      }
    }
    wave.push_back(op);
    wave_keys.push_back(key);
  }
  return flush(true);
}

Status StreamP2p::watch() {
  if (words_ == nullptr || reported_) return Status();
  const std::string what =
      "a stream send or receive on communicator " + std::to_string(twin_.base_id());
  Status failure;
  if (const unsigned bad = __atomic_load_n(&words_[1], __ATOMIC_ACQUIRE); bad != 0) {
    failure = bad == cuda::Cuda::kP2pBadReply
                  ? Status(Code::kProtocolError,
                           what +
                               ": a receiver's reply word held a value no receiver writes (its "
                               "inbox was overwritten, or the members run different builds)")
                  : Status(Code::kInvalidArgument,
                           what +
                               ": a message was larger than its receive, or its header was not "
                               "one this receive takes (do the members pass the same sizes, in "
                               "the same order?)");
  } else if (__atomic_load_n(&words_[2], __ATOMIC_ACQUIRE) != 0) {
    failure = Status(Code::kTimeout, what + ": a member did not arrive within FERRY_TIMEOUT (" +
                                         std::to_string(twin_.timeout()) + " s)");
  } else if (twin_.revoked()) {
    failure = twin_.revoked_status(what);
  } else {
    proto::Engine* engine = twin_.engine();
    for (const auto& [peer, pair] : pairs_) {
      if (!pair.kernel) continue;
      if (const std::string* why = engine->liveness().failure(twin_.member(peer)); why != nullptr) {
        failure =
            Status(Code::kPeerFailed, what + ": " + twin_.peer_label(peer) + " failed: " + *why);
        break;
      }
    }
  }
  if (failure.is_ok()) {
    if (const int m = departed_.look(&words_[3], twin_); m >= 0) {
      failure = Status(Code::kCanceled, what + ": " + twin_.departed_label(m));
    }
  }
  if (failure.is_ok()) return failure;
  stop();
  reported_ = true;
  return failure;
}

}  // namespace ferry::coll
