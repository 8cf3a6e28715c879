// bootstrap::create: picks the bootstrap from the environment (FERRY_STORE: ferryrun's store;
// nothing: a single process) and refuses half-configured environments with an explanation.
#include "bootstrap/bootstrap.hpp"
#include "bootstrap/single.hpp"
#include "bootstrap/store_client.hpp"
#include "util/config.hpp"

namespace ferry::bootstrap {

std::unique_ptr<Bootstrap> create(const util::Config& config) {
  using util::Var;
  const std::string& store = config.get_string(Var::kStore);
  auto size = config.get_int(Var::kSize);
  if (store.empty()) {
    if (size > 1) {
      throw Error(Code::kBootstrapError,
                  "FERRY_SIZE=" + std::to_string(size) +
                      " but FERRY_STORE is not set, so there is no way to reach the other ranks: "
                      "start the job with `ferryrun -n " +
                      std::to_string(size) +
                      " program ...` (which sets both), or unset FERRY_SIZE to run one process");
    }
    return std::make_unique<SingleBootstrap>(config.get_string(Var::kJobId));
  }
  const std::string prefix = "unix:";
  if (store.rfind(prefix, 0) != 0) {
    throw Error(Code::kBootstrapError, "FERRY_STORE='" + store +
                                           "' is not an address ferry can use (expected "
                                           "unix:PATH, as ferryrun sets it)");
  }
  StoreOptions options;
  options.path = store.substr(prefix.size());
  options.rank = static_cast<int>(config.get_int(Var::kRank));
  options.size = static_cast<int>(size);
  options.local_rank = static_cast<int>(config.get_int(Var::kLocalRank));
  options.local_size = static_cast<int>(config.get_int(Var::kLocalSize));
  options.job_id = config.get_string(Var::kJobId);
  options.timeout_s = config.get_seconds(Var::kBootstrapTimeout);
  if (options.rank < 0 || options.size < 1) {
    throw Error(Code::kBootstrapError,
                "ferryrun store " + store + ": FERRY_STORE is set but FERRY_RANK (" +
                    std::to_string(options.rank) + ") or FERRY_SIZE (" +
                    std::to_string(options.size) + ") is not; ferryrun sets all of them");
  }
  // Unset local variables: ferryrun starts one node, so every rank is local.
  if (options.local_size == 0 && options.local_rank < 0) {
    options.local_size = options.size;
    options.local_rank = options.rank;
  }
  if (options.job_id.empty()) {
    throw Error(Code::kBootstrapError, "ferryrun store " + store +
                                           ": FERRY_JOB_ID is not set; ferryrun sets it with "
                                           "FERRY_STORE, and shared-memory names need it");
  }
  return std::make_unique<StoreBootstrap>(std::move(options));
}

}  // namespace ferry::bootstrap
