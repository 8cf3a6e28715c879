// Native one-sided access over the network (ofi's fi_write/fi_read without the owner), by grant.
// The first access to a peer's region goes by messages and asks the owner, who checks the key as
// for any access and answers with the region's address and provider key; from then on accesses
// through the same key go natively. The owner's deregister revokes every grant and waits until
// each granted rank has no access to the region in flight (or has failed), then closes the
// registration. So no access with a forged or stale key ever reaches the provider (over tcp a
// refused one closes the connection), and none lands after deregister returns.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "ferry/status.hpp"
#include "proto/rma/target.hpp"
#include "transport/transport.hpp"

namespace ferry::proto {
class Engine;
}

namespace ferry::proto::rma {

class Regions;

class NativeAccess {
 public:
  // `transport`: the one that registers regions for it (ofi where the provider checks keys), or
  // null (then nothing is native).
  NativeAccess(Engine& engine, const Regions& regions, transport::Transport* transport, int ranks)
      : engine_(engine),
        regions_(regions),
        transport_(transport),
        refused_(static_cast<std::size_t>(ranks)) {}
  ~NativeAccess() { clear(); }
  NativeAccess(const NativeAccess&) = delete;
  NativeAccess& operator=(const NativeAccess&) = delete;

  // Whether other nodes may ask for this region (the key says so).
  [[nodiscard]] bool offered(bool device) const { return transport_ != nullptr && !device; }
  // A put or get (request `index`) started by the network transport itself, completed through
  // the engine's on_direct; false when it goes by messages (a first access asks for the grant).
  bool start(std::uint32_t index, const RmaTarget& target, void* local, std::size_t bytes, bool put,
             bool local_device);
  // A native access to (rank, region) ended: answers a revoke that waited for it.
  void ended(int rank, std::uint64_t region);
  // Revokes the grants of region `id` (deregister): waits for every granted rank's answer, then
  // closes its registration with the transport.
  Status revoke(std::uint64_t id);
  void on_ask(int source, std::span<const std::byte> data);
  void on_grant(int source, std::span<const std::byte> data);
  void on_revoke(int source, std::span<const std::byte> data);
  void on_revoked(int source, std::span<const std::byte> data);
  // The owner refused an access through a key: a refusal of native access kept for it is no
  // longer needed once the region is gone (so such entries do not pile up as regions come and go).
  void region_gone(int owner, std::uint64_t region);
  void peer_failed(int rank);
  // "native access granted to N of its regions and refused for M; this rank's regions
  // registered for it: K", or why its regions go by messages.
  [[nodiscard]] std::string describe(int rank) const;
  void clear();

 private:
  // A grant this rank holds (or asked for) for a peer's region.
  struct Grant {
    enum class State : std::uint8_t { kAsked, kGranted, kRefused, kRevoked } state = State::kAsked;
    std::uint64_t secret = 0;  // of the key that asked
    transport::Endpoint::RemoteRegion region;
    std::uint64_t size = 0;
    std::uint32_t in_flight = 0;  // native accesses started and not yet ended
  };
  // One of this rank's regions as registered with the transport, made when a rank first asks.
  struct Registration {
    void* handle = nullptr;
    transport::Endpoint::RemoteRegion remote;
    bool failed = false;     // registering it failed: no grant
    std::vector<int> ranks;  // the ranks granted native access (asked, key checked)
  };
  // Registers region `id` for its first ask; null if it cannot be.
  Registration* register_region(std::uint64_t id);

  Engine& engine_;
  const Regions& regions_;
  transport::Transport* transport_;
  std::vector<std::string> refused_;  // per peer: why native access to it goes by messages
  std::map<std::pair<int, std::uint64_t>, Grant> grants_;          // by (owner, region)
  std::unordered_map<std::uint64_t, Registration> registrations_;  // by region id
  std::map<std::uint64_t, std::vector<int>> revoking_;             // region -> ranks yet to answer
};

}  // namespace ferry::proto::rma
