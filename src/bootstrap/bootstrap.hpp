// Bootstrap: who am I (rank, size, node-local peers), and byte-blob exchange with the other ranks
// of the job. Implementations: ferryrun's store (store_client), single process (single).
// PMIx, PMI-1 and a TCP store plug in behind the same interface later.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::util {
class Config;
}

namespace ferry::bootstrap {

using Blob = std::vector<std::byte>;
// Called repeatedly while a bootstrap call waits, so communication keeps progressing.
using IdleFn = std::function<void()>;

class Bootstrap {
 public:
  virtual ~Bootstrap() = default;

  [[nodiscard]] virtual int rank() const = 0;
  [[nodiscard]] virtual int size() const = 0;
  // Global ranks of the processes on this node, in local-rank order (this rank among them).
  [[nodiscard]] virtual std::vector<int> local_ranks() const = 0;
  // This rank's index in local_ranks(), and their number.
  [[nodiscard]] int local_rank() const {
    const std::vector<int> local = local_ranks();
    return static_cast<int>(std::find(local.begin(), local.end(), rank()) - local.begin());
  }
  [[nodiscard]] int local_size() const { return static_cast<int>(local_ranks().size()); }
  // A short name for messages: "ferryrun store unix:/tmp/...", "single process".
  [[nodiscard]] virtual std::string name() const = 0;
  // Identifies the job; part of shared-memory names so jobs never collide.
  [[nodiscard]] virtual std::string job_id() const = 0;

  // Publishes a value under `key` (visible to others after the next fence).
  virtual Status put(const std::string& key, std::span<const std::byte> value) = 0;
  // Waits (bounded by FERRY_BOOTSTRAP_TIMEOUT) until `key` exists and returns it.
  virtual Status get(const std::string& key, Blob* value, const IdleFn& idle = {}) = 0;
  // Every rank contributes one blob; each receives all of them, indexed by rank.
  virtual Status allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                           const IdleFn& idle = {}) = 0;
  // All ranks arrive before any returns.
  virtual Status barrier(const IdleFn& idle = {}) = 0;
  // Asks the launcher to end the whole job with `code`; returns when the request was sent.
  virtual void abort(int code, const std::string& reason) = 0;
};

// Picks the implementation from the environment (FERRY_STORE set: ferryrun's store; otherwise a
// single process). Throws ferry::Error naming the bootstrap and what failed.
std::unique_ptr<Bootstrap> create(const util::Config& config);

}  // namespace ferry::bootstrap
