// The libfabric transport: one reliable-datagram endpoint (FI_EP_RDM) per process, found with
// fi_getinfo among the providers FERRY_OFI_PROVIDER allows. Active messages travel as FI_MSG
// sends from registered bounce buffers (fi_inject for what fits the provider's inject size) into
// receives posted in advance; every message carries a small header naming its source rank, its
// place in the stream and an acknowledgement, so that messages are delivered in order and one
// the provider loses while it connects is sent again (order.hpp). Peers
// are addresses in an address vector (fi_getname published through the bootstrap). A send that
// completes in error marks its peer failed, and a keepalive (FERRY_KEEPALIVE) sent to every peer
// finds dead ones that nothing else is sent to. No zero-copy get: rendezvous data is
// pipelined through active messages, except where the engine asks for direct transfers: one
// tagged send from the sender's buffer into a tagged receive posted on the receiver's buffer
// (the provider's own rendezvous moves the data). Over tcp;ofi_rxm the endpoint passes every call
// through to the tcp provider's own connected endpoints where rxm offers that
// (FERRY_OFI_PASSTHRU). Peers on the same node (same boot id and pid
// namespace, as published) are also watched by pidfd.
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "mem/registration_cache.hpp"
#include "transport/ofi/directs.hpp"
#include "transport/ofi/handles.hpp"
#include "transport/ofi/order.hpp"
#include "transport/ofi/wire.hpp"
#include "transport/transport.hpp"
#include "util/fd.hpp"

namespace ferry::util {
class Config;
}

namespace ferry::transport::ofi {

struct Fabric;

class OfiTransport final : public Transport {
 public:
  // Throws ferry::Error saying what was tried when no provider fits or a call fails.
  OfiTransport(const util::Config& config, int rank, int size, AmHandler* handler);
  ~OfiTransport() override;
  OfiTransport(const OfiTransport&) = delete;
  OfiTransport& operator=(const OfiTransport&) = delete;

  [[nodiscard]] const Capabilities& capabilities() const override { return capabilities_; }
  [[nodiscard]] std::vector<std::byte> address() const override { return address_; }
  [[nodiscard]] Reachability reach(const PeerInfo& peer) const override;
  std::unique_ptr<Endpoint> connect(const PeerInfo& peer) override;
  void check_peers(std::vector<std::pair<int, std::string>>* failed) override;
  int progress() override;
  // An eager message goes by fi_inject, which reports no completion, and the provider may still
  // hold it (tcp;ofi_rxm queues it while it connects): closing the endpoint then loses it. So
  // every peer sent to gets a last keepalive asking for delivery completion, and this says
  // whether each has completed (or its peer failed).
  [[nodiscard]] bool delivered() override;

  // "tcp;ofi_rxm on lo (127.0.0.1/32)"
  [[nodiscard]] const std::string& provider() const { return provider_; }
  // Whether the provider can register GPU memory, and what ferry does about it.
  [[nodiscard]] const std::string& hmem() const { return hmem_; }
  // "fi_read rendezvous; registration cache: …" or why there is none.
  [[nodiscard]] std::string rma() const;
  [[nodiscard]] bool has_read() const { return rma_; }
  // tcp;ofi_rxm passing every call to the tcp provider's connected endpoints.
  [[nodiscard]] bool passthru() const { return protocol_ == FI_PROTO_RXM_TCP; }
  // Every transfer goes by the tcp provider's own code over sockets: passed through, or the net
  // provider (libfabric's newer tcp, with reliable datagram endpoints of its own; FI_PROTO_XNET).
  [[nodiscard]] bool over_tcp_sockets() const { return passthru() || protocol_ == FI_PROTO_XNET; }
  [[nodiscard]] bool has_native_rma() const { return native_; }
  Status register_region(void* buffer, std::size_t length, std::uint64_t key, bool writable,
                         Endpoint::RemoteRegion* region, void** handle) override {
    return directs_.register_region(buffer, length, key, writable, region, handle);
  }
  void release_region(void* handle) override;
  [[nodiscard]] const mem::RegistrationCache::Stats& registrations() const {
    return cache_->stats();
  }
  // Direct transfers, one-sided reads and writes, and the GPU verdicts (for every peer at once:
  // the NIC is the same).
  [[nodiscard]] Directs& directs() { return directs_; }

  // Used by endpoints.
  // `confirm`: from a bounce buffer (never fi_inject) with FI_DELIVERY_COMPLETE where the
  // provider takes it, as delivered()'s last keepalive.
  Status send(int peer, fi_addr_t address, std::uint8_t id, std::span<const std::byte> header,
              std::span<const std::byte> payload, bool confirm = false);

