// PMIx client: rank, size and node-local peers from the job information; put/commit and fences
// (non-blocking, polled with the caller's idle function under FERRY_BOOTSTRAP_TIMEOUT) for
// allgather and barrier; PMIx_Abort for abort. Entry points come from dlopen("libpmix.so.2") and
// are typed by the prototypes of pmix.h, so a changed signature fails to compile.
#include "bootstrap/pmix.hpp"

#include "util/config.hpp"

#if FERRY_HAVE_PMIX
#include <dlfcn.h>
#include <pmix.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "util/log.hpp"
#endif

namespace ferry::bootstrap {

#if !FERRY_HAVE_PMIX

std::unique_ptr<Bootstrap> create_pmix(const util::Config&) {
  throw Error(Code::kBootstrapError,
              "PMIx: this build of ferry has no PMIx support (pmix.h was not found at configure "
              "time: apt-get install libpmix-dev and rebuild), so it cannot start under mpirun or "
              "srun --mpi=pmix; use ferryrun, PMI or the TCP store");
}

#else

namespace {

using Clock = std::chrono::steady_clock;

// The entry points ferry uses, typed from pmix.h.
struct PmixApi {
#define FERRY_PMIX_CALLS(X) \
  X(PMIx_Init)              \
  X(PMIx_Finalize)          \
  X(PMIx_Get)               \
  X(PMIx_Put)               \
  X(PMIx_Commit)            \
  X(PMIx_Fence_nb)          \
  X(PMIx_Abort)             \
  X(PMIx_Value_destruct)    \
  X(PMIx_Error_string)
#define FERRY_PMIX_MEMBER(name) decltype(&::name) name = nullptr;
  FERRY_PMIX_CALLS(FERRY_PMIX_MEMBER)
#undef FERRY_PMIX_MEMBER
  void* library = nullptr;
};

// Loaded once per process, never unloaded (libpmix keeps threads of its own).
const PmixApi* load_pmix(std::string* why) {
  static std::once_flag once;
  static PmixApi api;
  static std::string error;
  std::call_once(once, [] {
    for (const char* name : {"libpmix.so.2", "libpmix.so"}) {
      api.library = ::dlopen(name, RTLD_NOW | RTLD_GLOBAL);
      if (api.library != nullptr) break;
    }
    if (api.library == nullptr) {
      const char* text = ::dlerror();
      error = std::string("cannot load libpmix.so.2 (") + (text ? text : "?") +
              "): install libpmix2, or start the job another way";
      return;
    }
#define FERRY_PMIX_LOAD(name)                                                   \
  api.name = reinterpret_cast<decltype(api.name)>(::dlsym(api.library, #name)); \
  if (api.name == nullptr && error.empty())                                     \
    error = "libpmix has no " #name " (too old: PMIx 4 or later needed)";
    FERRY_PMIX_CALLS(FERRY_PMIX_LOAD)
#undef FERRY_PMIX_LOAD
  });
  if (!error.empty()) {
    *why = error;
    return nullptr;
  }
  return &api;
}

void set_key(char* key, const char* text) { std::snprintf(key, PMIX_MAX_KEYLEN + 1, "%s", text); }

pmix_info_t bool_info(const char* key, bool flag) {
  pmix_info_t info;
  std::memset(&info, 0, sizeof(info));
  set_key(info.key, key);
  info.value.type = PMIX_BOOL;
  info.value.data.flag = flag;
  return info;
}

pmix_info_t int_info(const char* key, int value) {
  pmix_info_t info;
  std::memset(&info, 0, sizeof(info));
  set_key(info.key, key);
  info.value.type = PMIX_INT;
  info.value.data.integer = value;
  return info;
}

// The state a fence callback writes; shared, since a fence that timed out may still call back.
struct FenceState {
  std::atomic<bool> done{false};
  pmix_status_t status = PMIX_SUCCESS;
};

void fence_done(pmix_status_t status, void* data) {
  auto* holder = static_cast<std::shared_ptr<FenceState>*>(data);
  (*holder)->status = status;
  (*holder)->done.store(true, std::memory_order_release);
  delete holder;
}

// Shared-memory names hold the job id: letters, digits and '-' only, at most 24 bytes.
std::string job_id_from(const std::string& nspace) {
  std::string id;
  for (char c : nspace) id += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
  if (id.size() <= 24 && !id.empty()) return id;
  std::uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (char c : nspace) hash = (hash ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  char text[24];
  std::snprintf(text, sizeof(text), "x%016llx", static_cast<unsigned long long>(hash));
  return text;
}

class PmixBootstrap final : public Bootstrap {
 public:
  PmixBootstrap(const PmixApi* api, double timeout_s) : api_(api), timeout_s_(timeout_s) {
    pmix_status_t rc = api_->PMIx_Init(&me_, nullptr, 0);
    if (rc != PMIX_SUCCESS) {
      throw Error(Code::kBootstrapError,
                  "PMIx: PMIx_Init failed: " + error_text(rc) +
                      " (PMIX_* variables are set, but the launcher's PMIx server cannot be "
                      "reached: did it exit, or is this process outside its job?)");
    }
    initialized_ = true;
    try {
      read_job();
    } catch (...) {
      api_->PMIx_Finalize(nullptr, 0);
      throw;
    }
    name_ = "PMIx namespace " + std::string(me_.nspace);
    FERRY_LOG(kDebug, "%s: rank %d of %d, %zu on this node", name_.c_str(), rank_, size_,
              local_.size());
  }
  ~PmixBootstrap() override {
    if (initialized_) api_->PMIx_Finalize(nullptr, 0);
  }
  PmixBootstrap(const PmixBootstrap&) = delete;
  PmixBootstrap& operator=(const PmixBootstrap&) = delete;

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] std::vector<int> local_ranks() const override { return local_; }
  [[nodiscard]] std::string name() const override { return name_; }
  [[nodiscard]] std::string job_id() const override { return job_id_; }

  Status put(const std::string& key, std::span<const std::byte> value) override {
    std::lock_guard lock(mutex_);
    return put_bytes("ferry.kv." + key, value);
  }

  Status get(const std::string& key, Blob* value, const IdleFn& idle) override {
    std::lock_guard lock(mutex_);
    // A key put by any rank (visible after the fence that follows the put). Debian's libpmix
    // does not search the namespace for PMIX_RANK_UNDEF (its dstore answers NOT-FOUND), so each
    // rank's local data is looked at (PMIX_OPTIONAL: no request to the server) until one has it.
    const std::string full = "ferry.kv." + key;
    pmix_info_t optional = bool_info(PMIX_OPTIONAL, true);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_));
    auto nap = std::chrono::microseconds(50);
    for (;;) {
      for (int r = 0; r < size_; ++r) {
        pmix_proc_t peer = me_;
        peer.rank = static_cast<pmix_rank_t>(r);
        pmix_value_t* found = nullptr;
        if (api_->PMIx_Get(&peer, full.c_str(), &optional, 1, &found) != PMIX_SUCCESS ||
            found == nullptr) {
          continue;
        }
        Status status = Status::ok();
        if (found->type == PMIX_BYTE_OBJECT) {
          const auto* begin = reinterpret_cast<const std::byte*>(found->data.bo.bytes);
          value->assign(begin, begin + found->data.bo.size);
        } else {
          status = Status(Code::kProtocolError, name_ + ": key '" + key + "' is not bytes");
        }
        api_->PMIx_Value_destruct(found);
        std::free(found);
        return status;
      }
      if (Clock::now() >= deadline) {
        return Status(Code::kTimeout, name_ + ": get of key '" + key + "' timed out after " +
                                          std::to_string(static_cast<int>(timeout_s_)) +
                                          " s (FERRY_BOOTSTRAP_TIMEOUT); no rank put that key");
      }
      if (idle) idle();
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(5000));
    }
  }

