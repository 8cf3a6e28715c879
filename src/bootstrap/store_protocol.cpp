// Encoding, bounds-checked decoding and socket I/O of ferryrun's store frames
// (store_protocol.hpp describes the format).
#include "bootstrap/store_protocol.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "util/wire.hpp"

namespace ferry::bootstrap::store {
namespace {

constexpr std::size_t kHeaderBytes = sizeof(std::uint32_t);
constexpr std::size_t kReadChunk = std::size_t{64} * 1024;

// Starts a frame whose length prefix is patched by finish().
util::Writer start(Op op) {
  util::Writer writer;
  writer.put<std::uint32_t>(0);
  writer.put<std::uint8_t>(static_cast<std::uint8_t>(op));
  return writer;
}

Bytes finish(util::Writer* writer) {
  Bytes frame = writer->take();
  auto length = static_cast<std::uint32_t>(frame.size() - kHeaderBytes);
  std::memcpy(frame.data(), &length, sizeof(length));
  return frame;
}

std::string errno_text(const char* call, int error) {
  return std::string(call) + "() failed: " + std::strerror(error);
}

bool is_closed_errno(int error) {
  return error == EPIPE || error == ECONNRESET || error == ENOTCONN;
}

int ms_until(Clock::time_point deadline) {
  auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(left, 0, 1 << 30));
}

// Polls `fd` for `events` for at most `wait_ms`; returns false (with *status set) on failure.
bool wait_for(int fd, short events, int wait_ms, Status* status) {
  pollfd p{fd, events, 0};
  int rc = ::poll(&p, 1, wait_ms);
  if (rc < 0 && errno != EINTR) {
    *status = Status(Code::kIoError, errno_text("poll", errno));
    return false;
  }
  return true;
}

}  // namespace

std::string op_name(Op op) {
  switch (op) {
    case Op::kHello:
      return "HELLO";
    case Op::kPut:
      return "PUT";
    case Op::kGet:
      return "GET";
    case Op::kBarrier:
      return "BARRIER";
    case Op::kAllgather:
      return "ALLGATHER";
    case Op::kAbort:
      return "ABORT";
    case Op::kHelloOk:
      return "HELLO_OK";
    case Op::kValue:
      return "VALUE";
    case Op::kBarrierDone:
      return "BARRIER_DONE";
    case Op::kAllgatherDone:
      return "ALLGATHER_DONE";
    case Op::kError:
      return "ERROR";
    case Op::kWatch:
      return "WATCH";
    case Op::kAborted:
      return "ABORTED";
    case Op::kBye:
      return "BYE";
    case Op::kMissing:
      return "MISSING";
    case Op::kMissingList:
      return "MISSING_LIST";
  }
  return "op " + std::to_string(static_cast<int>(op));
}

Bytes encode_hello(int rank, int size, int pid) {
  util::Writer w = start(Op::kHello);
  w.put<std::int32_t>(rank);
  w.put<std::int32_t>(size);
  w.put<std::int32_t>(pid);
  return finish(&w);
}

Bytes encode_put(std::string_view key, std::span<const std::byte> value) {
  util::Writer w = start(Op::kPut);
  w.put_string(key);
  w.put_bytes(value);
  return finish(&w);
}

Bytes encode_get(std::string_view key) {
  util::Writer w = start(Op::kGet);
  w.put_string(key);
  return finish(&w);
}

Bytes encode_barrier() {
  util::Writer w = start(Op::kBarrier);
  return finish(&w);
}

Bytes encode_allgather(std::span<const std::byte> blob) {
  util::Writer w = start(Op::kAllgather);
  w.put_bytes(blob);
  return finish(&w);
}

Bytes encode_abort(int code, std::string_view reason) {
  util::Writer w = start(Op::kAbort);
  w.put<std::int32_t>(code);
  w.put_string(reason.substr(0, kMaxReasonBytes));
  return finish(&w);
}

Bytes encode_watch(int rank, int size, int pid) {
  util::Writer w = start(Op::kWatch);
  w.put<std::int32_t>(rank);
  w.put<std::int32_t>(size);
  w.put<std::int32_t>(pid);
  return finish(&w);
}

Bytes encode_aborted(int rank, int code, std::string_view reason) {
  util::Writer w = start(Op::kAborted);
  w.put<std::int32_t>(rank);
  w.put<std::int32_t>(code);
  w.put_string(reason.substr(0, kMaxReasonBytes));
  return finish(&w);
}

Bytes encode_hello_ok() {
  util::Writer w = start(Op::kHelloOk);
  return finish(&w);
}

Bytes encode_value(std::string_view key, std::span<const std::byte> value) {
  util::Writer w = start(Op::kValue);
  w.put_string(key);
  w.put_bytes(value);
  return finish(&w);
}

