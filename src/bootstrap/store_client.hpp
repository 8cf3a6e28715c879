// A client of the ranks' key-value store (store_server.hpp): ferryrun's, over the UNIX socket
// named by FERRY_STORE=unix:PATH; or the TCP store, FERRY_STORE=HOST:PORT, served by rank 0 from a
// thread of its own, for custom launchers and containers. The TCP store's ranks also keep a WATCH
// connection: when any rank aborts, every rank exits with its code, as under a launcher.
#pragma once

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store_protocol.hpp"
#include "util/fd.hpp"

namespace ferry::bootstrap {

struct StoreOptions {
  std::string path;  // ferryrun's socket, without "unix:"; empty for the TCP store
  std::string host;  // the TCP store: rank 0's host and port
  int port = 0;
  int rank = -1;
  int size = 0;
  // Set by ferryrun (a contiguous block); local_size 0: the ranks whose node identity
  // (util/node.hpp) is this rank's, found by one allgather.
  int local_rank = -1;
  int local_size = 0;
  std::string job_id;      // empty (TCP store only): rank 0 picks one
  double timeout_s = 300;  // FERRY_BOOTSTRAP_TIMEOUT
  double linger_s = 30;    // TCP store: how long rank 0 serves the others after it finalized
};

class StoreHost;

class StoreBootstrap final : public Bootstrap {
 public:
  // Connects and says HELLO. Throws ferry::Error(kBootstrapError) naming the store and what failed
  // (bad options, no socket, the store refused the rank, no answer within the timeout).
  explicit StoreBootstrap(StoreOptions options);
  // Says BYE (the rank's Context ended in order: a launcher tells a rank that exited without
  // ending it, leaving its peers waiting, from one that did). Rank 0 of the TCP store then serves
  // the others until they have all left (at most linger_s).
  ~StoreBootstrap() override;
  StoreBootstrap(const StoreBootstrap&) = delete;
  StoreBootstrap& operator=(const StoreBootstrap&) = delete;

  [[nodiscard]] int rank() const override { return options_.rank; }
  [[nodiscard]] int size() const override { return options_.size; }
  [[nodiscard]] std::vector<int> local_ranks() const override { return local_ranks_; }
  [[nodiscard]] std::string name() const override { return name_; }
  [[nodiscard]] std::string job_id() const override { return options_.job_id; }
  [[nodiscard]] bool is_tcp() const { return options_.path.empty(); }

  // Thread-safe (calls are serialised); `idle` must not call back into this bootstrap.
  Status put(const std::string& key, std::span<const std::byte> value) override;
  Status get(const std::string& key, Blob* value, const IdleFn& idle = {}) override;
  Status allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                   const IdleFn& idle = {}) override;
  Status barrier(const IdleFn& idle = {}) override;
  void abort(int code, const std::string& reason) override;

 private:
  // After a barrier or allgather ran out of time: the store's word on whom it still waits for
  // (empty if it does not answer within a second).
  std::string ask_missing();
  // Sends one request; `what` names the operation for messages ("get of key 'x'").
  Status send(const store::Bytes& frame, const std::string& what, const IdleFn& idle);
  // Waits for the reply `want` (for kValue: the value of `key`), skipping replies left over from
  // requests that timed out earlier.
  Status await(store::Op want, const std::string& key, const std::string& what, const IdleFn& idle,
               store::Frame* reply);
  // Turns a failure of the connection into the message callers see; the connection is unusable
  // afterwards and every later call returns the same status.
  Status broken(const Status& status, const std::string& what);
  [[nodiscard]] store::Clock::time_point deadline() const;
  // A connected stream socket to the store, retrying until `until` where the store may not be
  // listening yet (the TCP store's rank 0 starting); throws naming what failed.
  util::Fd connect_store(store::Clock::time_point until);
  // Validates FERRY_LOCAL_* (ferryrun's contiguous block), or finds the ranks sharing this node
  // and (TCP store) the job id with one allgather.
  void find_locality();
  // The WATCH connection's thread: exits the process when a rank aborted the job.
  void start_watch();
  void watch();
  // Ends the watcher, closes the connections and (rank 0 of the TCP store) the server.
  void shutdown();

  StoreOptions options_;
  std::string name_;
  std::unique_ptr<StoreHost> host_;  // rank 0 of the TCP store; outlives socket_
  std::vector<int> local_ranks_;
  util::Fd watch_;
  util::Fd wake_;  // eventfd that ends the watcher
  std::thread watcher_;
  std::mutex mutex_;
  util::Fd socket_;
  store::FrameReader reader_;
  Status broken_;  // set once the connection cannot be used any more
};

}  // namespace ferry::bootstrap
