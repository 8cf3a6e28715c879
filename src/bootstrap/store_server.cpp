// ferryrun's store server: accepts ranks on a UNIX socket, validates every frame, and answers
// requests from one epoll loop without ever blocking the launcher.
#include "bootstrap/store_server.hpp"

#include <netdb.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/log.hpp"

namespace ferry::bootstrap {
namespace {

[[noreturn]] void fail(const std::string& where, const char* call) {
  throw Error(Code::kIoError, where + ": " + call + "() failed: " + std::strerror(errno));
}

util::Fd listen_unix(const std::string& path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.size() >= sizeof(address.sun_path)) {
    throw Error(Code::kInvalidArgument,
                "ferryrun store: socket path '" + path + "' is longer than the " +
                    std::to_string(sizeof(address.sun_path) - 1) + " bytes a UNIX socket allows");
  }
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  util::Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  const std::string where = "ferryrun store at unix:" + path;
  if (!listener.valid()) fail(where, "socket");
  if (::bind(listener.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0) {
    fail(where, "bind");
  }
  if (::listen(listener.get(), SOMAXCONN) != 0) {
    int error = errno;
    ::unlink(path.c_str());
    errno = error;
    fail(where, "listen");
  }
  return listener;
}

}  // namespace

StoreServer::StoreServer(std::string path, int size, AbortFn on_abort)
    : StoreServer(listen_unix(path), "ferryrun store", path, size, std::move(on_abort)) {}

std::unique_ptr<StoreServer> StoreServer::listen_tcp(const std::string& host, int port, int size,
                                                     AbortFn on_abort) {
  const std::string where = "TCP store at " + host + ":" + std::to_string(port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc =
          ::getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found);
      rc != 0) {
    throw Error(Code::kBootstrapError, where + ": cannot resolve the host: " + gai_strerror(rc));
  }
  std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> list(found, ::freeaddrinfo);
  std::string tried;
  for (const addrinfo* a = found; a != nullptr; a = a->ai_next) {
    util::Fd listener(::socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
    int one = 1;
    if (listener.valid() &&
        ::setsockopt(listener.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) == 0 &&
        ::bind(listener.get(), a->ai_addr, a->ai_addrlen) == 0 &&
        ::listen(listener.get(), SOMAXCONN) == 0) {
      return std::unique_ptr<StoreServer>(
          new StoreServer(std::move(listener), "TCP store", "", size, std::move(on_abort)));
    }
    tried += std::string(tried.empty() ? "" : "; ") + std::strerror(errno);
  }
  throw Error(Code::kBootstrapError,
              where + ": rank 0 cannot listen there (" + tried +
                  "); FERRY_STORE must name an address of rank 0's host and a free port");
}

StoreServer::StoreServer(util::Fd listener, std::string label, std::string path, int size,
                         AbortFn on_abort)
    : path_(std::move(path)),
      label_(std::move(label)),
      size_(size),
      on_abort_(std::move(on_abort)),
      rank_client_(static_cast<std::size_t>(std::max(size, 0)), 0),
      departed_pid_(static_cast<std::size_t>(std::max(size, 0)), 0),
      joined_(static_cast<std::size_t>(std::max(size, 0)), false),
      finalized_(static_cast<std::size_t>(std::max(size, 0)), false),
      exit_note_(static_cast<std::size_t>(std::max(size, 0))),
      departed_at_(static_cast<std::size_t>(std::max(size, 0)), 0),
      in_barrier_(static_cast<std::size_t>(std::max(size, 0)), false),
      gathered_(static_cast<std::size_t>(std::max(size, 0))),
      in_allgather_(static_cast<std::size_t>(std::max(size, 0)), false) {
  auto unlink = [&] {
    if (!path_.empty()) ::unlink(path_.c_str());
  };
  if (size < 1) {
    unlink();
    throw Error(Code::kInvalidArgument, label_ + ": job size must be positive");
  }
  try {
    connections_.emplace(std::move(listener), label_,
                         static_cast<StoreConnections::Handler*>(this));
  } catch (...) {
    unlink();
    throw;
  }
}

StoreServer::~StoreServer() {
  connections_.reset();
  if (!path_.empty()) ::unlink(path_.c_str());
}

int StoreServer::connected_ranks() const {
  int count = 0;
  for (std::uint64_t id : rank_client_) count += id != 0 ? 1 : 0;
  return count;
}

void StoreServer::on_frame(Client* client, store::Frame* frame) {
  if (client->rank < 0 && frame->op != store::Op::kHello && frame->op != store::Op::kWatch) {
    reject(client, Code::kProtocolError,
           "the first request must be HELLO or WATCH, not " + store::op_name(frame->op));
    return;
  }
  if (client->watcher) {
    reject(client, Code::kProtocolError,
           store::op_name(frame->op) + " on a WATCH connection (it only receives ABORTED)");
    return;
  }
  switch (frame->op) {
    case store::Op::kHello:
      return handle_hello(client, *frame);
    case store::Op::kWatch:
      return handle_watch(client, *frame);
    case store::Op::kPut:
      return handle_put(client, *frame);
    case store::Op::kGet:
      return handle_get(client, *frame);
    case store::Op::kBarrier:
      return handle_barrier(client, *frame);
    case store::Op::kAllgather:
      return handle_allgather(client, *frame);
    case store::Op::kAbort:
      return handle_abort(client, *frame);
    case store::Op::kBye:
      return handle_bye(client, *frame);
    case store::Op::kMissing:
      return handle_missing(client, *frame);
    default:
      reject(client, Code::kProtocolError,
             store::op_name(frame->op) + " is not a request the store accepts");
  }
}

void StoreServer::on_closed(Client* client) {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    it->second.erase(client->id);
    it = it->second.empty() ? waiting_.erase(it) : std::next(it);
  }
  if (client->rank < 0 || client->watcher) return;
  auto rank = static_cast<std::size_t>(client->rank);
  rank_client_[rank] = 0;
  departed_pid_[rank] = client->pid != 0 ? client->pid : -1;
  departed_at_[rank] = ++departures_;
  FERRY_LOG(kDebug, "%s: %s closed its connection", label_.c_str(),
            StoreConnections::describe(client).c_str());
  fail_rounds(client->rank);
}