Bytes encode_barrier_done() {
  util::Writer w = start(Op::kBarrierDone);
  return finish(&w);
}

std::size_t allgather_done_bytes(std::span<const Bytes> blobs) {
  std::size_t bytes = 1 + sizeof(std::uint32_t);
  for (const auto& blob : blobs) bytes += sizeof(std::uint32_t) + blob.size();
  return bytes;
}

Bytes encode_allgather_done(std::span<const Bytes> blobs) {
  util::Writer w = start(Op::kAllgatherDone);
  w.put<std::uint32_t>(static_cast<std::uint32_t>(blobs.size()));
  for (const auto& blob : blobs) w.put_bytes(blob);
  return finish(&w);
}

Bytes encode_bye() {
  util::Writer w = start(Op::kBye);
  return finish(&w);
}

Bytes encode_missing() {
  util::Writer w = start(Op::kMissing);
  return finish(&w);
}

Bytes encode_missing_list(std::string_view text) {
  util::Writer w = start(Op::kMissingList);
  w.put_string(text.substr(0, kMaxReasonBytes));
  return finish(&w);
}

bool decode_missing_list(std::span<const std::byte> payload, std::string* text) {
  util::Reader r(payload);
  return r.get_string(text, kMaxReasonBytes) && r.remaining() == 0;
}

Bytes encode_error(Code code, std::string_view message) {
  util::Writer w = start(Op::kError);
  w.put<std::int32_t>(static_cast<std::int32_t>(code));
  w.put_string(message.substr(0, kMaxReasonBytes));
  return finish(&w);
}

bool decode_hello(std::span<const std::byte> payload, Hello* out) {
  util::Reader r(payload);
  return r.get(&out->rank) && r.get(&out->size) && r.get(&out->pid) && r.remaining() == 0;
}

bool decode_put(std::span<const std::byte> payload, KeyValue* out) {
  util::Reader r(payload);
  return r.get_string(&out->key, kMaxKeyBytes) && r.get_bytes(&out->value, kMaxValueBytes) &&
         r.remaining() == 0;
}

bool decode_get(std::span<const std::byte> payload, std::string* key) {
  util::Reader r(payload);
  return r.get_string(key, kMaxKeyBytes) && r.remaining() == 0;
}

bool decode_empty(std::span<const std::byte> payload) { return payload.empty(); }

bool decode_allgather(std::span<const std::byte> payload, std::span<const std::byte>* blob) {
  util::Reader r(payload);
  return r.get_bytes(blob, kMaxValueBytes) && r.remaining() == 0;
}

bool decode_abort(std::span<const std::byte> payload, Abort* out) {
  util::Reader r(payload);
  return r.get(&out->code) && r.get_string(&out->reason, kMaxReasonBytes) && r.remaining() == 0;
}

bool decode_aborted(std::span<const std::byte> payload, Aborted* out) {
  util::Reader r(payload);
  return r.get(&out->rank) && r.get(&out->code) && r.get_string(&out->reason, kMaxReasonBytes) &&
         r.remaining() == 0;
}

bool decode_value(std::span<const std::byte> payload, KeyValue* out) {
  return decode_put(payload, out);
}

bool decode_allgather_done(std::span<const std::byte> payload, std::size_t expected,
                           std::vector<Bytes>* blobs) {
  util::Reader r(payload);
  std::uint32_t count = 0;
  if (!r.get(&count) || count != expected) return false;
  blobs->clear();
  blobs->reserve(count);
  for (std::uint32_t i = 0; i < count; ++i) {
    std::span<const std::byte> blob;
    if (!r.get_bytes(&blob, kMaxValueBytes)) return false;
    blobs->emplace_back(blob.begin(), blob.end());
  }
  return r.remaining() == 0;
}

bool decode_error(std::span<const std::byte> payload, ErrorReply* out) {
  util::Reader r(payload);
  std::int32_t code = 0;
  if (!r.get(&code) || !r.get_string(&out->message, kMaxReasonBytes) || r.remaining() != 0) {
    return false;
  }
  // An unknown code from a newer store still reads as an error, not as success.
  bool known = code > static_cast<std::int32_t>(Code::kOk) &&
               code <= static_cast<std::int32_t>(Code::kInternal);
  out->code = known ? static_cast<Code>(code) : Code::kBootstrapError;
  return true;
}

