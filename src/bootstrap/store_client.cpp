// StoreBootstrap: a rank's side of ferryrun's store. Every wait is bounded by
// FERRY_BOOTSTRAP_TIMEOUT and keeps calling the caller's idle function, so communication
// progresses while a rank waits for the others.
#include "bootstrap/store_client.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "bootstrap/store_server.hpp"
#include "util/log.hpp"
#include "util/node.hpp"

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

// Rank 0's side of the TCP store: the server, polled by a thread of its own until the bootstrap
// ends and every other rank has left (or linger_s passed). When a rank aborts, the others learn
// it on their WATCH connections; rank 0 exits once those notices have left.
class StoreHost {
 public:
  StoreHost(const std::string& host, int port, int size, int rank, double linger_s)
      : server_(StoreServer::listen_tcp(
            host, port, size,
            [this](int from, int pid, int code, const std::string& why) {
              if (aborted_) return;
              aborted_ = true;
              abort_code_ = code > 0 && code < 256 ? code : 1;
              abort_text_ = "rank " + std::to_string(from) + " (pid " + std::to_string(pid) +
                            ") aborted the job with code " + std::to_string(code) + ": " + why;
              abort_at_ = store::Clock::now();
            })),
        rank_(rank),
        linger_(std::chrono::duration_cast<store::Clock::duration>(
            std::chrono::duration<double>(linger_s))),
        thread_([this] { run(); }) {}
  StoreHost(const StoreHost&) = delete;
  StoreHost& operator=(const StoreHost&) = delete;
  ~StoreHost() {
    stop_ = true;
    thread_.join();
  }

 private:
  void run() {
    std::optional<store::Clock::time_point> until;
    for (;;) {
      server_->poll(20);
      if (aborted_ && (!server_->output_pending() ||
                       store::Clock::now() - abort_at_ > std::chrono::seconds(1))) {
        std::fprintf(stderr, "ferry[%d]: %s; exiting\n", rank_, abort_text_.c_str());
        std::fflush(stderr);
        ::_exit(abort_code_);
      }
      if (!stop_.load()) continue;
      if (!until) until = store::Clock::now() + linger_;
      if (server_->connected_ranks() == 0) return;
      if (store::Clock::now() >= *until) {
        FERRY_LOG(kWarn,
                  "TCP store: %d rank(s) still connected %.1f s after rank 0 finalized; "
                  "closing the store (FERRY_FINALIZE_TIMEOUT)",
                  server_->connected_ranks(), std::chrono::duration<double>(linger_).count());
        return;
      }
    }
  }

  // Written and read by the server's thread only (the abort callback runs inside poll()).
  bool aborted_ = false;
  int abort_code_ = 1;
  std::string abort_text_;
  store::Clock::time_point abort_at_;
  std::unique_ptr<StoreServer> server_;
  int rank_;
  store::Clock::duration linger_;
  std::atomic<bool> stop_{false};
  std::thread thread_;  // last: starts once the rest is built
};

StoreBootstrap::StoreBootstrap(StoreOptions options) : options_(std::move(options)) {
  const auto& o = options_;
  name_ = is_tcp() ? "TCP store " + o.host + ":" + std::to_string(o.port)
                   : "ferryrun store unix:" + o.path;
  auto fail = [&](const std::string& what) {
    throw Error(Code::kBootstrapError, name_ + ": " + what);
  };
  if (o.size < 1 || o.rank < 0 || o.rank >= o.size) {
    fail("FERRY_RANK=" + std::to_string(o.rank) + " and FERRY_SIZE=" + std::to_string(o.size) +
         " do not describe a rank of a job (expected 0 <= rank < size)");
  }
  if (is_tcp() && o.rank == 0)
    host_ = std::make_unique<StoreHost>(o.host, o.port, o.size, o.rank, o.linger_s);
  socket_ = connect_store(deadline());
  std::string what = "HELLO as rank " + std::to_string(o.rank);
  Status status = send(store::encode_hello(o.rank, o.size, static_cast<int>(::getpid())), what, {});
  store::Frame reply;
  if (status) status = await(store::Op::kHelloOk, "", what, {}, &reply);
  if (!status) throw Error(Code::kBootstrapError, status.message());
  try {
    // Rank 0 learns of an abort in its server thread (StoreHost), not by watching itself.
    if (is_tcp() && o.rank != 0) start_watch();
    find_locality();
  } catch (...) {
    shutdown();  // the destructor does not run for a constructor that throws
    throw;
  }
  FERRY_LOG(kDebug, "%s: connected as rank %d of %d (%zu on this node)", name_.c_str(), o.rank,
            o.size, local_ranks_.size());
}

