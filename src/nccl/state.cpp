// NCCL's API on ferry: the unique id, errors and type conversions (see state.hpp).
#include "nccl/state.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>

#include "coll/reduce.hpp"

namespace ferry::nccl {
namespace {

// The id's bytes: this magic, then "HOST:PORT", a NUL, then the nonce in hex and a NUL. Text, so
// that a user who prints an id sees where its store is.
constexpr char kMagic[] = "ferry-nccl-1 ";
thread_local std::string t_last_error;

bool parse_host_port(const std::string& text, std::string* host, int* port) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size()) return false;
  char* end = nullptr;
  const long value = std::strtol(text.c_str() + colon + 1, &end, 10);
  if (*end != '\0' || value < 1 || value > 65535) return false;
  *host = text.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  *port = static_cast<int>(value);
  return true;
}

// This host's IPv4 address on `interface` (or on the first that is up and not loopback).
std::string host_address(const char* interface) {
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return "127.0.0.1";
  std::string found;
  for (ifaddrs* a = list; a != nullptr && found.empty(); a = a->ifa_next) {
    if (a->ifa_addr == nullptr || a->ifa_addr->sa_family != AF_INET) continue;
    if ((a->ifa_flags & IFF_UP) == 0) continue;
    if (interface != nullptr ? std::strncmp(a->ifa_name, interface, std::strlen(interface)) != 0
                             : (a->ifa_flags & IFF_LOOPBACK) != 0) {
      continue;
    }
    char text[INET_ADDRSTRLEN] = {};
    const auto* in = reinterpret_cast<const sockaddr_in*>(a->ifa_addr);
    if (::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text)) != nullptr) found = text;
  }
  ::freeifaddrs(list);
  return found.empty() ? "127.0.0.1" : found;
}

}  // namespace

void encode(const UniqueId& id, ncclUniqueId* out) {
  std::memset(out->internal, 0, sizeof(out->internal));
  std::snprintf(out->internal, sizeof(out->internal), "%s%s:%d%c%016llx", kMagic, id.host.c_str(),
                id.port, '\0', static_cast<unsigned long long>(id.nonce));
}

bool decode(const ncclUniqueId& in, UniqueId* out) {
  const char* bytes = in.internal;
  const std::size_t magic = sizeof(kMagic) - 1;
  if (std::memcmp(bytes, kMagic, magic) != 0) return false;
  const std::size_t address_length = strnlen(bytes + magic, sizeof(in.internal) - magic);
  const std::size_t nonce_at = magic + address_length + 1;
  if (nonce_at + 17 > sizeof(in.internal) || bytes[nonce_at + 16] != '\0') return false;
  if (!parse_host_port(std::string(bytes + magic, address_length), &out->host, &out->port)) {
    return false;
  }
  char* end = nullptr;
  out->nonce = std::strtoull(bytes + nonce_at, &end, 16);
  return end == bytes + nonce_at + 16;
}

