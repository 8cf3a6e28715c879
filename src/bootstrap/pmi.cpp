// PMI-1 client over PMI_FD. Each request is one line and gets one reply line; every wait is
// bounded by FERRY_BOOTSTRAP_TIMEOUT and calls the caller's idle function, and a connection that
// fell out of step (a reply that never came) refuses later calls with the first failure.
#include "bootstrap/pmi.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "util/config.hpp"
#include "util/fd.hpp"
#include "util/log.hpp"
#include "util/node.hpp"

namespace ferry::bootstrap {

namespace pmi {

bool parse_line(const std::string& line, std::vector<std::pair<std::string, std::string>>* fields) {
  fields->clear();
  std::size_t at = 0;
  while (at < line.size()) {
    if (line[at] == ' ') {
      ++at;
      continue;
    }
    std::size_t end = line.find(' ', at);
    if (end == std::string::npos) end = line.size();
    const std::string word = line.substr(at, end - at);
    const std::size_t equals = word.find('=');
    if (equals == std::string::npos || equals == 0) return false;
    fields->emplace_back(word.substr(0, equals), word.substr(equals + 1));
    at = end;
  }
  return !fields->empty() && fields->front().first == "cmd";
}

std::string to_hex(std::span<const std::byte> bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string text(bytes.size() * 2, '0');
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const auto b = static_cast<unsigned>(bytes[i]);
    text[2 * i] = kDigits[b >> 4];
    text[2 * i + 1] = kDigits[b & 15];
  }
  return text;
}

bool from_hex(const std::string& text, std::vector<std::byte>* bytes) {
  if (text.size() % 2 != 0) return false;
  auto digit = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  };
  bytes->resize(text.size() / 2);
  for (std::size_t i = 0; i < bytes->size(); ++i) {
    const int high = digit(text[2 * i]), low = digit(text[2 * i + 1]);
    if (high < 0 || low < 0) return false;
    (*bytes)[i] = static_cast<std::byte>(high * 16 + low);
  }
  return true;
}

}  // namespace pmi

namespace {

using Clock = std::chrono::steady_clock;
using Fields = std::vector<std::pair<std::string, std::string>>;
// The longest request line PMI-1 launchers read (MPICH's PMIU_MAXLINE; Slurm's agent likewise).
constexpr std::size_t kMaxLine = 1024;

std::string field(const Fields& fields, const std::string& key) {
  for (const auto& [k, v] : fields) {
    if (k == key) return v;
  }
  return {};
}

int env_int(const char* name, int fallback) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return fallback;
  char* end = nullptr;
  long value = std::strtol(text, &end, 10);
  return *end == '\0' && value >= 0 && value <= (1 << 24) ? static_cast<int>(value) : fallback;
}

std::string env_text(const char* name) {
  const char* text = std::getenv(name);
  return text != nullptr ? text : "";
}

class PmiBootstrap final : public Bootstrap {
 public:
  PmiBootstrap(int fd, int rank, int size, double timeout_s)
      : fd_(fd), rank_(rank), size_(size), timeout_s_(timeout_s) {
    name_ = "PMI-1 (PMI_FD=" + std::to_string(fd) + ")";
    auto fail = [&](const Status& status) { throw Error(Code::kBootstrapError, status.message()); };
    Fields reply;
    Status status = call("cmd=init pmi_version=1 pmi_subversion=1", "response_to_init", &reply);
    if (!status) fail(status);
    if (field(reply, "rc") != "0") {
      fail(Status(Code::kBootstrapError, name_ + ": the launcher refused PMI version 1.1 (rc=" +
                                             field(reply, "rc") + ")"));
    }
    initialized_ = true;
    if (!(status = call("cmd=get_maxes", "maxes", &reply))) fail(status);
    vallen_max_ = std::atoi(field(reply, "vallen_max").c_str());
    const int keylen_max = std::atoi(field(reply, "keylen_max").c_str());
    if (vallen_max_ < 64 || keylen_max < 32) {
      fail(Status(Code::kBootstrapError,
                  name_ + ": the launcher's limits (vallen_max=" + field(reply, "vallen_max") +
                      ", keylen_max=" + field(reply, "keylen_max") + ") are too small"));
    }
    if (!(status = call("cmd=get_my_kvsname", "my_kvsname", &reply))) fail(status);
    kvs_ = field(reply, "kvsname");
    if (kvs_.empty()) fail(Status(Code::kBootstrapError, name_ + ": no kvsname from the launcher"));
    name_ = "PMI-1 kvs " + kvs_;
    job_id_.clear();
    for (char c : kvs_) job_id_ += std::isalnum(static_cast<unsigned char>(c)) ? c : '-';
    if (job_id_.size() > 24) job_id_ = job_id_.substr(job_id_.size() - 24);
    find_locality();
    FERRY_LOG(kDebug, "%s: rank %d of %d, %zu on this node", name_.c_str(), rank_, size_,
              local_.size());
  }
  ~PmiBootstrap() override {
    // The launcher counts a process that exits without finalize as failed.
    if (initialized_ && broken_) {
      Fields reply;
      Status status = call("cmd=finalize", "finalize_ack", &reply, 5);
      if (!status) FERRY_LOG(kWarn, "%s", status.message().c_str());
    }
  }
  PmiBootstrap(const PmiBootstrap&) = delete;
  PmiBootstrap& operator=(const PmiBootstrap&) = delete;

