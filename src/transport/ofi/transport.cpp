// The ofi transport (see transport.hpp): provider choice, endpoint set-up, bounce buffers, the
// completion queue and peer failure.
#include "transport/ofi/transport.hpp"

#include <poll.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>
#include <rdma/fi_tagged.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "transport/ofi/fabric.hpp"
#include "transport/ofi/nic.hpp"
#include "transport/ofi/wire.hpp"
#include "util/config.hpp"
#include "util/log.hpp"

namespace ferry::transport::ofi {
namespace {

constexpr std::size_t kBufferSize = 64 * 1024;  // the largest active message, with its header
constexpr std::uint32_t kReceives = 64;         // posted in advance
constexpr std::uint32_t kSends = 64;            // bounce buffers for sends larger than inject
constexpr int kSendsPerPeer = 16;  // in flight to one peer: a dead one cannot hold them all
constexpr std::uint8_t kKeepaliveId = 0xff;  // handled here, never delivered
}  // namespace

struct OfiTransport::Op {
  fi_context2 context;  // first: providers that ask for FI_CONTEXT(2) use it
  bool send = false;
  bool direct = false;  // a tagged transfer of a caller's buffer (else an active message)
  bool read = false;    // direct: an fi_read from the peer's exposed buffer
  bool write = false;   // direct: an fi_write into the peer's registered region
  int peer = -1;
  std::uint32_t buffer = 0;
  // Direct transfers:
  void* data = nullptr;
  std::size_t length = 0;
  std::uint64_t key = 0;
  std::uint64_t cookie = 0;
  fid_mr* mr = nullptr;  // where the provider wants local buffers registered
  mem::RegistrationCache::Entry* entry = nullptr;  // the same, from the cache (reads)
  Endpoint::RemoteRegion remote;                   // reads and writes: the peer's memory
  bool orphaned = false;  // its completion was reported already (the peer failed)
  bool drain = false;     // send(confirm): delivered()'s last keepalive, sent as message `seq`
  std::uint32_t seq = 0;
};

OfiTransport::OfiTransport(const util::Config& config, int rank, int size, AmHandler* handler)
    : rank_(rank),
      size_(size),
      handler_(handler),
      keepalive_s_(config.get_seconds(util::Var::kKeepalive)),
      silence_s_(config.get_seconds(util::Var::kKeepaliveTimeout)),
      test_remote_(config.get_bool(util::Var::kTestOfiRemote)),
      test_read_fail_(config.get_bool(util::Var::kTestOfiReadFail)) {
  if (silence_s_ > 0 && (keepalive_s_ == 0 || silence_s_ < 2 * keepalive_s_)) {
    throw Error(Code::kInvalidArgument,
                "FERRY_KEEPALIVE_TIMEOUT needs keepalives at least twice as often "
                "(FERRY_KEEPALIVE), or live peers would be taken for dead");
  }
  // tcp;ofi_rxm's pass-through: rxm hands every call (tagged ones too, to the tcp provider's
  // shared receive context) to tcp's own connected endpoints, without its protocol on each
  // message (docs/PERFORMANCE.md). rxm offers it only where FI_OFI_RXM_ENABLE_PASSTHRU is set
  // before libfabric's providers start in this process, beside its usual offers; a user's own
  // setting of the variable stays.
  const std::string& passthru_mode = config.get_string(util::Var::kOfiPassthru);
  const bool want_passthru = passthru_mode != "off";
  if (want_passthru) ::setenv("FI_OFI_RXM_ENABLE_PASSTHRU", "1", 0);
  std::string why;
  fi_ = fabric(&why);
  if (fi_ == nullptr) throw Error(Code::kUnsupported, why);
  auto fail = [this](const char* call, int code) {
    throw Error(Code::kIoError, std::string(call) + " failed: " + error_text(code) +
                                    (provider_.empty() ? "" : " (" + provider_ + ")"));
  };

  fi_info* hints = fi_->dupinfo(nullptr);
  if (hints == nullptr) throw Error(Code::kNoResources, "fi_allocinfo failed");
  // One-sided writes and reads (native puts and gets, fi_read rendezvous) where the allowed
  // provider has them: asked first, then reads alone, then neither.
  const std::string& rma_mode = config.get_string(util::Var::kOfiRma);
  const bool want_rma = rma_mode != "off";
  const bool want_native = rma_mode == "auto" || rma_mode == "native";
  const std::uint64_t reads = FI_RMA | FI_READ | FI_REMOTE_READ;
  std::vector<std::uint64_t> ladder;
  if (want_native) ladder.push_back(FI_MSG | FI_TAGGED | reads | FI_WRITE | FI_REMOTE_WRITE);
  if (want_rma) ladder.push_back(FI_MSG | FI_TAGGED | reads);
  ladder.push_back(FI_MSG | FI_TAGGED);
  hints->mode = FI_CONTEXT | FI_CONTEXT2;
  hints->ep_attr->type = FI_EP_RDM;
  hints->tx_attr->msg_order = FI_ORDER_SAS;  // the protocol relies on per-peer order
  hints->rx_attr->msg_order = FI_ORDER_SAS;
  hints->domain_attr->threading = FI_THREAD_DOMAIN;
  hints->domain_attr->mr_mode =
      FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED | FI_MR_PROV_KEY | FI_MR_ENDPOINT;
  const std::string& allowed = config.get_string(util::Var::kOfiProvider);
  std::string seen;
  auto is_passthru = [](const fi_info* i) { return i->ep_attr->protocol == FI_PROTO_RXM_TCP; };
  for (std::size_t step = 0; step < ladder.size() && info_ == nullptr; ++step) {
    hints->caps = ladder[step];
    fi_info* list = nullptr;
    int ret = fi_->getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints, &list);
    if (ret == -FI_ENODATA && step + 1 < ladder.size()) continue;
    if (ret != 0) {
      fi_->freeinfo(hints);
      fail("fi_getinfo (reliable datagram endpoints with ordered messages)", ret);
    }
    // The first provider allowed, and among its offers (NICs, addresses) the first on this
    // thread's NUMA node.
    std::vector<fi_info*> candidates;
    std::vector<int> nodes;
    for (fi_info* i = list; i != nullptr; i = i->next) {
      const char* name = i->fabric_attr->prov_name;
      if (!provider_allowed(allowed, name)) {
        if (seen.find(name) == std::string::npos) {
          seen += std::string(seen.empty() ? "" : ", ") + name;
        }
        continue;
      }
      if (!candidates.empty() && std::string(name) != candidates.front()->fabric_attr->prov_name) {
        continue;
      }
      std::optional<PciAddress> pci;
      if (i->nic != nullptr && i->nic->bus_attr != nullptr &&
          i->nic->bus_attr->bus_type == FI_BUS_PCI) {
        const fi_pci_attr& a = i->nic->bus_attr->attr.pci;
        pci = PciAddress{a.domain_id, a.bus_id, a.device_id, a.function_id};
      }
      candidates.push_back(i);
      nodes.push_back(
          nic_numa_node(i->domain_attr->name != nullptr ? i->domain_attr->name : "", pci));
    }
    // Pass-through offers where wanted and made, else the others.
    const bool through =
        want_passthru && std::any_of(candidates.begin(), candidates.end(), is_passthru);
    for (std::size_t c = candidates.size(); c-- > 0;) {
      if (is_passthru(candidates[c]) != through) {
        candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(c));
        nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(c));
      }
    }
    if (!candidates.empty()) {
      info_ = fi_->dupinfo(candidates[nearest_candidate(nodes, current_numa_node())]);
    }
    fi_->freeinfo(list);
  }
  fi_->freeinfo(hints);
  if (info_ == nullptr) {
    throw Error(Code::kUnsupported,
                "no libfabric provider allowed by FERRY_OFI_PROVIDER=" + allowed +
                    " (offered: " + (seen.empty() ? "none" : seen) + ")");
  }
  // GPU memory and the NIC: ask the chosen provider and domain for FI_HMEM. Where it is granted,
  // the endpoint is opened with it and each GPU's memory is tried on first use (device_direct);
  // elsewhere device data is staged through pinned host memory.
  const std::string& test_hmem = config.get_string(util::Var::kTestOfiHmem);
  if (config.get_string(util::Var::kOfiHmem) == "off") {
    hmem_ = "FERRY_OFI_HMEM=off: device data staged through pinned host memory";
  } else if (fi_info* probe = fi_->dupinfo(info_); probe != nullptr) {
    probe->caps |= FI_HMEM;
    probe->domain_attr->mr_mode |= FI_MR_HMEM;
    fi_info* offered = nullptr;
    if (fi_->getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, probe, &offered) == 0) {
      for (fi_info* i = offered; i != nullptr && !hmem_offered_; i = i->next) {
        if ((i->caps & FI_HMEM) != 0 &&
            std::strcmp(i->fabric_attr->prov_name, info_->fabric_attr->prov_name) == 0 &&
            std::strcmp(i->domain_attr->name, info_->domain_attr->name) == 0) {
          fi_->freeinfo(info_);
          info_ = fi_->dupinfo(i);
          hmem_offered_ = true;
        }
      }
    }
    if (offered != nullptr) fi_->freeinfo(offered);
    fi_->freeinfo(probe);
    if (info_ == nullptr) throw Error(Code::kNoResources, "fi_dupinfo failed");
    if (hmem_offered_) {
      hmem_ = "FI_HMEM offered";
    } else if (test_hmem != "none") {
      hmem_ = "FI_HMEM assumed (FERRY_TEST_OFI_HMEM=" + test_hmem + ")";
      hmem_offered_ = true;
    } else {
      hmem_ =
          "no FI_HMEM in this libfabric provider: device data staged through pinned host memory";
    }
    hmem_fail_ = hmem_offered_ && test_hmem == "fail";
  }
  provider_ = std::string(info_->fabric_attr->prov_name) + " on " + info_->domain_attr->name +
              " (" + info_->fabric_attr->name + ")";
  protocol_ = info_->ep_attr->protocol;
  if (passthru()) {
    provider_ += ", passed through to tcp's connected endpoints";
  } else if (passthru_mode == "on") {
    FERRY_LOG(kWarn,
              "ofi: FERRY_OFI_PASSTHRU=on, but %s offers no pass-through endpoint (only "
              "tcp;ofi_rxm does, where FI_OFI_RXM_ENABLE_PASSTHRU was set, not to 0, before "
              "libfabric started in this process)",
              provider_.c_str());
  }
  inject_size_ = std::min(info_->tx_attr->inject_size, kBufferSize);
  rma_ = want_rma && (info_->caps & FI_RMA) != 0;
  if (!want_rma) {
    rma_why_ = "FERRY_OFI_RMA=off";
  } else if (!rma_) {
    rma_why_ = "no FI_RMA in this provider";
  }
  // Native one-sided access goes only where the owner granted it (proto/rma.cpp), and the
  // provider checks the key again: not where it does not (the shared-memory providers write
  // through any address they are given).
  const std::string core = info_->fabric_attr->prov_name;
  if (!want_native) {
    native_why_ = "FERRY_OFI_RMA=" + rma_mode;
  } else if (!rma_ ||
             (info_->caps & (FI_WRITE | FI_REMOTE_WRITE)) != (FI_WRITE | FI_REMOTE_WRITE)) {
    native_why_ = "no FI_RMA writes in this provider";
  } else if (core == "shm" || core == "sm2") {
    native_why_ = "the " + core + " provider does not check keys";
  } else {
    native_ = true;
  }
  if (rma_mode == "native" && !native_) {
    FERRY_LOG(kWarn, "ofi: FERRY_OFI_RMA=native refused (%s): one-sided by messages",
              native_why_.c_str());
  }
  inject_scratch_.resize(inject_size_);

  int ret = fi_->fabric(info_->fabric_attr, &fabric_, nullptr);
  if (ret != 0) fail("fi_fabric", ret);
  if ((ret = fi_domain(fabric_, info_, &domain_, nullptr)) != 0) fail("fi_domain", ret);
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.size = 4 * (kReceives + kSends);
  if ((ret = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) != 0) fail("fi_cq_open", ret);
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = static_cast<std::size_t>(size_);
  if ((ret = fi_av_open(domain_, &av_attr, &av_, nullptr)) != 0) fail("fi_av_open", ret);
  if ((ret = fi_endpoint(domain_, info_, &ep_, nullptr)) != 0) fail("fi_endpoint", ret);
  if ((ret = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0) fail("fi_ep_bind(cq)", ret);
  if ((ret = fi_ep_bind(ep_, &av_->fid, 0)) != 0) fail("fi_ep_bind(av)", ret);
  if ((ret = fi_enable(ep_)) != 0) fail("fi_enable", ret);

  const std::size_t count = kReceives + kSends;
  buffers_ = static_cast<std::byte*>(std::aligned_alloc(4096, count * kBufferSize));
  if (buffers_ == nullptr) throw Error(Code::kNoResources, "ofi bounce buffers");
  ops_ = std::make_unique<Op[]>(count);
  if ((info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
    ret = fi_mr_reg(domain_, buffers_, count * kBufferSize, FI_SEND | FI_RECV, 0, 0, 0, &mr_,
                    nullptr);
    if (ret != 0) fail("fi_mr_reg (bounce buffers)", ret);
    if ((info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
      if ((ret = fi_mr_bind(mr_, &ep_->fid, 0)) != 0) fail("fi_mr_bind", ret);
      if ((ret = fi_mr_enable(mr_)) != 0) fail("fi_mr_enable", ret);
    }
    desc_ = fi_mr_desc(mr_);
  }
  for (std::uint32_t i = 0; i < kReceives; ++i) post_receive(i);
  for (std::uint32_t i = count; i-- > kReceives;) free_sends_.push_back(i);

  std::size_t length = 0;
  fi_getname(&ep_->fid, nullptr, &length);
  std::vector<std::byte> name(length);
  if ((ret = fi_getname(&ep_->fid, name.data(), &length)) != 0) fail("fi_getname", ret);
  node_ = node_identity();
  const AddressHeader header{kAddressMagic, static_cast<std::int32_t>(::getpid()), node_,
                             protocol_};
  name.resize(length);
  address_ = encode_address(header, name);
  peers_.resize(static_cast<std::size_t>(size_));
  for (PeerState& state : peers_) state.last_heard = std::chrono::steady_clock::now();

  // Host registrations (fi_read rendezvous) are kept for reuse while the kernel can say when
  // their memory goes away.
  const auto entries = static_cast<std::size_t>(config.get_int(util::Var::kOfiMrCache));
  std::string monitor_why;
  std::shared_ptr<mem::UnmapMonitor> monitor;
  if (entries > 0) monitor = mem::UnmapMonitor::shared(&monitor_why);
  if (entries > 0 && monitor == nullptr) {
    FERRY_LOG(kInfo, "ofi: registrations are not cached: %s", monitor_why.c_str());
  }
  cache_ = std::make_unique<mem::RegistrationCache>(
      entries, config.get_size(util::Var::kOfiMrCacheSize),
      [this](void* base, std::size_t length, std::uint64_t access, void** handle) {
        fid_mr* mr = nullptr;
        const int error = register_memory(base, length, access, -1, &mr);
        *handle = mr;
        return error;
      },
      [](void* handle) {
        if (handle != nullptr) fi_close(&static_cast<fid_mr*>(handle)->fid);
      },
      std::move(monitor), entries == 0 ? "FERRY_OFI_MR_CACHE=0" : monitor_why);

  capabilities_.name = "ofi";
  capabilities_.max_am = kBufferSize - sizeof(Wire);
  capabilities_.max_inline = inject_size_ > sizeof(Wire) ? inject_size_ - sizeof(Wire) : 0;
  capabilities_.get_from = SIZE_MAX;  // no zero-copy get yet
  // Over tcp's own sockets (passed through, or the net provider), a tagged transfer after
  // clear-to-send beats a read below 512 KiB (latency and windows; docs/PERFORMANCE.md); rxm's
  // own protocol and RDMA NICs read at once.
  const std::int64_t read_from = config.get_int(util::Var::kOfiReadFrom);
  capabilities_.read_from = read_from >= 0       ? static_cast<std::size_t>(read_from)
                            : over_tcp_sockets() ? std::size_t{512} << 10
                                                 : 0;
  capabilities_.latency_us = 10;
  capabilities_.bandwidth_GBps = 2;
  next_keepalive_ = std::chrono::steady_clock::now();
  FERRY_LOG(kDebug, "ofi: %s, inject up to %zu B", provider_.c_str(), inject_size_);
}

OfiTransport::~OfiTransport() {
  // Cached registrations first (they may be bound to the endpoint); then the endpoint (cancels
  // posted receives), then what it was bound to.
  exposed_.clear();
  cache_.reset();
  if (ep_ != nullptr) fi_close(&ep_->fid);
  if (mr_ != nullptr) fi_close(&mr_->fid);
  if (av_ != nullptr) fi_close(&av_->fid);
  if (cq_ != nullptr) fi_close(&cq_->fid);
  if (domain_ != nullptr) fi_close(&domain_->fid);
  if (fabric_ != nullptr) fi_close(&fabric_->fid);
  if (info_ != nullptr) fi_->freeinfo(info_);
  std::free(buffers_);
}

std::string OfiTransport::error_text(int code) const {
  const int positive = code < 0 ? -code : code;
  return std::string(fi_ != nullptr ? fi_->strerror(positive) : std::strerror(positive)) + " (" +
         std::to_string(code) + ")";
}

std::byte* OfiTransport::buffer(std::uint32_t index) const {
  return buffers_ + static_cast<std::size_t>(index) * kBufferSize;
}

void OfiTransport::post_receive(std::uint32_t index) {
  Op& op = ops_[index];
  op.send = false;
  op.buffer = index;
  const ssize_t ret = fi_recv(ep_, buffer(index), kBufferSize, desc_, FI_ADDR_UNSPEC, &op.context);
  if (ret == -FI_EAGAIN) {
    reposts_.push_back(index);  // retried at the next progress
  } else if (ret != 0) {
    FERRY_LOG(kWarn, "ofi: posting a receive failed: %s",
              error_text(static_cast<int>(ret)).c_str());
  }
}

Reachability OfiTransport::reach(const PeerInfo& peer) const {
  if (peer.address.empty())
    return {false, "rank " + std::to_string(peer.rank) + " has no ofi address"};
  AddressHeader header{};
  std::span<const std::byte> name;
  if (parse_address(peer.address, &header, &name) && header.protocol != protocol_) {
    // Another provider (net and tcp), or tcp;ofi_rxm with and without pass-through: their
    // connections would carry garbage.
    return {false, "rank " + std::to_string(peer.rank) + "'s endpoint speaks wire protocol " +
                       std::to_string(header.protocol) + ", this rank's " +
                       std::to_string(protocol_) + " (" + provider_ +
                       "): the ranks chose different providers or protocols; set "
                       "FERRY_OFI_PROVIDER and FERRY_OFI_PASSTHRU alike on every rank"};
  }
  return {true, provider_};
}

namespace {

class OfiEndpoint final : public Endpoint {
 public:
  OfiEndpoint(OfiTransport* transport, int peer, fi_addr_t address)
      : transport_(transport), peer_(peer), address_(address) {}
  Status am_send(std::uint8_t id, std::span<const std::byte> header,
                 std::span<const std::byte> payload, AmHint /*hint*/) override {
    return transport_->send(peer_, address_, id, header, payload);
  }
  Status get(void* /*local*/, std::uint64_t /*remote*/, std::size_t /*length*/) override {
    return Status(Code::kUnsupported, "ofi: no zero-copy get yet");
  }
  [[nodiscard]] bool has_get() const override { return false; }
  [[nodiscard]] bool has_direct() const override { return true; }
  Status send_direct(const void* buffer, std::size_t length, int device, std::uint64_t key,
                     std::uint64_t cookie) override {
    return transport_->start_direct(true, peer_, const_cast<void*>(buffer), length, device, key,
                                    cookie);
  }
  Status recv_direct(void* buffer, std::size_t length, int device, std::uint64_t key,
                     std::uint64_t cookie) override {
    return transport_->start_direct(false, peer_, buffer, length, device, key, cookie);
  }
  bool device_direct(int device, const void* buffer, std::size_t length) override {
    return transport_->device_direct(device, buffer, length);
  }
  [[nodiscard]] std::string device_route() const override { return transport_->device_route(); }
  void cancel_direct(std::uint64_t cookie) override { transport_->cancel_direct(cookie); }
  [[nodiscard]] bool has_read() const override { return transport_->has_read(); }
  [[nodiscard]] bool has_native_rma() const override { return transport_->has_native_rma(); }
  Status write_direct(const void* buffer, std::size_t length, RemoteRegion region,
                      std::uint64_t cookie) override {
    return transport_->start_write(peer_, buffer, length, region, cookie);
  }
  Status expose(const void* buffer, std::size_t length, std::uint64_t cookie,
                RemoteRegion* region) override {
    return transport_->expose(buffer, length, cookie, region);
  }
  void unexpose(std::uint64_t cookie, bool revoke) override {
    transport_->unexpose(cookie, revoke);
  }
  Status read_direct(void* buffer, std::size_t length, RemoteRegion region,
                     std::uint64_t cookie) override {
    return transport_->start_read(peer_, buffer, length, region, cookie);
  }
  [[nodiscard]] std::string describe() const override {
    return "ofi (" + transport_->provider() + "; " + transport_->rma() + "; " + transport_->hmem() +
           ")";
  }

 private:
  OfiTransport* transport_;
  int peer_;
  fi_addr_t address_;
};

}  // namespace

std::unique_ptr<Endpoint> OfiTransport::connect(const PeerInfo& peer) {
  if (peer.rank < 0 || peer.rank >= size_) {
    throw Error(Code::kInvalidArgument, "ofi: no rank " + std::to_string(peer.rank));
  }
  AddressHeader header{};
  std::span<const std::byte> name;
  if (!parse_address(peer.address, &header, &name)) {
    throw Error(Code::kProtocolError, "ofi: rank " + std::to_string(peer.rank) +
                                          " published a malformed address of " +
                                          std::to_string(peer.address.size()) + " bytes");
  }
  PeerState& state = peers_[static_cast<std::size_t>(peer.rank)];
  const int ret =
      fi_av_insert(av_, peer.address.data() + sizeof header, 1, &state.address, 0, nullptr);
  if (ret != 1) {
    throw Error(Code::kIoError, "ofi: fi_av_insert of rank " + std::to_string(peer.rank) +
                                    "'s address failed: " + error_text(ret < 0 ? ret : -FI_EINVAL));
  }
  state.connected = true;
  if (header.node == node_ && header.pid > 0 && !test_remote_) {
    // On this node: its death is seen by its process, not only by the next failed send.
    state.pid = header.pid;
    state.pidfd.reset(static_cast<int>(::syscall(SYS_pidfd_open, header.pid, 0)));
  }
  return std::make_unique<OfiEndpoint>(this, peer.rank, state.address);
}

Status OfiTransport::send(int peer, fi_addr_t address, std::uint8_t id,
                          std::span<const std::byte> header, std::span<const std::byte> payload,
                          bool confirm) {
  PeerState& state = peers_[static_cast<std::size_t>(peer)];
  if (state.failed) return Status(Code::kPeerFailed, state.why);
  const std::size_t length = header.size() + payload.size();
  const std::size_t total = sizeof(Wire) + length;
  if (total > kBufferSize) {
    return Status(Code::kInvalidArgument, "ofi: active message of " + std::to_string(total) +
                                              " bytes exceeds " + std::to_string(kBufferSize));
  }
  Wire wire{id, 0, kWireMagic, rank_, static_cast<std::uint32_t>(length), state.next_seq};
  auto fill = [&](std::byte* out) {
    std::memcpy(out, &wire, sizeof wire);
    if (!header.empty()) std::memcpy(out + sizeof wire, header.data(), header.size());
    if (!payload.empty())
      std::memcpy(out + sizeof wire + header.size(), payload.data(), payload.size());
  };
  ssize_t ret;
  if (state.outstanding >= kSendsPerPeer) return Status(Code::kWouldBlock);
  if (total <= inject_size_ && !confirm) {
    fill(inject_scratch_.data());
    ret = fi_inject(ep_, inject_scratch_.data(), total, address);
  } else {
    // No progress from here: a send may be made from inside a delivered message's handler.
    if (free_sends_.empty()) return Status(Code::kWouldBlock);
    const std::uint32_t index = free_sends_.back();
    fill(buffer(index));
    Op& op = ops_[index];
    op.send = true;
    op.drain = confirm;
    op.seq = state.next_seq;
    op.peer = peer;
    op.buffer = index;
    if (!confirm) {
      ret = fi_send(ep_, buffer(index), total, desc_, address, &op.context);
    } else {
      iovec iov{buffer(index), total};
      void* desc = desc_;
      fi_msg msg{};
      msg.msg_iov = &iov;
      msg.desc = &desc;
      msg.iov_count = 1;
      msg.addr = address;
      msg.context = &op.context;
      ret = -FI_EINVAL;
      if (delivery_complete_) {
        ret = fi_sendmsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
        if (ret != 0 && ret != -FI_EAGAIN) {
          // Then a transmit completion, which follows the earlier messages' (they are ordered).
          FERRY_LOG(kInfo,
                    "ofi: a send with delivery completion was refused (%s): finalize waits "
                    "for transmit completion",
                    error_text(static_cast<int>(ret)).c_str());
          delivery_complete_ = false;
        }
      }
      if (!delivery_complete_) ret = fi_sendmsg(ep_, &msg, FI_COMPLETION);
    }
    if (ret == 0) {
      free_sends_.pop_back();
      ++state.outstanding;
      if (confirm) state.drain_sent = true;
    }
  }
  if (ret == 0) {
    ++state.next_seq;
    state.refused_since = {};
    return Status::ok();
  }
  if (ret == -FI_EAGAIN) {
    // Normal back-pressure, retried by the engine after progress, unless it never ends: a
    // provider keeps answering -FI_EAGAIN for a peer that died (check_peers decides).
    if (state.refused_since == std::chrono::steady_clock::time_point{}) {
      state.refused_since = std::chrono::steady_clock::now();
    }
    return Status(Code::kWouldBlock);
  }
  const std::string why = "ofi: sending to rank " + std::to_string(peer) +
                          " failed: " + error_text(static_cast<int>(ret));
  peer_failed(peer, why);
  return Status(Code::kPeerFailed, why);
}

int OfiTransport::register_memory(void* data, std::size_t length, std::uint64_t access, int device,
                                  fid_mr** mr, std::uint64_t key) {
  *mr = nullptr;
  int ret = 0;
  // Without FI_MR_PROV_KEY the keys are ours to choose, and must differ within the domain.
  if ((info_->domain_attr->mr_mode & FI_MR_PROV_KEY) != 0) {
    key = 0;
  } else if (key == 0) {
    key = next_key_++;
  }
  if (device < 0) {
    ret = fi_mr_reg(domain_, data, length, access, 0, key, 0, mr, nullptr);
  } else if (hmem_fail_) {
    return -FI_EINVAL;  // what a NIC that cannot map GPU memory answers
  } else {
    iovec iov{data, length};
    fi_mr_attr attr{};
    attr.mr_iov = &iov;
    attr.iov_count = 1;
    attr.access = access;
    attr.iface = FI_HMEM_CUDA;
    attr.device.cuda = device;
    attr.requested_key = key;
    ret = fi_mr_regattr(domain_, &attr, 0, mr);
  }
  if (ret == 0 && (info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
    ret = fi_mr_bind(*mr, &ep_->fid, 0);
    if (ret == 0) ret = fi_mr_enable(*mr);
  }
  if (ret != 0 && *mr != nullptr) {
    fi_close(&(*mr)->fid);
    *mr = nullptr;
  }
  return ret;
}

bool OfiTransport::device_direct(int device, const void* buffer, std::size_t length) {
  if (!hmem_offered_ || device < 0) return false;
  if (auto found = gpus_.find(device); found != gpus_.end()) return found->second.direct;
  // The provider's word is not enough (a NIC may offer FI_HMEM and still fail to map a GPU's
  // memory): register this buffer for real, once per GPU.
  const std::string gpu = "cuda:" + std::to_string(device);
  fid_mr* mr = nullptr;
  const int ret = register_memory(const_cast<void*>(buffer), std::max<std::size_t>(length, 1),
                                  FI_SEND | FI_RECV, device, &mr);
  GpuVerdict& verdict = gpus_[device];
  if (ret == 0) {
    fi_close(&mr->fid);
    verdict = GpuVerdict{true, gpu + " memory registered with the NIC (trial registration)"};
    FERRY_LOG(kInfo, "ofi: %s", verdict.why.c_str());
  } else {
    verdict = GpuVerdict{
        false, "registering " + gpu + " memory with the NIC failed (" + error_text(ret) + ")"};
    FERRY_LOG(kWarn, "ofi: %s; device data over ofi is staged through pinned host memory",
              verdict.why.c_str());
  }
  return verdict.direct;
}

std::string OfiTransport::device_route() const {
  if (!hmem_offered_) return hmem_;
  std::string out = hmem_ + "; ";
  if (gpus_.empty()) return out + "GPU memory not tried yet (the first device transfer tries it)";
  for (const auto& [device, verdict] : gpus_) {
    out += (device == gpus_.begin()->first ? "" : "; ") +
           (verdict.direct ? verdict.why : verdict.why + ": staged through pinned host memory");
  }
  return out;
}

Status OfiTransport::new_direct(int peer, void* data, std::size_t length, std::uint64_t cookie,
                                std::unique_ptr<Op>* op) {
  const PeerState& state = peers_[static_cast<std::size_t>(peer)];
  if (state.failed) return Status(Code::kPeerFailed, state.why);
  if (directs_.count(cookie) != 0) {
    return Status(Code::kInternal, "ofi: a direct transfer with that cookie is in flight");
  }
  *op = std::make_unique<Op>();
  (*op)->direct = true;
  (*op)->peer = peer;
  (*op)->data = data;
  (*op)->length = length;
  (*op)->cookie = cookie;
  return Status::ok();
}

void OfiTransport::release_local(Op& op) {
  if (op.mr != nullptr) fi_close(&op.mr->fid);
  if (op.entry != nullptr) cache_->release(op.entry, false);
  op.mr = nullptr;
  op.entry = nullptr;
}

Status OfiTransport::launch_direct(std::unique_ptr<Op> op) {
  Op* raw = op.get();
  const std::uint64_t cookie = raw->cookie;
  directs_.emplace(cookie, std::move(op));
  if (raw->read && test_read_fail_) {
    // Fails at the next progress, as a provider's error completion would. (A read of a key the
    // peer never registered would do it for real, but tcp;ofi_rxm then drops the connection
    // and the messages in flight on it.)
    failed_reads_.push_back(raw);
    return Status::ok();
  }
  Status status;
  if (!post_direct(*raw, &status)) direct_retries_.push_back(raw);
  if (!status) {
    release_local(*raw);
    directs_.erase(cookie);
  }
  return status;
}

Status OfiTransport::start_direct(bool send, int peer, void* data, std::size_t length, int device,
                                  std::uint64_t key, std::uint64_t cookie) {
  std::unique_ptr<Op> op;
  if (Status status = new_direct(peer, data, length, cookie, &op); !status) return status;
  op->send = send;
  op->key = key;
  // GPU memory is always registered (with its interface); host memory where the provider asks.
  if (length > 0 && (device >= 0 || (info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0)) {
    const int ret = register_memory(data, length, send ? FI_SEND : FI_RECV, device, &op->mr);
    if (ret != 0) {
      std::string why = "ofi: registering a " + std::to_string(length) + "-byte " +
                        (device >= 0 ? "cuda:" + std::to_string(device) + " " : "host ") +
                        "buffer failed: " + error_text(ret);
      if (device >= 0) {
        // Later transfers of this GPU's memory are staged.
        gpus_[device] = GpuVerdict{false, why};
        FERRY_LOG(kWarn, "%s; later device data over ofi is staged through pinned host memory",
                  why.c_str());
      }
      return Status(Code::kIoError, std::move(why));
    }
  }
  return launch_direct(std::move(op));
}

std::string OfiTransport::rma() const {
  if (!rma_) return "tagged rendezvous (" + rma_why_ + ")";
  return std::string("fi_read rendezvous; ") +
         (native_ ? "puts and gets by fi_write/fi_read" : "puts and gets by messages") + "; " +
         cache_->describe();
}

Status OfiTransport::register_region(void* data, std::size_t length, std::uint64_t key,
                                     bool writable, Endpoint::RemoteRegion* region, void** handle) {
  if (!native_) return Status(Code::kUnsupported, "ofi: " + native_why_);
  fid_mr* mr = nullptr;
  const std::uint64_t access = FI_REMOTE_READ | (writable ? FI_REMOTE_WRITE : 0);
  const int ret = register_memory(data, length, access, -1, &mr, key);
  if (ret != 0) {
    return Status(Code::kIoError,
                  "ofi: registering a " + std::to_string(length) +
                      "-byte region for one-sided access failed: " + error_text(ret));
  }
  // Without FI_MR_VIRT_ADDR a remote address is an offset into the registration.
  region->address = (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0
                        ? reinterpret_cast<std::uint64_t>(data)
                        : 0;
  region->key = fi_mr_key(mr);
  *handle = mr;
  return Status::ok();
}

void OfiTransport::release_region(void* handle) {
  if (handle != nullptr) fi_close(&static_cast<fid_mr*>(handle)->fid);
}

Status OfiTransport::expose(const void* data, std::size_t length, std::uint64_t cookie,
                            Endpoint::RemoteRegion* region) {
  if (!rma_) return Status(Code::kUnsupported, "ofi: " + rma_why_);
  if (exposed_.count(cookie) != 0) {
    return Status(Code::kInternal, "ofi: a buffer with that cookie is exposed already");
  }
  int error = 0;
  mem::RegistrationCache::Entry* entry = cache_->acquire(data, length, FI_REMOTE_READ, &error);
  if (entry == nullptr) {
    return Status(Code::kIoError,
                  "ofi: registering a " + std::to_string(length) +
                      "-byte host buffer for remote reads failed: " + error_text(error));
  }
  auto* mr = static_cast<fid_mr*>(entry->handle);
  const auto address = reinterpret_cast<std::uint64_t>(data);
  // Without FI_MR_VIRT_ADDR a remote address is an offset into the registration.
  region->address =
      (info_->domain_attr->mr_mode & FI_MR_VIRT_ADDR) != 0 ? address : address - entry->begin;
  region->key = fi_mr_key(mr);
  exposed_.emplace(cookie, entry);
  return Status::ok();
}

void OfiTransport::unexpose(std::uint64_t cookie, bool revoke) {
  auto it = exposed_.find(cookie);
  if (it == exposed_.end()) return;
  cache_->release(it->second, revoke);
  exposed_.erase(it);
}

Status OfiTransport::start_read(int peer, void* data, std::size_t length,
                                Endpoint::RemoteRegion region, std::uint64_t cookie) {
  if (!rma_) return Status(Code::kUnsupported, "ofi: " + rma_why_);
  return start_rma(false, peer, data, length, region, cookie);
}

Status OfiTransport::start_write(int peer, const void* data, std::size_t length,
                                 Endpoint::RemoteRegion region, std::uint64_t cookie) {
  if (!native_) return Status(Code::kUnsupported, "ofi: " + native_why_);
  return start_rma(true, peer, const_cast<void*>(data), length, region, cookie);
}

Status OfiTransport::start_rma(bool write, int peer, void* data, std::size_t length,
                               Endpoint::RemoteRegion region, std::uint64_t cookie) {
  const char* what = write ? "write" : "read";
  if (length > info_->ep_attr->max_msg_size) {
    return Status(Code::kUnsupported, std::string("ofi: a ") + what + " of " +
                                          std::to_string(length) +
                                          " bytes exceeds the provider's largest message (" +
                                          std::to_string(info_->ep_attr->max_msg_size) + ")");
  }
  std::unique_ptr<Op> op;
  if (Status status = new_direct(peer, data, length, cookie, &op); !status) return status;
  op->read = !write;
  op->write = write;
  op->remote = region;
  if ((info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
    int error = 0;
    op->entry = cache_->acquire(data, length, write ? FI_WRITE : FI_READ, &error);
    if (op->entry == nullptr) {
      return Status(Code::kIoError,
                    "ofi: registering a " + std::to_string(length) + "-byte host buffer to " +
                        what + (write ? " from" : " into") + " failed: " + error_text(error));
    }
  }
  return launch_direct(std::move(op));
}

bool OfiTransport::post_direct(Op& op, Status* status) {
  const PeerState& state = peers_[static_cast<std::size_t>(op.peer)];
  void* desc = op.mr != nullptr      ? fi_mr_desc(op.mr)
               : op.entry != nullptr ? fi_mr_desc(static_cast<fid_mr*>(op.entry->handle))
                                     : nullptr;
  ssize_t ret;
  if (op.read) {
    ret = fi_read(ep_, op.data, op.length, desc, state.address, op.remote.address, op.remote.key,
                  &op.context);
  } else if (op.write) {
    // Complete once the data is in the peer's memory: a put's request means that.
    iovec iov{op.data, op.length};
    fi_rma_iov remote{op.remote.address, op.length, op.remote.key};
    fi_msg_rma msg{};
    msg.msg_iov = &iov;
    msg.desc = &desc;
    msg.iov_count = 1;
    msg.addr = state.address;
    msg.rma_iov = &remote;
    msg.rma_iov_count = 1;
    msg.context = &op.context;
    ret = fi_writemsg(ep_, &msg, FI_COMPLETION | FI_DELIVERY_COMPLETE);
  } else if (op.send) {
    ret = fi_tsend(ep_, op.data, op.length, desc, state.address, op.key, &op.context);
  } else {
    ret = fi_trecv(ep_, op.data, op.length, desc, state.address, op.key, 0, &op.context);
  }
  if (ret == -FI_EAGAIN) return false;
  if (ret != 0) {
    const char* call = op.read    ? "fi_read"
                       : op.write ? "fi_writemsg"
                       : op.send  ? "fi_tsend"
                                  : "fi_trecv";
    *status =
        Status(Code::kIoError, std::string("ofi: ") + call + " to rank " + std::to_string(op.peer) +
                                   " failed: " + error_text(static_cast<int>(ret)));
  }
  return true;
}

void OfiTransport::finish_direct(Op* op, Status status) {
  auto it = directs_.find(op->cookie);
  if (it == directs_.end() || it->second.get() != op) return;
  const bool report = !op->orphaned;
  const std::uint64_t cookie = op->cookie;
  release_local(*op);
  directs_.erase(it);
  if (report) handler_->on_direct(cookie, std::move(status));
}

void OfiTransport::cancel_direct(std::uint64_t cookie) {
  auto it = directs_.find(cookie);
  if (it == directs_.end()) return;
  Op* op = it->second.get();
  auto queued = std::find(direct_retries_.begin(), direct_retries_.end(), op);
  if (queued != direct_retries_.end()) {  // never reached the provider
    direct_retries_.erase(queued);
    return finish_direct(op, Status(Code::kCanceled, "direct transfer canceled"));
  }
  fi_cancel(&ep_->fid, &op->context);  // its completion (canceled, or done) follows
}

void OfiTransport::handle_receive(std::uint32_t index, std::size_t length) {
  const std::byte* data = buffer(index);
  Wire wire{};
  if (!parse_message({data, length}, size_, rank_, &wire)) {
    if (malformed_++ == 0) {
      FERRY_LOG(kWarn, "ofi: dropped a malformed message (%zu bytes, claims rank %d, length %u)",
                length, wire.source, wire.length);
    }
    return;
  }
  PeerState& peer = peers_[static_cast<std::size_t>(wire.source)];
  if (peer.failed) return;
  const auto ahead = static_cast<std::int32_t>(wire.seq - peer.expected_seq);
  if (ahead < 0 || (ahead > 0 && peer.held.count(wire.seq) != 0)) {
    if (malformed_++ == 0) {
      FERRY_LOG(kWarn, "ofi: dropped a repeated message from rank %d (seq %u, expecting %u)",
                wire.source, wire.seq, peer.expected_seq);
    }
    return;
  }
  if (ahead > 0) {  // overtook an earlier one still completing: keep a copy, repost the buffer
    FERRY_LOG(kDebug, "ofi: message %u from rank %d arrived before %u: held", wire.seq, wire.source,
              peer.expected_seq);
    peer.held.emplace(wire.seq, std::vector<std::byte>(data, data + length));
    return;
  }
  deliver(wire, data + sizeof wire);
  // Messages that had overtaken this one follow it now, in order.
  for (auto it = peer.held.find(peer.expected_seq); it != peer.held.end() && !peer.failed;
       it = peer.held.find(peer.expected_seq)) {
    std::vector<std::byte> message = std::move(it->second);
    peer.held.erase(it);
    Wire held;
    std::memcpy(&held, message.data(), sizeof held);
    deliver(held, message.data() + sizeof held);
  }
}

void OfiTransport::deliver(const Wire& wire, const std::byte* body) {
  PeerState& peer = peers_[static_cast<std::size_t>(wire.source)];
  ++peer.expected_seq;
  peer.last_heard = std::chrono::steady_clock::now();
  if (wire.id == kKeepaliveId) return;
  handler_->on_am(wire.id, wire.source, {body, wire.length});
}

void OfiTransport::peer_failed(int peer, const std::string& why) {
  PeerState& state = peers_[static_cast<std::size_t>(peer)];
  if (state.failed) return;
  state.failed = true;
  state.why = why;
  // Let the provider drop what it holds for the peer (sends stuck on it complete in error).
  if (state.connected) fi_av_remove(av_, &state.address, 1, 0);
  // Nothing is called back from here (this may run inside an engine's send): check_peers ends
  // the peer's direct transfers when it reports the failure.
}

void OfiTransport::orphan_directs(int peer, const std::string& why) {
  // A provider may never complete a send to a dead peer (tcp;ofi_rxm keeps it queued): its
  // direct transfers end now for the caller. The Op stays until the provider lets go of it.
  std::vector<std::uint64_t> cookies;
  for (auto& [cookie, op] : directs_) {
    if (op->peer == peer && !op->orphaned) cookies.push_back(cookie);
  }
  for (std::uint64_t cookie : cookies) {
    Op* op = directs_[cookie].get();
    fi_cancel(&ep_->fid, &op->context);
    std::erase(direct_retries_, op);
    op->orphaned = true;
    handler_->on_direct(cookie, Status(Code::kPeerFailed, why));
  }
}

void OfiTransport::check_peers(std::vector<std::pair<int, std::string>>* failed) {
  std::vector<pollfd> fds;
  std::vector<int> watched;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    if (peers_[i].pidfd.valid() && !peers_[i].failed) {
      fds.push_back({peers_[i].pidfd.get(), POLLIN, 0});
      watched.push_back(static_cast<int>(i));
    }
  }
  if (!fds.empty() && ::poll(fds.data(), fds.size(), 0) > 0) {
    // What an exited process sent before it went is in this process already (its provider
    // confirmed delivery, or the bytes wait in the socket): read it before the process is taken
    // for dead, since messages from a failed peer are dropped. A wildcard receive may wait for
    // its last message.
    for (int pass = 0, quiet = 0; pass < 100 && quiet < 2; ++pass) {
      quiet = progress() == 0 ? quiet + 1 : 0;
    }
    for (std::size_t i = 0; i < fds.size(); ++i) {
      if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      const int rank = watched[i];
      peer_failed(rank, "rank " + std::to_string(rank) + " (pid " +
                            std::to_string(peers_[static_cast<std::size_t>(rank)].pid) +
                            ") exited or was killed (seen by ofi's pidfd)");
    }
  }
  const auto now = std::chrono::steady_clock::now();
  // The first keepalive to a dead peer is refused within an interval of its death; two more
  // intervals of refusals, and it is failed: at most 3 intervals from death to failure.
  const auto refused_limit = std::chrono::duration<double>(2 * keepalive_s_);
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    if (keepalive_s_ > 0 && !state.failed &&
        state.refused_since != std::chrono::steady_clock::time_point{} &&
        now - state.refused_since > refused_limit) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.3g s", 2 * keepalive_s_);
      peer_failed(static_cast<int>(i),
                  "rank " + std::to_string(i) + " refused every send for " + seconds +
                      " (2 keepalive intervals; the provider answers -FI_EAGAIN): unreachable");
    }
    if (silence_s_ > 0 && state.connected && !state.failed && static_cast<int>(i) != rank_ &&
        now - state.last_heard > std::chrono::duration<double>(silence_s_)) {
      char seconds[32];
      std::snprintf(seconds, sizeof seconds, "%.3g s", silence_s_);
      peer_failed(static_cast<int>(i), "rank " + std::to_string(i) + " sent nothing for " +
                                           seconds + " (FERRY_KEEPALIVE_TIMEOUT)");
    }
  }
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    if (state.failed && !state.reported) {
      state.reported = true;
      failed->emplace_back(static_cast<int>(i), state.why);
      orphan_directs(static_cast<int>(i), state.why);
    }
  }
}

void OfiTransport::keepalive() {
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    const PeerState& state = peers_[i];
    if (!state.connected || state.failed || static_cast<int>(i) == rank_) continue;
    // Lost to back-pressure is fine: the next interval tries again.
    Status status = send(static_cast<int>(i), state.address, kKeepaliveId, {}, {});
    FERRY_LOG(kDebug, "ofi: keepalive to rank %zu: %s", i, status.to_string().c_str());
  }
}

bool OfiTransport::delivered() {
  bool done = true;
  for (std::size_t i = 0; i < peers_.size(); ++i) {
    PeerState& state = peers_[i];
    if (static_cast<int>(i) == rank_ || !state.connected || state.failed) continue;
    // A bounce-buffer send above the provider's eager size may complete after later ones (it
    // waits for the peer to fetch it): it is delivered at its own completion.
    if (state.confirmed == state.next_seq && state.outstanding == 0) continue;
    if (!state.drain_sent && state.confirmed != state.next_seq) {
      // Refused for now (back-pressure) or failed (the peer with it): the next call sees which.
      (void)send(static_cast<int>(i), state.address, kKeepaliveId, {}, {}, true);
    }
    if (!state.failed) done = false;
  }
  return done;
}

int OfiTransport::progress() {
  if (keepalive_s_ > 0 && (++polls_ & 255) == 0) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= next_keepalive_) {
      next_keepalive_ = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(keepalive_s_));
      keepalive();
    }
  }
  if (!reposts_.empty()) {
    std::vector<std::uint32_t> again;
    again.swap(reposts_);
    for (std::uint32_t index : again) post_receive(index);
  }
  if (!failed_reads_.empty()) {
    std::vector<Op*> failed;
    failed.swap(failed_reads_);
    for (Op* op : failed) {
      finish_direct(
          op, Status(Code::kIoError, "ofi: direct read from rank " + std::to_string(op->peer) +
                                         " failed (FERRY_TEST_OFI_READ_FAIL)"));
    }
  }
  if (!direct_retries_.empty()) {
    std::vector<Op*> again;
    again.swap(direct_retries_);
    for (std::size_t i = 0; i < again.size(); ++i) {
      Status status;
      if (!post_direct(*again[i], &status)) {
        direct_retries_.insert(direct_retries_.end(), again.begin() + static_cast<long>(i),
                               again.end());
        break;
      }
      if (!status) finish_direct(again[i], std::move(status));
    }
  }
  int delivered = 0;
  for (;;) {
    fi_cq_msg_entry entries[16];
    const ssize_t n = fi_cq_read(cq_, entries, 16);
    if (n == -FI_EAGAIN) break;
    if (n == -FI_EAVAIL) {
      fi_cq_err_entry error{};
      if (fi_cq_readerr(cq_, &error, 0) < 0) break;
      auto* op = static_cast<Op*>(error.op_context);
      if (op == nullptr) continue;
      if (op->direct) {
        const bool canceled = error.err == FI_ECANCELED;
        finish_direct(op, Status(canceled ? Code::kCanceled : Code::kIoError,
                                 std::string("ofi: direct ") +
                                     (op->read    ? "read from"
                                      : op->write ? "write to"
                                      : op->send  ? "send to"
                                                  : "receive from") +
                                     " rank " + std::to_string(op->peer) +
                                     " failed: " + error_text(-error.err)));
        continue;
      }
      FERRY_LOG(kDebug, "ofi: completion error %d (%s) for a %s", error.err,
                error_text(-error.err).c_str(), op->send ? "send" : "receive");
      if (op->send) {
        free_sends_.push_back(op->buffer);
        --peers_[static_cast<std::size_t>(op->peer)].outstanding;
        const char* detail = fi_cq_strerror(cq_, error.prov_errno, error.err_data, nullptr, 0);
        peer_failed(op->peer, "ofi: a send to rank " + std::to_string(op->peer) +
                                  " failed: " + error_text(-error.err) +
                                  (detail != nullptr ? std::string(": ") + detail : ""));
      } else if (error.err != FI_ECANCELED) {
        FERRY_LOG(kWarn, "ofi: a receive failed: %s", error_text(-error.err).c_str());
        post_receive(op->buffer);
      }
      continue;
    }
    if (n < 0) {
      FERRY_LOG(kWarn, "ofi: fi_cq_read failed: %s", error_text(static_cast<int>(n)).c_str());
      break;
    }
    for (ssize_t i = 0; i < n; ++i) {
      auto* op = static_cast<Op*>(entries[i].op_context);
      if (op->direct) {
        finish_direct(op, op->send || op->read || op->write || entries[i].len == op->length
                              ? Status::ok()
                              : Status(Code::kProtocolError,
                                       "ofi: direct receive from rank " + std::to_string(op->peer) +
                                           " got " + std::to_string(entries[i].len) + " of " +
                                           std::to_string(op->length) + " bytes"));
        continue;
      }
      if (op->send) {
        PeerState& state = peers_[static_cast<std::size_t>(op->peer)];
        free_sends_.push_back(op->buffer);
        --state.outstanding;
        if (op->drain) {  // what was sent after it needs another
          state.drain_sent = false;
          state.confirmed = op->seq + 1;
        }
      } else {
        handle_receive(op->buffer, entries[i].len);
        post_receive(op->buffer);
        ++delivered;
      }
    }
    handler_->on_batch_end();  // before the next fi_cq_read, whose progress polls the sockets
    if (n < 16) break;
  }
  return delivered;
}

}  // namespace ferry::transport::ofi