StoreBootstrap::~StoreBootstrap() {
  if (socket_.valid() && broken_) {
    Status status = store::send_all(socket_.get(), store::encode_bye(),
                                    store::Clock::now() + std::chrono::seconds(1));
    if (!status) FERRY_LOG(kDebug, "%s: BYE not sent: %s", name_.c_str(), status.message().c_str());
  }
  shutdown();
}

void StoreBootstrap::shutdown() {
  if (watcher_.joinable()) {
    std::uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(wake_.get(), &one, sizeof(one));
    watcher_.join();
  }
  watch_.reset();
  socket_.reset();
  host_.reset();
}

util::Fd StoreBootstrap::connect_store(store::Clock::time_point until) {
  auto fail = [&](const std::string& what) {
    throw Error(Code::kBootstrapError, name_ + ": " + what);
  };
  util::Fd socket;
  if (!is_tcp()) {
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    if (options_.path.empty() || options_.path.size() >= sizeof(address.sun_path)) {
      fail("the socket path must be 1 to " + std::to_string(sizeof(address.sun_path) - 1) +
           " bytes long");
    }
    std::memcpy(address.sun_path, options_.path.c_str(), options_.path.size() + 1);
    for (;;) {
      socket.reset(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      if (!socket.valid()) fail(std::string("socket() failed: ") + std::strerror(errno));
      if (::connect(socket.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
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
  } else {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_NUMERICSERV;
    addrinfo* found = nullptr;
    const std::string service = std::to_string(options_.port);
    if (int rc = ::getaddrinfo(options_.host.c_str(), service.c_str(), &hints, &found); rc != 0) {
      fail(std::string("cannot resolve the host: ") + gai_strerror(rc));
    }
    std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, ::freeaddrinfo);
    // Rank 0 may not be listening yet: refused connections are retried until the deadline.
    std::string last;
    int tries = 0;
    for (;; ++tries) {
      for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
        socket.reset(::socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, 0));
        if (socket.valid() && ::connect(socket.get(), a->ai_addr, a->ai_addrlen) == 0) {
          if (!store::connected_to_itself(socket.get())) break;
          last = "the connection reached itself (nobody listens on that port)";
          store::close_without_time_wait(socket.get());
        } else {
          last = std::strerror(errno);
        }
        socket.reset();
      }
      if (socket.valid()) break;
      if (store::Clock::now() >= until) {
        fail("cannot connect after " + std::to_string(tries + 1) + " tries in " +
             seconds_text(options_.timeout_s) + " (FERRY_BOOTSTRAP_TIMEOUT): " + last +
             "; rank 0 serves the store there: is it running, and is " + options_.host + ":" +
             service + " its address and a port it could listen on?");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(std::min(10 + 10 * tries, 200)));
    }
    int one = 1;
    ::setsockopt(socket.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  }
  int flags = ::fcntl(socket.get(), F_GETFL);
  if (flags < 0 || ::fcntl(socket.get(), F_SETFL, flags | O_NONBLOCK) != 0) {
    fail(std::string("fcntl(O_NONBLOCK) failed: ") + std::strerror(errno));
  }
  return socket;
}

void StoreBootstrap::find_locality() {
  const auto& o = options_;
  auto fail = [&](const std::string& what) {
    throw Error(Code::kBootstrapError, name_ + ": " + what);
  };
  if (o.local_size > 0 || o.local_rank >= 0) {
    if (o.local_size < 1 || o.local_size > o.size || o.local_rank < 0 ||
        o.local_rank >= o.local_size || o.local_rank > o.rank ||
        o.rank - o.local_rank + o.local_size > o.size) {
      fail("FERRY_LOCAL_RANK=" + std::to_string(o.local_rank) + " and FERRY_LOCAL_SIZE=" +
           std::to_string(o.local_size) + " do not fit rank " + std::to_string(o.rank) + " of " +
           std::to_string(o.size) + " (a node's ranks are numbered contiguously)");
    }
    for (int i = 0; i < o.local_size; ++i) local_ranks_.push_back(o.rank - o.local_rank + i);
    if (!o.job_id.empty()) return;
  }
  // One allgather of "<job id proposal>\n<node identity>": rank 0's proposal wins.
  std::string job;
  if (o.rank == 0 && o.job_id.empty()) {
    std::random_device random;
    char text[16];
    std::snprintf(text, sizeof(text), "t%08x", static_cast<unsigned>(random()));
    job = text;
  }
  const std::string mine = job + "\n" + util::node_identity();
  std::vector<Blob> all;
  Status status = allgather(std::as_bytes(std::span(mine)), &all);
  if (!status) throw Error(Code::kBootstrapError, status.message());
  std::vector<std::string> nodes;
  for (const Blob& blob : all) {
    std::string text(reinterpret_cast<const char*>(blob.data()), blob.size());
    auto newline = text.find('\n');
    if (newline == std::string::npos) fail("a rank sent a malformed node identity");
    if (nodes.empty() && o.job_id.empty()) {
      options_.job_id = text.substr(0, newline);
      if (options_.job_id.empty() || options_.job_id.size() > 32) {
        fail("rank 0 sent no usable job id");
      }
    }
    nodes.push_back(text.substr(newline + 1));
  }
  if (!local_ranks_.empty()) return;
  for (int r = 0; r < o.size; ++r) {
    if (nodes[static_cast<std::size_t>(r)] == nodes[static_cast<std::size_t>(o.rank)]) {
      local_ranks_.push_back(r);
    }
  }
}

void StoreBootstrap::start_watch() {
  watch_ = connect_store(deadline());
  const std::string what = "WATCH as rank " + std::to_string(options_.rank);
  Status status = store::send_all(
      watch_.get(), store::encode_watch(options_.rank, options_.size, static_cast<int>(::getpid())),
      deadline());
  store::FrameReader reader;
  store::Frame reply;
  if (status) status = store::receive_frame(watch_.get(), &reader, &reply, deadline());
  if (status && reply.op != store::Op::kHelloOk) {
    status = Status(Code::kProtocolError, "the store answered " + store::op_name(reply.op));
  }
  if (!status) throw Error(Code::kBootstrapError, name_ + ": " + what + ": " + status.message());
  wake_.reset(::eventfd(0, EFD_CLOEXEC));
  if (!wake_.valid()) {
    throw Error(Code::kBootstrapError, name_ + ": eventfd() failed: " + std::strerror(errno));
  }
  watcher_ = std::thread([this] { watch(); });
}

void StoreBootstrap::watch() {
  store::FrameReader reader;
  for (;;) {
    pollfd fds[2] = {{watch_.get(), POLLIN, 0}, {wake_.get(), POLLIN, 0}};
    if (::poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[1].revents != 0) return;
    auto read = reader.read_some(watch_.get());
    if (read == store::FrameReader::Read::kClosed || read == store::FrameReader::Read::kError) {
      return;  // the store is gone: the transports see rank 0's end
    }
    for (;;) {
      store::Frame frame;
      bool got = false;
      if (!reader.next(&frame, &got) || !got) break;
      store::Aborted aborted;
      if (frame.op != store::Op::kAborted || !store::decode_aborted(frame.payload, &aborted)) {
        continue;
      }
      // As a launcher would: every rank ends with the aborting rank's code.
      std::fprintf(stderr, "ferry[%d]: rank %d aborted the job with code %d: %s; exiting\n",
                   options_.rank, aborted.rank, aborted.code, aborted.reason.c_str());
      std::fflush(stderr);
      ::_exit(aborted.code > 0 && aborted.code < 256 ? aborted.code : 1);
    }
  }
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

std::string StoreBootstrap::ask_missing() {
  const auto until = store::Clock::now() + std::chrono::seconds(1);
  if (!store::send_all(socket_.get(), store::encode_missing(), until)) return "";
  for (;;) {
    store::Frame reply;
    if (!store::receive_frame(socket_.get(), &reader_, &reply, until)) return "";
    std::string text;
    if (reply.op == store::Op::kMissingList && store::decode_missing_list(reply.payload, &text)) {
      return text;
    }
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
      std::string waiting;
      if (!is_get) {
        waiting = ask_missing();
        waiting = "; rank " + std::to_string(options_.rank) +
                  (waiting.empty() ? " was still waiting for the other ranks"
                                   : " was still waiting: " + waiting);
      }
      result =
          Status(Code::kTimeout,
                 name_ + ": " + what + " timed out after " + seconds_text(options_.timeout_s) +
                     " (FERRY_BOOTSTRAP_TIMEOUT)" + (is_get ? "; no rank put that key" : waiting));
      // A GET that timed out leaves nothing behind; a half-done round or a partly sent frame
      // leaves the connection out of step with the store.
      if (is_get) return result;
      break;
    }
    case Code::kPeerFailed:
      result = Status(Code::kBootstrapError,
                      name_ + " closed the connection during " + what +
                          (is_tcp() ? " (rank 0, which serves it, ended or exited)"
                                    : " (ferryrun ended the job, or exited)"));
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
