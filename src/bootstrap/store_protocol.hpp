// Wire format of ferryrun's store: length-prefixed frames on a UNIX stream socket, their encoders
// and bounds-checked decoders, and helpers that send or receive whole frames under a deadline.
// Frame = u32 length (of what follows) + u8 op + payload. Integers travel in host byte order:
// ferryrun's store is on the ranks' host, and the TCP store's ranks are little-endian Linux hosts
// (the only kind ferry builds for).
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.hpp"

namespace ferry::bootstrap::store {

using Bytes = std::vector<std::byte>;
using Clock = std::chrono::steady_clock;

// A frame (op + payload) is at most this long; a larger length prefix is a malformed frame.
inline constexpr std::uint32_t kMaxFrameBytes = 64u << 20;
inline constexpr std::size_t kMaxKeyBytes = 4096;
inline constexpr std::size_t kMaxReasonBytes = 4096;
// Room left for a value or an allgather blob once the op, key and length fields are counted.
inline constexpr std::size_t kMaxValueBytes = kMaxFrameBytes - kMaxKeyBytes - 64;

enum class Op : std::uint8_t {
  // Requests, client to store.
  kHello = 1,      // i32 rank, i32 size, i32 pid; answered by kHelloOk or kError
  kPut = 2,        // string key, bytes value; not answered
  kGet = 3,        // string key; answered by kValue once the key exists
  kBarrier = 4,    // empty; answered by kBarrierDone once every rank arrived
  kAllgather = 5,  // bytes blob; answered by kAllgatherDone (all blobs in rank order)
  kAbort = 6,      // i32 code, string reason; not answered
  kWatch = 7,      // as kHello, on a second connection that only ever receives kAborted
  kBye = 8,        // empty; not answered: this rank finalized, its connection closes next
  kMissing = 9,    // empty; answered by kMissingList: whom this rank's round still waits for
  // Replies, store to client.
  kHelloOk = 16,        // empty
  kValue = 17,          // string key, bytes value
  kBarrierDone = 18,    // empty
  kAllgatherDone = 19,  // u32 count, count x bytes
  kError = 20,          // i32 ferry::Code, string message
  kAborted = 21,        // i32 rank, i32 code, string reason: to watchers, when a rank aborted
  kMissingList = 22,    // string: the ranks a barrier or allgather round waits for, and why
};

// "HELLO", "PUT", ... for messages; "op <n>" for a value that is no op.
std::string op_name(Op op);

struct Frame {
  Op op = Op::kError;
  Bytes payload;
};

// Encoders return whole frames, ready to send. Callers keep keys, values and reasons within the
// limits above (the store client checks them and returns kInvalidArgument instead).
Bytes encode_hello(int rank, int size, int pid);
Bytes encode_put(std::string_view key, std::span<const std::byte> value);
Bytes encode_get(std::string_view key);
Bytes encode_barrier();
Bytes encode_allgather(std::span<const std::byte> blob);
Bytes encode_abort(int code, std::string_view reason);
Bytes encode_hello_ok();
Bytes encode_value(std::string_view key, std::span<const std::byte> value);
Bytes encode_barrier_done();
Bytes encode_allgather_done(std::span<const Bytes> blobs);
Bytes encode_error(Code code, std::string_view message);
Bytes encode_watch(int rank, int size, int pid);
Bytes encode_aborted(int rank, int code, std::string_view reason);
Bytes encode_bye();
Bytes encode_missing();
Bytes encode_missing_list(std::string_view text);

// Payload length of the kAllgatherDone frame for `blobs`, to check it against kMaxFrameBytes
// before building it.
std::size_t allgather_done_bytes(std::span<const Bytes> blobs);

// Decoders read a payload with util::Reader. Each returns false when the payload is short, a
// length is out of bounds, or bytes are left over; views point into the payload.
struct Hello {
  std::int32_t rank = -1;
  std::int32_t size = 0;
  std::int32_t pid = 0;
};
struct KeyValue {
  std::string key;
  std::span<const std::byte> value;
};
struct Abort {
  std::int32_t code = 0;
  std::string reason;
};
struct Aborted {
  std::int32_t rank = -1;
  std::int32_t code = 0;
  std::string reason;
};
struct ErrorReply {
  Code code = Code::kInternal;
  std::string message;
};
[[nodiscard]] bool decode_hello(std::span<const std::byte> payload, Hello* out);
[[nodiscard]] bool decode_put(std::span<const std::byte> payload, KeyValue* out);
[[nodiscard]] bool decode_get(std::span<const std::byte> payload, std::string* key);
[[nodiscard]] bool decode_empty(std::span<const std::byte> payload);
[[nodiscard]] bool decode_allgather(std::span<const std::byte> payload,
                                    std::span<const std::byte>* blob);
[[nodiscard]] bool decode_abort(std::span<const std::byte> payload, Abort* out);
[[nodiscard]] bool decode_value(std::span<const std::byte> payload, KeyValue* out);
// `expected` is the job size: a count that differs is malformed.
[[nodiscard]] bool decode_allgather_done(std::span<const std::byte> payload, std::size_t expected,
                                         std::vector<Bytes>* blobs);
[[nodiscard]] bool decode_error(std::span<const std::byte> payload, ErrorReply* out);
[[nodiscard]] bool decode_aborted(std::span<const std::byte> payload, Aborted* out);
[[nodiscard]] bool decode_missing_list(std::span<const std::byte> payload, std::string* text);

// Accumulates bytes from a non-blocking stream socket and cuts them into frames.
class FrameReader {
 public:
  enum class Read { kData, kWouldBlock, kClosed, kError };
  // One recv() without blocking. kError leaves errno set.
  Read read_some(int fd);
  // Extracts the next complete frame into `frame` and sets *got. A length prefix that is zero or
  // over kMaxFrameBytes returns kProtocolError; the stream cannot be resynchronised after that.
  Status next(Frame* frame, bool* got);
  // Bytes received but not yet returned as frames.
  [[nodiscard]] std::size_t buffered() const { return end_ - start_; }

 private:
  Bytes buffer_;           // allocated room; bytes [start_, end_) hold data
  std::size_t start_ = 0;  // first byte not yet consumed
  std::size_t end_ = 0;    // one past the last byte received
};

// Sends all of `bytes` on a non-blocking socket, polling for room until `deadline` and calling
// `idle` between polls. Returns kPeerFailed when the other end closed the connection, kTimeout
// at the deadline, kIoError for other failures; messages name the failing call.
Status send_all(int fd, std::span<const std::byte> bytes, Clock::time_point deadline,
                const std::function<void()>& idle = {});

// Waits until `reader` holds a whole frame from `fd`. Polls with short timeouts (1 ms growing to
// 10 ms) and calls `idle` between them; without `idle` it sleeps in poll() until data or the
// deadline. Returns kPeerFailed when the connection closed, kTimeout at the deadline,
// kProtocolError for a malformed frame, kIoError for other failures.
Status receive_frame(int fd, FrameReader* reader, Frame* frame, Clock::time_point deadline,
                     const std::function<void()>& idle = {});

// Whether a connected TCP socket reached itself: a connection to a port nobody listens on succeeds
// that way when the kernel picks that same port for the connecting side (a port in the ephemeral
// range). The store's clients treat it as refused.
bool connected_to_itself(int fd);

// Makes the coming close() of `fd` reset the connection instead of holding its port in TIME_WAIT,
// so that rank 0 can still listen on the port a connection to itself used.
void close_without_time_wait(int fd);

}  // namespace ferry::bootstrap::store
