// The store server's connections (see store_connections.hpp).
#include "bootstrap/store_connections.hpp"

#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "util/log.hpp"

namespace ferry::bootstrap {
namespace {

constexpr std::uint64_t kListenerId = 0;

}  // namespace

StoreConnections::StoreConnections(util::Fd listener, std::string label, Handler* handler)
    : label_(std::move(label)), handler_(handler), listener_(std::move(listener)) {
  epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  epoll_event event{};
  event.events = EPOLLIN;
  event.data.u64 = kListenerId;
  if (!epoll_.valid() || ::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, listener_.get(), &event) != 0) {
    throw Error(Code::kIoError, label_ + ": " + (epoll_.valid() ? "epoll_ctl" : "epoll_create1") +
                                    "() failed: " + std::strerror(errno));
  }
}

int StoreConnections::port() const {
  sockaddr_storage address{};
  socklen_t length = sizeof(address);
  if (::getsockname(listener_.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return -1;
  }
  if (address.ss_family == AF_INET) {
    return ntohs(reinterpret_cast<const sockaddr_in*>(&address)->sin_port);
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&address)->sin6_port);
  }
  return -1;
}

bool StoreConnections::output_pending() const {
  for (const auto& [id, client] : clients_) {
    if (!client->dead && client->out_front < client->out.size()) return true;
  }
  return false;
}

void StoreConnections::poll(int timeout_ms) {
  epoll_event events[64];
  int n = ::epoll_wait(epoll_.get(), events, 64, timeout_ms);
  for (int i = 0; i < n; ++i) {
    std::uint64_t id = events[i].data.u64;
    if (id == kListenerId) {
      accept_clients();
      continue;
    }
    auto it = clients_.find(id);
    if (it == clients_.end() || it->second->dead) continue;
    Client* client = it->second.get();
    if ((events[i].events & EPOLLOUT) != 0) flush(client);
    if ((events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0 && !client->dead) {
      on_readable(client);
    }
  }
  drop_dead();
}

void StoreConnections::accept_clients() {
  for (;;) {
    int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ECONNABORTED) {
        FERRY_LOG(kWarn, "%s: accept4() failed: %s", label_.c_str(), std::strerror(errno));
      }
      return;
    }
    auto client = std::make_unique<Client>();
    client->id = next_id_++;
    client->fd.reset(fd);
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = client->id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &event) != 0) {
      FERRY_LOG(kWarn, "%s: epoll_ctl() failed: %s", label_.c_str(), std::strerror(errno));
      continue;
    }
    clients_.emplace(client->id, std::move(client));
  }
}

void StoreConnections::on_readable(Client* client) {
  // Read what is there now; frames that arrived before a close (an ABORT sent just before the
  // rank exited) are still served.
  bool closed = false;
  for (int reads = 0; reads < 64 && !closed; ++reads) {
    auto result = client->reader.read_some(client->fd.get());
    if (result == store::FrameReader::Read::kWouldBlock) break;
    if (result == store::FrameReader::Read::kError) {
      FERRY_LOG(kWarn, "%s: recv() from %s failed: %s", label_.c_str(), describe(client).c_str(),
                std::strerror(errno));
      closed = true;
    }
    closed = closed || result == store::FrameReader::Read::kClosed;
  }
  store::Frame frame;
  while (!client->dead && !client->closing) {
    bool got = false;
    Status status = client->reader.next(&frame, &got);
    if (!status) {
      reject(client, Code::kProtocolError, "malformed frame: " + status.message());
      break;
    }
    if (!got) break;
    handler_->on_frame(client, &frame);
  }
  if (closed) close(client);
}

StoreConnections::Client* StoreConnections::find(std::uint64_t id) {
  auto it = clients_.find(id);
  return it != clients_.end() && !it->second->dead ? it->second.get() : nullptr;
}

void StoreConnections::for_each(const std::function<void(Client*)>& visit) {
  for (auto& [id, client] : clients_) {
    if (!client->dead) visit(client.get());
  }
}

void StoreConnections::reject(Client* client, Code code, const std::string& message) {
  FERRY_LOG(kWarn, "%s: dropping %s: %s", label_.c_str(), describe(client).c_str(),
            message.c_str());
  send(client, std::make_shared<const store::Bytes>(store::encode_error(code, message)));
  // Stop reading: nothing more from this client is trusted.
  client->closing = true;
  update_events(client);
  if (!client->dead && client->out_front == client->out.size()) close(client);
}

void StoreConnections::send(Client* client, std::shared_ptr<const store::Bytes> frame) {
  if (client->dead) return;
  client->out.push_back(std::move(frame));
  flush(client);
}

void StoreConnections::flush(Client* client) {
  while (!client->dead && client->out_front < client->out.size()) {
    const store::Bytes& buffer = *client->out[client->out_front];
    ssize_t n = ::send(client->fd.get(), buffer.data() + client->out_offset,
                       buffer.size() - client->out_offset, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
        set_want_write(client, true);
        return;
      }
      // The client went away; its departure is handled like a close.
      close(client);
      return;
    }
    client->out_offset += static_cast<std::size_t>(n);
    if (client->out_offset == buffer.size()) {
      client->out[client->out_front].reset();
      ++client->out_front;
      client->out_offset = 0;
    }
  }
  if (client->dead) return;
  client->out.clear();
  client->out_front = 0;
  set_want_write(client, false);
  if (client->closing) close(client);
}

void StoreConnections::set_want_write(Client* client, bool want) {
  client->want_write = want;
  update_events(client);
}

void StoreConnections::update_events(Client* client) {
  // A closing client is no longer read, so what it keeps sending cannot grow our buffers.
  std::uint32_t events = (client->closing ? 0u : static_cast<std::uint32_t>(EPOLLIN)) |
                         (client->want_write ? static_cast<std::uint32_t>(EPOLLOUT) : 0u);
  if (client->dead || events == client->registered) return;
  epoll_event event{};
  event.events = events;
  event.data.u64 = client->id;
  if (::epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, client->fd.get(), &event) == 0) {
    client->registered = events;
  }
}

void StoreConnections::close(Client* client) {
  if (client->dead) return;
  client->dead = true;
  ::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, client->fd.get(), nullptr);
  handler_->on_closed(client);
}

void StoreConnections::drop_dead() {
  for (auto it = clients_.begin(); it != clients_.end();) {
    it = it->second->dead ? clients_.erase(it) : std::next(it);
  }
}

std::string StoreConnections::describe(const Client* client) {
  if (client->rank < 0) return "a client before its HELLO";
  return "rank " + std::to_string(client->rank) + " (pid " + std::to_string(client->pid) + ")";
}

}  // namespace ferry::bootstrap
