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
  timeout_ = config_.get_seconds(util::Var::kTimeout);
  crash_on_send_ =
      config_.get_int(util::Var::kTestCrashRank) == rank_ &&
      config_.get_int(util::Var::kTestCrashAt) == static_cast<int>(util::CrashPoint::kFirstSend);
  crash_mid_pipeline_ =
      config_.get_int(util::Var::kTestCrashRank) == rank_ &&
      config_.get_int(util::Var::kTestCrashAt) == static_cast<int>(util::CrashPoint::kMidPipeline);
  peers_.resize(static_cast<std::size_t>(size_));
  cuda_ = cuda::Cuda::create(config_, &cuda_why_);
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
  setup_transports();
  rma_ = std::make_unique<rma::OneSided>(*this, native_rma_, size_);
  connect_peers();
  waiting_.start_threads(config_);
  util::crash_point(config_, rank_, util::CrashPoint::kInitialized);
}

void Engine::setup_transports() {
  {
    std::string local;
    for (int r : bootstrap_->local_ranks()) local += (local.empty() ? "" : ",") + std::to_string(r);
    transport_notes_.push_back("bootstrap: " + bootstrap_->name() + " (rank " +
                               std::to_string(rank_) + " of " + std::to_string(size_) +
                               "; ranks on this node: " + local + ")");
    transport_notes_.push_back(waiting_.describe());
  }
  if (config_.list_contains(util::Var::kTransports, "self")) {
    auto self = std::make_unique<transport::self::SelfTransport>(rank_, this);
    self_ = self.get();
    transports_.push_back(std::move(self));
    transport_notes_.push_back("self: available");
  } else {
    transport_notes_.push_back("self: excluded by FERRY_TRANSPORTS");
  }
  if (cuda_) {
    transport_notes_.push_back("cuda: " + cuda_->describe() +
                               (cuda_ipc_ ? "; IPC on, host staging when refused"
                                          : "; IPC off (FERRY_CUDA_IPC=0): host staging"));
  } else {
    transport_notes_.push_back("cuda: not used (" + cuda_why_ + ")");
  }
  std::vector<int> local = bootstrap_->local_ranks();
  if (!config_.list_contains(util::Var::kTransports, "shm")) {
    transport_notes_.push_back("shm: excluded by FERRY_TRANSPORTS");
  } else if (local.size() < 2) {
    transport_notes_.push_back("shm: not needed (no other process of the job on this node)");
  } else {
    auto it = std::find(local.begin(), local.end(), rank_);
    if (it == local.end()) {
      throw Error(Code::kBootstrapError,
                  bootstrap_->name() + " lists this node's ranks without " + std::to_string(rank_));
    }
    auto shm = std::make_unique<transport::shm::ShmTransport>(
        config_, bootstrap_->job_id(), rank_, static_cast<int>(it - local.begin()), local, this);
    shm_ = shm.get();
    transports_.push_back(std::move(shm));
    polled_.push_back(shm_);
    transport_notes_.push_back("shm: available (" + std::to_string(local.size()) +
                               " processes on this node)");
  }
  setup_ofi(local.size());
}

void Engine::setup_ofi(std::size_t local_count) {
  if (!config_.list_contains(util::Var::kTransports, "ofi")) {
    transport_notes_.push_back("ofi: excluded by FERRY_TRANSPORTS");
    return;
  }
  const bool shm = config_.list_contains(util::Var::kTransports, "shm");
  if (shm && local_count == static_cast<std::size_t>(size_)) {
    transport_notes_.push_back("ofi: not needed (every rank is on this node)");
    return;
  }
#if FERRY_HAVE_OFI
  try {
    const util::FatalSignalGuard handlers;  // providers loaded now must not take them either
    auto ofi = std::make_unique<transport::ofi::OfiTransport>(config_, rank_, size_, this);
    transport_notes_.push_back("ofi: " + ofi->provider());
    if (ofi->has_native_rma()) native_rma_ = ofi.get();
    transports_.push_back(std::move(ofi));
    polled_.push_back(transports_.back().get());
  } catch (const Error& e) {
    // Not fatal here: peers it was needed for say "no transport reaches rank N (ofi: …)".
    FERRY_LOG(kWarn, "ofi transport unavailable: %s", e.what());
    transport_notes_.push_back(std::string("ofi: unavailable (") + e.what() + ")");
  }
#else
  transport_notes_.push_back(
      "ofi: not in this build (no rdma/fabric.h at configure time: install libfabric-dev)");
#endif
}

