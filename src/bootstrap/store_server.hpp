// The ranks' key-value store: a single-threaded, non-blocking server that answers HELLO, PUT, GET,
// BARRIER, ALLGATHER and ABORT (store_protocol.hpp), and tells WATCH connections when a rank
// aborted. ferryrun serves it on a UNIX socket inside its event loop (poll fd() with the
// launcher's other fds, then call poll(0)); the TCP store's rank 0 serves it on a TCP port from a
// thread of its own (tcp_store.hpp). The sockets are store_connections.hpp's; this is what the
// requests mean.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "bootstrap/store_connections.hpp"
#include "bootstrap/store_protocol.hpp"
#include "util/fd.hpp"

namespace ferry::bootstrap {

class StoreServer final : private StoreConnections::Handler {
 public:
  // Called when a rank sends ABORT; the launcher ends the job.
  using AbortFn = std::function<void(int rank, int pid, int code, const std::string& reason)>;

  // Listens on `path` (which must not exist yet) for a job of `size` ranks. Throws
  // ferry::Error(kIoError) naming the path and the failed call.
  StoreServer(std::string path, int size, AbortFn on_abort);
  // The TCP store: listens on `host`:`port` (port 0: any free one, see port()). Throws
  // ferry::Error(kBootstrapError) naming the address and why it cannot listen there.
  static std::unique_ptr<StoreServer> listen_tcp(const std::string& host, int port, int size,
                                                 AbortFn on_abort);
  // Closes every connection and removes the socket file.
  ~StoreServer() override;
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // An epoll descriptor that is readable whenever poll(0) has something to do.
  [[nodiscard]] int fd() const { return connections_->fd(); }
  // Accepts connections and serves requests that are ready, waiting at most `timeout_ms` for the
  // first event (0: never blocks, -1: waits). Misbehaving clients get an error reply and are
  // dropped; the server itself never fails here.
  void poll(int timeout_ms) { connections_->poll(timeout_ms); }

  [[nodiscard]] const std::string& path() const { return path_; }
  // The TCP port listened on, or -1 for a UNIX socket.
  [[nodiscard]] int port() const { return connections_->port(); }
  [[nodiscard]] int size() const { return size_; }
  // Ranks whose HELLO was accepted and whose connection is still open.
  [[nodiscard]] int connected_ranks() const;
  // Whether replies or notices still wait for room in some client's socket.
  [[nodiscard]] bool output_pending() const { return connections_->output_pending(); }
  // Whether `rank` said HELLO and has since closed its connection (cleanly or not), or exited
  // without ever saying it (rank_exited).
  [[nodiscard]] bool departed(int rank) const {
    return rank >= 0 && static_cast<std::size_t>(rank) < departed_pid_.size() &&
           departed_pid_[static_cast<std::size_t>(rank)] != 0;
  }
  // Whether `rank` joined the job (its HELLO was accepted), and whether it then finalized (BYE):
  // a rank that joined and exited without finalizing left its peers waiting.
  [[nodiscard]] bool joined(int rank) const { return valid(rank) && joined_[rank]; }
  [[nodiscard]] bool finalized(int rank) const { return valid(rank) && finalized_[rank]; }
  // The launcher saw `rank` (process `pid`) end, as `how` says ("exited with code 0"). A rank
  // that never joined cannot join any more: the rounds waiting for it fail at once, naming it,
  // instead of running into FERRY_BOOTSTRAP_TIMEOUT.
  void rank_exited(int rank, int pid, const std::string& how);

 private:
  using Client = StoreConnections::Client;

  [[nodiscard]] bool valid(int rank) const {
    return rank >= 0 && static_cast<std::size_t>(rank) < joined_.size();
  }

  StoreServer(util::Fd listener, std::string label, std::string path, int size, AbortFn on_abort);

  void on_frame(Client* client, store::Frame* frame) override;
  // A connection ended: its GETs are forgotten, and a rank's departure fails the rounds it never
  // joined.
  void on_closed(Client* client) override;
  void handle_hello(Client* client, const store::Frame& frame);
  void handle_put(Client* client, const store::Frame& frame);
  void handle_get(Client* client, const store::Frame& frame);
  void release_all(const std::shared_ptr<const store::Bytes>& reply);
  void handle_barrier(Client* client, const store::Frame& frame);
  void handle_allgather(Client* client, const store::Frame& frame);
  void handle_abort(Client* client, const store::Frame& frame);
  void handle_watch(Client* client, const store::Frame& frame);
  void handle_bye(Client* client, const store::Frame& frame);
  void handle_missing(Client* client, const store::Frame& frame);
  // The ranks a round whose arrivals are `joined` waits for, by what keeps them: "rank 2 has not
  // connected; rank 3 connected but has not arrived; rank 1 left".
  [[nodiscard]] std::string waiting_for(const std::vector<bool>& joined) const;
  void reject(Client* client, Code code, const std::string& message) {
    connections_->reject(client, code, message);
  }
  void send(Client* client, std::shared_ptr<const store::Bytes> frame) {
    connections_->send(client, std::move(frame));
  }
  // A rank left: rounds it never joined can no longer complete.
  void fail_rounds(int rank);
  // The rank that left the job first among those missing from the round whose arrivals are
  // `joined`, or -1.
  [[nodiscard]] int missing_departed(const std::vector<bool>& joined) const;
  [[nodiscard]] std::string departed_message(int rank, const char* what, std::uint64_t round) const;

  std::string path_;                             // the UNIX socket to remove, or empty
  std::string label_;                            // "ferryrun store" or "TCP store", for messages
  std::optional<StoreConnections> connections_;  // made once the job's size is known to be valid
  int size_;
  AbortFn on_abort_;
  std::vector<std::uint64_t> rank_client_;  // client id per rank, 0 when not connected
  std::vector<int> departed_pid_;           // pid of a rank that closed its connection, else 0
  std::vector<bool> joined_;                // HELLO accepted once
  std::vector<bool> finalized_;             // BYE received
  std::vector<std::string> exit_note_;      // how a rank that never joined ended (rank_exited)
  std::vector<std::uint64_t> departed_at_;  // order of departures (1 first): the first is the cause
  std::uint64_t departures_ = 0;
  std::map<std::string, store::Bytes> values_;
  std::map<std::string, std::set<std::uint64_t>> waiting_;  // GETs on keys not put yet
  std::vector<bool> in_barrier_;
  int barrier_arrived_ = 0;
  std::uint64_t barrier_round_ = 0;
  std::vector<store::Bytes> gathered_;
  std::vector<bool> in_allgather_;
  int allgather_arrived_ = 0;
  std::uint64_t allgather_round_ = 0;
};

}  // namespace ferry::bootstrap
