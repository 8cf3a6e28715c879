// Device data with a peer that shares no memory with us (ofi): a message in device memory on
// either side travels as a series of direct transfers of FERRY_OFI_CHUNK bytes. Where the NIC
// registers that GPU's memory (DirectTransfers::device_direct: FI_HMEM, and a trial registration
// that succeeded) a device side sends from or receives into its buffer as it is; elsewhere each
// chunk goes through a pinned host bounce on the device side:
//   sender:   RTS (address kRtsFromDevice when its buffer is device memory)
//   receiver: posts a direct receive for chunk 0 (into its buffer, or into its bounce), answers
//             CTS_CHUNKED {length, chunk}
//   sender:   chunk k: copy device -> bounce (a device buffer), direct send; on completion, k + 1
//   receiver: chunk k arrived: copy bounce -> device (a device buffer), post k + 1
// Chunks of one message share a key and the provider matches them in order. Memory in flight is
// one chunk per message on each side. Copies are synchronous; the network is the slower leg.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <span>
#include <vector>

#include "ferry/status.hpp"
#include "proto/request_pool.hpp"
#include "transport/transport.hpp"
#include "util/config.hpp"

namespace ferry::proto {

class Engine;

class ChunkedPath {
 public:
  ChunkedPath(Engine& engine, const util::Config& config);
  ~ChunkedPath();
  ChunkedPath(const ChunkedPath&) = delete;
  ChunkedPath& operator=(const ChunkedPath&) = delete;

  // FERRY_TEST_OFI_CHUNKED: host rendezvous messages over ofi go in chunks too.
  [[nodiscard]] bool forced() const { return forced_; }
  // A matched rendezvous whose data goes in chunks: post chunk 0, ask the sender for the rest.
  void start_receive(std::uint32_t index, int source, std::uint64_t sreq);
  void on_cts(int source, std::span<const std::byte> data);
  // A chunk's direct transfer ended (Engine::on_direct): the next one, or the request's end.
  void chunk_done(std::uint32_t index, Status status);
  // A request with a bounce ended: the bounce goes back to the pool (and to a waiting transfer).
  void return_bounce(RequestSlot* slot);

 private:
  static bool needs_bounce(const RequestSlot& slot, transport::DirectTransfers& direct);
  std::byte* take_bounce();
  // The first chunk of a transfer that has its bounce (if it needs one): post it, and on the
  // receiving side ask the sender for the chunks.
  void start_chunks(std::uint32_t index);
  // Posts the next chunk of a chunked send or receive (sync copy out of device memory first).
  Status post_chunk(std::uint32_t index);

  Engine& engine_;
  std::size_t chunk_;  // FERRY_OFI_CHUNK
  bool forced_;
  std::vector<std::byte*> pool_;  // pinned, chunk_ bytes each, free for reuse
  std::size_t made_ = 0;
  std::deque<std::uint64_t> waiting_;  // chunked transfers (wire ids) waiting for a bounce
};

}  // namespace ferry::proto