  [[nodiscard]] int rank() const override { return rank_; }
  [[nodiscard]] int size() const override { return size_; }
  [[nodiscard]] std::vector<int> local_ranks() const override { return local_; }
  [[nodiscard]] std::string name() const override { return name_; }
  [[nodiscard]] std::string job_id() const override { return job_id_; }

  Status put(const std::string& key, std::span<const std::byte> value) override {
    std::lock_guard lock(mutex_);
    return put_value("kv." + key, value);
  }

  Status get(const std::string& key, Blob* value, const IdleFn& idle) override {
    std::lock_guard lock(mutex_);
    // PMI-1's get does not wait for a key: ask again until it exists or the deadline.
    const auto until = deadline();
    for (;;) {
      bool found = false;
      Status status = get_value("kv." + key, value, &found, idle);
      if (!status || found) return status;
      if (Clock::now() >= until) {
        return Status(Code::kTimeout, name_ + ": get of key '" + key + "' timed out after " +
                                          std::to_string(static_cast<int>(timeout_s_)) +
                                          " s (FERRY_BOOTSTRAP_TIMEOUT); no rank put that key");
      }
      if (idle) idle();
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }

  Status allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                   const IdleFn& idle) override {
    std::lock_guard lock(mutex_);
    const std::string prefix = "ag" + std::to_string(round_++) + ".";
    Status status = put_value(prefix + std::to_string(rank_), mine);
    if (status) status = barrier_locked("allgather", idle);
    if (!status) return status;
    all->assign(static_cast<std::size_t>(size_), {});
    for (int r = 0; r < size_; ++r) {
      bool found = false;
      status =
          get_value(prefix + std::to_string(r), &(*all)[static_cast<std::size_t>(r)], &found, idle);
      if (status && !found) {
        status = Status(Code::kBootstrapError, name_ + ": allgather: rank " + std::to_string(r) +
                                                   "'s contribution is missing after the barrier");
      }
      if (!status) return status;
    }
    return Status::ok();
  }

  Status barrier(const IdleFn& idle) override {
    std::lock_guard lock(mutex_);
    return barrier_locked("barrier", idle);
  }

  void abort(int code, const std::string& reason) override {
    std::lock_guard lock(mutex_);
    // No reply comes: the launcher ends the job.
    std::string line = "cmd=abort exitcode=" + std::to_string(code) + "\n";
    if (!write_all(line, Clock::now() + std::chrono::seconds(5), {})) {
      FERRY_LOG(kError, "%s: could not ask the launcher to abort (code %d, reason: %s)",
                name_.c_str(), code, reason.c_str());
    }
  }