 private:
  friend class Directs;  // a part of the transport: it posts on the endpoint, reports to handler_
  // Opening, step by step (open.cpp); each throws ferry::Error naming its step.
  void choose_provider(const util::Config& config, bool want_passthru);
  static const fi_info* pick_offer(const fi_info* list, const std::string& allowed,
                                   bool want_passthru, std::string* seen);
  void probe_hmem(const util::Config& config);
  void describe_provider(const util::Config& config);
  void decide_rma(const util::Config& config);
  void open_endpoint();
  void publish_address();
  void open_cache(const util::Config& config);
  void set_capabilities(const util::Config& config);
  // Throws, naming `step`, unless `ret` is 0.
  void check(const char* step, int ret);
  struct PeerState {
    fi_addr_t address = FI_ADDR_UNSPEC;
    bool connected = false;
    bool failed = false;
    bool reported = false;
    std::string why;
    PeerOrder order;  // sequence numbers both ways, held and kept messages
    std::chrono::steady_clock::time_point last_heard{};
    std::chrono::steady_clock::time_point refused_since{};  // sends answered -FI_EAGAIN since
    int refused_rounds = 0;  // keepalive rounds refused in a row (a peer that makes no progress)
    int outstanding = 0;     // sends awaiting completion
    std::uint32_t confirmed = 0;  // our messages before this seq are delivered (delivered())
    bool drain_sent = false;      // a keepalive asking for delivery is in flight
    int pid = 0;                  // on this node: its process, watched by pidfd
    util::Fd pidfd;
  };
  void post_receive(std::uint32_t buffer);
  void handle_receive(std::uint32_t buffer, std::size_t length);
  // progress()'s parts: posts what the provider had no room for before (receives, direct
  // transfers: Directs::retry); and a completion that ended in error (a direct transfer fails,
  // a failed send fails its peer, a receive is posted again).
  void retry_deferred();
  void on_completion_error(const fi_cq_err_entry& error);
  void deliver(const Wire& wire, const std::byte* body);
  // Records the failure (reported by check_peers); never calls back into the engine.
  void peer_failed(int peer, const std::string& why);
  void keepalive();
  // What PeerOrder asks for: acknowledgements owed, kept messages asked for again, a gap that is
  // a loss (the peer fails); only while some peer has one (order_work_).
  void order_work();
  // The kept messages from `from` up to `until`, again (each as it was first sent: same seq).
  void resend(int peer, std::uint32_t from, std::uint32_t until);
  // A header-only message outside the stream (kWireResend, kWireBroken), best effort.
  void post_control(int peer, std::uint8_t id, std::uint8_t flag, std::uint32_t ack,
                    std::uint32_t until);
  // Posts a whole message (header included) from a bounce buffer, outside the stream's count.
  ssize_t post_copy(int peer, std::span<const std::byte> message);
  [[nodiscard]] std::byte* buffer(std::uint32_t index) const;
  [[nodiscard]] std::string error_text(int code) const;

  const Fabric* fi_;
  int rank_;
  int size_;
  AmHandler* handler_;
  std::string fail_at_;  // FERRY_TEST_OFI_FAIL_AT: the step of opening that fails
  // What opening made, in the order it is made (and closed in reverse when the transport goes or
  // a later step fails); the registration cache, declared after, goes before all of them.
  Info info_;
  Fid<fid_fabric> fabric_;
  Fid<fid_domain> domain_;
  Fid<fid_cq> cq_;
  Fid<fid_av> av_;
  std::unique_ptr<std::byte, Free>
      buffers_;     // receive buffers, then send buffers, kBufferSize each
  Fid<fid_mr> mr_;  // the buffers' registration, where needed
  Fid<fid_ep> ep_;
  Capabilities capabilities_;
  std::string provider_;
  std::string hmem_ = "FI_HMEM not probed";
  bool hmem_offered_ = false;   // FI_HMEM requested and granted (or assumed by the test knob)
  bool hmem_fail_ = false;      // FERRY_TEST_OFI_HMEM=fail
  bool rma_ = false;            // fi_read rendezvous (FI_RMA granted, FERRY_OFI_RMA not off)
  std::string rma_why_;         // why not, when not
  std::uint32_t protocol_ = 0;  // the endpoint's wire protocol, published with its address
  bool native_ = false;         // native puts and gets (FERRY_OFI_RMA=auto or native)
  std::string native_why_;      // why not, when not
  std::unique_ptr<mem::RegistrationCache> cache_;  // host registrations
  std::vector<std::byte> address_;
  void* desc_ = nullptr;  // the bounce buffers' registration, where the provider wants one
  std::size_t inject_size_ = 0;
  std::vector<std::byte> inject_scratch_;  // a message built for fi_inject
  std::unique_ptr<Op[]> ops_;
  std::vector<std::uint32_t> free_sends_;
  std::vector<std::uint32_t> reposts_;  // receives the provider had no room for
  Directs directs_;
  std::vector<PeerState> peers_;
  std::size_t malformed_ = 0;
  double keepalive_s_ = 0;
  double silence_s_ = 0;      // FERRY_KEEPALIVE_TIMEOUT (0: silence is not failure)
  bool test_remote_ = false;  // FERRY_TEST_OFI_REMOTE
  std::array<char, 64> node_{};
  std::chrono::steady_clock::time_point next_keepalive_{};
  std::uint32_t polls_ = 0;
  bool order_work_ = false;        // a peer owes an acknowledgement or has a gap (order_work)
  std::int64_t test_drop_ = -1;    // FERRY_TEST_OFI_DROP: the message of this seq is never posted
  bool test_drop_copies_ = false;  // FERRY_TEST_OFI_DROP_COPIES: nor its copies
  bool delivery_complete_ = true;  // until the provider refuses FI_DELIVERY_COMPLETE on a send
};

}  // namespace ferry::transport::ofi
