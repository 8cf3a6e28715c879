// What the parts of one-sided communication share (proto/rma/): the layout of the memory peers
// on a node map (an allocated region's header page, the owner's guard table of registered
// regions) and the small helpers every part uses: refusal messages and atomics on a word.
//
// Memory from allocate_memory is a memfd: a header page (SharedHeader), then the caller's bytes.
// A rank on the same node takes the descriptor with pidfd_getfd (the permission CMA needs),
// maps it, checks the header against the key, and from then on accesses it directly: copies and
// CPU atomics, complete at once. The owner clears `live` before it unmaps, and every direct access
// looks at it first, so a deregistered region is refused; a store racing with the
// deregistration lands in memory nobody else uses any more (the mapping keeps it), never in the
// owner's.
//
// Registered memory (the caller's own) is reached by peers on the node through the owner's guard
// table, a memfd they map like allocated memory: a slot per region says where it is (an address
// for CMA, or a CUDA IPC handle) and whether it is live, and each accessing rank has two counters.
// An access adds one to its `begun`, checks the slot, copies once (process_vm_writev/readv, or a
// CUDA copy waited for), then adds one to its `ended`. Deregistration clears `live`, then waits
// until every rank's `ended` reaches the `begun` it read afterwards. Both sides order their write
// before their read (sequentially consistent), so an access either sees `live` cleared or is
// waited for: none lands after deregister returns, and the slot is reused only then.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"
#include "proto/wire.hpp"

namespace ferry::proto::rma {

struct SharedHeader {
  std::uint64_t magic;
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t size;
  std::uint32_t live;  // 1 while registered (read and written through std::atomic_ref)
};
constexpr std::uint64_t kSharedMagic = 0x46455252594d4d31;  // "FERRYMM1"
constexpr std::size_t kHeaderBytes = 4096;

constexpr std::uint64_t kGuardMagic = 0x3154475952524546;  // "FERRYGT1"
constexpr int kGuardSlots = 1024;
constexpr int kGuardRanks = 256;  // accessing ranks of the node, by their place in local_ranks()

struct alignas(64) GuardCounters {
  std::uint64_t begun;
  std::uint64_t ended;
};

struct GuardSlot {
  std::uint32_t live;   // 1 while registered (std::atomic_ref)
  std::int32_t device;  // -1: host memory, at `address` in the owner (CMA); else device memory
  std::uint64_t region;
  std::uint64_t secret;
  std::uint64_t size;
  std::uint64_t address;
  std::int32_t ipc_fd;      // device memory exported as a descriptor: the owner's number; else -1
  std::uint32_t read_only;  // 1: registered from read-only memory (gets only)
  cuda::IpcKey ipc;         // device memory: the allocation, offset at the region's start
};

struct GuardTable {
  std::uint64_t magic;
  std::int32_t pid;
  std::uint32_t reserved;
  GuardCounters counters[kGuardRanks];
  GuardSlot slots[kGuardSlots];
};

template <typename T>
std::atomic_ref<T> shared(T& word) {
  return std::atomic_ref<T>(word);
}

inline std::size_t page_round(std::size_t bytes) {
  const auto page = static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
  return (bytes + page - 1) / page * page;
}

inline std::uint32_t load_live(SharedHeader* header) {
  return std::atomic_ref<std::uint32_t>(header->live).load(std::memory_order_acquire);
}

// An atomic's previous value, as the caller's uint32_t or uint64_t.
inline void store_result(void* result, std::size_t width, std::uint64_t previous) {
  if (result == nullptr) return;
  if (width == 4) {
    const auto value = static_cast<std::uint32_t>(previous);
    std::memcpy(result, &value, 4);
  } else {
    std::memcpy(result, &previous, 8);
  }
}

inline std::string errno_text(const char* call) {
  return std::string(call) + ": " + std::strerror(errno);
}

inline std::string refusal_text(std::uint32_t code, int target) {
  const std::string who = "rank " + std::to_string(target);
  switch (code) {
    case kRmaNoRegion:
      return who + " has no such memory region (deregistered, or the key is not one of its own)";
    case kRmaBadKey:
      return who + " refused the key: it does not match the region (stale or corrupt key)";
    case kRmaOutOfRange:
      return who + " refused the access: it reaches outside the region";
    case kRmaBadAtomic:
      return who + " refused the atomic: unknown operation, width not 4 or 8, or misaligned";
    case kRmaCutShort:
      return who + " deregistered the region while answering the get";
    case kRmaDeviceCopy:
      return who + " could not copy to or from the region's device memory (its log says why)";
    case kRmaNotNative:
      return who + " has not registered the region with the network transport";
    case kRmaReadOnly:
      return who + " registered the region from memory it cannot write: only gets may use it";
    case kRmaUnmapped:
      return who +
             "'s memory behind the region is no longer mapped (it was freed or unmapped "
             "without being deregistered)";
    default:
      return who + " refused the operation with unknown code " + std::to_string(code);
  }
}

template <typename T>
T apply_atomic(std::byte* word, AtomicOp op, T operand, T compare) {
  std::atomic_ref<T> ref(*reinterpret_cast<T*>(word));
  switch (op) {
    case AtomicOp::kAdd:
      return ref.fetch_add(operand);
    case AtomicOp::kSwap:
      return ref.exchange(operand);
    case AtomicOp::kCompareSwap:
      ref.compare_exchange_strong(compare, operand);
      return compare;  // the previous value either way
    case AtomicOp::kAnd:
      return ref.fetch_and(operand);
    case AtomicOp::kOr:
      return ref.fetch_or(operand);
    case AtomicOp::kXor:
      return ref.fetch_xor(operand);
  }
  return 0;
}

// The atomic on a 4- or 8-byte word; returns the word's previous value.
inline std::uint64_t atomic_at(std::byte* word, AtomicOp op, std::size_t width,
                               std::uint64_t operand, std::uint64_t compare) {
  return width == 4 ? apply_atomic<std::uint32_t>(word, op, static_cast<std::uint32_t>(operand),
                                                  static_cast<std::uint32_t>(compare))
                    : apply_atomic<std::uint64_t>(word, op, operand, compare);
}

// The same, its previous value stored where the caller asked.
inline void apply_atomic_at(std::byte* word, AtomicOp op, std::size_t width, std::uint64_t operand,
                            std::uint64_t compare, void* result) {
  store_result(result, width, atomic_at(word, op, width, operand, compare));
}

}  // namespace ferry::proto::rma