 private:
  [[nodiscard]] Clock::time_point deadline() const {
    return Clock::now() +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s_));
  }

  bool write_all(const std::string& line, Clock::time_point until, const IdleFn& idle) {
    std::size_t sent = 0;
    while (sent < line.size()) {
      ssize_t n = ::send(fd_, line.data() + sent, line.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n > 0) {
        sent += static_cast<std::size_t>(n);
        continue;
      }
      if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return false;
      if (Clock::now() >= until) return false;
      if (idle) idle();
      pollfd pfd{fd_, POLLOUT, 0};
      ::poll(&pfd, 1, idle ? 0 : 10);
    }
    return true;
  }

  // Sends `request` and waits for the reply line whose cmd is `want`.
  Status call(const std::string& request, const char* want, Fields* reply, double timeout_s = -1,
              const IdleFn& idle = {}) {
    if (!broken_) return broken_;
    const auto until = timeout_s < 0 ? deadline()
                                     : Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                                          std::chrono::duration<double>(timeout_s));
    const std::string command = request.substr(4, request.find(' ') - 4);
    if (!write_all(request + "\n", until, idle)) {
      return fail(
          Status(Code::kBootstrapError, name_ + ": cannot send " + command + " to the launcher: " +
                                            (errno != 0 ? std::strerror(errno) : "timed out") +
                                            " (did the launcher exit?)"));
    }
    int naps = 0;
    for (;;) {
      auto newline = buffer_.find('\n');
      if (newline != std::string::npos) {
        std::string line = buffer_.substr(0, newline);
        buffer_.erase(0, newline + 1);
        if (!pmi::parse_line(line, reply) || field(*reply, "cmd") != want) {
          return fail(Status(Code::kProtocolError, name_ + ": expected " + want + " after " +
                                                       command + ", got '" + line.substr(0, 200) +
                                                       "'"));
        }
        return Status::ok();
      }
      if (buffer_.size() > 1 << 20) {
        return fail(Status(Code::kProtocolError, name_ + ": a reply line over 1 MiB"));
      }
      char chunk[4096];
      ssize_t n = ::recv(fd_, chunk, sizeof(chunk), MSG_DONTWAIT);
      if (n > 0) {
        buffer_.append(chunk, static_cast<std::size_t>(n));
        continue;
      }
      if (n == 0) {
        return fail(Status(Code::kBootstrapError, name_ + ": the launcher closed PMI_FD during " +
                                                      command + " (it ended the job, or exited)"));
      }
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        return fail(Status(Code::kBootstrapError, name_ + ": recv() during " + command +
                                                      " failed: " + std::strerror(errno)));
      }
      if (Clock::now() >= until) {
        return fail(
            Status(Code::kTimeout,
                   name_ + ": " + command + " timed out after " +
                       std::to_string(static_cast<int>(timeout_s < 0 ? timeout_s_ : timeout_s)) +
                       " s (FERRY_BOOTSTRAP_TIMEOUT); rank " + std::to_string(rank_) +
                       " was still waiting for the launcher or the other ranks"));
      }
      // With progress to make: poll at once, then 1 ms naps, so ranks of an oversubscribed node
      // leave the CPU to the launcher that answers them.
      if (idle) idle();
      pollfd pfd{fd_, POLLIN, 0};
      ::poll(&pfd, 1, idle ? std::min(naps++, 1) : 10);
    }
  }

  Status fail(Status status) {
    broken_ = status;
    return status;
  }

  // A value as "<chunks>" under `key` and hex chunks under "key:i", each within vallen_max.
  // A value is "h<hex>" under `key` where that fits vallen_max (one get reads it); otherwise
  // "c<chunks>.<bytes>" under `key` and hex chunks under "key:i", each within vallen_max.
  Status put_value(const std::string& key, std::span<const std::byte> value) {
    const std::string hex = pmi::to_hex(value);
    if (1 + hex.size() <= value_room(key)) return put_raw(key, "h" + hex);
    // Room for the longest chunk key ("key:<index>"), rounded down to whole bytes.
    const std::size_t chunk = value_room(key + ":" + std::to_string(hex.size())) & ~std::size_t{1};
    if (chunk < 16) {
      return Status(Code::kBootstrapError, name_ + ": the kvs name and key '" + key +
                                               "' leave no room for a value in a PMI line");
    }
    const std::size_t chunks = std::max<std::size_t>(1, (hex.size() + chunk - 1) / chunk);
    Fields reply;
    for (std::size_t i = 0; i < chunks; ++i) {
      std::string part = hex.substr(i * chunk, chunk);
      Status status = put_raw(key + ":" + std::to_string(i), part.empty() ? "-" : part);
      if (!status) return status;
    }
    return put_raw(key, "c" + std::to_string(chunks) + "." + std::to_string(value.size()));
  }

  // The longest value a put of `key` may carry: within the launcher's vallen_max, and the whole
  // request line within kMaxLine (Slurm's and MPICH's PMI-1 read at most 1024 bytes per line).
  [[nodiscard]] std::size_t value_room(const std::string& key) const {
    const std::size_t line = std::strlen("cmd=put kvsname=") + kvs_.size() + std::strlen(" key=") +
                             key.size() + std::strlen(" value=") + 1;  // + the newline
    const std::size_t by_line = line < kMaxLine ? kMaxLine - line : 0;
    return std::min(static_cast<std::size_t>(vallen_max_ - 1), by_line);
  }

  Status put_raw(const std::string& key, const std::string& value) {
    Fields reply;
    Status status =
        call("cmd=put kvsname=" + kvs_ + " key=" + key + " value=" + value, "put_result", &reply);
    if (status && field(reply, "rc") != "0") {
      status = Status(Code::kBootstrapError,
                      name_ + ": put of key '" + key + "' refused: " + field(reply, "msg"));
    }
    return status;
  }

  Status get_raw(const std::string& key, std::string* value, bool* found, const IdleFn& idle) {
    Fields reply;
    Status status = call("cmd=get kvsname=" + kvs_ + " key=" + key, "get_result", &reply, -1, idle);
    if (!status) return status;
    *found = field(reply, "rc") == "0";
    *value = field(reply, "value");
    return Status::ok();
  }

  Status get_value(const std::string& key, Blob* out, bool* found, const IdleFn& idle) {
    std::string header;
    Status status = get_raw(key, &header, found, idle);
    if (!status || !*found) return status;
    if (header.size() >= 1 && header[0] == 'h') {
      if (!pmi::from_hex(header.substr(1), out)) {
        return Status(Code::kProtocolError, name_ + ": key '" + key + "' holds malformed data");
      }
      return Status::ok();
    }
    char* end = nullptr;
    const unsigned long chunks =
        header.size() > 1 && header[0] == 'c' ? std::strtoul(header.c_str() + 1, &end, 10) : 0;
    if (end == nullptr) end = header.data();
    const unsigned long bytes = *end == '.' ? std::strtoul(end + 1, &end, 10) : ~0ul;
    if (*end != '\0' || chunks == 0 || chunks > 1u << 20 || bytes > (1ul << 30)) {
      return Status(Code::kProtocolError,
                    name_ + ": key '" + key + "' holds a malformed header '" + header + "'");
    }
    std::string hex;
    for (unsigned long i = 0; i < chunks; ++i) {
      std::string part;
      bool have = false;
      status = get_raw(key + ":" + std::to_string(i), &part, &have, idle);
      if (!status) return status;
      if (!have) {
        return Status(Code::kProtocolError,
                      name_ + ": key '" + key + "' lacks chunk " + std::to_string(i));
      }
      if (part != "-") hex += part;
    }
    if (!pmi::from_hex(hex, out) || out->size() != bytes) {
      return Status(Code::kProtocolError, name_ + ": key '" + key + "' holds malformed data");
    }
    return Status::ok();
  }

  Status barrier_locked(const char* what, const IdleFn& idle) {
    Fields reply;
    Status status = call("cmd=barrier_in", "barrier_out", &reply, -1, idle);
    if (!status) {
      return Status(status.code(), status.message() + " (in " + what + ")");
    }
    return Status::ok();
  }

  // PMI-1 has no locality: the ranks whose node identity is this one's.
  void find_locality() {
    const std::string mine = util::node_identity();
    std::vector<Blob> all;
    Status status = allgather(std::as_bytes(std::span(mine)), &all, {});
    if (!status) throw Error(Code::kBootstrapError, status.message());
    for (int r = 0; r < size_; ++r) {
      const Blob& blob = all[static_cast<std::size_t>(r)];
      if (std::string(reinterpret_cast<const char*>(blob.data()), blob.size()) == mine) {
        local_.push_back(r);
      }
    }
  }

  int fd_;
  int rank_;
  int size_;
  double timeout_s_;
  std::string name_;
  std::string kvs_;
  std::string job_id_;
  int vallen_max_ = 0;
  bool initialized_ = false;
  std::vector<int> local_;
  std::string buffer_;  // bytes received after the last reply line
  Status broken_;       // the first failure; the connection is out of step after it
  std::mutex mutex_;
  std::uint64_t round_ = 0;
};

}  // namespace

