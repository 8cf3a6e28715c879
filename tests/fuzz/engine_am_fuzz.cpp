// Fuzzes the protocol engine's handling of active messages from a peer (Engine::on_am): a
// single-process engine gets a few receives and sends posted, then a sequence of eager, RTS, CTS,
// FRAG, FIN and unknown messages taken from the input, then progress; all is drained per input.
#include <array>
#include <cstddef>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "ferry/ferry.hpp"
#include "fuzz_input.hpp"
#include "proto/engine.hpp"
#include "proto/messages.hpp"
#include "proto/wire.hpp"

namespace proto = ferry::proto;
using ferry::Code;
using ferry::Request;

namespace {

constexpr std::size_t kMaxCapacity = 64 * 1024;
constexpr std::size_t kRendezvousBytes = 40000;  // over the default FERRY_RNDV_THRESHOLD (32 KiB)
constexpr std::array<std::size_t, 8> kCapacities = {0, 1, 8, 100, 1024, 4096, 40000, kMaxCapacity};
constexpr std::uint8_t kProgressCommand = 0xff;  // an "id" that runs progress() instead

// The self transport's get is a memcpy from the address in the RTS: the sender is this very
// process, so that address is trusted by design. Forged RTS addresses are pointed here instead
// (large enough for any receive); the shm transport reads them with process_vm_readv, which fails
// cleanly, and is not in a single-process engine.
alignas(64) std::byte g_remote[kMaxCapacity];
alignas(64) std::byte g_recv[4][kMaxCapacity];
alignas(64) std::byte g_send[kRendezvousBytes];
alignas(64) std::byte g_drain[kMaxCapacity];
// A registered region one-sided messages may name (with its real id and secret, on request).
alignas(64) std::byte g_window[4096];
std::uint64_t g_region = 0;
std::uint64_t g_secret = 0;

std::unique_ptr<proto::Engine> g_engine;

// A copy of RequestPool's slot and generation bookkeeping (proto/request_pool.hpp), so that the
// harness knows the wire id of each request it posts and can put live ids into forged messages
// even though the engine lives across inputs. Exact because every request is complete before the
// harness drops its Request; LLVMFuzzerInitialize checks it against the engine.
class PoolModel {
 public:
  std::uint32_t allocate() {
    if (!free_.empty()) {
      std::uint32_t index = free_.back();
      free_.pop_back();
      return index;
    }
    generation_.push_back(1);
    return static_cast<std::uint32_t>(generation_.size() - 1);
  }
  void free(std::uint32_t index) {
    if (++generation_[index] == 0) generation_[index] = 1;
    free_.push_back(index);
  }
  [[nodiscard]] std::uint64_t wire_id(std::uint32_t index) const {
    return (std::uint64_t{generation_[index]} << 32) | index;
  }

