// The shm transport (see transport.hpp): segment set-up, connect with a CMA probe, FIFO polling.
#include "transport/shm/transport.hpp"

#include <fcntl.h>
#include <glob.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "transport/shm/endpoint.hpp"
#include "util/abstract_socket.hpp"
#include "util/cma.hpp"
#include "util/config.hpp"
#include "util/copy.hpp"
#include "util/faults.hpp"
#include "util/fd.hpp"
#include "util/log.hpp"
#include "util/node.hpp"

namespace ferry::transport::shm {
namespace {

// Abstract, so it lives in this network namespace: a peer in another one cannot ring it, and the
// sleeper's timer bounds what that costs.
sockaddr_un doorbell_address(const std::string& job_id, int rank, socklen_t* length) {
  return util::abstract_socket_address("ferry-" + job_id + "-bell-" + std::to_string(rank), length);
}

// No such process, or a zombie that nobody reaped (a launcher that exits right after killing its
// ranks leaves them to a pid 1 that may never reap them).
bool process_gone(pid_t pid) {
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  char path[32];
  std::snprintf(path, sizeof(path), "/proc/%d/stat", static_cast<int>(pid));
  util::Fd fd(::open(path, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return false;
  char text[512];
  const ssize_t n = ::read(fd.get(), text, sizeof(text) - 1);
  if (n <= 0) return false;
  text[n] = '\0';
  // "pid (comm) S ...": the state follows the last ')' (comm may hold spaces and parentheses).
  const char* close = std::strrchr(text, ')');
  return close != nullptr && close[1] == ' ' && (close[2] == 'Z' || close[2] == 'X');
}

// A rank SIGKILLed during init, before its peers mapped its segment, leaves the name behind;
// under ferryrun the launcher removes it, under other launchers the next ferry process of this
// pid namespace does: names whose creator pid no longer exists. A live process that reused the
// pid keeps the name (harmless: it is only swept later).
void sweep_dead_segments() {
  const std::string suffix = "n" + util::pid_namespace();
  glob_t found{};
  if (::glob("/dev/shm/ferry-*-p*n*", GLOB_NOSORT, nullptr, &found) != 0) return;
  for (std::size_t i = 0; i < found.gl_pathc; ++i) {
    const std::string path = found.gl_pathv[i];
    if (path.size() <= suffix.size() ||
        path.compare(path.size() - suffix.size(), suffix.size(), suffix) != 0) {
      continue;
    }
    const auto p = path.rfind("-p");
    if (p == std::string::npos) continue;
    char* end = nullptr;
    const long pid = std::strtol(path.c_str() + p + 2, &end, 10);
    if (end == nullptr || *end != 'n' || pid <= 0) continue;
    if (process_gone(static_cast<pid_t>(pid)) && ::unlink(path.c_str()) == 0) {
      FERRY_LOG(kInfo, "shm: removed %s, left by a process that no longer exists", path.c_str());
    }
  }
  ::globfree(&found);
}

}  // namespace

ShmTransport::ShmTransport(const util::Config& config, std::string job_id, int rank,
                           int local_index, std::vector<int> local_ranks, AmHandler* handler)
    : job_id_(job_id),
      rank_(rank),
      local_index_(local_index),
      local_ranks_(std::move(local_ranks)),
      handler_(handler),
      cma_enabled_(config.get_bool(util::Var::kShmCma)) {
  auto bounce_size =
      static_cast<std::uint32_t>((config.get_size(util::Var::kShmBounceSize) + 63) / 64 * 64);
  Layout layout;
  std::string error = Layout::compute(
      static_cast<std::uint32_t>(config.get_int(util::Var::kShmFifoSize)),
      static_cast<std::uint32_t>(config.get_int(util::Var::kShmBounceCount)), bounce_size, &layout);
  if (!error.empty()) throw Error(Code::kInvalidArgument, "shm: " + error);
  sweep_dead_segments();
  own_ = Segment::create(util::shm_name(job_id, rank, ""), layout);
  util::crash_point(config, rank, util::CrashPoint::kSegmentCreated);
  crash_mid_claim_ =
      config.get_int(util::Var::kTestCrashRank) == rank &&
      config.get_int(util::Var::kTestCrashAt) == static_cast<int>(util::CrashPoint::kMidClaim);

  split_refused_ = config.get_bool(util::Var::kTestSplitRefused);
  std::random_device random;
  own_.header()->cma_cookie = (std::uint64_t{random()} << 32) | random();
  address_.name = own_.name();
  address_.pid = static_cast<std::int32_t>(::getpid());
  address_.fifo_size = layout.fifo_size;
  address_.bounce_count = layout.bounce_count;
  address_.bounce_size = layout.bounce_size;
  address_.cookie_address = reinterpret_cast<std::uint64_t>(&own_.header()->cma_cookie);
  address_.cookie = own_.header()->cma_cookie;
  consumer_ = FifoConsumer(&own_.header()->fifo, own_.fifo(), layout.fifo_size,
                           static_cast<std::uint32_t>(config.get_int(util::Var::kShmReleaseBatch)));
  peers_.resize(local_ranks_.size());
  bounce_to_.assign(layout.bounce_count, -1);
  if (cma_enabled_) {
    // Under Yama ptrace_scope=1 only descendants may be read; let our peers read us. Without Yama
    // this fails harmlessly, and the probe at connect tells whether CMA really works.
    ::prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
  }
  capabilities_.name = "shm";
  capabilities_.max_am = layout.bounce_size;
  capabilities_.max_inline = kInlineCapacity;
  const std::int64_t cma_from = config.get_int(util::Var::kShmCmaThreshold);
  // Where the kernel's copy is slow (rep movsb), CMA loses to the bounce buffers' pipeline; two
  // CPUs copying by CMA (a split) win only in some of the VM's vCPU placements there (4 MiB
  // windows 13.7-23 GB/s against the pipeline's 16-18: docs/PERFORMANCE.md).
  const std::int64_t split_from = config.get_int(util::Var::kShmCmaSplit);
  capabilities_.split_from = split_from >= 0 ? static_cast<std::size_t>(split_from) : SIZE_MAX;
  capabilities_.get_from = cma_from >= 0         ? static_cast<std::size_t>(cma_from)
                           : util::kRepMovsbSlow ? std::size_t{128} << 20
                                                 : 0;
  capabilities_.latency_us = 0.2;
  capabilities_.bandwidth_GBps = 10;
  // The doorbell peers ring while this process sleeps in a wait (FERRY_WAIT_MODE). Without one,
  // a sleeper wakes on its timer only.
  doorbell_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  socklen_t length = 0;
  const sockaddr_un bell = doorbell_address(job_id_, rank_, &length);
  if (!doorbell_.valid() ||
      ::bind(doorbell_.get(), reinterpret_cast<const sockaddr*>(&bell), length) != 0) {
    FERRY_LOG(kInfo, "shm: no doorbell @%s (%s): a sleeping wait wakes on its timer",
              bell.sun_path + 1, std::strerror(errno));
    doorbell_.reset();
  }
}

ShmTransport::~ShmTransport() = default;

Reachability ShmTransport::reach(const PeerInfo& peer) const {
  if (!peer.same_node) return {false, "not on this node"};
  if (peer.rank == rank_) return {false, "the process itself (self transport)"};
  return {true, "same node"};
}

std::unique_ptr<Endpoint> ShmTransport::connect(const PeerInfo& peer) {
  Address address;
  Status status = Address::decode(peer.address, &address);
  if (!status)
    throw Error(Code::kProtocolError,
                "shm: rank " + std::to_string(peer.rank) + ": " + status.message());
  if (peer.local_index < 0 || static_cast<std::size_t>(peer.local_index) >= peers_.size() ||
      local_ranks_[static_cast<std::size_t>(peer.local_index)] != peer.rank) {
    throw Error(Code::kInternal,
                "shm: rank " + std::to_string(peer.rank) + " has no valid local index");
  }
  Layout layout;
  std::string error =
      Layout::compute(address.fifo_size, address.bounce_count, address.bounce_size, &layout);
  if (!error.empty()) {
    throw Error(Code::kProtocolError,
                "shm: rank " + std::to_string(peer.rank) + " announced a bad segment: " + error);
  }
  auto mapped = std::make_unique<Peer>();
  mapped->rank = peer.rank;
  mapped->pid = address.pid;
  // A pidfd tells of the peer's death without races on PID reuse; kernels before 5.3 lack it.
  mapped->pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, address.pid, 0)));
  mapped->segment = Segment::attach(address.name, layout);