std::unique_ptr<Bootstrap> create_pmi(const util::Config& config) {
  const int fd = env_int("PMI_FD", -1);
  const int rank = env_int("PMI_RANK", -1);
  const int size = env_int("PMI_SIZE", -1);
  if (fd < 0) {
    throw Error(Code::kBootstrapError,
                std::getenv("PMI_PORT") != nullptr
                    ? "PMI: PMI_PORT is set but not PMI_FD; ferry speaks PMI-1 over the "
                      "descriptor the launcher passes (mpiexec.hydra, srun --mpi=pmi2)"
                    : "PMI: PMI_FD is not set to a descriptor number");
  }
  if (rank < 0 || size < 1 || rank >= size) {
    throw Error(Code::kBootstrapError, "PMI: PMI_RANK and PMI_SIZE must describe a rank (got '" +
                                           env_text("PMI_RANK") + "' and '" + env_text("PMI_SIZE") +
                                           "')");
  }
  int type = 0;
  socklen_t length = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &length) != 0) {
    throw Error(Code::kBootstrapError,
                "PMI: PMI_FD=" + std::to_string(fd) + " is not a socket: " + std::strerror(errno));
  }
  return std::make_unique<PmiBootstrap>(fd, rank, size,
                                        config.get_seconds(util::Var::kBootstrapTimeout));
}

}  // namespace ferry::bootstrap
