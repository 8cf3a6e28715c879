// The engine's links (see links.hpp): transports made, peers connected, queued sending.
#include "proto/links.hpp"

#include <sched.h>

#include <algorithm>
#include <cstring>

#include "proto/engine.hpp"
#include "proto/wire.hpp"
#include "transport/self/transport.hpp"
#include "transport/shm/transport.hpp"
#include "util/faults.hpp"
#include "util/log.hpp"
#include "util/signals.hpp"
#if FERRY_HAVE_OFI
#include "transport/ofi/transport.hpp"
#endif

namespace ferry::proto {

Links::~Links() = default;

void Links::open(bootstrap::Bootstrap& bootstrap, std::vector<std::string> first_notes,
                 std::string cuda_note) {
  rank_ = bootstrap.rank();
  size_ = bootstrap.size();
  peers_.resize(static_cast<std::size_t>(size_));
  crash_mid_pipeline_ = engine_.crashes().at(util::CrashPoint::kMidPipeline);
  notes_ = std::move(first_notes);
  if (config_.list_contains(util::Var::kTransports, "self")) {
    auto self = std::make_unique<transport::self::SelfTransport>(rank_, &engine_);
    self_ = self.get();
    transports_.push_back(std::move(self));
    notes_.push_back("self: available");
  } else {
    notes_.push_back("self: excluded by FERRY_TRANSPORTS");
  }
  notes_.push_back(std::move(cuda_note));
  std::vector<int> local = bootstrap.local_ranks();
  if (!config_.list_contains(util::Var::kTransports, "shm")) {
    notes_.push_back("shm: excluded by FERRY_TRANSPORTS");
  } else if (local.size() < 2) {
    notes_.push_back("shm: not needed (no other process of the job on this node)");
  } else {
    auto it = std::find(local.begin(), local.end(), rank_);
    if (it == local.end()) {
      throw Error(Code::kBootstrapError,
                  bootstrap.name() + " lists this node's ranks without " + std::to_string(rank_));
    }
    auto shm = std::make_unique<transport::shm::ShmTransport>(
        config_, bootstrap.job_id(), rank_, static_cast<int>(it - local.begin()), local, &engine_);
    shm_ = shm.get();
    transports_.push_back(std::move(shm));
    polled_.push_back(shm_);
    notes_.push_back("shm: available (" + std::to_string(local.size()) +
                     " processes on this node)");
  }
  open_ofi(local.size());
}

void Links::open_ofi(std::size_t local_count) {
  if (!config_.list_contains(util::Var::kTransports, "ofi")) {
    notes_.push_back("ofi: excluded by FERRY_TRANSPORTS");
    return;
  }
  const bool shm = config_.list_contains(util::Var::kTransports, "shm");
  if (shm && local_count == static_cast<std::size_t>(size_)) {
    notes_.push_back("ofi: not needed (every rank is on this node)");
    return;
  }
#if FERRY_HAVE_OFI
  try {
    const util::FatalSignalGuard handlers;  // providers loaded now must not take them either
    auto ofi = std::make_unique<transport::ofi::OfiTransport>(config_, rank_, size_, &engine_);
    notes_.push_back("ofi: " + ofi->provider());
    if (ofi->has_native_rma()) native_rma_ = ofi.get();
    transports_.push_back(std::move(ofi));
    polled_.push_back(transports_.back().get());
  } catch (const Error& e) {
    // Not fatal here: peers it was needed for say "no transport reaches rank N (ofi: …)".
    FERRY_LOG(kWarn, "ofi transport unavailable: %s", e.what());
    notes_.push_back(std::string("ofi: unavailable (") + e.what() + ")");
  }
#else
  notes_.push_back(
      "ofi: not in this build (no rdma/fabric.h at configure time: install libfabric-dev)");
#endif
}

namespace {

// The entry of the published blob that carries the job-wide settings (util::kJobWide), one
// "NAME=value" line each: never a transport's name.
constexpr const char* kSettingsEntry = "settings";
// The entry that carries the rank's CPUs (its affinity mask, a cpu_set_t), so that each rank of a
// node can count the ranks that share its CPUs.
constexpr const char* kCpusEntry = "cpus";

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

void Links::connect(bootstrap::Bootstrap& bootstrap, std::size_t rndv_threshold,
                    const std::function<void()>& idle) {
  std::vector<std::vector<std::byte>> addresses;
  Published mine;
  for (const auto& t : transports_) addresses.push_back(t->address());
  for (std::size_t i = 0; i < transports_.size(); ++i) {
    mine.emplace_back(transports_[i]->capabilities().name, addresses[i]);
  }
  const std::string settings = job_settings(config_);
  mine.emplace_back(kSettingsEntry, std::as_bytes(std::span(settings.data(), settings.size())));
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  const bool cpus_known = ::sched_getaffinity(0, sizeof(cpus), &cpus) == 0;
  if (cpus_known) mine.emplace_back(kCpusEntry, std::as_bytes(std::span(&cpus, 1)));
  std::vector<bootstrap::Blob> all;
  Status status = bootstrap.allgather(encode_addresses(mine), &all, idle);
  if (!status) throw Error(status);
  if (all.size() != static_cast<std::size_t>(size_)) {
    throw Error(Code::kBootstrapError, bootstrap.name() + " returned " +
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
  std::vector<int> local = bootstrap.local_ranks();
  for (int r = 0; r < size_; ++r) {
    connect_peer(r, everyone[static_cast<std::size_t>(r)], local, rndv_threshold);
  }
  count_cpu_sharers(everyone, local, cpus_known ? &cpus : nullptr);
}

void Links::count_cpu_sharers(const std::vector<Published>& everyone, const std::vector<int>& local,
                              const cpu_set_t* mine) {
  cpu_sharers_ = static_cast<int>(local.size());  // without a mask: every rank of the node
  if (mine == nullptr) return;
  cpu_sharers_ = 0;
  for (int r : local) {
    if (r < 0 || r >= size_) continue;
    const Published& published = everyone[static_cast<std::size_t>(r)];
    auto entry = std::find_if(published.begin(), published.end(),
                              [](const auto& p) { return p.first == kCpusEntry; });
    if (entry == published.end() || entry->second.size() != sizeof(cpu_set_t)) {
      ++cpu_sharers_;  // its CPUs are unknown: it may share ours
      continue;
    }
    cpu_set_t theirs;
    std::memcpy(&theirs, entry->second.data(), sizeof(theirs));
    cpu_set_t both;
    CPU_AND(&both, &theirs, mine);
    if (CPU_COUNT(&both) > 0) ++cpu_sharers_;
  }
}

void Links::renote(const std::string& prefix, std::string note) {
  for (std::string& line : notes_) {
    if (line.rfind(prefix, 0) == 0) line = std::move(note);
  }
}

void Links::all_connected(bootstrap::Bootstrap& bootstrap, const std::function<void()>& idle) {
  // Everyone has mapped everyone: names in /dev/shm can go now.
  Status status = bootstrap.barrier(idle);
  if (!status) throw Error(status);
  for (auto& t : transports_) t->on_all_connected();
}

void Links::connect_peer(int r, const Published& published, const std::vector<int>& local,
                         std::size_t rndv_threshold) {
  auto it = std::find(local.begin(), local.end(), r);
  Link& peer = link(r);
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
    peer.split = peer.endpoint->split_copies();
    peer.direct = peer.endpoint->direct();
    peer.reads = peer.endpoint->reads();
    peer.writes = peer.endpoint->writes();
    peer.transport = name;
    peer.shares_memory = name == "self" || name == "shm";
    peer.why = peer.endpoint->describe();
    const std::size_t max_am = t->capabilities().max_am;
    peer.eager_limit = std::min(rndv_threshold, max_am - sizeof(EagerHeader));
    peer.frag_size = std::min<std::size_t>(max_am, 1u << 20) - sizeof(FragHeader);
    peer.get_from = t->capabilities().get_from;
    peer.split_from = t->capabilities().split_from;
    peer.read_from = t->capabilities().read_from;
    break;
  }
  if (peer.endpoint == nullptr) {
    peer.why = "no transport reaches rank " + std::to_string(r) + " (" +
               (tried.empty() ? std::string("none enabled") : tried.substr(0, tried.size() - 2)) +
               ")";
  }
}

void Links::close() {
  endpoints_.clear();
  polled_.clear();
  shm_ = nullptr;
  self_ = nullptr;
  transports_.clear();
}

bool Links::delivered() const {
  bool all = true;
  for (const auto& t : transports_) all = t->delivered() && all;
  return all;
}

void Links::check(std::vector<std::pair<int, std::string>>* failed) {
  for (auto& t : transports_) t->check_peers(failed);
}

void Links::send_or_queue(int peer_rank, Pending&& pending) {
  Link& peer = link(peer_rank);
  if (peer.failed) {
    std::uint32_t index = pending.stream != UINT32_MAX ? pending.stream : pending.request;
    if (index != UINT32_MAX) engine_.complete(index, Status(Code::kPeerFailed, peer.why));
    return;
  }
  if (peer.pending.empty()) {
    if (try_send(peer, pending)) return;
    pending_peers_.push_back(peer_rank);
  }
  peer.pending.push_back(std::move(pending));
}

bool Links::try_send(Link& peer, Pending& pending) {
  if (pending.stream != UINT32_MAX) {
    const RequestSlot& slot = engine_.requests()[pending.stream];
    const bool put = pending.am == kAmPut;  // else a rendezvous or get answer's fragments
    const std::size_t room =
        put ? peer.frag_size - (sizeof(PutHeader) - sizeof(FragHeader)) : peer.frag_size;
    while (pending.offset < pending.length) {
      std::size_t chunk = std::min(room, pending.length - pending.offset);
      const auto data = std::span<const std::byte>(slot.send_buffer + pending.offset, chunk);
      Status status =
          put ? peer.endpoint->am_send(
                    kAmPut,
                    as_bytes(PutHeader{pending.rreq, pending.region, pending.secret,
                                       pending.region_offset + pending.offset}),
                    data, transport::AmHint::kBulk)
              : peer.endpoint->am_send(kAmFrag, as_bytes(FragHeader{pending.rreq, pending.offset}),
                                       data, transport::AmHint::kBulk);
      if (status.code() == Code::kWouldBlock) return false;
      if (!status) {
        engine_.complete(pending.stream, std::move(status));
        return true;
      }
      pending.offset += chunk;
      if (crash_mid_pipeline_) engine_.crashes().here(util::CrashPoint::kMidPipeline);
    }
    if (!put) engine_.complete(pending.stream, Status::ok());  // a put completes when acknowledged
    return true;
  }
  Status status = peer.endpoint->am_send(
      pending.am, std::span<const std::byte>(pending.header.data(), pending.header_size),
      std::span<const std::byte>(pending.payload, pending.payload_size), transport::AmHint::kNone);
  if (status.code() == Code::kWouldBlock) return false;
  if (pending.request != UINT32_MAX && (!status || pending.complete_on_send)) {
    engine_.complete(pending.request, std::move(status));
  } else if (!status && status.code() != Code::kPeerFailed) {
    // (To a dead peer it does not matter: its failure is handled as such.)
    FERRY_LOG(kError, "%s: control message %u lost: %s", peer.transport.c_str(), pending.am,
              status.to_string().c_str());
  }
  return true;
}

int Links::drain() {
  int sent = 0;
  std::size_t keep = 0;
  for (std::size_t i = 0; i < pending_peers_.size(); ++i) {
    int rank = pending_peers_[i];
    Link& peer = link(rank);
    while (!peer.pending.empty() && try_send(peer, peer.pending.front())) {
      peer.pending.pop_front();
      ++sent;
    }
    if (!peer.pending.empty()) pending_peers_[keep++] = rank;
  }
  pending_peers_.resize(keep);
  return sent;
}

Pending Links::stream(std::uint8_t am, std::uint32_t index, std::uint64_t id, std::size_t length) {
  Pending pending;
  pending.am = am;
  pending.stream = index;
  pending.rreq = id;
  pending.length = length;
  return pending;
}

void Links::send_control(int peer_rank, std::uint8_t am, std::span<const std::byte> header) {
  Pending pending;
  pending.am = am;
  pending.header_size = static_cast<std::uint8_t>(header.size());
  std::memcpy(pending.header.data(), header.data(), header.size());
  send_or_queue(peer_rank, std::move(pending));
}

void Links::drop_queue(int rank, const std::function<void(std::uint32_t)>& fail) {
  Link& peer = link(rank);
  for (Pending& pending : peer.pending) {
    std::uint32_t index = pending.stream != UINT32_MAX ? pending.stream : pending.request;
    if (index != UINT32_MAX) fail(index);
  }
  peer.pending.clear();
  std::erase(pending_peers_, rank);
}

}  // namespace ferry::proto
