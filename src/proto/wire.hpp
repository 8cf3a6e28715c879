// The protocol layer's active messages: ids and headers. Every header is decoded with a size check
// (decode) before use; the values in it are validated by the handler.
#pragma once

#include <cstdint>
#include <cstring>
#include <span>

namespace ferry::proto {

// A message from `source` that breaks the protocol: logged (the first few only, so that a
// hostile peer cannot flood stderr) and dropped by the caller.
void protocol_error(int source, const char* what);

enum AmId : std::uint8_t {
  kAmEager = 1,   // EagerHeader + the whole message
  kAmRts = 2,     // RtsHeader: a large message is ready at `address` in the sender
  kAmCts = 3,     // CtsHeader: the receiver matched it and wants it pipelined (no zero-copy get)
  kAmFrag = 4,    // FragHeader + one chunk of a pipelined message
  kAmFin = 5,     // FinHeader: the receiver is done with the sender's buffer
  kAmCancel = 6,  // CancelHeader: the sender gave up an announced message (FERRY_TIMEOUT)
  kAmNack = 7,    // NackHeader: the sender will not send the fragments a receive waits for
  // Device buffers (proto/device_path.hpp).
  kAmRtsDev = 8,       // RtsDevHeader [+ cuda::IpcKey]: a device buffer is ready in the sender
  kAmStageCts = 9,     // StageCtsHeader: the receiver wants the message through the staging ring
  kAmStageFrag = 10,   // StageFragHeader: one chunk waits in the sender's staging ring
  kAmStageAck = 11,    // StageAckHeader: the receiver has copied a ring slot out
  kAmCtsDirect = 12,   // CtsHeader: a direct receive waits under key rreq; send it directly
  kAmCtsChunked = 13,  // ChunkCtsHeader: send it as direct transfers of `chunk` bytes, in order
  kAmRtsRead = 14,     // RtsReadHeader: as kAmRts, and the buffer may be read with the key
  // One-sided operations (proto/rma/).
  kAmPut = 15,     // PutHeader + bytes to store in a region
  kAmGet = 16,     // GetHeader: send back bytes of a region (as kAmFrag to `id`)
  kAmAtomic = 17,  // AtomicHeader + operand and compare (8 bytes each)
  kAmRmaAck = 18,  // RmaAckHeader: a put fragment stored, an atomic applied, or a refusal
  // Native one-sided access over the network transport, granted by the owner
  // (proto/rma/native.hpp).
  kAmNativeAsk = 19,      // NativeAskHeader: may this rank reach the region by itself?
  kAmNativeGrant = 20,    // NativeGrantHeader: yes, there and under that key; or a refusal
  kAmNativeRevoke = 21,   // NativeRevokeHeader: the region is being deregistered: stop
  kAmNativeRevoked = 22,  // NativeRevokeHeader: no access to the region is in flight here now
  kAmRmaAcks = 23,        // RmaAcksHeader + `count` RmaAckHeaders: kAmRmaAck, several at once

