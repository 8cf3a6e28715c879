// The protocol engine's set-up, finalize and descriptions (see engine.hpp); its core is in
// progress.cpp, its parts in messages.hpp, device_path.hpp, chunked.hpp and rma/.
#include "proto/engine.hpp"

#include <poll.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <ctime>
#include <utility>

#include "proto/address_blob.hpp"
#include "proto/chunked.hpp"
#include "proto/device_path.hpp"
#include "proto/messages.hpp"
#include "proto/stream_ops.hpp"
#include "proto/wire.hpp"
#include "transport/self/transport.hpp"
#include "transport/shm/transport.hpp"
#include "util/clock.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"
#include "util/signals.hpp"
#if FERRY_HAVE_OFI
#include "transport/ofi/transport.hpp"
#endif
#include "util/wire.hpp"

namespace ferry::proto {
using util::Clock;

std::unique_ptr<Engine> Engine::create(const Options& options) {
  util::Config config = util::Config::load(options.config);
  util::set_log_level(static_cast<util::LogLevel>(config.get_int(util::Var::kLogLevel)));
  for (const auto& name : config.unknown()) {
    FERRY_LOG(kWarn, "unknown variable %s is ignored (ferry-info lists the known ones)",
              name.c_str());
  }
  std::unique_ptr<bootstrap::Bootstrap> bootstrap = bootstrap::create(config);
  return std::unique_ptr<Engine>(new Engine(std::move(config), std::move(bootstrap)));
}

Engine::Engine(util::Config config, std::unique_ptr<bootstrap::Bootstrap> bootstrap)
    : config_(std::move(config)), bootstrap_(std::move(bootstrap)) {
  rank_ = bootstrap_->rank();
  size_ = bootstrap_->size();
  handle_ = std::make_shared<Engine*>(this);
  util::set_log_rank(size_ > 1 ? rank_ : -1);
  rndv_threshold_ = config_.get_size(util::Var::kRndvThreshold);
  waiting_.configure(config_, bootstrap_->local_ranks().size());
  // ferryrun's board, where a long wait says what it waits for (util/wait_board.hpp).
  if (board_.adopt(static_cast<int>(config_.get_int(util::Var::kBoardFd)), size_)) {
    waiting_.attach_board(&board_, rank_);
  }
  crashes_ = util::CrashPoints(config_, rank_);
  cuda_ = cuda::Cuda::create(config_, &cuda_why_);
  if (cuda_) cuda_->set_rank(rank_);
  if (!cuda_ && config_.get_string(util::Var::kCuda) == "require") {
    throw Error(Code::kUnsupported, "FERRY_CUDA=require, but CUDA cannot be used: " + cuda_why_);
  }
  cuda_ipc_ = config_.get_bool(util::Var::kCudaIpc);
  std::unique_ptr<util::FdMailbox> mailbox;
  std::string mailbox_why;
  if (cuda_ && cuda_ipc_ && bootstrap_->local_ranks().size() > 1) {
    // Bound before the address exchange, so a peer never finds it missing.
    try {
      mailbox = std::make_unique<util::FdMailbox>(bootstrap_->job_id(), rank_);
    } catch (const Error& e) {
      mailbox_why = e.what();
      FERRY_LOG(kInfo, "cuMem allocations go by host staging: %s", e.what());
    }
  } else {
    mailbox_why = "no descriptor mailbox (CUDA IPC off or no other process on this node)";
  }
  messages_ = std::make_unique<Messages>(*this, config_);
  device_ = std::make_unique<DevicePath>(*this, config_, std::move(mailbox), std::move(mailbox_why),
                                         size_);
  chunked_ = std::make_unique<ChunkedPath>(*this, config_);
  open_links();
  rma_ = std::make_unique<rma::OneSided>(*this, links_.native_rma(), size_);
  const auto idle = [this] { progress(); };
  links_.connect(*bootstrap_, rndv_threshold_, idle);
  waiting_.placed(links_.cpu_sharers());
  links_.renote("waiting:", waiting_.describe());
  liveness_.connected(rank_);
  links_.all_connected(*bootstrap_, idle);
  waiting_.start_threads(config_);
  util::crash_point(config_, rank_, util::CrashPoint::kInitialized);
}

void Engine::open_links() {
  std::vector<std::string> notes;
  std::string local;
  for (int r : bootstrap_->local_ranks()) local += (local.empty() ? "" : ",") + std::to_string(r);
  notes.push_back("bootstrap: " + bootstrap_->name() + " (rank " + std::to_string(rank_) + " of " +
                  std::to_string(size_) + "; ranks on this node: " + local + ")");
  notes.push_back(waiting_.describe());
  const std::string cuda = cuda_ ? "cuda: " + cuda_->describe() +
                                       (cuda_ipc_ ? "; IPC on, host staging when refused"
                                                  : "; IPC off (FERRY_CUDA_IPC=0): host staging")
                                 : "cuda: not used (" + cuda_why_ + ")";
  links_.open(*bootstrap_, std::move(notes), cuda);
}

Engine::~Engine() { shutdown(); }

proto::StreamOps& Engine::streams() {
  if (!streams_) {
    streams_ = std::make_unique<proto::StreamOps>(*this);
    streams_made_.store(streams_.get(), std::memory_order_release);
  }
  return *streams_;
}

void Engine::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
  // The stream proxy first: it calls the engine like an application thread.
  if (streams_) streams_->stop();
  waiting_.stop_progress_thread();
  *handle_ = nullptr;
  finalize();
  // Communicators that outlive this Context give up their device state while CUDA is here.
  for (auto& [owner, work] : std::exchange(teardown_, {})) work();
  // Allocated regions still registered (their MemoryRegions outlive the Context) and the peers'
  // regions mapped here.
  rma_->clear();
  chunked_.reset();  // its pinned bounces, while CUDA is here
}

