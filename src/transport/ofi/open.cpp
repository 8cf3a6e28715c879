// Opening the ofi transport (see transport.hpp), step by step: the provider, what it offers for
// GPU memory and one-sided access, the endpoint and its bounce buffers, the address peers find
// it by, the registration cache. Every libfabric object is held by an owner (handles.hpp), so a
// step that fails closes what the earlier ones opened, and its error names the step.
#include <rdma/fi_cm.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_errno.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "transport/ofi/fabric.hpp"
#include "transport/ofi/nic.hpp"
#include "transport/ofi/op.hpp"
#include "transport/ofi/transport.hpp"
#include "transport/ofi/wire.hpp"
#include "util/config.hpp"
#include "util/log.hpp"

namespace ferry::transport::ofi {

OfiTransport::OfiTransport(const util::Config& config, int rank, int size, AmHandler* handler)
    : rank_(rank),
      size_(size),
      handler_(handler),
      fail_at_(config.get_string(util::Var::kTestOfiFailAt)),
      directs_(*this, config),
      keepalive_s_(config.get_seconds(util::Var::kKeepalive)),
      silence_s_(config.get_seconds(util::Var::kKeepaliveTimeout)),
      test_remote_(config.get_bool(util::Var::kTestOfiRemote)),
      test_drop_(config.get_int(util::Var::kTestOfiDrop)),
      test_drop_copies_(config.get_bool(util::Var::kTestOfiDropCopies)) {
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
  const bool want_passthru = config.get_string(util::Var::kOfiPassthru) != "off";
  if (want_passthru) ::setenv("FI_OFI_RXM_ENABLE_PASSTHRU", "1", 0);
  std::string why;
  fi_ = fabric(&why);
  if (fi_ == nullptr) throw Error(Code::kUnsupported, why);
  choose_provider(config, want_passthru);
  probe_hmem(config);
  describe_provider(config);
  decide_rma(config);
  open_endpoint();
  publish_address();
  open_cache(config);
  set_capabilities(config);
  FERRY_LOG(kDebug, "ofi: %s, inject up to %zu B", provider_.c_str(), inject_size_);
}

// Cached registrations go first (they may be bound to the endpoint); then the endpoint (which
// cancels posted receives), then what it was bound to: the members' order.
OfiTransport::~OfiTransport() = default;

void OfiTransport::check(const char* step, int ret) {
  if (ret == 0) return;
  throw Error(Code::kIoError, std::string("opening the ofi endpoint failed at ") + step + ": " +
                                  error_text(ret) +
                                  (provider_.empty() ? "" : " (" + provider_ + ")"));
}

void OfiTransport::choose_provider(const util::Config& config, bool want_passthru) {
  Info hints(fi_->dupinfo(nullptr));
  if (!hints) throw Error(Code::kNoResources, "fi_allocinfo failed");
  // One-sided writes and reads (native puts and gets, fi_read rendezvous) where the allowed
  // provider has them: asked first, then reads alone, then neither.
  const std::string& rma_mode = config.get_string(util::Var::kOfiRma);
  const std::uint64_t reads = FI_RMA | FI_READ | FI_REMOTE_READ;
  std::vector<std::uint64_t> ladder;
  if (rma_mode == "auto" || rma_mode == "native") {
    ladder.push_back(FI_MSG | FI_TAGGED | reads | FI_WRITE | FI_REMOTE_WRITE);
  }
  if (rma_mode != "off") ladder.push_back(FI_MSG | FI_TAGGED | reads);
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
  for (std::size_t step = 0; step < ladder.size() && !info_; ++step) {
    hints->caps = ladder[step];
    fi_info* offers = nullptr;
    const int ret = fi_->getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, hints.get(), &offers);
    const Info list(offers);
    if (ret == -FI_ENODATA && step + 1 < ladder.size()) continue;
    check("fi_getinfo (reliable datagram endpoints with ordered messages)", ret);
    if (const fi_info* chosen = pick_offer(list.get(), allowed, want_passthru, &seen)) {
      info_.reset(fi_->dupinfo(chosen));
    }
  }
  if (!info_) {
    throw Error(Code::kUnsupported,
                "no libfabric provider allowed by FERRY_OFI_PROVIDER=" + allowed +
                    " (offered: " + (seen.empty() ? "none" : seen) + ")");
  }
}

