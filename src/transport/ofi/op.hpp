// What the parts of the ofi transport share: its buffer geometry and the state of one operation
// handed to the provider (an active message's bounce, or a direct transfer).
#pragma once

#include <rdma/fabric.h>

#include <cstddef>
#include <cstdint>

#include "mem/registration_cache.hpp"
#include "transport/ofi/transport.hpp"

namespace ferry::transport::ofi {

inline constexpr std::size_t kBufferSize =
    64 * 1024;                                  // the largest active message, with its header
inline constexpr std::uint32_t kReceives = 64;  // posted in advance
inline constexpr std::uint32_t kSends = 64;     // bounce buffers for sends larger than inject
inline constexpr int kSendsPerPeer = 16;  // in flight to one peer: a dead one cannot hold them all
inline constexpr std::uint8_t kKeepaliveId = kWireKeepaliveId;  // handled here, never delivered

struct Op {
  fi_context2 context;  // first: providers that ask for FI_CONTEXT(2) use it
  bool send = false;
  bool direct = false;  // a tagged transfer of a caller's buffer (else an active message)
  bool read = false;    // direct: an fi_read from the peer's exposed buffer
  bool write = false;   // direct: an fi_write into the peer's registered region
  int peer = -1;
  std::uint32_t buffer = 0;
  // Direct transfers:
  void* data = nullptr;
  std::size_t length = 0;
  std::uint64_t key = 0;
  std::uint64_t cookie = 0;
  fid_mr* mr = nullptr;  // where the provider wants local buffers registered
  mem::RegistrationCache::Entry* entry = nullptr;  // the same, from the cache (reads)
  Endpoint::RemoteRegion remote;                   // reads and writes: the peer's memory
  bool orphaned = false;  // its completion was reported already (the peer failed)
  bool drain = false;     // send(confirm): delivered()'s last keepalive, sent as message `seq`
  std::uint32_t seq = 0;
};

}  // namespace ferry::transport::ofi
