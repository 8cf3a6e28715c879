// The bootstrap of a process that runs alone (not started by a launcher): rank 0 of 1, with a
// local key-value map. Also the job-id generator that ferryrun shares.
#pragma once

#include <map>
#include <mutex>
#include <string>

#include "bootstrap/bootstrap.hpp"

namespace ferry::bootstrap {

// A job id unique on this host: "<pid>x<16 random hex digits>", short enough for shm names.
std::string new_job_id();

class SingleBootstrap final : public Bootstrap {
 public:
  // `job_id` empty: a new one (new_job_id()).
  explicit SingleBootstrap(std::string job_id = {});

  [[nodiscard]] int rank() const override { return 0; }
  [[nodiscard]] int size() const override { return 1; }
  [[nodiscard]] std::vector<int> local_ranks() const override { return {0}; }
  [[nodiscard]] std::string name() const override { return "single process"; }
  [[nodiscard]] std::string job_id() const override { return job_id_; }

  Status put(const std::string& key, std::span<const std::byte> value) override;
  // A missing key is an error at once: no other process could ever put it.
  Status get(const std::string& key, Blob* value, const IdleFn& idle = {}) override;
  Status allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                   const IdleFn& idle = {}) override;
  Status barrier(const IdleFn& idle = {}) override;
  // Prints the reason and ends the process with _exit(code): there is no launcher to ask.
  void abort(int code, const std::string& reason) override;

 private:
  std::string job_id_;
  std::mutex mutex_;
  std::map<std::string, Blob> values_;
};

}  // namespace ferry::bootstrap