  bool cma_ok = false;
  std::string reason;
  if (!cma_enabled_) {
    reason = "CMA disabled by FERRY_SHM_CMA=0";
  } else {
    std::uint64_t seen = 0;
    Status probe = util::cma_read(address.pid, &seen, address.cookie_address, sizeof(seen));
    if (!probe) {
      reason = "CMA probe failed: " + probe.message();
    } else if (seen != address.cookie) {
      reason = "CMA probe read the wrong bytes (different PID namespace?)";
    } else {
      cma_ok = true;
      reason = "CMA probe ok";
    }
  }
  FERRY_LOG(kDebug, "shm: connected to rank %d (pid %d): %s", peer.rank, address.pid,
            reason.c_str());
  const Segment* segment = &mapped->segment;
  peers_[static_cast<std::size_t>(peer.local_index)] = std::move(mapped);
  return std::make_unique<ShmEndpoint>(this, segment, peer.rank, peer.local_index, address.pid,
                                       cma_ok, reason);
}

void ShmTransport::check_peers(std::vector<std::pair<int, std::string>>* failed) {
  std::vector<pollfd> fds;
  std::vector<int> watched;  // local indexes
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    Peer* peer = peers_[i].get();
    if (peer == nullptr || peer->reported) continue;
    if (peer->pidfd.valid()) {
      fds.push_back({peer->pidfd.get(), POLLIN, 0});
      watched.push_back(static_cast<int>(i));
    } else if (::kill(peer->pid, 0) != 0 && errno == ESRCH) {
      peer->reported = true;
      ++dead_producers_;
      reclaim_bounce(static_cast<int>(i));
      failed->emplace_back(peer->rank, "rank " + std::to_string(peer->rank) + " (pid " +
                                           std::to_string(peer->pid) + ") is gone (kill(pid, 0))");
    }
  }
  if (fds.empty() || ::poll(fds.data(), fds.size(), 0) <= 0) return;
  for (std::size_t i = 0; i < fds.size(); ++i) {
    if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
    Peer& peer = *peers_[static_cast<std::size_t>(watched[i])];
    peer.reported = true;
    ++dead_producers_;
    reclaim_bounce(watched[i]);
    failed->emplace_back(peer.rank, "rank " + std::to_string(peer.rank) + " (pid " +
                                        std::to_string(peer.pid) +
                                        ") exited or was killed (seen by shm's pidfd)");
  }
}

