// ferry public API: a Context per process, tag-matched point-to-point messages with MPI-like
// matching rules, requests, probe and barrier. Everything a user of ferry sees is in include/ferry.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "ferry/status.hpp"
#include "ferry/version.hpp"

namespace ferry {

using Tag = std::uint64_t;
inline constexpr Tag kFullMask = ~Tag{0};
inline constexpr int kAnySource = -1;

namespace proto {
class Engine;
}

// What a completed receive (or a probe) learned about the message.
struct MessageInfo {
  int source = -1;
  Tag tag = 0;
  std::size_t bytes = 0;  // for a receive: bytes delivered; for a probe: the message size
};

// A non-blocking operation. Movable, not copyable. Dropping an incomplete Request does not cancel
// the operation: a send still goes out and a receive stays posted (like MPI_Request_free).
class Request {
 public:
  Request() noexcept = default;
  Request(Request&& other) noexcept;
  Request& operator=(Request&& other) noexcept;
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;
  ~Request();

  [[nodiscard]] bool valid() const noexcept { return engine_ != nullptr; }
  // Drives progress once; true when the operation has completed (successfully or not).
  bool test();
  // Drives progress until the operation completes (or FERRY_TIMEOUT passes: kTimeout, and the
  // operation stays pending); returns its status.
  Status wait();
  // Like wait, but gives up after `seconds` with Code::kTimeout; the operation stays pending
  // (wait again, or cancel a receive).
  Status wait_for(double seconds);
  // Cancels a receive that has not matched yet. True if it was canceled (its status is then
  // kCanceled); false for sends and for receives that already matched.
  bool cancel();

  // Valid after completion.
  [[nodiscard]] Status status() const;
  [[nodiscard]] MessageInfo info() const;

  // Waits for all; returns the first non-ok status (all are waited for even after a failure).
  static Status wait_all(std::span<Request> requests);
  // Waits until one completes; returns its index. Requests that are not valid are skipped;
  // returns requests.size() when none is valid.
  static std::size_t wait_any(std::span<Request> requests);

 private:
  friend class proto::Engine;
  friend class Context;
  // The handle keeps its slot alive (the engine frees it only once released), so the index alone
  // names the operation.
  Request(proto::Engine* engine, std::uint32_t index) noexcept : engine_(engine), index_(index) {}
  void release() noexcept;

  proto::Engine* engine_ = nullptr;
  std::uint32_t index_ = 0;
};

struct Options {
  // Overrides for FERRY_* variables (name without or with the FERRY_ prefix), taking precedence
  // over the environment. Validated like the environment.
  std::map<std::string, std::string> config;
};

// One per process. Not thread-safe yet: call it from one thread at a time.
class Context {
 public:
  // Joins the job described by the environment (ferryrun's variables), or a job of one process
  // when none is set. Throws ferry::Error with what failed and why.
  static Context init(const Options& options = {});

  Context(Context&&) noexcept;
  Context& operator=(Context&&) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;
  // Finalizes: drains queued sends, waits for the other ranks (bounded), releases every resource.
  ~Context();

  [[nodiscard]] int rank() const;
  [[nodiscard]] int size() const;
  [[nodiscard]] int local_rank() const;
  [[nodiscard]] int local_size() const;
  // Ranks of the processes on this node (this one included), in local-rank order. The launcher
  // says where it can (PMIx, ferryrun); otherwise ranks compare node identities (boot id,
  // namespaces, /dev/shm), so containers and network namespaces count as separate nodes.
  [[nodiscard]] std::vector<int> local_ranks() const;

  Request isend(const void* buffer, std::size_t bytes, int destination, Tag tag);
  // Receives the first message from `source` (or kAnySource) whose tag matches `tag` on the bits
  // set in `mask`. Messages from one sender that match are received in the order they were sent.
  Request irecv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask = kFullMask);

  // Blocking forms. With FERRY_TIMEOUT set they give up after it with kTimeout: a send withdraws
  // what the receiver has not taken (it never reads the buffer after returning); a receive that
  // has not matched is canceled.
  Status send(const void* buffer, std::size_t bytes, int destination, Tag tag);
  Status recv(void* buffer, std::size_t capacity, int source, Tag tag, MessageInfo* info = nullptr,
              Tag mask = kFullMask);

  // A message that a receive with these arguments would match, without receiving it.
  std::optional<MessageInfo> iprobe(int source, Tag tag, Tag mask = kFullMask);
  // Waits for such a message; with FERRY_TIMEOUT set, returns source -1 when none came in time.
  MessageInfo probe(int source, Tag tag, Tag mask = kFullMask);

  // All ranks enter before any leaves; progresses communication while waiting.
  Status barrier();

  // Moves pending work forward; returns the number of events handled.
  int progress();

  // Ends the whole job: the launcher stops every rank and exits with `code`, printing `reason`.
  // Does not return (the process exits with `code` if the launcher has not killed it within 10 s).
  [[noreturn]] void abort(int code, const std::string& reason);

  // Per peer: the transport in use and why (for ferry-info and error messages).
  [[nodiscard]] std::string describe_peer(int rank) const;
  // The transports this process has, and why the absent ones are absent.
  [[nodiscard]] std::vector<std::string> describe_transports() const;

 private:
  explicit Context(std::unique_ptr<proto::Engine> engine);
  std::unique_ptr<proto::Engine> engine_;
};

}  // namespace ferry