FrameReader::Read FrameReader::read_some(int fd) {
  // Room for the rest of a large frame at once rather than many small chunks; the buffer only
  // grows (and zero-fills) when that room is missing. A length that next() rejects gets no room:
  // four bytes of garbage must not cost a 64 MiB allocation.
  std::size_t want = kReadChunk;
  if (buffered() >= kHeaderBytes) {
    std::uint32_t length = 0;
    std::memcpy(&length, buffer_.data() + start_, sizeof(length));
    std::size_t total = kHeaderBytes + length;
    if (length != 0 && length <= kMaxFrameBytes && total > buffered()) {
      want = std::max(want, total - buffered());
    }
  }
  if (buffer_.size() - end_ < want) {
    if (start_ > 0) {
      std::memmove(buffer_.data(), buffer_.data() + start_, end_ - start_);
      end_ -= start_;
      start_ = 0;
    }
    if (buffer_.size() - end_ < want) buffer_.resize(end_ + want);
  }
  ssize_t n = ::recv(fd, buffer_.data() + end_, buffer_.size() - end_, MSG_DONTWAIT);
  if (n > 0) {
    end_ += static_cast<std::size_t>(n);
    return Read::kData;
  }
  if (n == 0) return Read::kClosed;
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return Read::kWouldBlock;
  if (is_closed_errno(errno)) return Read::kClosed;
  return Read::kError;
}

Status FrameReader::next(Frame* frame, bool* got) {
  *got = false;
  if (buffered() < kHeaderBytes) return Status::ok();
  std::uint32_t length = 0;
  std::memcpy(&length, buffer_.data() + start_, sizeof(length));
  if (length == 0 || length > kMaxFrameBytes) {
    return Status(Code::kProtocolError, "frame length " + std::to_string(length) +
                                            " is outside 1.." + std::to_string(kMaxFrameBytes));
  }
  if (buffered() - kHeaderBytes < length) return Status::ok();
  const std::byte* body = buffer_.data() + start_ + kHeaderBytes;
  frame->op = static_cast<Op>(body[0]);
  frame->payload.assign(body + 1, body + length);
  start_ += kHeaderBytes + length;
  if (start_ == end_) {
    start_ = end_ = 0;
    // A large frame's room is given back, so an idle connection holds little memory.
    if (buffer_.size() > 4 * kReadChunk) Bytes().swap(buffer_);
  }
  *got = true;
  return Status::ok();
}

Status send_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline,
                const std::function<void()>& idle) {
  std::size_t sent = 0;
  int wait_ms = 1;
  while (sent < bytes.size()) {
    ssize_t n = ::send(fd, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent += static_cast<std::size_t>(n);
      wait_ms = 1;
      continue;
    }
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
      if (is_closed_errno(errno)) return Status(Code::kPeerFailed, "connection closed");
      return Status(Code::kIoError, errno_text("send", errno));
    }
    if (Clock::now() >= deadline) {
      return Status(Code::kTimeout, "sent " + std::to_string(sent) + " of " +
                                        std::to_string(bytes.size()) + " bytes");
    }
    Status status;
    if (!wait_for(fd, POLLOUT, std::min(idle ? wait_ms : 100, ms_until(deadline)), &status)) {
      return status;
    }
    if (idle) idle();
    wait_ms = std::min(wait_ms * 2, 10);
  }
  return Status::ok();
}

Status receive_frame(int fd, FrameReader* reader, Frame* frame, Clock::time_point deadline,
                     const std::function<void()>& idle) {
  int wait_ms = 1;
  for (;;) {
    bool got = false;
    Status status = reader->next(frame, &got);
    if (!status || got) return status;
    switch (reader->read_some(fd)) {
      case FrameReader::Read::kData:
        wait_ms = 1;
        continue;
      case FrameReader::Read::kClosed:
        return Status(Code::kPeerFailed, "connection closed");
      case FrameReader::Read::kError:
        return Status(Code::kIoError, errno_text("recv", errno));
      case FrameReader::Read::kWouldBlock:
        break;
    }
    if (Clock::now() >= deadline) return Status(Code::kTimeout, "no reply before the deadline");
    if (!wait_for(fd, POLLIN, idle ? std::min(wait_ms, ms_until(deadline)) : ms_until(deadline),
                  &status)) {
      return status;
    }
    if (idle) idle();
    wait_ms = std::min(wait_ms * 2, 10);
  }
}

bool connected_to_itself(int fd) {
  sockaddr_storage self{}, peer{};
  socklen_t self_length = sizeof(self), peer_length = sizeof(peer);
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_length) != 0 ||
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_length) != 0) {
    return false;
  }
  return self_length == peer_length && std::memcmp(&self, &peer, self_length) == 0;
}

void close_without_time_wait(int fd) {
  linger reset{};
  reset.l_onoff = 1;
  reset.l_linger = 0;
  ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset));
}

}  // namespace ferry::bootstrap::store