void StoreServer::handle_hello(Client* client, const store::Frame& frame) {
  store::Hello hello;
  if (!store::decode_hello(frame.payload, &hello)) {
    return reject(client, Code::kProtocolError, "malformed HELLO");
  }
  if (client->rank >= 0) {
    return reject(client, Code::kProtocolError, "a second HELLO on one connection");
  }
  if (hello.size != size_) {
    return reject(client, Code::kInvalidArgument,
                  "HELLO from rank " + std::to_string(hello.rank) + " says the job has " +
                      std::to_string(hello.size) + " ranks, but this store serves " +
                      std::to_string(size_));
  }
  if (hello.rank < 0 || hello.rank >= size_) {
    return reject(
        client, Code::kInvalidArgument,
        "rank " + std::to_string(hello.rank) + " is outside 0.." + std::to_string(size_ - 1));
  }
  auto rank = static_cast<std::size_t>(hello.rank);
  if (rank_client_[rank] != 0 || departed_pid_[rank] != 0) {
    return reject(client, Code::kInvalidArgument,
                  "rank " + std::to_string(hello.rank) + " (pid " + std::to_string(hello.pid) +
                      ") already connected to this store" +
                      (departed_pid_[rank] != 0 ? " and left" : ""));
  }
  client->rank = hello.rank;
  client->pid = hello.pid;
  rank_client_[rank] = client->id;
  joined_[rank] = true;
  FERRY_LOG(kDebug, "%s: rank %d (pid %d) connected", label_.c_str(), hello.rank, hello.pid);
  send(client, std::make_shared<const store::Bytes>(store::encode_hello_ok()));
}

void StoreServer::handle_put(Client* client, const store::Frame& frame) {
  store::KeyValue kv;
  if (!store::decode_put(frame.payload, &kv)) {
    return reject(client, Code::kProtocolError, "malformed PUT");
  }
  auto& value = values_[kv.key];
  value.assign(kv.value.begin(), kv.value.end());
  auto waiting = waiting_.find(kv.key);
  if (waiting == waiting_.end()) return;
  auto reply = std::make_shared<const store::Bytes>(store::encode_value(kv.key, value));
  std::set<std::uint64_t> ids = std::move(waiting->second);
  waiting_.erase(waiting);
  for (std::uint64_t id : ids) {
    if (Client* waiter = connections_->find(id)) send(waiter, reply);
  }
}

void StoreServer::handle_get(Client* client, const store::Frame& frame) {
  std::string key;
  if (!store::decode_get(frame.payload, &key)) {
    return reject(client, Code::kProtocolError, "malformed GET");
  }
  auto it = values_.find(key);
  if (it != values_.end()) {
    send(client, std::make_shared<const store::Bytes>(store::encode_value(key, it->second)));
  } else {
    // A set: a client that repeats a GET after its own timeout still gets one reply.
    waiting_[key].insert(client->id);
  }
}