ncclResult_t make_unique_id(UniqueId* out) {
  std::random_device random;
  out->nonce = (std::uint64_t{random()} << 32) | random();
  if (const char* given = std::getenv("NCCL_COMM_ID"); given != nullptr && *given != '\0') {
    if (!parse_host_port(given, &out->host, &out->port)) {
      return fail(ncclInvalidArgument, std::string("NCCL_COMM_ID='") + given +
                                           "' is not HOST:PORT (the address rank 0 listens on)");
    }
    // Every rank may make its id itself from the same NCCL_COMM_ID (as NCCL's ids then are
    // alike): the job's number comes from the address (FNV-1a), so the ids are the same.
    std::uint64_t hash = 14695981039346656037ull;
    for (const char* c = given; *c != '\0'; ++c) {
      hash = (hash ^ static_cast<unsigned char>(*c)) * 1099511628211ull;
    }
    out->nonce = hash == 0 ? 1 : hash;
    return ncclSuccess;
  }
  out->host = host_address(std::getenv("NCCL_SOCKET_IFNAME"));
  // A port free now, on that address: rank 0's store binds it again (SO_REUSEADDR) at init.
  const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  socklen_t length = sizeof(address);
  const bool ok = probe >= 0 && ::inet_pton(AF_INET, out->host.c_str(), &address.sin_addr) == 1 &&
                  ::bind(probe, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0 &&
                  ::getsockname(probe, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  const int error = errno;
  if (probe >= 0) ::close(probe);
  if (!ok) {
    return fail(ncclSystemError,
                "ncclGetUniqueId: no free TCP port on " + out->host + ": " + std::strerror(error));
  }
  out->port = ntohs(address.sin_port);
  return ncclSuccess;
}

Worker::Worker() : thread_([this] { loop(); }) {}

Worker::~Worker() {
  {
    std::lock_guard guard(lock_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void Worker::post(std::function<void()> task) {
  {
    std::lock_guard guard(lock_);
    task_ = std::move(task);
    busy_.store(true, std::memory_order_release);
  }
  changed_.notify_all();
}

namespace {

// Polls `done` for `spin` (yielding the core between looks); true where it came.
template <typename Done>
bool poll_for(std::chrono::microseconds spin, Done done) {
  const auto until = std::chrono::steady_clock::now() + spin;
  while (!done()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::yield();
  }
  return true;
}

}  // namespace

void Worker::wait() {
  if (poll_for(kSpin, [this] { return !busy_.load(std::memory_order_acquire); })) return;
  std::unique_lock guard(lock_);
  changed_.wait(guard, [this] { return !busy_.load(std::memory_order_acquire); });
}

void Worker::loop() {
  for (;;) {
    poll_for(kSpin, [this] { return busy_.load(std::memory_order_acquire); });
    std::unique_lock guard(lock_);
    changed_.wait(guard, [this] { return busy_.load(std::memory_order_acquire) || stop_; });
    if (!busy_.load(std::memory_order_acquire)) return;  // stopped with nothing to do
    std::function<void()> task = std::move(task_);
    guard.unlock();
    task();
    guard.lock();
    busy_.store(false, std::memory_order_release);
    guard.unlock();
    changed_.notify_all();
  }
}

Process& process() {
  static Process* state = new Process;  // never destroyed: entry points may run at exit
  return *state;
}

ncclResult_t fail(ncclResult_t result, const std::string& message) {
  t_last_error = message;
  info("%s: %s", ncclGetErrorString(result), message.c_str());
  return result;
}

ncclResult_t fail(const Status& status) {
  const ncclResult_t result = result_of(status);
  return result == ncclSuccess ? result : fail(result, status.to_string());
}

ncclResult_t result_of(const Status& status) {
  ncclResult_t result = ncclInternalError;
  switch (status.code()) {
    case Code::kOk:
      return ncclSuccess;
    case Code::kInvalidArgument:
      result = ncclInvalidArgument;
      break;
    case Code::kUnsupported:
      result = ncclInvalidUsage;
      break;
    case Code::kPeerFailed:
    case Code::kRevoked:
    case Code::kProtocolError:
      result = ncclRemoteError;
      break;
    case Code::kInProgress:
      result = ncclInProgress;
      break;
    case Code::kTimeout:
    case Code::kNoResources:
    case Code::kIoError:
    case Code::kBootstrapError:
      result = status.message().find("CUDA_ERROR") != std::string::npos ? ncclUnhandledCudaError
                                                                        : ncclSystemError;
      break;
    default:
      break;
  }
  return result;
}

ncclResult_t report(const Status& status) {
  const ncclResult_t result = result_of(status);
  if (result != ncclSuccess && t_last_error != status.to_string()) {
    static_cast<void>(fail(result, status.to_string()));
  }
  return result;
}

const char* last_error() { return t_last_error.c_str(); }

namespace {
// Bit 0: NCCL_DEBUG asks for INFO lines; bit 1: NCCL_DEBUG_SUBSYS names COLL (or ALL) too; -1: not
// read yet.
std::atomic<int> g_debug{-1};

int debug() {
  int enabled = g_debug.load(std::memory_order_relaxed);
  if (enabled < 0) {
    const char* level = std::getenv("NCCL_DEBUG");
    const char* subsys = std::getenv("NCCL_DEBUG_SUBSYS");
    enabled =
        level != nullptr && (std::strcmp(level, "INFO") == 0 || std::strcmp(level, "TRACE") == 0);
    if (enabled != 0 && subsys != nullptr &&
        (std::strstr(subsys, "COLL") != nullptr || std::strstr(subsys, "ALL") != nullptr)) {
      enabled |= 2;
    }
    g_debug.store(enabled);
  }
  return enabled;
}

}  // namespace

void reread_debug() { g_debug.store(-1); }

bool tracing_calls() { return (debug() & 2) != 0; }

void info(const char* format, ...) {
  if (debug() == 0) return;
  char line[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(line, sizeof(line), format, args);
  va_end(args);
  std::fprintf(stderr, "ferry-nccl INFO pid %d: %s\n", static_cast<int>(::getpid()), line);
}

ncclResult_t to_ferry(ncclDataType_t type, DataType* out) {
  // By NCCL's value: ncclInt8 … ncclBfloat16 are 0 … 9.
  static constexpr DataType kTypes[] = {DataType::kInt8,    DataType::kUint8,   DataType::kInt32,
                                        DataType::kUint32,  DataType::kInt64,   DataType::kUint64,
                                        DataType::kFloat16, DataType::kFloat32, DataType::kFloat64,
                                        DataType::kBfloat16};
  static_assert(ncclBfloat16 == 9 && ncclFloat16 == 6 && ncclUint32 == 3);
  const auto index = static_cast<std::size_t>(type);
  if (type >= 0 && index < std::size(kTypes)) {
    *out = kTypes[index];
    return ncclSuccess;
  }
  if (type == ncclFloat8e4m3 || type == ncclFloat8e5m2) {
    // Moved as bytes; a reduction of them is refused (to_ferry of the op below).
    *out = DataType::kUint8;
    return ncclSuccess;
  }
  return fail(ncclInvalidArgument,
              "datatype " + std::to_string(static_cast<int>(type)) + " is no ncclDataType_t");
}

ncclResult_t to_ferry(ncclRedOp_t op, ReduceOp* out) {
  switch (op) {
    case ncclSum:
      *out = ReduceOp::kSum;
      return ncclSuccess;
    case ncclProd:
      *out = ReduceOp::kProd;
      return ncclSuccess;
    case ncclMax:
      *out = ReduceOp::kMax;
      return ncclSuccess;
    case ncclMin:
      *out = ReduceOp::kMin;
      return ncclSuccess;
    default:
      return fail(ncclInvalidArgument, "reduction " + std::to_string(static_cast<int>(op)) +
                                           " is no ncclRedOp_t ferry's NCCL made");
  }
}

ncclResult_t to_ferry(ncclRedOp_t op, ncclDataType_t type, const ncclComm& comm, Reduction* out) {
  *out = Reduction{};
  if (type == ncclFloat8e4m3 || type == ncclFloat8e5m2) {
    return fail(ncclInvalidUsage,
                std::string("reductions of the 8-bit float types (") +
                    (type == ncclFloat8e4m3 ? "ncclFloat8e4m3" : "ncclFloat8e5m2") +
                    ") are not built in ferry's NCCL yet (they move as bytes: allgather, "
                    "broadcast, send and receive take them)");
  }
  DataType t{};
  if (ncclResult_t r = to_ferry(type, &t); r != ncclSuccess) return r;
  if (op == ncclAvg) {
    // As NCCL: a float average multiplies each input by 1/n (in the type), an integer one
    // divides the sum by n (truncating).
    const int n = comm.comm.size();
    if (coll::is_integer(t)) {
      out->post_divide = true;
      out->scale.divisor = static_cast<std::uint64_t>(n);
      return ncclSuccess;
    }
    out->pre_multiply = true;
    const float inverse = 1.0f / static_cast<float>(n);
    switch (t) {
      case DataType::kFloat16:
        out->scale.factor_bits = coll::float_to_half(inverse);
        break;
      case DataType::kBfloat16:
        out->scale.factor_bits = coll::float_to_bf16(inverse);
        break;
      case DataType::kFloat32:
        out->scale.factor_bits = std::bit_cast<std::uint32_t>(inverse);
        break;
      default:
        out->scale.factor_bits = std::bit_cast<std::uint64_t>(1.0 / static_cast<double>(n));
        break;
    }
    return ncclSuccess;
  }
  if (op >= ncclNumOps) {
    std::lock_guard guard(process().lock);
    const auto made = comm.premul_sums.find(static_cast<int>(op));
    if (made == comm.premul_sums.end()) {
      return fail(ncclInvalidArgument,
                  "reduction " + std::to_string(static_cast<int>(op)) +
                      " is no ncclRedOp_t of this communicator (made by ncclRedOpCreatePreMulSum "
                      "on another one, or destroyed?)");
    }
    if (made->second.type != type) {
      return fail(ncclInvalidArgument, "reduction " + std::to_string(static_cast<int>(op)) +
                                           " was made for datatype " +
                                           std::to_string(static_cast<int>(made->second.type)) +
                                           ", not " + std::to_string(static_cast<int>(type)));
    }
    out->pre_multiply = true;
    out->scale.device_factor = made->second.device;
    out->scale.factor_bits = made->second.bits;
    return ncclSuccess;
  }
  return to_ferry(op, &out->op);
}

}  // namespace ferry::nccl
