// The store server's connections: a listening socket, its clients and one epoll set, read and
// written without ever blocking. It cuts what clients send into frames (store_protocol.hpp) and
// hands each to the server (Handler); what it sends waits in the client's queue for room in its
// socket. What the frames mean is the server's (store_server.hpp).
#pragma once

#include <sys/epoll.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bootstrap/store_protocol.hpp"
#include "ferry/ferry.hpp"
#include "util/fd.hpp"

namespace ferry::bootstrap {

class StoreConnections {
 public:
  struct Client {
    std::uint64_t id = 0;
    util::Fd fd;
    store::FrameReader reader;
    // Replies still to send; an allgather result is shared by every rank's queue.
    std::vector<std::shared_ptr<const store::Bytes>> out;
    std::size_t out_front = 0;           // index of the first unsent buffer in `out`
    std::size_t out_offset = 0;          // bytes of out[out_front] already sent
    bool want_write = false;             // replies wait for room in the socket
    std::uint32_t registered = EPOLLIN;  // the epoll events asked for now
    bool closing = false;                // drop once `out` is flushed (after an error reply)
    bool dead = false;                   // dropped at the end of this poll()
    // The server's: set by an accepted HELLO or WATCH.
    int rank = -1;
    int pid = 0;
    bool watcher = false;  // a WATCH connection: receives ABORTED, sends nothing more
  };

  class Handler {
   public:
    virtual ~Handler() = default;
    // A whole frame from `client` (not closing, not dead).
    virtual void on_frame(Client* client, store::Frame* frame) = 0;
    // `client`'s connection ended (it closed, a send failed, or it was rejected); called once,
    // before the client is dropped.
    virtual void on_closed(Client* client) = 0;
  };

  // Watches `listener` (listening already) for `handler`; `label` names the server in messages
  // ("ferryrun store"). Throws ferry::Error(kIoError) if the epoll set cannot be made.
  StoreConnections(util::Fd listener, std::string label, Handler* handler);
  ~StoreConnections() { clients_.clear(); }
  StoreConnections(const StoreConnections&) = delete;
  StoreConnections& operator=(const StoreConnections&) = delete;

  // Readable whenever poll(0) has something to do.
  [[nodiscard]] int fd() const { return epoll_.get(); }
  // The TCP port listened on, or -1 for a UNIX socket.
  [[nodiscard]] int port() const;
  [[nodiscard]] const std::string& label() const { return label_; }
  // Accepts connections and reads and writes what is ready, waiting at most `timeout_ms` for the
  // first event; frames go to the handler. Clients that closed are dropped at the end.
  void poll(int timeout_ms);
  // Whether replies or notices still wait for room in some client's socket.
  [[nodiscard]] bool output_pending() const;

  // The live client `id`, or null.
  [[nodiscard]] Client* find(std::uint64_t id);
  void for_each(const std::function<void(Client*)>& visit);
  // Queues `frame` for `client` and sends what its socket takes now.
  void send(Client* client, std::shared_ptr<const store::Bytes> frame);
  // Replies with an error and drops the client once the reply has left.
  void reject(Client* client, Code code, const std::string& message);
  // Ends `client`'s connection now (the handler's on_closed runs).
  void close(Client* client);
  // "rank 3 (pid 1234)", or "a client before its HELLO".
  [[nodiscard]] static std::string describe(const Client* client);

 private:
  void accept_clients();
  void on_readable(Client* client);
  void flush(Client* client);
  void set_want_write(Client* client, bool want);
  // Re-registers with epoll when want_write or closing changed.
  void update_events(Client* client);
  void drop_dead();

  std::string label_;
  Handler* handler_;
  util::Fd listener_;
  util::Fd epoll_;
  std::uint64_t next_id_ = 1;  // 0 is the listener
  std::map<std::uint64_t, std::unique_ptr<Client>> clients_;
};

}  // namespace ferry::bootstrap