void StoreServer::handle_barrier(Client* client, const store::Frame& frame) {
  if (!store::decode_empty(frame.payload)) {
    return reject(client, Code::kProtocolError, "malformed BARRIER");
  }
  auto rank = static_cast<std::size_t>(client->rank);
  if (in_barrier_[rank]) {
    return reject(
        client, Code::kProtocolError,
        "a second BARRIER before barrier round " + std::to_string(barrier_round_) + " completed");
  }
  in_barrier_[rank] = true;
  ++barrier_arrived_;
  if (int gone = missing_departed(in_barrier_); gone >= 0) return fail_rounds(gone);
  if (barrier_arrived_ < size_) return;
  release_all(std::make_shared<const store::Bytes>(store::encode_barrier_done()));
  in_barrier_.assign(in_barrier_.size(), false);
  barrier_arrived_ = 0;
  ++barrier_round_;
}

void StoreServer::handle_allgather(Client* client, const store::Frame& frame) {
  std::span<const std::byte> blob;
  if (!store::decode_allgather(frame.payload, &blob)) {
    return reject(client, Code::kProtocolError, "malformed ALLGATHER");
  }
  auto rank = static_cast<std::size_t>(client->rank);
  if (in_allgather_[rank]) {
    return reject(client, Code::kProtocolError,
                  "a second ALLGATHER before allgather round " + std::to_string(allgather_round_) +
                      " completed");
  }
  in_allgather_[rank] = true;
  gathered_[rank].assign(blob.begin(), blob.end());
  ++allgather_arrived_;
  if (int gone = missing_departed(in_allgather_); gone >= 0) return fail_rounds(gone);
  if (allgather_arrived_ < size_) return;
  std::shared_ptr<const store::Bytes> reply;
  if (std::size_t bytes = store::allgather_done_bytes(gathered_); bytes > store::kMaxFrameBytes) {
    reply = std::make_shared<const store::Bytes>(store::encode_error(
        Code::kInvalidArgument, "allgather round " + std::to_string(allgather_round_) +
                                    " gathered " + std::to_string(bytes) +
                                    " bytes, more than the store's frame limit of " +
                                    std::to_string(store::kMaxFrameBytes)));
  } else {
    reply = std::make_shared<const store::Bytes>(store::encode_allgather_done(gathered_));
  }
  release_all(std::move(reply));
  in_allgather_.assign(in_allgather_.size(), false);
  for (auto& b : gathered_) store::Bytes().swap(b);
  allgather_arrived_ = 0;
  ++allgather_round_;
}

void StoreServer::release_all(const std::shared_ptr<const store::Bytes>& reply) {
  // Highest rank first: rank 0 may host this server (the TCP store), and once its own reply
  // arrives it may go on, or die, before this thread writes the others'. Written in this order,
  // every other rank's reply is in its socket before rank 0 can leave the round.
  for (auto r = rank_client_.size(); r-- > 0;) {
    if (Client* client = connections_->find(rank_client_[r])) send(client, reply);
  }
}

void StoreServer::handle_abort(Client* client, const store::Frame& frame) {
  store::Abort abort;
  if (!store::decode_abort(frame.payload, &abort)) {
    return reject(client, Code::kProtocolError, "malformed ABORT");
  }
  if (on_abort_) on_abort_(client->rank, client->pid, abort.code, abort.reason);
  auto notice = std::make_shared<const store::Bytes>(
      store::encode_aborted(client->rank, abort.code, abort.reason));
  connections_->for_each([&](Client* other) {
    if (other->watcher) send(other, notice);
  });
}

void StoreServer::handle_watch(Client* client, const store::Frame& frame) {
  store::Hello hello;
  if (!store::decode_hello(frame.payload, &hello)) {
    return reject(client, Code::kProtocolError, "malformed WATCH");
  }
  if (hello.size != size_ || hello.rank < 0 || hello.rank >= size_) {
    return reject(client, Code::kInvalidArgument,
                  "WATCH from rank " + std::to_string(hello.rank) + " of " +
                      std::to_string(hello.size) + ", but this store serves ranks 0.." +
                      std::to_string(size_ - 1));
  }
  client->watcher = true;
  client->rank = hello.rank;
  client->pid = hello.pid;
  send(client, std::make_shared<const store::Bytes>(store::encode_hello_ok()));
}

void StoreServer::handle_bye(Client* client, const store::Frame& frame) {
  if (!store::decode_empty(frame.payload)) {
    return reject(client, Code::kProtocolError, "malformed BYE");
  }
  finalized_[static_cast<std::size_t>(client->rank)] = true;
}