int ShmTransport::alloc_bounce(int receiver) {
  const std::uint32_t count = own_.layout().bounce_count;
  for (std::uint32_t i = 0; i < count; ++i) {
    std::uint32_t slot = bounce_cursor_;
    bounce_cursor_ = (bounce_cursor_ + 1 == count) ? 0 : bounce_cursor_ + 1;
    BounceHeader* bounce = own_.bounce(slot);
    // acquire: the receiver's reads of the previous contents happen before we overwrite them.
    if (bounce->busy.load(std::memory_order_acquire) == 0) {
      bounce->busy.store(1, std::memory_order_relaxed);
      bounce_to_[slot] = receiver;
      return static_cast<int>(slot);
    }
  }
  return -1;
}

void ShmTransport::reclaim_bounce(int local_index) {
  std::uint32_t taken = 0;
  for (std::uint32_t slot = 0; slot < bounce_to_.size(); ++slot) {
    if (bounce_to_[slot] != local_index) continue;
    bounce_to_[slot] = -1;
    // The dead receiver cannot read it any more; one it had freed is free already.
    if (own_.bounce(slot)->busy.exchange(0, std::memory_order_acq_rel) != 0) ++taken;
  }
  if (taken > 0) {
    FERRY_LOG(kDebug, "shm: took back %u bounce buffers sent to local index %d, which died", taken,
              local_index);
  }
}

void ShmTransport::free_bounce(std::uint32_t slot) {
  own_.bounce(slot)->busy.store(0, std::memory_order_release);
}

void ShmTransport::handle(const FifoElem& elem) {
  // Copy the fields once: a peer may change shared memory under us, so validate the copies.
  const std::uint8_t id = elem.am_id;
  const std::uint8_t flags = elem.flags;
  const std::uint16_t source = elem.source;
  const std::uint32_t length = elem.length;
  const std::uint32_t slot = elem.bounce;
  Peer* peer = source < peers_.size() ? peers_[source].get() : nullptr;
  if (peer == nullptr) {
    FERRY_LOG_ONCE(kError, "shm: dropped a FIFO element from unknown local index %u", source);
    return;
  }
  if (flags == kElemInline && length <= kInlineCapacity) {
    handler_->on_am(id, peer->rank, std::span<const std::byte>(elem.data, length));
    return;
  }
  const Layout& layout = peer->segment.layout();
  if (flags == kElemBounce && slot < layout.bounce_count && length <= layout.bounce_size) {
    handler_->on_am(id, peer->rank,
                    std::span<const std::byte>(peer->segment.bounce_data(slot), length));
    peer->segment.bounce(slot)->busy.store(0, std::memory_order_release);
    return;
  }
  FERRY_LOG_ONCE(kError,
                 "shm: dropped a malformed FIFO element from rank %d (flags %u, length %u, "
                 "bounce slot %u)",
                 peer->rank, flags, length, slot);
}