  Status allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                   const IdleFn& idle) override {
    std::lock_guard lock(mutex_);
    const std::string key = "ferry.ag." + std::to_string(round_++);
    Status status = put_bytes(key, mine);
    if (status) status = fence(true, "allgather", idle);
    if (!status) return status;
    all->assign(static_cast<std::size_t>(size_), {});
    for (int r = 0; r < size_; ++r) {
      pmix_proc_t peer = me_;
      peer.rank = static_cast<pmix_rank_t>(r);
      status = get_bytes(peer, key, &(*all)[static_cast<std::size_t>(r)], idle);
      if (!status) return status;
    }
    return Status::ok();
  }

  Status barrier(const IdleFn& idle) override {
    std::lock_guard lock(mutex_);
    return fence(false, "barrier", idle);
  }

  void abort(int code, const std::string& reason) override {
    // Asks the launcher to end every process of the namespace (nullptr: the whole job).
    pmix_status_t rc = api_->PMIx_Abort(code, reason.c_str(), nullptr, 0);
    if (rc != PMIX_SUCCESS) {
      FERRY_LOG(kError, "%s: PMIx_Abort failed: %s", name_.c_str(), error_text(rc).c_str());
    }
  }

 private:
  std::string error_text(pmix_status_t rc) const {
    const char* text = api_->PMIx_Error_string(rc);
    return std::string(text != nullptr ? text : "?") + " (" + std::to_string(rc) + ")";
  }

