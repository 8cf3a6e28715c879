// StoreBootstrap: a rank's side of ferryrun's store. Every wait is bounded by
// FERRY_BOOTSTRAP_TIMEOUT and keeps calling the caller's idle function, so communication
// progresses while a rank waits for the others.
#include "bootstrap/store_client.hpp"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <thread>

#include "util/log.hpp"

namespace ferry::bootstrap {
namespace {

std::string seconds_text(double seconds) {
  char text[32];
  std::snprintf(text, sizeof(text), "%g s", seconds);
  return text;
}

std::string key_what(const char* op, const std::string& key) {
  return std::string(op) + " of key '" + key + "'";
}

}  // namespace

StoreBootstrap::StoreBootstrap(StoreOptions options)
    : options_(std::move(options)), name_("ferryrun store unix:" + options_.path) {
  auto fail = [&](const std::string& what) {
    throw Error(Code::kBootstrapError, name_ + ": " + what);
  };
  const auto& o = options_;
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    fail("FERRY_RANK=" + std::to_string(o.rank) + " and FERRY_SIZE=" + std::to_string(o.size) +
         " do not describe a rank of a job (expected 0 <= rank < size)");
  }
  if (o.local_size < 1 || o.local_size > o.size || o.local_rank < 0 ||
      o.local_rank >= o.local_size || o.local_rank > o.rank ||
      o.rank - o.local_rank + o.local_size > o.size) {
    fail("FERRY_LOCAL_RANK=" + std::to_string(o.local_rank) + " and FERRY_LOCAL_SIZE=" +
         std::to_string(o.local_size) + " do not fit rank " + std::to_string(o.rank) + " of " +
         std::to_string(o.size) + " (ferryrun numbers a node's ranks contiguously)");
  }
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (o.path.empty() || o.path.size() >= sizeof(address.sun_path)) {
    fail("the socket path must be 1 to " + std::to_string(sizeof(address.sun_path) - 1) +
         " bytes long");
  }
  std::memcpy(address.sun_path, o.path.c_str(), o.path.size() + 1);

