// The engine's links to its peers: the transports this job uses (FERRY_TRANSPORTS: self, shm,
// ofi), the address exchange that connects every peer by the first transport that reaches it,
// and the queues of active messages waiting for room in a link (nothing bypasses a queue).
#pragma once

#include <sched.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "proto/address_blob.hpp"
#include "proto/link.hpp"
#include "transport/transport.hpp"
#include "util/config.hpp"

namespace ferry::transport::self {
class SelfTransport;
}
namespace ferry::transport::shm {
class ShmTransport;
}

namespace ferry::proto {

class Engine;

class Links {
 public:
  Links(Engine& engine, const util::Config& config) : engine_(engine), config_(config) {}
  ~Links();
  Links(const Links&) = delete;
  Links& operator=(const Links&) = delete;

  // Makes the transports this rank can use, and a link for each rank of the job; notes() says why
  // each transport is or is not here, after `first_notes` (the bootstrap's, the waiting
  // policy's), with `cuda_note` after self's.
  void open(bootstrap::Bootstrap& bootstrap, std::vector<std::string> first_notes,
            std::string cuda_note);
  // Publishes every transport's address and the job-wide settings, fails where the ranks'
  // settings differ, and connects each peer by the first transport that reaches it (`idle` runs
  // while the exchange waits). Throws ferry::Error naming what failed.
  void connect(bootstrap::Bootstrap& bootstrap, std::size_t rndv_threshold,
               const std::function<void()>& idle);
  // After every rank connected (a barrier): the transports remove their names in /dev/shm.
  void all_connected(bootstrap::Bootstrap& bootstrap, const std::function<void()>& idle);
  // Endpoints, then transports (finalize).
  void close();

  [[nodiscard]] Link& link(int rank) { return peers_[static_cast<std::size_t>(rank)]; }
  [[nodiscard]] const Link& link(int rank) const { return peers_[static_cast<std::size_t>(rank)]; }
  [[nodiscard]] std::vector<Link>& all() { return peers_; }
  // The transports progress polls every time, and the two it treats apart.
  [[nodiscard]] const std::vector<transport::Transport*>& polled() const { return polled_; }
  [[nodiscard]] transport::self::SelfTransport* self() const { return self_; }
  [[nodiscard]] transport::shm::ShmTransport* shm() const { return shm_; }
  // The transport that registers regions for native one-sided access (ofi, where the provider
  // has FI_RMA writes and checks keys), or null.
  [[nodiscard]] transport::Transport* native_rma() const { return native_rma_; }
  // Whether every transport has confirmed delivery of what was sent (Transport::delivered).
  [[nodiscard]] bool delivered() const;
  // Asks the transports which peers died.
  void check(std::vector<std::pair<int, std::string>>* failed);
  // Why each transport is or is not here (ferry-info); renote replaces the line that starts with
  // `prefix`.
  [[nodiscard]] const std::vector<std::string>& notes() const { return notes_; }
  void renote(const std::string& prefix, std::string note);
  // After connect: the ranks of this node (this one included) whose CPUs (affinity) overlap
  // this process's, as they published them; every rank of the node where that is unknown.
  [[nodiscard]] int cpu_sharers() const { return cpu_sharers_; }

  // ---- Sending through the queues ----
  // Sends an active message now or queues it behind what is already queued for that peer.
  void send_or_queue(int peer, Pending&& pending);
  void send_control(int peer, std::uint8_t am, std::span<const std::byte> header);
  // A fragment stream of `length` bytes of request `index`'s send buffer: kAmFrag into the
  // peer's request `id`, or kAmPut (the caller completes it with the region fields).
  static Pending stream(std::uint8_t am, std::uint32_t index, std::uint64_t id, std::size_t length);
  // Sends what waits in the queues, as far as the transports take it.
  int drain();
  [[nodiscard]] bool queued() const { return !pending_peers_.empty(); }
  // A dead peer's queue: each request waiting in it is handed to `fail`, then it is emptied.
  void drop_queue(int rank, const std::function<void(std::uint32_t)>& fail);

 private:
  void open_ofi(std::size_t local_count);
  // The first transport that reaches rank r, as `published` offers them (or why none does).
  void connect_peer(int r, const Published& published, const std::vector<int>& local,
                    std::size_t rndv_threshold);
  bool try_send(Link& peer, Pending& pending);  // true when fully sent
  void count_cpu_sharers(const std::vector<Published>& everyone, const std::vector<int>& local,
                         const cpu_set_t* mine);

  Engine& engine_;
  const util::Config& config_;
  int rank_ = 0;
  int size_ = 1;
  bool crash_mid_pipeline_ = false;  // FERRY_TEST_CRASH_AT=mid-pipeline names this rank
  std::vector<std::unique_ptr<transport::Transport>> transports_;
  transport::self::SelfTransport* self_ = nullptr;  // polled only when it has work
  std::vector<transport::Transport*> polled_;       // the other transports, polled every time
  transport::shm::ShmTransport* shm_ = nullptr;
  transport::Transport* native_rma_ = nullptr;
  std::vector<std::string> notes_;
  std::vector<std::unique_ptr<transport::Endpoint>> endpoints_;
  std::vector<Link> peers_;
  std::vector<int> pending_peers_;  // peers whose queue is not empty
  int cpu_sharers_ = 1;
};

}  // namespace ferry::proto