  // A job-level value (PMIX_RANK_WILDCARD) or one of this process, as an unsigned integer.
  bool get_number(bool job, const char* key, std::uint64_t* out) {
    pmix_proc_t proc = me_;
    if (job) proc.rank = PMIX_RANK_WILDCARD;
    pmix_value_t* value = nullptr;
    if (api_->PMIx_Get(&proc, key, nullptr, 0, &value) != PMIX_SUCCESS || value == nullptr) {
      return false;
    }
    bool ok = true;
    switch (value->type) {
      case PMIX_UINT32:
        *out = value->data.uint32;
        break;
      case PMIX_UINT16:
        *out = value->data.uint16;
        break;
      case PMIX_UINT64:
        *out = value->data.uint64;
        break;
      case PMIX_INT:
        *out = static_cast<std::uint64_t>(std::max(value->data.integer, 0));
        break;
      case PMIX_SIZE:
        *out = value->data.size;
        break;
      case PMIX_PROC_RANK:
        *out = value->data.rank;
        break;
      default:
        ok = false;
    }
    api_->PMIx_Value_destruct(value);
    std::free(value);
    return ok;
  }

  void read_job() {
    rank_ = static_cast<int>(me_.rank);
    std::uint64_t size = 0;
    if (!get_number(true, PMIX_JOB_SIZE, &size) || size < 1 || size > (1u << 24) ||
        me_.rank >= size) {
      throw Error(Code::kBootstrapError,
                  "PMIx namespace " + std::string(me_.nspace) +
                      ": the launcher gave no usable PMIX_JOB_SIZE for rank " +
                      std::to_string(me_.rank));
    }
    size_ = static_cast<int>(size);
    job_id_ = job_id_from(me_.nspace);
    // This node's ranks of the job, as the launcher placed them.
    pmix_proc_t job = me_;
    job.rank = PMIX_RANK_WILDCARD;
    pmix_value_t* value = nullptr;
    if (api_->PMIx_Get(&job, PMIX_LOCAL_PEERS, nullptr, 0, &value) == PMIX_SUCCESS &&
        value != nullptr && value->type == PMIX_STRING && value->data.string != nullptr) {
      std::stringstream list(value->data.string);
      for (std::string item; std::getline(list, item, ',');) {
        char* end = nullptr;
        long r = std::strtol(item.c_str(), &end, 10);
        if (*end == '\0' && r >= 0 && r < size_) local_.push_back(static_cast<int>(r));
      }
    }
    if (value != nullptr) {
      api_->PMIx_Value_destruct(value);
      std::free(value);
    }
    std::sort(local_.begin(), local_.end());
    local_.erase(std::unique(local_.begin(), local_.end()), local_.end());
    if (std::find(local_.begin(), local_.end(), rank_) == local_.end()) {
      FERRY_LOG(kInfo, "PMIx: no usable PMIX_LOCAL_PEERS; this rank counts as alone on its node");
      local_ = {rank_};
    }
  }

  Status put_bytes(const std::string& key, std::span<const std::byte> bytes) {
    if (key.size() > PMIX_MAX_KEYLEN) {
      return Status(Code::kInvalidArgument, name_ + ": key '" + key.substr(0, 64) +
                                                "...' is longer than PMIx allows (" +
                                                std::to_string(PMIX_MAX_KEYLEN) + " bytes)");
    }
    pmix_value_t value;
    std::memset(&value, 0, sizeof(value));
    value.type = PMIX_BYTE_OBJECT;
    value.data.bo.bytes = const_cast<char*>(reinterpret_cast<const char*>(bytes.data()));
    value.data.bo.size = bytes.size();
    pmix_status_t rc = api_->PMIx_Put(PMIX_GLOBAL, key.c_str(), &value);
    if (rc == PMIX_SUCCESS) rc = api_->PMIx_Commit();
    if (rc != PMIX_SUCCESS) {
      return Status(Code::kBootstrapError,
                    name_ + ": PMIx_Put of '" + key + "' failed: " + error_text(rc));
    }
    return Status::ok();
  }