namespace {

// The entry of the published blob that carries the job-wide settings (util::kJobWide), one
// "NAME=value" line each: never a transport's name.
constexpr const char* kSettingsEntry = "settings";

std::string job_settings(const util::Config& config) {
  std::string text;
  for (util::Var var : util::kJobWide) {
    text += std::string(util::registry()[static_cast<std::size_t>(var)].name) + "=" +
            config.canonical(var) + "\n";
  }
  return text;
}

// "rank 3", "ranks 0, 2-5, 7".
std::string ranks_text(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (i > 0) out += ", ";
    out += std::to_string(ranks[i]);
    if (j > i) out += "-" + std::to_string(ranks[j]);
    i = j + 1;
  }
  return out;
}

// Fails (on every rank alike, since every rank sees every blob) where the ranks' job-wide
// settings differ, naming each variable, its values and the ranks that hold each.
void check_job_settings(const std::vector<std::string>& settings) {
  std::string differences;
  for (util::Var var : util::kJobWide) {
    const std::string name = util::registry()[static_cast<std::size_t>(var)].name;
    std::vector<std::pair<std::string, std::vector<int>>> values;  // in order of first rank
    for (std::size_t r = 0; r < settings.size(); ++r) {
      std::string value = "(not published)";
      const std::string key = name + "=";
      if (std::size_t at = settings[r].find(key); at != std::string::npos) {
        const std::size_t start = at + key.size();
        value = settings[r].substr(start, settings[r].find('\n', start) - start);
      }
      auto it = std::find_if(values.begin(), values.end(),
                             [&](const auto& entry) { return entry.first == value; });
      if (it == values.end()) it = values.insert(values.end(), {value, {}});
      it->second.push_back(static_cast<int>(r));
    }
    if (values.size() < 2) continue;
    differences += (differences.empty() ? "" : "; ") + name + " is ";
    for (std::size_t i = 0; i < values.size(); ++i) {
      differences += (i == 0                   ? ""
                      : i + 1 == values.size() ? " and "
                                               : ", ") +
                     values[i].first + " on " + ranks_text(values[i].second);
    }
  }
  if (!differences.empty()) {
    throw Error(Code::kInvalidArgument,
                "settings that every rank must share differ: " + differences +
                    " (set them alike on every rank, or leave them unset)");
  }
}

}  // namespace

void Engine::connect_peers() {
  std::vector<std::vector<std::byte>> addresses;
  Published mine;
  for (const auto& t : transports_) addresses.push_back(t->address());
  for (std::size_t i = 0; i < transports_.size(); ++i) {
    mine.emplace_back(transports_[i]->capabilities().name, addresses[i]);
  }
  const std::string settings = job_settings(config_);
  mine.emplace_back(kSettingsEntry, std::as_bytes(std::span(settings.data(), settings.size())));
  std::vector<bootstrap::Blob> all;
  auto idle = [this] { progress(); };
  Status status = bootstrap_->allgather(encode_addresses(mine), &all, idle);
  if (!status) throw Error(status);
  if (all.size() != static_cast<std::size_t>(size_)) {
    throw Error(Code::kBootstrapError, bootstrap_->name() + " returned " +
                                           std::to_string(all.size()) + " addresses for " +
                                           std::to_string(size_) + " ranks");
  }
  std::vector<Published> everyone(static_cast<std::size_t>(size_));
  std::vector<std::string> their_settings(static_cast<std::size_t>(size_));
  for (int r = 0; r < size_; ++r) {
    // What rank r published: (transport name, address) pairs, and its job-wide settings.
    Published& published = everyone[static_cast<std::size_t>(r)];
    if (!decode_addresses(all[static_cast<std::size_t>(r)], &published)) {
      throw Error(Code::kProtocolError,
                  "rank " + std::to_string(r) + " published a malformed address blob");
    }
    for (const auto& [name, blob] : published) {
      if (name == kSettingsEntry) {
        their_settings[static_cast<std::size_t>(r)].assign(
            reinterpret_cast<const char*>(blob.data()), blob.size());
      }
    }
  }
  check_job_settings(their_settings);
  std::vector<int> local = bootstrap_->local_ranks();
  for (int r = 0; r < size_; ++r) {
    const Published& published = everyone[static_cast<std::size_t>(r)];
    auto it = std::find(local.begin(), local.end(), r);
    Peer& peer = peers_[static_cast<std::size_t>(r)];
    std::string tried;
    for (const auto& t : transports_) {
      const std::string& name = t->capabilities().name;
      transport::PeerInfo info;
      info.rank = r;
      info.same_node = it != local.end();
      info.local_index = info.same_node ? static_cast<int>(it - local.begin()) : -1;
      auto match = std::find_if(published.begin(), published.end(),
                                [&](const auto& p) { return p.first == name; });
      if (match == published.end() && name != "self") {
        tried += name + ": rank " + std::to_string(r) + " does not offer it; ";
        continue;
      }
      if (match != published.end()) info.address = match->second;
      transport::Reachability reach = t->reach(info);
      if (!reach.reachable) {
        tried += name + ": " + reach.reason + "; ";
        continue;
      }
      try {
        endpoints_.push_back(t->connect(info));
      } catch (const Error& e) {
        FERRY_LOG(kWarn, "%s could not connect to rank %d: %s", name.c_str(), r, e.what());
        tried += name + ": " + e.what() + "; ";
        continue;
      }
      peer.endpoint = endpoints_.back().get();
      peer.zero_copy = peer.endpoint->zero_copy_get();
      peer.direct = peer.endpoint->direct();
      peer.reads = peer.endpoint->reads();
      peer.writes = peer.endpoint->writes();
      peer.transport = name;
      peer.shares_memory = name == "self" || name == "shm";
      peer.why = peer.endpoint->describe();
      const std::size_t max_am = t->capabilities().max_am;
      peer.eager_limit = std::min(rndv_threshold_, max_am - sizeof(EagerHeader));
      peer.frag_size = std::min<std::size_t>(max_am, 1u << 20) - sizeof(FragHeader);
      peer.get_from = t->capabilities().get_from;
      peer.read_from = t->capabilities().read_from;
      break;
    }
    if (peer.endpoint == nullptr) {
      peer.why = "no transport reaches rank " + std::to_string(r) + " (" +
                 (tried.empty() ? std::string("none enabled") : tried.substr(0, tried.size() - 2)) +
                 ")";
    }
  }
  liveness_.connected(rank_);
  // Everyone has mapped everyone: names in /dev/shm can go now.
  status = bootstrap_->barrier(idle);
  if (!status) throw Error(status);
  for (auto& t : transports_) t->on_all_connected();
}