  auto until = deadline();
  for (;;) {
    socket_.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!socket_.valid()) fail(std::string("socket() failed: ") + std::strerror(errno));
    if (::connect(socket_.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
      break;
    }
    int error = errno;
    // A full accept backlog is worth waiting for; a missing store is not.
    if ((error == EAGAIN || error == EINTR) && store::Clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      continue;
    }
    fail(std::string("cannot connect: ") + std::strerror(error) +
         " (FERRY_STORE is set by ferryrun for the processes it starts; is that ferryrun still "
         "running?)");
  }
  int flags = ::fcntl(socket_.get(), F_GETFL);
  if (flags < 0 || ::fcntl(socket_.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    fail(std::string("fcntl(O_NONBLOCK) failed: ") + std::strerror(errno));
  }
  std::string what = "HELLO as rank " + std::to_string(o.rank);
  Status status = send(store::encode_hello(o.rank, o.size, static_cast<int>(::getpid())), what, {});
  store::Frame reply;
  if (status) status = await(store::Op::kHelloOk, "", what, {}, &reply);
  if (!status) throw Error(Code::kBootstrapError, status.message());
  FERRY_LOG(kDebug, "%s: connected as rank %d of %d", name_.c_str(), o.rank, o.size);
}

std::vector<int> StoreBootstrap::local_ranks() const {
  std::vector<int> ranks;
  ranks.reserve(static_cast<std::size_t>(options_.local_size));
  int first = options_.rank - options_.local_rank;
  for (int i = 0; i < options_.local_size; ++i) ranks.push_back(first + i);
  return ranks;
}

Status StoreBootstrap::put(const std::string& key, std::span<const std::byte> value) {
  if (key.size() > store::kMaxKeyBytes || value.size() > store::kMaxValueBytes) {
    return Status(Code::kInvalidArgument,
                  name_ + ": put of key '" + key.substr(0, 64) + "': the key (" +
                      std::to_string(key.size()) + " bytes, at most " +
                      std::to_string(store::kMaxKeyBytes) + ") or the value (" +
                      std::to_string(value.size()) + " bytes, at most " +
                      std::to_string(store::kMaxValueBytes) + ") is too long");
  }
  std::lock_guard lock(mutex_);
  if (!broken_) return broken_;
  return send(store::encode_put(key, value), key_what("put", key), {});
}

Status StoreBootstrap::get(const std::string& key, Blob* value, const IdleFn& idle) {
  if (key.size() > store::kMaxKeyBytes) {
    return Status(Code::kInvalidArgument, name_ + ": get of a key of " +
                                              std::to_string(key.size()) + " bytes (at most " +
                                              std::to_string(store::kMaxKeyBytes) + ")");
  }
  std::lock_guard lock(mutex_);
  if (!broken_) return broken_;
  std::string what = key_what("get", key);
  Status status = send(store::encode_get(key), what, idle);
  store::Frame reply;
  if (status) status = await(store::Op::kValue, key, what, idle, &reply);
  if (!status) return status;
  store::KeyValue kv;
  if (!store::decode_value(reply.payload, &kv)) {
    return broken(Status(Code::kProtocolError, "malformed VALUE"), what);
  }
  value->assign(kv.value.begin(), kv.value.end());
  return Status::ok();
}

Status StoreBootstrap::allgather(std::span<const std::byte> mine, std::vector<Blob>* all,
                                 const IdleFn& idle) {
  if (mine.size() > store::kMaxValueBytes) {
    return Status(Code::kInvalidArgument, name_ + ": allgather of a blob of " +
                                              std::to_string(mine.size()) + " bytes (at most " +
                                              std::to_string(store::kMaxValueBytes) + ")");
  }
  std::lock_guard lock(mutex_);
  if (!broken_) return broken_;
  const std::string what = "allgather";
  Status status = send(store::encode_allgather(mine), what, idle);
  store::Frame reply;
  if (status) status = await(store::Op::kAllgatherDone, "", what, idle, &reply);
  if (!status) return status;
  if (!store::decode_allgather_done(reply.payload, static_cast<std::size_t>(options_.size), all)) {
    return broken(Status(Code::kProtocolError, "malformed ALLGATHER_DONE"), what);
  }
  return Status::ok();
}

Status StoreBootstrap::barrier(const IdleFn& idle) {
  std::lock_guard lock(mutex_);
  if (!broken_) return broken_;
  const std::string what = "barrier";
  Status status = send(store::encode_barrier(), what, idle);
  store::Frame reply;
  if (status) status = await(store::Op::kBarrierDone, "", what, idle, &reply);
  return status;
}

void StoreBootstrap::abort(int code, const std::string& reason) {
  std::lock_guard lock(mutex_);
  Status status = broken_;
  if (status) {
    // Short: the job is failing, and a store that does not take 64 bytes in 5 s is gone.
    status = store::send_all(socket_.get(), store::encode_abort(code, reason),
                             store::Clock::now() + std::chrono::seconds(5));
  }
  if (!status) {
    FERRY_LOG(kError, "%s: could not ask ferryrun to abort the job (code %d, reason: %s): %s",
              name_.c_str(), code, reason.c_str(), status.message().c_str());
  }
}

Status StoreBootstrap::send(const store::Bytes& frame, const std::string& what,
                            const IdleFn& idle) {
  Status status = store::send_all(socket_.get(), frame, deadline(), idle);
  return status ? status : broken(status, what);
}

Status StoreBootstrap::await(store::Op want, const std::string& key, const std::string& what,
                             const IdleFn& idle, store::Frame* reply) {
  auto until = deadline();
  for (;;) {
    Status status = store::receive_frame(socket_.get(), &reader_, reply, until, idle);
    if (!status) return broken(status, what);
    if (reply->op == store::Op::kError) {
      store::ErrorReply error;
      if (!store::decode_error(reply->payload, &error)) {
        return broken(Status(Code::kProtocolError, "malformed ERROR"), what);
      }
      Status failed(error.code, name_ + ": " + what + " failed: " + error.message);
      // After a protocol error the store drops this connection; other errors (a rank left, an
      // allgather too large) end one request only.
      if (error.code == Code::kProtocolError) broken_ = failed;
      return failed;
    }
    if (reply->op == want && want != store::Op::kValue) return Status::ok();
    if (reply->op == want) {
      store::KeyValue kv;
      if (!store::decode_value(reply->payload, &kv)) {
        return broken(Status(Code::kProtocolError, "malformed VALUE"), what);
      }
      if (kv.key == key) return Status::ok();
    }
    // The answer to a GET that timed out earlier: the caller gave up on it.
    if (reply->op != store::Op::kValue) {
      return broken(Status(Code::kProtocolError, "unexpected " + store::op_name(reply->op) +
                                                     " while waiting for " + store::op_name(want)),
                    what);
    }
    FERRY_LOG(kDebug, "%s: skipping a late VALUE during %s", name_.c_str(), what.c_str());
  }
}

Status StoreBootstrap::broken(const Status& status, const std::string& what) {
  Status result;
  switch (status.code()) {
    case Code::kTimeout: {
      bool is_get = what.rfind("get of", 0) == 0;
      result = Status(Code::kTimeout, name_ + ": " + what + " timed out after " +
                                          seconds_text(options_.timeout_s) +
                                          " (FERRY_BOOTSTRAP_TIMEOUT)" +
                                          (is_get ? "; no rank put that key"
                                                  : "; rank " + std::to_string(options_.rank) +
                                                        " was still waiting for the other ranks"));
      // A GET that timed out leaves nothing behind; a half-done round or a partly sent frame
      // leaves the connection out of step with the store.
      if (is_get) return result;
      break;
    }
    case Code::kPeerFailed:
      result = Status(Code::kBootstrapError, "ferryrun's store at unix:" + options_.path +
                                                 " closed the connection during " + what +
                                                 " (ferryrun ended the job, or exited)");
      break;
    case Code::kProtocolError:
      result = Status(Code::kBootstrapError,
                      name_ + ": bad reply during " + what + ": " + status.message());
      break;
    default:
      result = Status(Code::kBootstrapError, name_ + ": " + what + ": " + status.message());
      break;
  }
  broken_ = result;
  return result;
}

store::Clock::time_point StoreBootstrap::deadline() const {
  return store::Clock::now() + std::chrono::duration_cast<store::Clock::duration>(
                                   std::chrono::duration<double>(options_.timeout_s));
}

}  // namespace ferry::bootstrap
