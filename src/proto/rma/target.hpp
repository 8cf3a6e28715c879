// The two records one-sided communication passes between the API and the engine: where one
// access goes (RmaTarget, from a RemoteKey and an offset), and what a region's key carries
// besides its id and secret (RegionAccess).
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry::proto {

struct RmaTarget {
  int rank = -1;
  std::uint64_t region = 0;
  std::uint64_t secret = 0;
  std::size_t size = 0;  // of the region, as its key says
  std::uint64_t offset = 0;
  int fd = -1;  // allocated regions: the owner's descriptor, for mapping on this node
  // Registered regions: the owner's guard table (its descriptor) and the region's slot in it,
  // through which peers on this node reach it directly; -1: through the owner.
  int guard_fd = -1;
  int slot = -1;
  bool native = false;     // the network transport may reach it once the owner grants the key
  bool read_only = false;  // registered from memory its owner cannot write: gets only
};

// Where peers on this node find a region (-1: they do not), whether other nodes may reach it
// natively, and whether it is read-only: RmaTarget's fields, as the owner knows them.
struct RegionAccess {
  int guard_fd = -1;
  int slot = -1;
  bool native = false;
  bool read_only = false;
};

}  // namespace ferry::proto