void StoreServer::handle_missing(Client* client, const store::Frame& frame) {
  if (!store::decode_empty(frame.payload)) {
    return reject(client, Code::kProtocolError, "malformed MISSING");
  }
  const auto rank = static_cast<std::size_t>(client->rank);
  std::string text;
  if (in_allgather_[rank]) {
    text =
        "allgather round " + std::to_string(allgather_round_) + ": " + waiting_for(in_allgather_);
  } else if (in_barrier_[rank]) {
    text = "barrier round " + std::to_string(barrier_round_) + ": " + waiting_for(in_barrier_);
  } else {
    text = "this rank is in no barrier or allgather round";
  }
  send(client, std::make_shared<const store::Bytes>(store::encode_missing_list(text)));
}

std::string StoreServer::waiting_for(const std::vector<bool>& joined) const {
  std::vector<int> unconnected, absent, left;
  for (std::size_t r = 0; r < joined.size(); ++r) {
    if (joined[r]) continue;
    const int rank = static_cast<int>(r);
    if (departed_pid_[r] != 0) {
      left.push_back(rank);
    } else if (rank_client_[r] == 0) {
      unconnected.push_back(rank);
    } else {
      absent.push_back(rank);
    }
  }
  auto list = [](const std::vector<int>& ranks) {
    std::string out = ranks.size() == 1 ? "rank" : "ranks";
    for (std::size_t i = 0; i < ranks.size() && i < 32; ++i) {
      out += (i == 0 ? " " : ", ") + std::to_string(ranks[i]);
    }
    if (ranks.size() > 32) out += " and " + std::to_string(ranks.size() - 32) + " more";
    return out;
  };
  std::string out;
  auto add = [&](const std::vector<int>& ranks, const char* why) {
    if (ranks.empty()) return;
    out += (out.empty() ? "" : "; ") + list(ranks) + why;
  };
  add(unconnected, " never connected to the store (not started, or not yet in Context::init)");
  add(absent, " connected but had not arrived");
  add(left, " left the job");
  return out.empty() ? "every rank has arrived" : "waiting for " + out;
}

void StoreServer::rank_exited(int rank, int pid, const std::string& how) {
  if (!valid(rank)) return;
  const auto r = static_cast<std::size_t>(rank);
  exit_note_[r] = how;
  if (joined_[r] || departed_pid_[r] != 0) return;  // its closed connection said it already
  departed_pid_[r] = pid > 0 ? pid : -1;
  departed_at_[r] = ++departures_;
  FERRY_LOG(kDebug, "%s: rank %d %s before it joined", label_.c_str(), rank, how.c_str());
  fail_rounds(rank);
}

int StoreServer::missing_departed(const std::vector<bool>& joined) const {
  int first = -1;
  for (std::size_t rank = 0; rank < departed_pid_.size(); ++rank) {
    if (departed_pid_[rank] == 0 || joined[rank]) continue;
    if (first < 0 || departed_at_[rank] < departed_at_[static_cast<std::size_t>(first)]) {
      first = static_cast<int>(rank);
    }
  }
  return first;
}

std::string StoreServer::departed_message(int rank, const char* what, std::uint64_t round) const {
  int pid = departed_pid_[static_cast<std::size_t>(rank)];
  if (!joined_[static_cast<std::size_t>(rank)]) {
    return "rank " + std::to_string(rank) + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : "") +
           " " + exit_note_[static_cast<std::size_t>(rank)] +
           " before it joined the job (it never called Context::init, or ended during it), "
           "so the " +
           what + " round " + std::to_string(round) + " cannot complete";
  }
  return "rank " + std::to_string(rank) + (pid > 0 ? " (pid " + std::to_string(pid) + ")" : "") +
         " closed its connection to the store before it joined " + what + " round " +
         std::to_string(round) + ", so the round cannot complete";
}

void StoreServer::fail_rounds(int rank) {
  // Ranks already waiting in a round the departed rank never joined would wait forever: tell
  // them now, and start a fresh round (which fails at once for the next arrival too).
  auto fail_round = [&](std::vector<bool>* joined, int* arrived, std::uint64_t* round,
                        const char* what) {
    if (*arrived == 0 || (*joined)[static_cast<std::size_t>(rank)]) return;
    auto reply = std::make_shared<const store::Bytes>(
        store::encode_error(Code::kPeerFailed, departed_message(rank, what, *round)));
    for (std::size_t r = 0; r < joined->size(); ++r) {
      if (!(*joined)[r]) continue;
      if (Client* client = connections_->find(rank_client_[r])) send(client, reply);
    }
    joined->assign(joined->size(), false);
    *arrived = 0;
    ++*round;
  };
  fail_round(&in_barrier_, &barrier_arrived_, &barrier_round_, "barrier");
  fail_round(&in_allgather_, &allgather_arrived_, &allgather_round_, "allgather");
  if (allgather_arrived_ == 0) {
    for (auto& b : gathered_) store::Bytes().swap(b);
  }
}

}  // namespace ferry::bootstrap