const fi_info* OfiTransport::pick_offer(const fi_info* list, const std::string& allowed,
                                        bool want_passthru, std::string* seen) {
  // The first provider allowed, and among its offers (NICs, addresses) the first on this
  // thread's NUMA node.
  std::vector<const fi_info*> candidates;
  std::vector<int> nodes;
  for (const fi_info* i = list; i != nullptr; i = i->next) {
    const char* name = i->fabric_attr->prov_name;
    if (!provider_allowed(allowed, name)) {
      if (seen->find(name) == std::string::npos) {
        *seen += std::string(seen->empty() ? "" : ", ") + name;
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
  auto is_passthru = [](const fi_info* i) { return i->ep_attr->protocol == FI_PROTO_RXM_TCP; };
  const bool through =
      want_passthru && std::any_of(candidates.begin(), candidates.end(), is_passthru);
  for (std::size_t c = candidates.size(); c-- > 0;) {
    if (is_passthru(candidates[c]) != through) {
      candidates.erase(candidates.begin() + static_cast<std::ptrdiff_t>(c));
      nodes.erase(nodes.begin() + static_cast<std::ptrdiff_t>(c));
    }
  }
  if (candidates.empty()) return nullptr;
  return candidates[nearest_candidate(nodes, current_numa_node())];
}

// GPU memory and the NIC: ask the chosen provider and domain for FI_HMEM. Where it is granted,
// the endpoint is opened with it and each GPU's memory is tried on first use (device_direct);
// elsewhere device data is staged through pinned host memory.
void OfiTransport::probe_hmem(const util::Config& config) {
  const std::string& test_hmem = config.get_string(util::Var::kTestOfiHmem);
  if (config.get_string(util::Var::kOfiHmem) == "off") {
    hmem_ = "FERRY_OFI_HMEM=off: device data staged through pinned host memory";
    return;
  }
  const Info probe(fi_->dupinfo(info_.get()));
  if (!probe) return;
  probe->caps |= FI_HMEM;
  probe->domain_attr->mr_mode |= FI_MR_HMEM;
  fi_info* offers = nullptr;
  const int ret = fi_->getinfo(FI_VERSION(1, 14), nullptr, nullptr, 0, probe.get(), &offers);
  const Info offered(offers);
  for (const fi_info* i = ret == 0 ? offered.get() : nullptr; i != nullptr && !hmem_offered_;
       i = i->next) {
    if ((i->caps & FI_HMEM) != 0 &&
        std::strcmp(i->fabric_attr->prov_name, info_->fabric_attr->prov_name) == 0 &&
        std::strcmp(i->domain_attr->name, info_->domain_attr->name) == 0) {
      info_.reset(fi_->dupinfo(i));
      if (!info_) throw Error(Code::kNoResources, "fi_dupinfo failed");
      hmem_offered_ = true;
    }
  }
  if (hmem_offered_) {
    hmem_ = "FI_HMEM offered";
  } else if (test_hmem != "none") {
    hmem_ = "FI_HMEM assumed (FERRY_TEST_OFI_HMEM=" + test_hmem + ")";
    hmem_offered_ = true;
  } else {
    hmem_ = "no FI_HMEM in this libfabric provider: device data staged through pinned host memory";
  }
  hmem_fail_ = hmem_offered_ && test_hmem == "fail";
}

void OfiTransport::describe_provider(const util::Config& config) {
  provider_ = std::string(info_->fabric_attr->prov_name) + " on " + info_->domain_attr->name +
              " (" + info_->fabric_attr->name + ")";
  protocol_ = info_->ep_attr->protocol;
  if (passthru()) {
    provider_ += ", passed through to tcp's connected endpoints";
  } else if (config.get_string(util::Var::kOfiPassthru) == "on") {
    FERRY_LOG(kWarn,
              "ofi: FERRY_OFI_PASSTHRU=on, but %s offers no pass-through endpoint (only "
              "tcp;ofi_rxm does, where FI_OFI_RXM_ENABLE_PASSTHRU was set, not to 0, before "
              "libfabric started in this process)",
              provider_.c_str());
  }
  inject_size_ = std::min(info_->tx_attr->inject_size, kBufferSize);
  inject_scratch_.resize(inject_size_);
}

void OfiTransport::decide_rma(const util::Config& config) {
  const std::string& rma_mode = config.get_string(util::Var::kOfiRma);
  rma_ = rma_mode != "off" && (info_->caps & FI_RMA) != 0;
  if (rma_mode == "off") {
    rma_why_ = "FERRY_OFI_RMA=off";
  } else if (!rma_) {
    rma_why_ = "no FI_RMA in this provider";
  }
  // Native one-sided access goes only where the owner granted it (proto/rma/native.hpp), and
  // the provider checks the key again: not where it does not (the shared-memory providers write
  // through any address they are given).
  const std::string core = info_->fabric_attr->prov_name;
  if (rma_mode != "auto" && rma_mode != "native") {
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
}

void OfiTransport::open_endpoint() {
  // Each step's call, unless FERRY_TEST_OFI_FAIL_AT names it: then it fails as if the provider
  // had no memory for it.
  auto attempt = [this](const char* step, auto&& call) {
    check(step, fail_at_ == step ? -FI_ENOMEM : call());
  };
  attempt("fi_fabric", [&] {
    return fabric_.open(
        [&](fid_fabric** f) { return fi_->fabric(info_->fabric_attr, f, nullptr); });
  });
  attempt("fi_domain", [&] {
    return domain_.open(
        [&](fid_domain** d) { return fi_domain(fabric_, info_.get(), d, nullptr); });
  });
  fi_cq_attr cq_attr{};
  cq_attr.format = FI_CQ_FORMAT_MSG;
  cq_attr.size = 4 * (kReceives + kSends);
  attempt("fi_cq_open", [&] {
    return cq_.open([&](fid_cq** cq) { return fi_cq_open(domain_, &cq_attr, cq, nullptr); });
  });
  fi_av_attr av_attr{};
  av_attr.type = FI_AV_TABLE;
  av_attr.count = static_cast<std::size_t>(size_);
  attempt("fi_av_open", [&] {
    return av_.open([&](fid_av** av) { return fi_av_open(domain_, &av_attr, av, nullptr); });
  });
  const std::size_t count = kReceives + kSends;
  buffers_.reset(static_cast<std::byte*>(std::aligned_alloc(4096, count * kBufferSize)));
  if (!buffers_) throw Error(Code::kNoResources, "ofi bounce buffers");
  ops_ = std::make_unique<Op[]>(count);
  attempt("fi_endpoint", [&] {
    return ep_.open([&](fid_ep** ep) { return fi_endpoint(domain_, info_.get(), ep, nullptr); });
  });
  // The address vector first: libfabric's rxm endpoint (tcp;ofi_rxm) cannot be closed while
  // bound to none (it follows a null pointer), so such an endpoint is left open, once.
  try {
    attempt("fi_ep_bind(av)", [&] { return fi_ep_bind(ep_, &av_->fid, 0); });
  } catch (const Error&) {
    if (std::strstr(info_->fabric_attr->prov_name, "ofi_rxm") != nullptr) ep_.abandon();
    throw;
  }
  attempt("fi_ep_bind(cq)", [&] { return fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV); });
  attempt("fi_enable", [&] { return fi_enable(ep_); });
  if ((info_->domain_attr->mr_mode & FI_MR_LOCAL) != 0) {
    attempt("fi_mr_reg (bounce buffers)", [&] {
      return mr_.open([&](fid_mr** mr) {
        return fi_mr_reg(domain_, buffers_.get(), count * kBufferSize, FI_SEND | FI_RECV, 0, 0, 0,
                         mr, nullptr);
      });
    });
    if ((info_->domain_attr->mr_mode & FI_MR_ENDPOINT) != 0) {
      attempt("fi_mr_bind", [&] { return fi_mr_bind(mr_, &ep_->fid, 0); });
      attempt("fi_mr_enable", [&] { return fi_mr_enable(mr_); });
    }
    desc_ = fi_mr_desc(mr_);
  }
  for (std::uint32_t i = 0; i < kReceives; ++i) post_receive(i);
  for (std::uint32_t i = count; i-- > kReceives;) free_sends_.push_back(i);
}

void OfiTransport::publish_address() {
  std::size_t length = 0;
  fi_getname(&ep_->fid, nullptr, &length);
  std::vector<std::byte> name(length);
  check("fi_getname",
        fail_at_ == "fi_getname" ? -FI_ENOMEM : fi_getname(&ep_->fid, name.data(), &length));
  node_ = node_identity();
  const AddressHeader header{kAddressMagic, static_cast<std::int32_t>(::getpid()), node_,
                             protocol_};
  name.resize(length);
  address_ = encode_address(header, name);
  peers_.resize(static_cast<std::size_t>(size_));
  for (PeerState& state : peers_) state.last_heard = std::chrono::steady_clock::now();
}

// Host registrations (fi_read rendezvous) are kept for reuse while the kernel can say when their
// memory goes away.
void OfiTransport::open_cache(const util::Config& config) {
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
        const int error = directs_.register_memory(base, length, access, -1, &mr);
        *handle = mr;
        return error;
      },
      [](void* handle) {
        if (handle != nullptr) fi_close(&static_cast<fid_mr*>(handle)->fid);
      },
      std::move(monitor), entries == 0 ? "FERRY_OFI_MR_CACHE=0" : monitor_why);
}

void OfiTransport::set_capabilities(const util::Config& config) {
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
}

}  // namespace ferry::transport::ofi