int ShmTransport::progress() {
  int count = 0;
  constexpr int kMaxPerCall = 64;
  while (count < kMaxPerCall) {
    FifoElem* elem = consumer_.peek();
    if (elem == nullptr) {
      if (dead_producers_ > 0 && skip_hole()) continue;
      break;
    }
    handle(*elem);
    consumer_.pop();
    ++count;
  }
  if (count == 0) consumer_.release();
  return count;
}

bool ShmTransport::skip_hole() {
  // Only while a producer is known dead: the element we wait on may be one it claimed and never
  // published. Step over it when its record (in its segment, still mapped) names the element
  // and no live producer's does.
  const std::uint64_t wanted =
      claim_record(static_cast<std::uint32_t>(local_index_), consumer_.position());
  std::vector<ProducerView> views;
  for (const auto& peer : peers_) {
    if (!peer) continue;
    views.push_back(
        {peer->segment.header()->claim.load(std::memory_order_acquire), peer->reported});
  }
  if (!is_hole_of_dead_producer(views.data(), views.size(), wanted)) return false;
  if (consumer_.head_published()) return false;  // its claimant published after all
  FERRY_LOG(kWarn,
            "shm: stepped over FIFO element %llu, claimed by a producer that died before "
            "publishing it",
            static_cast<unsigned long long>(consumer_.position()));
  consumer_.pop();
  return true;
}

}  // namespace ferry::transport::shm

namespace ferry::transport::shm {

bool ShmTransport::arm() {
  // Dekker with wake(): our flag before our look at the FIFO, the sender's element before its
  // look at the flag. The sender side has no fence (busy senders pay one load); in the rare
  // interleaving where both miss, the sleeper's timer wakes it.
  own_.header()->armed.store(1, std::memory_order_seq_cst);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  return !consumer_.head_published();
}

void ShmTransport::disarm() {
  own_.header()->armed.store(0, std::memory_order_relaxed);
  if (!doorbell_.valid()) return;
  char rings[64];
  while (::recv(doorbell_.get(), rings, sizeof rings, MSG_DONTWAIT) > 0) {
  }
}

bool ShmTransport::open_claim(SplitCopies::Claim* claim) {
  if (claims_used_ == ~std::uint64_t{0}) return false;
  static_assert(kSplitClaims == 64, "claims_used_ is a 64-bit mask");
  const auto slot = static_cast<std::uint32_t>(std::countr_one(claims_used_));
  claims_used_ |= std::uint64_t{1} << slot;
  claim->slot = slot;
  claim->ticket = next_ticket_++;
  // Release: the word is open before the kAmCtsSplit that names it is sent.
  own_.header()->split_claims[slot].store(claim->ticket << 2 | kClaimOpen,
                                          std::memory_order_release);
  return true;
}

bool ShmTransport::claim_tail(const SplitCopies::Claim& claim) {
  std::uint64_t open = claim.ticket << 2 | kClaimOpen;
  return own_.header()->split_claims[claim.slot].compare_exchange_strong(
      open, claim.ticket << 2 | kClaimReceiver, std::memory_order_acq_rel);
}

void ShmTransport::close_claim(const SplitCopies::Claim& claim) {
  // The word keeps its last state: a sender's claim of this ticket can only fail from now on.
  claims_used_ &= ~(std::uint64_t{1} << claim.slot);
}

void ShmTransport::ring(int peer_rank) const {
  if (!doorbell_.valid()) return;
  socklen_t length = 0;
  const sockaddr_un bell = doorbell_address(job_id_, peer_rank, &length);
  const char ring = 1;
  // Best effort: a full socket already holds a ring; a peer without a doorbell has its timer.
  (void)::sendto(doorbell_.get(), &ring, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
                 reinterpret_cast<const sockaddr*>(&bell), length);
}

}  // namespace ferry::transport::shm
