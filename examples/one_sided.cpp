// One-sided: each rank exposes a window, the others put into it, get from it and count with an
// atomic, without the owner posting anything. Run: ferryrun -n 3 build/examples/one_sided
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "ferry/ferry.hpp"

int main() {
  try {
    ferry::Context ctx = ferry::Context::init();
    ferry::Communicator world = ctx.world();
    const int me = ctx.rank(), n = ctx.size();
    // A window of one 8-byte counter, then one 8-byte slot per rank.
    ferry::MemoryRegion window;
    if (ferry::Status s = ctx.allocate_memory(8 * (n + 1), &window); !s) {
      std::fprintf(stderr, "allocate_memory: %s\n", s.to_string().c_str());
      return 1;
    }
    // Every rank's key, to every rank (a key is a few dozen bytes).
    const std::vector<std::byte> mine = window.remote_key();
    std::vector<std::byte> all(mine.size() * n);
    world.allgather(mine.data(), all.data(), mine.size(), ferry::DataType::kUint8);
    std::vector<ferry::RemoteKey> keys(n);
    for (int r = 0; r < n; ++r) {
      ferry::RemoteKey::unpack(std::span(all).subspan(r * mine.size(), mine.size()), &keys[r]);
    }
    // Put this rank's number into its slot of every window, and count itself in each.
    for (int r = 0; r < n; ++r) {
      const std::uint64_t value = 100 + me;
      ctx.iput(&value, sizeof(value), keys[r], 8 * (1 + me));  // completes in the background
      std::uint64_t before = 0;
      ctx.iatomic(ferry::AtomicOp::kAdd, 8, keys[r], 0, 1, &before).wait();
    }
    if (ferry::Status s = ctx.flush_all(); !s) {  // every put done at its target
      std::fprintf(stderr, "flush: %s\n", s.to_string().c_str());
      return 1;
    }
    world.barrier();  // every rank's puts are in every window now
    std::uint64_t slot_of_next = 0;
    ctx.iget(&slot_of_next, 8, keys[(me + 1) % n], 8 * (1 + (me + 1) % n)).wait();
    std::uint64_t counter = 0;
    std::memcpy(&counter, window.address(), 8);
    std::printf("rank %d: %llu ranks counted here, the next rank's own slot says %llu\n", me,
                static_cast<unsigned long long>(counter),
                static_cast<unsigned long long>(slot_of_next));
    world.barrier();  // nobody deregisters a window another rank may still read
    return counter == static_cast<std::uint64_t>(n) && slot_of_next == 100u + (me + 1) % n ? 0 : 1;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "one_sided: %s\n", e.what());
    return 1;
  }
}