  kAmRevoke = 24,  // RevokeHeader: a communicator was revoked (proto/revocations.hpp)
  kAmPeerDead =
      25,  // PeerDeadHeader: a rank of the sender's node exited (Engine::look_for_failures)
  // Device buffers again (proto/device_path.hpp).
  kAmStageWritten = 26,  // StageWrittenHeader: the sender wrote the message into the offered key
  // Host messages copied from both ends (transport::SplitCopies).
  kAmCtsSplit = 27,  // CtsSplitHeader: the receiver reads the head; the sender may write the tail
  kAmTailWritten =
      28,  // TailWrittenHeader: the sender claimed the tail and wrote it (or could not)
  // The sender's Context is ending (Engine::finalize): after everything it sent, nothing more.
  kAmBye = 29,  // ByeHeader
};

// RtsHeader::address of a message in device memory sent to a peer that shares no memory with us
// (there is nothing to get from it; the receiver asks for chunks, kAmCtsChunked).
constexpr std::uint64_t kRtsFromDevice = ~std::uint64_t{0};

struct EagerHeader {
  std::uint64_t tag;
};
struct RtsHeader {
  std::uint64_t tag;
  std::uint64_t size;
  std::uint64_t sreq;
  std::uint64_t address;
};
struct RtsReadHeader {
  std::uint64_t tag;
  std::uint64_t size;
  std::uint64_t sreq;
  std::uint64_t
      address;  // for OneSidedReads::read_direct (an offset where the transport wants one)
  std::uint64_t key;
};
struct CtsHeader {
  std::uint64_t sreq;
  std::uint64_t rreq;
  std::uint64_t length;
};
struct ChunkCtsHeader {
  std::uint64_t sreq;
  std::uint64_t rreq;
  std::uint64_t length;
  std::uint64_t chunk;  // bytes per direct transfer (the last may be shorter)
};
struct FragHeader {
  std::uint64_t rreq;
  std::uint64_t offset;
};
struct FinHeader {
  std::uint64_t sreq;
  std::uint32_t code;  // FinCode
  std::uint32_t reserved;
};
enum FinCode : std::uint32_t {
  kFinDone = 0,  // the message was received
  kFinFailed =
      1,  // the receiver could not receive it (IPC copy, staging, chunks): so fails the send
  kFinNeverMatched = 2,  // the receiver finalized with the message announced and no receive for it
};

struct RtsDevHeader {
  std::uint64_t tag;
  std::uint64_t size;
  std::uint64_t sreq;
  std::uint32_t flags;  // kRtsHasKey
  std::uint32_t reserved;
};
constexpr std::uint32_t kRtsHasKey = 1;  // a cuda::IpcKey follows
struct StageCtsHeader {
  std::uint64_t sreq;
  std::uint64_t rreq;
  std::uint64_t length;
  std::uint32_t flags;  // kStageIpcRefused, kStageHasKey
  std::uint32_t reserved;
};
constexpr std::uint32_t kStageIpcRefused = 1;  // the receiver could not use the IPC key
// A cuda::IpcKey of the receive buffer follows: a sender of page-locked host memory may write
// the message into it by its own GPU and say so with STAGE_WRITTEN, instead of staging it.
constexpr std::uint32_t kStageHasKey = 2;
struct StageFragHeader {
  std::uint64_t rreq;
  std::uint64_t offset;       // in the message
  std::uint64_t ring_offset;  // in the sender's ring
  std::uint64_t length;
};
struct StageAckHeader {
  std::uint64_t ring_offset;
};
struct StageWrittenHeader {
  std::uint64_t rreq;
  std::uint64_t length;  // the STAGE_CTS's length: all of it was written
};

struct CtsSplitHeader {
  std::uint64_t sreq;
  std::uint64_t rreq;
  std::uint64_t address;  // of the receive buffer, in the receiver
  std::uint64_t offset;   // the tail: [offset, length) of the message
  std::uint64_t length;
  std::uint64_t ticket;  // the claim word's ticket (SplitCopies::Claim)
  std::uint32_t slot;    // the claim word
  std::uint32_t reserved;
};
struct TailWrittenHeader {
  std::uint64_t rreq;
  std::uint32_t code;  // 0: written; else the sender's Code, and the receiver copies the tail
  std::uint32_t reserved;
};

struct CancelHeader {
  std::uint64_t sreq;
};
struct NackHeader {
  std::uint64_t rreq;
};

// One-sided operations: `id` is the initiator's request; `region` and `secret` come from the key.
struct PutHeader {
  std::uint64_t id;
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t offset;  // in the region, of this fragment's first byte
};
struct GetHeader {
  std::uint64_t id;
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t offset;
  std::uint64_t length;
};
struct AtomicHeader {
  std::uint64_t id;
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t offset;
  std::uint8_t op;     // ferry::AtomicOp
  std::uint8_t width;  // 4 or 8
  std::uint8_t reserved[6];
};
struct RmaAckHeader {
  std::uint64_t id;
  std::uint64_t value;  // put: bytes stored; atomic: the previous value
  std::uint32_t code;   // RmaRefusal (0: done)
  std::uint32_t reserved;
};
// The answers (RmaAckHeader) one batch of messages produced for one peer, sent as one message
// (Engine::send_acks).
inline constexpr std::uint32_t kMaxAcksPerMessage = 256;
struct RmaAcksHeader {
  std::uint32_t count;  // 1 to kMaxAcksPerMessage
  std::uint32_t reserved;
};
struct NativeAskHeader {
  std::uint64_t region;
  std::uint64_t secret;
};
struct NativeGrantHeader {
  std::uint64_t region;
  std::uint64_t secret;   // as asked
  std::uint64_t address;  // where the network transport reaches the region's first byte
  std::uint64_t key;      // the provider's key for it
  std::uint64_t size;
  std::uint32_t code;  // RmaRefusal (0: granted)
  std::uint32_t reserved;
};
struct NativeRevokeHeader {
  std::uint64_t region;
};
enum RmaRefusal : std::uint32_t {
  kRmaOk = 0,
  kRmaNoRegion = 1,    // no such region (never registered, or deregistered)
  kRmaBadKey = 2,      // the region exists but the key's secret does not match
  kRmaOutOfRange = 3,  // offset and length reach outside the region
  kRmaBadAtomic = 4,   // unknown op, width not 4 or 8, or a misaligned word
  kRmaCutShort = 5,    // the region was deregistered while a get was answered from it
  kRmaDeviceCopy = 6,  // the region is device memory and the owner's CUDA copy failed
  kRmaNotNative = 7,   // the region is not registered with the network transport
  kRmaReadOnly = 8,    // a put or atomic on a region registered from read-only memory
  kRmaUnmapped = 9,    // the owner's memory behind the region is no longer mapped (writable)
};

// kAmRevoke: communicator `id` (its base id, no stream-twin bit) was revoked by job rank `by`.
struct RevokeHeader {
  std::uint32_t id;
  std::int32_t by;
};

// kAmPeerDead: job rank `rank`, on the sender's node, exited (seen by its pid there).
struct PeerDeadHeader {
  std::int32_t rank;
  std::int32_t reserved;
};

struct ByeHeader {
  std::uint64_t reserved;
};

template <typename H>
std::span<const std::byte> as_bytes(const H& header) {
  return {reinterpret_cast<const std::byte*>(&header), sizeof(H)};
}

// Copies a header out of `data`; false when `data` is too short.
template <typename H>
[[nodiscard]] bool decode(std::span<const std::byte> data, H* header) {
  if (data.size() < sizeof(H)) return false;
  std::memcpy(header, data.data(), sizeof(H));
  return true;
}

}  // namespace ferry::proto
