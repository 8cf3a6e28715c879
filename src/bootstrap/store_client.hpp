// The bootstrap of a rank started by ferryrun: a client of ferryrun's store (store_server.hpp)
// over the UNIX socket named by FERRY_STORE.
#pragma once

#include <mutex>
#include <string>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/store_protocol.hpp"
#include "util/fd.hpp"

namespace ferry::bootstrap {

struct StoreOptions {
  std::string path;  // the socket, without "unix:"
  int rank = -1;
  int size = 0;
  int local_rank = -1;
  int local_size = 0;
  std::string job_id;
  double timeout_s = 300;  // FERRY_BOOTSTRAP_TIMEOUT
};

class StoreBootstrap final : public Bootstrap {
 public:
  // Connects and says HELLO. Throws ferry::Error(kBootstrapError) naming the store and what failed
  // (bad options, no socket, the store refused the rank, no answer within the timeout).
  explicit StoreBootstrap(StoreOptions options);

  [[nodiscard]] int rank() const override { return options_.rank; }
  [[nodiscard]] int size() const override { return options_.size; }
  [[nodiscard]] int local_rank() const override { return options_.local_rank; }
  [[nodiscard]] int local_size() const override { return options_.local_size; }
  // ferryrun numbers the ranks of a node contiguously, so this node's ranks are the block that
  // holds this rank (all of them, as ferryrun starts one node).
  [[nodiscard]] std::vector<int> local_ranks() const override;
  [[nodiscard]] std::string name() const override { return name_; }
  [[nodiscard]] std::string job_id() const override { return options_.job_id; }

  // Thread-safe (calls are serialised); `idle` must not call back into this bootstrap.
  Status put(const std::string& key, std::span<const std::byte> value) override;
  Status get(const std::string& key, Blob* value, const IdleFn& idle = {}) override;
  Status allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                   const IdleFn& idle = {}) override;
  Status barrier(const IdleFn& idle = {}) override;
  void abort(int code, const std::string& reason) override;

 private:
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

  StoreOptions options_;
  std::string name_;
  std::mutex mutex_;
  util::Fd socket_;
  store::FrameReader reader_;
  Status broken_;  // set once the connection cannot be used any more
};

}  // namespace ferry::bootstrap
