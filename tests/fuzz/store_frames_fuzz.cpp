// Fuzzes the store's wire decoding as both ends see it: a byte stream from a peer is cut into
// frames by FrameReader (through a real socketpair, written in chunks) and every frame goes to
// every decoder, requests (server side) and replies (client side); what decodes must re-encode
// unchanged.
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <vector>

#include "bootstrap/store_protocol.hpp"
#include "fuzz_input.hpp"
#include "util/fd.hpp"

namespace store = ferry::bootstrap::store;
using ferry::Code;
using store::Bytes;

namespace {

// The payload part of an encoded frame (after the length prefix and the op).
bool same_payload(const Bytes& encoded, std::span<const std::byte> payload) {
  return encoded.size() == 5 + payload.size() &&
         std::equal(payload.begin(), payload.end(), encoded.begin() + 5);
}

void check_frame(const store::Frame& frame, std::size_t job_size) {
  (void)store::op_name(frame.op);
  const std::span<const std::byte> p = frame.payload;

  store::Hello hello;
  if (store::decode_hello(p, &hello)) {
    FUZZ_CHECK(same_payload(store::encode_hello(hello.rank, hello.size, hello.pid), p), "HELLO");
  }
  store::KeyValue kv;
  if (store::decode_put(p, &kv)) {
    FUZZ_CHECK(kv.key.size() <= store::kMaxKeyBytes, "PUT key of %zu bytes", kv.key.size());
    FUZZ_CHECK(same_payload(store::encode_put(kv.key, kv.value), p), "PUT");
  }
  store::KeyValue value;
  if (store::decode_value(p, &value)) {
    FUZZ_CHECK(same_payload(store::encode_value(value.key, value.value), p), "VALUE");
  }
  std::string key;
  if (store::decode_get(p, &key)) {
    FUZZ_CHECK(key.size() <= store::kMaxKeyBytes, "GET key of %zu bytes", key.size());
    FUZZ_CHECK(same_payload(store::encode_get(key), p), "GET");
  }
  if (store::decode_empty(p)) {
    FUZZ_CHECK(same_payload(store::encode_barrier(), p), "BARRIER");
    FUZZ_CHECK(same_payload(store::encode_hello_ok(), p), "HELLO_OK");
    FUZZ_CHECK(same_payload(store::encode_barrier_done(), p), "BARRIER_DONE");
  }
  std::span<const std::byte> blob;
  if (store::decode_allgather(p, &blob)) {
    FUZZ_CHECK(blob.size() <= store::kMaxValueBytes, "ALLGATHER blob of %zu bytes", blob.size());
    FUZZ_CHECK(same_payload(store::encode_allgather(blob), p), "ALLGATHER");
  }
  store::Abort abort;
  if (store::decode_abort(p, &abort)) {
    FUZZ_CHECK(abort.reason.size() <= store::kMaxReasonBytes, "ABORT reason too long");
    FUZZ_CHECK(same_payload(store::encode_abort(abort.code, abort.reason), p), "ABORT");
  }
  std::vector<Bytes> blobs;
  if (store::decode_allgather_done(p, job_size, &blobs)) {
    FUZZ_CHECK(blobs.size() == job_size, "%zu blobs for a job of %zu", blobs.size(), job_size);
    FUZZ_CHECK(store::allgather_done_bytes(blobs) == 1 + p.size(), "ALLGATHER_DONE size");
    FUZZ_CHECK(same_payload(store::encode_allgather_done(blobs), p), "ALLGATHER_DONE");
  }
  store::ErrorReply error;
  if (store::decode_error(p, &error)) {
    FUZZ_CHECK(error.code != Code::kOk, "an ERROR reply decoded as success");
    FUZZ_CHECK(error.message.size() <= store::kMaxReasonBytes, "ERROR message too long");
    std::int32_t sent = 0;
    std::memcpy(&sent, p.data(), sizeof(sent));
    if (sent == static_cast<std::int32_t>(error.code)) {
      FUZZ_CHECK(same_payload(store::encode_error(error.code, error.message), p), "ERROR");
    }
  }
}

// A valid length prefix makes FrameReader allocate (and zero) room for the whole frame, up to
// 64 MiB: that takes milliseconds, and mutations make such lengths often. Unless the input asks
// for lengths as they are, the harness folds those over 64 KiB to below it, which keeps the fuzzer
// fast on everything else.
void fold_large_lengths(std::vector<std::byte>* stream) {
  std::size_t offset = 0;
  while (offset + sizeof(std::uint32_t) <= stream->size()) {
    std::uint32_t length = 0;
    std::memcpy(&length, stream->data() + offset, sizeof(length));
    if (length == 0 || length > store::kMaxFrameBytes) return;  // the stream ends in an error
    if (length > 0xffff) {
      length &= 0xffff;
      std::memcpy(stream->data() + offset, &length, sizeof(length));
    }
    offset += sizeof(length) + length;
  }
}

}  // namespace

// Input: u8 job size, u8 how (bits 0-6: bytes per send - 1; bit 7: keep large lengths), then the
// byte stream a peer sends.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::Input in(data, size);
  const std::size_t job_size = in.u8();  // the client's job size, for ALLGATHER_DONE
  const std::uint8_t how = in.u8();
  const std::size_t chunk = 1 + (how & 0x7f);  // bytes per send(): frames straddle reads
  const auto rest = in.rest();
  std::vector<std::byte> stream(rest.begin(), rest.end());
  if ((how & 0x80) == 0) fold_large_lengths(&stream);

  int fds[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds) != 0) {
    std::perror("socketpair");
    std::abort();
  }
  ferry::util::Fd peer(fds[0]), local(fds[1]);

  store::FrameReader reader;
  store::Frame frame;
  std::size_t sent = 0, consumed = 0;
  bool shut = false;
  for (;;) {
    if (sent < stream.size()) {
      ssize_t n = ::send(peer.get(), stream.data() + sent, std::min(chunk, stream.size() - sent),
                         MSG_DONTWAIT | MSG_NOSIGNAL);
      FUZZ_CHECK(n > 0 || errno == EAGAIN, "send: %s", std::strerror(errno));
      if (n > 0) sent += static_cast<std::size_t>(n);
    } else if (!shut) {
      ::shutdown(peer.get(), SHUT_WR);
      shut = true;
    }
    store::FrameReader::Read read = reader.read_some(local.get());
    FUZZ_CHECK(read != store::FrameReader::Read::kError, "recv: %s", std::strerror(errno));
    for (;;) {
      bool got = false;
      ferry::Status status = reader.next(&frame, &got);
      if (!status) {
        FUZZ_CHECK(status.code() == Code::kProtocolError, "%s", status.to_string().c_str());
        return 0;  // a malformed length: the stream cannot be resynchronised
      }
      if (!got) break;
      consumed += 5 + frame.payload.size();
      check_frame(frame, job_size);
    }
    if (read == store::FrameReader::Read::kClosed) break;
  }
  FUZZ_CHECK(consumed + reader.buffered() == stream.size(),
             "%zu bytes in frames + %zu buffered != %zu received", consumed, reader.buffered(),
             stream.size());
  return 0;
}