Engine::~Engine() { shutdown(); }

void Engine::shutdown() {
  if (shut_down_) return;
  shut_down_ = true;
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
  int idle = 0;
  while ((!pending_peers_.empty() || outstanding_sends_ > 0) && Clock::now() < deadline) {
    waiting_.step(&idle);
  }
  if (const std::size_t never_matched = messages_->never_matched(); never_matched > 0) {
    FERRY_LOG(kWarn,
              "finalize: %zu send(s) of this rank were never received: their receivers "
              "finalized without a matching receive",
              never_matched);
  }
  if (!pending_peers_.empty() || outstanding_sends_ > 0) {
    FERRY_LOG(kWarn,
              "finalize: %zu sends still incomplete after %.1f s (FERRY_FINALIZE_TIMEOUT); "
              "were they received?",
              outstanding_sends_, config_.get_seconds(util::Var::kFinalizeTimeout));
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
    auto delivered = [this] {
      bool all = true;
      for (auto& t : transports_) all = t->delivered() && all;
      return all;
    };
    while (!delivered() && Clock::now() < deadline) waiting_.step(&idle);
    if (!delivered()) {
      FERRY_LOG(kWarn,
                "finalize: delivery of this rank's last messages not confirmed by every live "
                "peer within FERRY_FINALIZE_TIMEOUT (%.1f s)",
                config_.get_seconds(util::Var::kFinalizeTimeout));
    }
  }
  device_->drain();
  device_->close_rings();
  endpoints_.clear();
  polled_.clear();
  shm_ = nullptr;
  self_ = nullptr;
  rma_->close_native();  // its registrations belong to a transport closed here
  transports_.clear();
}

// Sleeping is for waits that only a message can end: not while device copies, queued sends
// (the receiver frees room without ringing) or collectives with GPU work are in flight.
bool Engine::only_a_message_can_end_a_wait() const {
  return !device_->busy() && pending_peers_.empty() && suspects_.empty() &&
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
  int idle = 0;
  return bootstrap_->barrier([this, &idle] { waiting_.step(&idle); });
}

std::string Engine::describe_peer(int rank) const {
  if (rank < 0 || rank >= size_) return "rank " + std::to_string(rank) + " is not in the job";
  const Peer& peer = peers_[static_cast<std::size_t>(rank)];
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
    large = "by zero-copy get from " + std::to_string(peer.get_from) + " B, pipelined below";
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

std::vector<std::string> Engine::describe_transports() const { return transport_notes_; }

}  // namespace ferry::proto
