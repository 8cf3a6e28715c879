// ferry::Context and ferry::Request: the public face over the protocol engine.
#include <chrono>
#include <cstdio>
#include <utility>

#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "util/clock.hpp"

namespace ferry {

Context Context::init(const Options& options) { return Context(proto::Engine::create(options)); }

Context::Context(std::unique_ptr<proto::Engine> engine) : engine_(std::move(engine)) {}
Context::Context(Context&&) noexcept = default;
Context& Context::operator=(Context&& other) noexcept {
  if (this != &other) {
    close();
    engine_ = std::move(other.engine_);
    world_ = std::move(other.world_);
  }
  return *this;
}
Context::~Context() { close(); }

void Context::close() noexcept {
  world_.reset();
  if (!engine_) return;
  engine_->shutdown();
  // Requests that outlive the Context still name the engine's slots: the last one to go deletes
  // what is left of it (Request::release_slot).
  if (engine_->requests().retire()) static_cast<void>(engine_.release());
  engine_.reset();
}

int Context::rank() const { return engine_->rank(); }
int Context::size() const { return engine_->size(); }
int Context::local_rank() const { return engine_->job().local_rank(); }
int Context::local_size() const { return engine_->job().local_size(); }
std::vector<int> Context::local_ranks() const { return engine_->job().local_ranks(); }

namespace {

Status reserved(const char* call, Tag tag) {
  char hex[32];
  std::snprintf(hex, sizeof(hex), "%#llx", static_cast<unsigned long long>(tag));
  return Status(Code::kInvalidArgument,
                std::string(call) + ": tag " + hex + " has bit 63 set, which collectives reserve");
}

}  // namespace

Request Context::isend(const void* buffer, std::size_t bytes, int destination, Tag tag) {
  auto entry = engine_->enter();
  if ((tag & kReservedTagBit) != 0) [[unlikely]] {
    return engine_->operations().failed(reserved("isend", tag));
  }
  return engine_->messages().isend(buffer, bytes, destination, tag);
}

Request Context::issend(const void* buffer, std::size_t bytes, int destination, Tag tag) {
  auto entry = engine_->enter();
  if ((tag & kReservedTagBit) != 0) [[unlikely]] {
    return engine_->operations().failed(reserved("issend", tag));
  }
  return engine_->messages().isend(buffer, bytes, destination, tag, /*synchronous=*/true);
}

Request Context::irecv(void* buffer, std::size_t capacity, int source, Tag tag, Tag mask) {
  auto entry = engine_->enter();
  if ((tag & mask & kReservedTagBit) != 0) [[unlikely]] {
    return engine_->operations().failed(reserved("irecv", tag));
  }
  // The bit always takes part in matching, so no receive of ours meets a collective's message.
  return engine_->messages().irecv(buffer, capacity, source, tag & ~kReservedTagBit,
                                   mask | kReservedTagBit);
}

Status Context::send(const void* buffer, std::size_t bytes, int destination, Tag tag) {
  auto entry = engine_->enter();
  if ((tag & kReservedTagBit) == 0) {
    if (std::optional<Status> sent =
            engine_->messages().send_now(buffer, bytes, destination, tag)) {
      return std::move(*sent);
    }
  }
  return wait_send(isend(buffer, bytes, destination, tag));
}

Status Context::ssend(const void* buffer, std::size_t bytes, int destination, Tag tag) {
  auto entry = engine_->enter();
  return wait_send(issend(buffer, bytes, destination, tag));
}

Status Context::wait_send(Request request) {
  Status status = request.wait();
  if (status.code() == Code::kTimeout && !request.test()) {
    // The caller gets the buffer back: nothing may read it after this returns.
    return engine_->messages().abandon_send(request.index_);
  }
  return status;
}

Status Context::recv(void* buffer, std::size_t capacity, int source, Tag tag, MessageInfo* info,
                     Tag mask) {
  auto entry = engine_->enter();
  if ((tag & mask & kReservedTagBit) != 0) [[unlikely]] {
    if (info != nullptr) *info = MessageInfo{};
    return reserved("recv", tag);
  }
  // No Request handle: its wait, info and release would each enter the engine again, on the
  // path from the message's arrival to the caller's next send.
  proto::RequestPool& requests = engine_->requests();
  const std::uint32_t index = engine_->messages().post_recv(
      buffer, capacity, source, tag & ~kReservedTagBit, mask | kReservedTagBit);
  struct Release {  // whatever way this call ends (a wait may throw)
    proto::RequestPool& requests;
    std::uint32_t index;
    ~Release() { static_cast<void>(requests.release(index)); }
  } release{requests, index};
  Status status = engine_->waiting().wait(index);
  if (status.code() == Code::kTimeout && !engine_->messages().cancel(index) &&
      !requests.done(index)) {
    // Matched and receiving: the data is on its way (a dead sender fails it), so finish it.
    int idle = 0;
    while (!requests.done(index)) engine_->waiting().step(&idle);
    status = requests[index].status;
  }
  if (info != nullptr) *info = requests.done(index) ? requests[index].info : MessageInfo{};
  return status;
}

std::optional<MessageInfo> Context::iprobe(int source, Tag tag, Tag mask) {
  auto entry = engine_->enter();
  return engine_->messages().iprobe(source, tag & ~kReservedTagBit, mask | kReservedTagBit);
}

MessageInfo Context::probe(int source, Tag tag, Tag mask) {
  auto entry = engine_->enter();
  const double timeout = engine_->waiting().timeout();
  const auto deadline = util::deadline_after(timeout);
  int idle = 0;
  for (;;) {
    if (auto info = iprobe(source, tag, mask)) return *info;
    if (engine_->liveness().none_can_come(source))
      return MessageInfo{};  // source -1: none will come
    engine_->waiting().step(&idle);
    if (timeout > 0 && util::Clock::now() >= deadline) {
      return MessageInfo{};  // source -1: nothing matched within FERRY_TIMEOUT
    }
  }
}

Status Context::barrier() {
  auto entry = engine_->enter();
  return engine_->barrier();
}
namespace {
// Out of line, so that progress() without the lock (FERRY_THREADS=single) saves no registers.
[[gnu::noinline]] int locked_progress(proto::Engine* engine) {
  auto entry = engine->enter();
  return engine->progress();
}
}  // namespace

int Context::progress() {
  proto::Engine* engine = engine_.get();
  return engine->waiting().threaded() ? locked_progress(engine) : engine->progress();
}
void Context::abort(int code, const std::string& reason) { engine_->abort(code, reason); }
int Context::event_fd() const {
  auto entry = engine_->enter();
  return engine_->waiting().event_fd();
}
bool Context::arm() {
  auto entry = engine_->enter();
  return engine_->waiting().arm();
}
std::string Context::wait_report() const {
  auto entry = engine_->enter();
  return engine_->wait_report();
}

std::string Context::describe_peer(int rank) const {
  auto entry = engine_->enter();
  return engine_->describe_peer(rank);
}
std::vector<std::string> Context::describe_transports() const {
  auto entry = engine_->enter();
  return engine_->links().notes();
}

// ---- Request ----

void Request::release_slot() noexcept {
  bool last = false;
  {
    auto entry = engine_->enter();
    last = engine_->requests().release(index_);
  }
  if (last) delete engine_;  // the last handle of a Context that is gone
}

bool Request::test_slot() {
  auto entry = engine_->enter();
  return engine_->waiting().test(index_);
}

Status Request::wait_slot() {
  if (engine_ == nullptr) return Status(Code::kInvalidArgument, "wait on an empty Request");
  auto entry = engine_->enter();
  return engine_->waiting().wait(index_);
}

Status Request::wait_for(double seconds) {
  if (engine_ == nullptr) return Status(Code::kInvalidArgument, "wait on an empty Request");
  if (done_at_start()) return Status();
  auto entry = engine_->enter();
  return engine_->waiting().wait_for(index_, seconds);
}

bool Request::cancel() {
  if (engine_ == nullptr || done_at_start()) return false;
  auto entry = engine_->enter();
  return engine_->messages().cancel(index_);
}

Status Request::status() const {
  if (engine_ == nullptr) return Status(Code::kInvalidArgument, "status of an empty Request");
  if (done_at_start()) return Status();
  auto entry = engine_->enter();
  if (!engine_->requests().done(index_)) return Status(Code::kInProgress);
  return engine_->requests()[index_].status;
}

MessageInfo Request::info() const {
  if (engine_ == nullptr || done_at_start()) return {};
  auto entry = engine_->enter();
  if (!engine_->requests().done(index_)) return {};
  return engine_->requests()[index_].info;
}

Status Request::wait_all(std::span<Request> requests) {
  Status first;
  for (Request& request : requests) {
    if (!request.valid()) continue;
    Status status = request.wait();
    if (first.is_ok() && !status.is_ok()) first = status;
  }
  return first;
}

std::size_t Request::wait_any(std::span<Request> requests) {
  proto::Engine* engine = nullptr;
  for (const Request& request : requests) {
    if (request.valid()) engine = request.engine_;
  }
  if (engine == nullptr) return requests.size();
  auto entry = engine->enter();
  std::size_t found = requests.size();  // also the answer when FERRY_TIMEOUT runs out
  engine->waiting().wait_until([&] {
    for (std::size_t i = 0; i < requests.size(); ++i) {
      const Request& r = requests[i];
      if (r.valid() && (r.done_at_start() || r.engine_->requests().done(r.index_))) {
        found = i;
        return true;
      }
    }
    return false;
  });
  return found;
}

}  // namespace ferry
