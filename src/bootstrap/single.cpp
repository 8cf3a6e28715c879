// SingleBootstrap: rank 0 of a one-process job; every exchange is local.
#include "bootstrap/single.hpp"

#include <sys/random.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>

namespace ferry::bootstrap {

std::string new_job_id() {
  std::uint64_t random = 0;
  if (::getrandom(&random, sizeof(random), GRND_NONBLOCK) != static_cast<ssize_t>(sizeof(random))) {
    // No entropy yet (early boot): the clock still separates jobs of the same pid.
    random = static_cast<std::uint64_t>(
        std::chrono::high_resolution_clock::now().time_since_epoch().count());
  }
  char text[48];
  std::snprintf(text, sizeof(text), "%dx%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(random));
  return text;
}

SingleBootstrap::SingleBootstrap(std::string job_id)
    : job_id_(job_id.empty() ? new_job_id() : std::move(job_id)) {}

Status SingleBootstrap::put(const std::string& key, std::span<const std::byte> value) {
  std::lock_guard lock(mutex_);
  values_[key].assign(value.begin(), value.end());
  return Status::ok();
}

Status SingleBootstrap::get(const std::string& key, Blob* value, const IdleFn& /*idle*/) {
  std::lock_guard lock(mutex_);
  auto it = values_.find(key);
  if (it == values_.end()) {
    return Status(Code::kBootstrapError, "single process: get of key '" + key +
                                             "', which this process never put (there is no "
                                             "other rank that could)");
  }
  *value = it->second;
  return Status::ok();
}

Status SingleBootstrap::allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                                  const IdleFn& /*idle*/) {
  all->assign(1, Blob(mine.begin(), mine.end()));
  return Status::ok();
}

Status SingleBootstrap::barrier(const IdleFn& /*idle*/) { return Status::ok(); }

void SingleBootstrap::abort(int code, const std::string& reason) {
  std::fprintf(stderr, "ferry: aborting (code %d): %s\n", code, reason.c_str());
  std::fflush(stderr);
  ::_exit(code);
}

}  // namespace ferry::bootstrap