 private:
  std::vector<std::uint32_t> generation_;
  std::vector<std::uint32_t> free_;
};
PoolModel g_pool;

struct Posted {
  Request request;
  std::uint32_t index = 0;
};

Posted post_recv(std::byte* buffer, std::size_t capacity, int source, ferry::Tag tag,
                 ferry::Tag mask) {
  std::uint32_t index = g_pool.allocate();
  return {g_engine->messages().irecv(buffer, capacity, source, tag, mask), index};
}

Posted post_send(std::size_t bytes, ferry::Tag tag) {
  std::uint32_t index = g_pool.allocate();
  return {g_engine->messages().isend(g_send, bytes, 0, tag), index};
}

bool is_done(const Posted& posted) { return posted.request.status().code() != Code::kInProgress; }

void drop(Posted* posted) {
  FUZZ_CHECK(is_done(*posted), "request %u still in progress after the drain", posted->index);
  posted->request = Request();
  g_pool.free(posted->index);
}

// Progresses and receives every unexpected message until nothing moves any more.
void drain() {
  for (int round = 0; round < 1000; ++round) {
    int events = g_engine->progress();
    bool received = false;
    while (g_engine->messages().iprobe(ferry::kAnySource, 0, 0)) {
      Posted sink = post_recv(g_drain, kMaxCapacity, ferry::kAnySource, 0, 0);
      // Eager and host rendezvous messages complete at once (the self transport's get is a
      // memcpy); a device rendezvous (RTS_DEV) goes through the staging handshake first.
      for (int i = 0; i < 100 && !is_done(sink); ++i) g_engine->progress();
      FUZZ_CHECK(is_done(sink),
                 "a receive of a probed message did not complete in 100 progress calls");
      drop(&sink);
      received = true;
    }
    if (events == 0 && !received) return;
  }
  FUZZ_CHECK(false, "the engine still has events after 1000 rounds of draining");
}

void put_u64(std::vector<std::byte>* message, std::size_t offset, std::uint64_t value) {
  if (message->size() >= offset + sizeof(value)) {
    std::memcpy(message->data() + offset, &value, sizeof(value));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  g_engine = proto::Engine::create({});
  FUZZ_CHECK(
      g_engine->rma().register_memory(g_window, sizeof(g_window), &g_region, &g_secret, nullptr),
      "registering the one-sided window failed");
  // Check the pool model: a FIN naming the send's modelled wire id must complete that send.
  Posted send = post_send(kRendezvousBytes, 1);
  proto::FinHeader fin{g_pool.wire_id(send.index), 0, 0};
  g_engine->on_am(proto::kAmFin, 0, proto::as_bytes(fin));
  FUZZ_CHECK(is_done(send),
             "the harness's copy of the request pool disagrees with proto/request_pool.hpp");
  drain();
  drop(&send);
  return 0;
}

// Input: u8 setup (bits 0-1: receives to post; bit 2: a rendezvous send to self; bit 3: an eager
// send to self); per receive u8 how (bits 0-2: capacity; bit 3: any source; bits 4-5 both set: a
// source outside the job; bit 6: tag mask 0x0f) and u8 tag; u8 tag of the rendezvous send; u8 tag
// and u8 size of the eager send. Then messages: u8 id (0xff: run progress() instead), u8 fix (bit
// 0: put the wire id of our request (fix >> 1) % count into the message; bit 7: into a CTS's rreq
// instead of its sreq; bit 6: a PUT, GET or ATOMIC names the registered window with its real id
// and secret), u16 length, the message.
extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  ferry::fuzz::Input in(data, size);
  std::vector<Posted> posted;  // receives first, then sends

  const std::uint8_t setup = in.u8();
  const int receives = setup & 3;
  for (int i = 0; i < receives; ++i) {
    const std::uint8_t how = in.u8();
    const ferry::Tag tag = in.u8();
    int source = (how & 0x08) != 0 ? ferry::kAnySource : 0;
    if ((how & 0x30) == 0x30) source = 7;  // not in the job: fails at once
    const ferry::Tag mask = (how & 0x40) != 0 ? 0x0f : ferry::kFullMask;
    posted.push_back(post_recv(g_recv[i], kCapacities[how & 7], source, tag, mask));
  }
  if ((setup & 0x04) != 0) posted.push_back(post_send(kRendezvousBytes, in.u8()));
  if ((setup & 0x08) != 0) {
    const ferry::Tag tag = in.u8();
    posted.push_back(post_send(in.u8(), tag));
  }

  std::vector<std::byte> message;
  while (!in.empty()) {
    const std::uint8_t id = in.u8();
    if (id == kProgressCommand) {
      g_engine->progress();
      continue;
    }
    const std::uint8_t fix = in.u8();
    auto body = in.bytes(in.u16());
    message.assign(body.begin(), body.end());
    if (id == proto::kAmRts)
      put_u64(&message, offsetof(proto::RtsHeader, address),
              reinterpret_cast<std::uint64_t>(g_remote));
    if ((fix & 1) != 0 && !posted.empty()) {
      // Aim the message at one of our live requests instead of a forged id.
      std::uint64_t wire = g_pool.wire_id(posted[(fix >> 1) % posted.size()].index);
      switch (id) {
        case proto::kAmRts:
          put_u64(&message, offsetof(proto::RtsHeader, sreq), wire);
          break;
        case proto::kAmCts:
          put_u64(&message,
                  (fix & 0x80) != 0 ? offsetof(proto::CtsHeader, rreq)
                                    : offsetof(proto::CtsHeader, sreq),
                  wire);
          break;
        case proto::kAmFrag:
          put_u64(&message, offsetof(proto::FragHeader, rreq), wire);
          break;
        case proto::kAmFin:
          put_u64(&message, offsetof(proto::FinHeader, sreq), wire);
          break;
        case proto::kAmRmaAck:
          put_u64(&message, offsetof(proto::RmaAckHeader, id), wire);
          break;
        case proto::kAmRmaAcks:  // the first answer's
          put_u64(&message, sizeof(proto::RmaAcksHeader) + offsetof(proto::RmaAckHeader, id), wire);
          break;
        default:
          break;
      }
    }
    if ((fix & 0x40) != 0 &&
        (id == proto::kAmPut || id == proto::kAmGet || id == proto::kAmAtomic)) {
      // The same offsets in all three headers.
      put_u64(&message, offsetof(proto::PutHeader, region), g_region);
      put_u64(&message, offsetof(proto::PutHeader, secret), g_secret);
    }
    if ((fix & 0x40) != 0 && id == proto::kAmNativeAsk) {
      put_u64(&message, offsetof(proto::NativeAskHeader, region), g_region);
      put_u64(&message, offsetof(proto::NativeAskHeader, secret), g_secret);
    }
    if ((fix & 0x40) != 0 && (id == proto::kAmNativeRevoke || id == proto::kAmNativeRevoked ||
                              id == proto::kAmNativeGrant)) {
      put_u64(&message, 0, g_region);  // each of these headers starts with the region
    }
    g_engine->on_am(id, 0, message);
  }
  g_engine->progress();

  // Nothing may carry over to the next input: cancel what is still posted, receive everything
  // unexpected (which completes the rendezvous sends), then every request must be complete.
  for (int i = 0; i < receives; ++i) posted[static_cast<std::size_t>(i)].request.cancel();
  drain();
  for (Posted& p : posted) drop(&p);
  return 0;
}
