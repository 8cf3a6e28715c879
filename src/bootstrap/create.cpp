// bootstrap::create: picks the bootstrap from the environment, in the order PMIx, PMI, the store
// (ferryrun's or the TCP store), single process; FERRY_BOOTSTRAP names one instead. Half-configured
// environments are refused with an explanation.
#include <cstdlib>

#include "bootstrap/bootstrap.hpp"
#include "bootstrap/pmi.hpp"
#include "bootstrap/pmix.hpp"
#include "bootstrap/single.hpp"
#include "bootstrap/store_client.hpp"
#include "util/config.hpp"

namespace ferry::bootstrap {
namespace {

bool has_env(const char* name) {
  const char* value = std::getenv(name);
  return value != nullptr && *value != '\0';
}

// "tcp:HOST:PORT", "HOST:PORT" or "[V6]:PORT" into host and port; false if it is none of them.
bool parse_tcp(std::string address, std::string* host, int* port) {
  if (address.rfind("tcp:", 0) == 0) address = address.substr(4);
  auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == address.size()) return false;
  std::string name = address.substr(0, colon);
  if (name.front() == '[' && name.back() == ']') name = name.substr(1, name.size() - 2);
  if (name.empty()) return false;
  char* end = nullptr;
  long value = std::strtol(address.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || value < 1 || value > 65535) return false;
  *host = name;
  *port = static_cast<int>(value);
  return true;
}

std::unique_ptr<Bootstrap> create_store(const util::Config& config) {
  using util::Var;
  const std::string& store = config.get_string(Var::kStore);
  auto size = config.get_int(Var::kSize);
  StoreOptions options;
  options.rank = static_cast<int>(config.get_int(Var::kRank));
  options.size = static_cast<int>(size);
  options.local_rank = static_cast<int>(config.get_int(Var::kLocalRank));
  options.local_size = static_cast<int>(config.get_int(Var::kLocalSize));
  options.job_id = config.get_string(Var::kJobId);
  options.timeout_s = config.get_seconds(Var::kBootstrapTimeout);
  options.linger_s = config.get_seconds(Var::kFinalizeTimeout);
  const std::string prefix = "unix:";
  const bool unix_socket = store.rfind(prefix, 0) == 0;
  if (unix_socket) {
    options.path = store.substr(prefix.size());
  } else if (!parse_tcp(store, &options.host, &options.port)) {
    throw Error(Code::kBootstrapError,
                "FERRY_STORE='" + store +
                    "' is not an address ferry can use (expected unix:PATH, as ferryrun sets it, "
                    "or HOST:PORT of the TCP store that rank 0 serves)");
  }
  const std::string name = unix_socket ? "ferryrun store " + store : "TCP store " + store;
  if (options.rank < 0 || options.size < 1) {
    throw Error(Code::kBootstrapError,
                name + ": FERRY_STORE is set but FERRY_RANK (" + std::to_string(options.rank) +
                    ") or FERRY_SIZE (" + std::to_string(options.size) + ") is not; " +
                    (unix_socket ? "ferryrun sets all of them"
                                 : "a launcher using the TCP store must set all three"));
  }
  if (unix_socket) {
    // Unset local variables: ferryrun starts one node, so every rank is local.
    if (options.local_size == 0 && options.local_rank < 0) {
      options.local_size = options.size;
      options.local_rank = options.rank;
    }
    if (options.job_id.empty()) {
      throw Error(Code::kBootstrapError, name +
                                             ": FERRY_JOB_ID is not set; ferryrun sets it with "
                                             "FERRY_STORE, and shared-memory names need it");
    }
  }
  return std::make_unique<StoreBootstrap>(std::move(options));
}

}  // namespace

std::unique_ptr<Bootstrap> create(const util::Config& config) {
  using util::Var;
  std::string kind = config.get_string(Var::kBootstrap);
  const std::string& store = config.get_string(Var::kStore);
  if (kind == "auto") {
    if (has_env("PMIX_RANK") && has_env("PMIX_NAMESPACE")) {
      kind = "pmix";
    } else if (has_env("PMI_FD") || has_env("PMI_PORT")) {
      kind = "pmi";
    } else if (!store.empty()) {
      kind = "store";
    } else {
      kind = "single";
    }
  }
  if (kind == "pmix") return create_pmix(config);
  if (kind == "pmi") return create_pmi(config);
  if (kind == "store") {
    if (store.empty()) {
      throw Error(Code::kBootstrapError,
                  "FERRY_BOOTSTRAP=store but FERRY_STORE is not set (unix:PATH from ferryrun, or "
                  "HOST:PORT of the TCP store that rank 0 serves)");
    }
    return create_store(config);
  }
  auto size = config.get_int(Var::kSize);
  if (size > 1) {
    throw Error(Code::kBootstrapError,
                "FERRY_SIZE=" + std::to_string(size) +
                    " but no launcher was found (no PMIx, no PMI, no FERRY_STORE), so there is "
                    "no way to reach the other ranks: start the job with `ferryrun -n " +
                    std::to_string(size) +
                    " program ...`, mpirun or srun, set FERRY_STORE=HOST:PORT for the TCP store, "
                    "or unset FERRY_SIZE to run one process");
  }
  return std::make_unique<SingleBootstrap>(config.get_string(Var::kJobId));
}

}  // namespace ferry::bootstrap
