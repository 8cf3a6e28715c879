// The ofi transport's direct transfers: tagged sends and receives of a caller's buffer (the
// provider's own rendezvous), one-sided reads and writes of a peer's memory (fi_read rendezvous,
// native puts and gets), the registrations they need, and whether each GPU's memory can be
// registered with the NIC. A part of OfiTransport: it posts on the transport's endpoint and
// reports each transfer's end to the transport's handler (AmHandler::on_direct).
#pragma once

#include <rdma/fabric.h>
#include <rdma/fi_domain.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ferry/status.hpp"
#include "mem/registration_cache.hpp"
#include "transport/transport.hpp"
#include "util/config.hpp"

namespace ferry::transport::ofi {

class OfiTransport;
struct Op;  // op.hpp

class Directs {
 public:
  Directs(OfiTransport& transport, const util::Config& config);
  ~Directs();
  Directs(const Directs&) = delete;
  Directs& operator=(const Directs&) = delete;

  // A tagged send or receive of `length` bytes at `data` (GPU `device`'s memory, or host memory
  // for -1) under `key`, reported under `cookie`.
  Status start(bool send, int peer, void* data, std::size_t length, int device, std::uint64_t key,
               std::uint64_t cookie);
  void cancel(std::uint64_t cookie);
  // Whether GPU `device`'s memory can go to the NIC directly (a trial registration, once per
  // GPU), and in words for describe().
  bool device_direct(int device, const void* buffer, std::size_t length);
  [[nodiscard]] std::string device_route() const;
  // Host memory a peer reads (fi_read rendezvous), from the registration cache.
  Status expose(const void* data, std::size_t length, std::uint64_t cookie,
                Endpoint::RemoteRegion* region);
  void unexpose(std::uint64_t cookie, bool revoke);
  Status start_read(int peer, void* data, std::size_t length, Endpoint::RemoteRegion region,
                    std::uint64_t cookie);
  Status start_write(int peer, const void* data, std::size_t length, Endpoint::RemoteRegion region,
                     std::uint64_t cookie);
  // Transport::register_region and release_region (native one-sided access).
  Status register_region(void* data, std::size_t length, std::uint64_t key, bool writable,
                         Endpoint::RemoteRegion* region, void** handle);

  // Registers `length` bytes at `data` (host memory, or GPU `device`'s) for `access` under
  // `key` (0: the next of ours; ignored where the provider chooses); 0 or a negative fi_errno.
  // FERRY_TEST_OFI_HMEM=fail makes GPU memory fail here. (The registration cache registers
  // host memory by it too.)
  int register_memory(void* data, std::size_t length, std::uint64_t access, int device, fid_mr** mr,
                      std::uint64_t key = 0);

  // ---- What the transport's progress and failure handling call ----
  // Posts what the provider had no room for before, and fails the reads
  // FERRY_TEST_OFI_READ_FAIL marked.
  void retry();
  // A transfer's end (its Op was the completion's context), reported to the handler once.
  void finish(Op* op, Status status);
  // A dead peer's transfers end now for the caller (a provider may never complete them).
  void orphan(int peer, const std::string& why);

 private:
  // A transfer's Op for `peer` (refused when the peer failed or the cookie is in use), then
  // handed to the provider by launch (which undoes it on failure).
  Status new_op(int peer, void* data, std::size_t length, std::uint64_t cookie,
                std::unique_ptr<Op>* op);
  Status launch(std::unique_ptr<Op> op);
  // Lets go of an Op's registration of its local buffer (its own, or the cache's).
  void release_local(Op& op);
  // Posts a transfer; false when the provider said -FI_EAGAIN (retried by retry()).
  bool post(Op& op, Status* status);
  Status start_rma(bool write, int peer, void* data, std::size_t length,
                   Endpoint::RemoteRegion region, std::uint64_t cookie);

  OfiTransport& t_;
  bool test_read_fail_;  // FERRY_TEST_OFI_READ_FAIL
  struct GpuVerdict {
    bool direct = false;
    std::string why;
  };
  std::map<int, GpuVerdict> gpus_;  // by device ordinal, from the first device_direct()
  std::uint64_t next_key_ = 1;      // requested keys, unique in the domain (no FI_MR_PROV_KEY)
  std::unordered_map<std::uint64_t, mem::RegistrationCache::Entry*> exposed_;  // by cookie
  std::unordered_map<std::uint64_t, std::unique_ptr<Op>> ops_;  // by cookie, in flight
  std::vector<Op*> retries_;       // transfers the provider had no room for
  std::vector<Op*> failed_reads_;  // FERRY_TEST_OFI_READ_FAIL: reads that fail at retry()
};

}  // namespace ferry::transport::ofi