void Engine::finalize() {
  const auto deadline = util::deadline_after(config_.get_seconds(util::Var::kFinalizeTimeout));
  // No receive is posted from here on: what peers announced and nothing matched never will be.
  const std::size_t dropped = messages_->finalize();
  if (dropped > 0) {
    FERRY_LOG(kWarn,
              "finalize: %zu message(s) sent to this rank were never received (no receive "
              "matched them)",
              dropped);
  }
  // A peer waiting for a message this rank never sent would wait in its receive while this rank
  // waits for it below (its own sends, then the barrier): each peer learns, behind everything
  // this rank sent it, that nothing more comes (kAmBye), and such receives end (kCanceled).
  for (int r = 0; r < size_; ++r) {
    const Link& link = links_.link(r);
    if (r != rank_ && !link.failed && link.endpoint != nullptr) {
      links_.send_control(r, kAmBye, as_bytes(ByeHeader{0}));
    }
  }
  int idle = 0;
  while ((links_.queued() || requests_.sends() > 0) && Clock::now() < deadline) {
    waiting_.step(&idle);
  }
  if (const std::size_t never_matched = messages_->never_matched(); never_matched > 0) {
    FERRY_LOG(kWarn,
              "finalize: %zu send(s) of this rank were never received: their receivers "
              "finalized without a matching receive",
              never_matched);
  }
  if (links_.queued() || requests_.sends() > 0) {
    FERRY_LOG(kWarn,
              "finalize: %zu sends still incomplete after %.1f s (FERRY_FINALIZE_TIMEOUT); "
              "were they received?",
              requests_.sends(), config_.get_seconds(util::Var::kFinalizeTimeout));
  }
  device_->drain();
  util::crash_point(config_, rank_, util::CrashPoint::kFinalize);
  // Peers may still be reading our bounce buffers or our memory: leave only together.
  Status status = bootstrap_->barrier([this] { progress(); });
  if (!status) {
    FERRY_LOG(kWarn, "finalize: %s", status.to_string().c_str());
    // The barrier failed at once (a rank is dead), so the live peers may not have what was sent
    // them yet. Sends complete before they leave some transports (ofi's eager ones): closing
    // those now would lose messages that a live peer still waits for. (After a barrier that
    // held, every peer that needed a message had it before it came.)
    while (!links_.delivered() && Clock::now() < deadline) waiting_.step(&idle);
    if (!links_.delivered()) {
      FERRY_LOG(kWarn,
                "finalize: delivery of this rank's last messages not confirmed by every live "
                "peer within FERRY_FINALIZE_TIMEOUT (%.1f s)",
                config_.get_seconds(util::Var::kFinalizeTimeout));
    }
  }
  device_->drain();
  device_->close_rings();
  rma_->close_native();  // its registrations belong to a transport closed here
  links_.close();
}