  Status get_bytes(const pmix_proc_t& proc, const std::string& key, Blob* out, const IdleFn& idle) {
    (void)idle;  // PMIx_Get blocks; its PMIX_TIMEOUT bounds it
    pmix_info_t timeout = int_info(PMIX_TIMEOUT, std::max(1, static_cast<int>(timeout_s_ + 0.5)));
    pmix_value_t* value = nullptr;
    pmix_status_t rc = api_->PMIx_Get(&proc, key.c_str(), &timeout, 1, &value);
    if (rc != PMIX_SUCCESS || value == nullptr) {
      const std::string who = proc.rank == PMIX_RANK_UNDEF ? std::string("any rank")
                                                           : "rank " + std::to_string(proc.rank);
      return Status(
          rc == PMIX_ERR_TIMEOUT ? Code::kTimeout : Code::kBootstrapError,
          name_ + ": get of key '" + key + "' from " + who + " failed: " + error_text(rc) +
              (rc == PMIX_ERR_TIMEOUT ? " after FERRY_BOOTSTRAP_TIMEOUT; no rank put it" : ""));
    }
    Status status = Status::ok();
    if (value->type == PMIX_BYTE_OBJECT) {
      const auto* begin = reinterpret_cast<const std::byte*>(value->data.bo.bytes);
      out->assign(begin, begin + value->data.bo.size);
    } else {
      status =
          Status(Code::kProtocolError, name_ + ": key '" + key + "' holds a value of PMIx type " +
                                           std::to_string(value->type) + ", not bytes");
    }
    api_->PMIx_Value_destruct(value);
    std::free(value);
    return status;
  }

  Status fence(bool collect, const char* what, const IdleFn& idle) {
    auto state = std::make_shared<FenceState>();
    pmix_info_t info[2] = {bool_info(PMIX_COLLECT_DATA, collect),
                           int_info(PMIX_TIMEOUT, std::max(1, static_cast<int>(timeout_s_ + 0.5)))};
    auto* holder = new std::shared_ptr<FenceState>(state);
    pmix_status_t rc = api_->PMIx_Fence_nb(nullptr, 0, info, 2, fence_done, holder);
    if (rc != PMIX_SUCCESS) {
      delete holder;
      return Status(Code::kBootstrapError,
                    name_ + ": " + what + ": PMIx_Fence_nb failed: " + error_text(rc));
    }
    // The callback comes from libpmix's thread; meanwhile the caller's communication progresses.
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(timeout_s_ + 1));
    // Waits sleep a little (growing to 1 ms): on an oversubscribed node, ranks spinning here
    // would take the CPU from the launcher's server, which completes the fence.
    auto nap = std::chrono::microseconds(20);
    while (!state->done.load(std::memory_order_acquire)) {
      if (Clock::now() >= deadline) {
        return Status(Code::kTimeout, name_ + ": " + what + " timed out after " +
                                          std::to_string(static_cast<int>(timeout_s_)) +
                                          " s (FERRY_BOOTSTRAP_TIMEOUT); rank " +
                                          std::to_string(rank_) +
                                          " was still waiting for the other ranks");
      }
      if (idle) idle();
      std::this_thread::sleep_for(nap);
      nap = std::min(nap * 2, std::chrono::microseconds(1000));
    }
    if (state->status != PMIX_SUCCESS) {
      const bool timed_out = state->status == PMIX_ERR_TIMEOUT;
      return Status(
          timed_out ? Code::kTimeout : Code::kPeerFailed,
          name_ + ": " + what + " failed: " + error_text(state->status) +
              (timed_out ? " (FERRY_BOOTSTRAP_TIMEOUT)" : " (a rank of the job is gone?)"));
    }
    return Status::ok();
  }

  const PmixApi* api_;
  double timeout_s_;
  pmix_proc_t me_{};
  bool initialized_ = false;
  int rank_ = -1;
  int size_ = 0;
  std::vector<int> local_;
  std::string name_ = "PMIx";
  std::string job_id_;
  std::mutex mutex_;
  std::uint64_t round_ = 0;
};

}  // namespace

std::unique_ptr<Bootstrap> create_pmix(const util::Config& config) {
  std::string why;
  const PmixApi* api = load_pmix(&why);
  if (api == nullptr) throw Error(Code::kBootstrapError, "PMIx: " + why);
  return std::make_unique<PmixBootstrap>(api, config.get_seconds(util::Var::kBootstrapTimeout));
}

#endif

}  // namespace ferry::bootstrap