// Sleeping is for waits that only a message can end: not while device copies, queued sends
// (the receiver frees room without ringing) or collectives with GPU work are in flight.
bool Engine::only_a_message_can_end_a_wait() const {
  return !device_->busy() && !links_.queued() && !direct_ends_.suspects() && gpu_waits_ == 0 &&
         (!cuda_ || operations_.empty());
}

void Engine::abort(int code, const std::string& reason) {
  FERRY_LOG(kError, "aborting the job (code %d): %s", code, reason.c_str());
  bootstrap_->abort(code, reason);
  // The launcher ends every rank; if it does not, leave anyway.
  const auto deadline = util::deadline_after(10);
  while (Clock::now() < deadline) ::usleep(10000);
  ::_exit(code);
}

Status Engine::barrier() {
  const Waiting::Note note = waiting_.note(
      [](const void*, std::uintptr_t) {
        return std::string("barrier of the job (Context::barrier, through the launcher)");
      },
      nullptr);
  int idle = 0;
  return bootstrap_->barrier([this, &idle] { waiting_.step(&idle); });
}

std::string Engine::wait_report() {
  char line[64];
  std::string report;
  if (!board_.usable()) {
    const std::string mine = waiting_.current_wait();
    std::snprintf(line, sizeof(line), "rank %d: ", rank_);
    return line + (mine.empty() ? std::string("not waiting in ferry") : "waiting: " + mine) +
           " (no wait board: only ferryrun's jobs have one)\n";
  }
  const std::vector<util::WaitBoard::Entry> entries = board_.read();
  for (std::size_t r = 0; r < entries.size(); ++r) {
    const util::WaitBoard::Entry& e = entries[r];
    if (e.waited_s > 0) {
      std::snprintf(line, sizeof(line), "rank %zu: waiting %.2f s: ", r, e.waited_s);
      report += line + e.text + "\n";
    } else {
      std::snprintf(line, sizeof(line), "rank %zu: not waiting in ferry\n", r);
      report += line;
    }
  }
  return report;
}

std::string Engine::describe_peer(int rank) const {
  if (rank < 0 || rank >= size_) return "rank " + std::to_string(rank) + " is not in the job";
  const Link& peer = links_.link(rank);
  if (peer.endpoint == nullptr) return peer.why;
  std::string large;
  if (peer.get_failed) {
    large = "pipelined (zero-copy get failed earlier)";
  } else if ((peer.reads != nullptr) && !peer.read_failed && !chunked_->forced()) {
    const bool direct = (peer.direct != nullptr) && !peer.direct_failed;
    large = direct ? "by one-sided read of the sender's buffer (direct transfer if a read fails)"
                   : "by one-sided read of the sender's buffer (pipelined if a read fails)";
    if (direct && peer.read_from > 0) {
      large =
          "by direct transfer below " + std::to_string(peer.read_from) + " B, from there " + large;
    }
  } else if ((peer.direct != nullptr) && !peer.direct_failed) {
    large = "by direct transfer (the transport's own rendezvous)";
  } else if (peer.zero_copy != nullptr) {
    large = "by zero-copy get from " + std::to_string(peer.get_from) + " B";
    if (peer.split != nullptr && !peer.split_failed && peer.split_from != SIZE_MAX) {
      large += " (copied from both ends from " + std::to_string(peer.split_from) + " B)";
    }
    large += ", pipelined below";
  } else {
    large = "pipelined";
  }
  std::string out =
      peer.why + ": eager up to " + std::to_string(peer.eager_limit) + " B, rendezvous " + large;
  out += rma_->describe(rank, (peer.writes != nullptr));
  if (cuda_) {
    out += "; device buffers: ";
    if (!peer.shares_memory) {
      out +=
          "no shared memory with this peer: small ones copied through host memory, larger "
          "ones in chunks (" +
          peer.direct->device_route() + ")";
    } else if (!cuda_ipc_) {
      out += "host-staged (FERRY_CUDA_IPC=0)";
    } else if (rank == rank_) {
      out += "host-staged (same process)";
    } else {
      out += device_->describe(rank);
    }
    if (std::string done = cuda_->completion(); !done.empty()) {
      out += "; GPU copies complete " + done;
    }
  }
  return out;
}

}  // namespace ferry::proto
