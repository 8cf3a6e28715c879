// A process's shared-memory segment: its receive FIFO and its pool of bounce buffers. Each process
// creates one and maps every local peer's; the layout is computed from a few header fields that
// are validated against the file size before any of them is trusted.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>

#include "transport/shm/fifo.hpp"
#include "util/fd.hpp"

namespace ferry::transport::shm {

inline constexpr std::uint64_t kSegmentMagic = 0x46455252595f5348ULL;  // "FERRY_SH"
inline constexpr std::uint32_t kSegmentVersion = 4;
inline constexpr std::uint32_t kMaxFifoSize = 65536;
inline constexpr std::uint32_t kMaxBounceCount = 65536;
inline constexpr std::uint32_t kMaxBounceSize = 1u << 24;
inline constexpr std::size_t kBounceHeaderSize = 64;
inline constexpr std::size_t kWithdrawnSlots = 256;
inline constexpr std::uint32_t kSplitClaims = 64;

struct SegmentHeader {
  std::uint64_t magic;
  std::uint32_t version;
  std::uint32_t fifo_size;
  std::uint32_t bounce_count;
  std::uint32_t bounce_size;
  std::uint64_t total_size;
  std::uint64_t cma_cookie;  // read by peers through process_vm_readv to probe CMA
  FifoControl fifo;
  // This process's claim record as a producer into its peers' FIFOs (fifo.hpp claim_record).
  alignas(64) std::atomic<std::uint64_t> claim;
  // Rendezvous sends of this process withdrawn after FERRY_TIMEOUT (request wire ids), newest at
  // withdrawn_next - 1; read by peers after a CMA get (transport.hpp mark_withdrawn).
  alignas(64) std::atomic<std::uint32_t> withdrawn_next;
  std::atomic<std::uint64_t> withdrawn[kWithdrawnSlots];
  // Claim words of messages copied from both ends (transport.hpp SplitCopies), each
  // ticket << 2 | state (kClaimOpen, kClaimSender, kClaimReceiver); the owner is the receiver.
  alignas(64) std::atomic<std::uint64_t> split_claims[kSplitClaims];
  // 1 while the owner sleeps on its doorbell (transport.hpp arm()): the next sender to publish
  // into its FIFO swaps it to 0 and rings the doorbell.
  alignas(64) std::atomic<std::uint32_t> armed;
};

inline constexpr std::uint64_t kClaimOpen = 1;
inline constexpr std::uint64_t kClaimSender = 2;
inline constexpr std::uint64_t kClaimReceiver = 3;

struct BounceHeader {
  std::atomic<std::uint32_t> busy;  // 1 from the sender's fill until the receiver's copy-out
};

struct Layout {
  std::uint32_t fifo_size = 0;
  std::uint32_t bounce_count = 0;
  std::uint32_t bounce_size = 0;
  std::size_t fifo_offset = 0;
  std::size_t bounce_offset = 0;
  std::size_t bounce_stride = 0;
  std::size_t total_size = 0;

  // Empty string when the numbers describe a valid layout, else what is wrong.
  static std::string compute(std::uint32_t fifo_size, std::uint32_t bounce_count,
                             std::uint32_t bounce_size, Layout* out);
};

class Segment {
 public:
  Segment() = default;
  // Creates, sizes (posix_fallocate, so a full /dev/shm is an error now, not a SIGBUS later) and
  // maps a new segment. Throws ferry::Error naming the segment, the size and the reason.
  static Segment create(const std::string& name, const Layout& layout);
  // Maps a peer's segment and validates its header against `expected` and the file size.
  static Segment attach(const std::string& name, const Layout& expected);

  Segment(Segment&& other) noexcept { *this = std::move(other); }
  Segment& operator=(Segment&& other) noexcept {
    if (this != &other) {
      unlink();
      name_ = std::move(other.name_);
      owner_ = std::exchange(other.owner_, false);
      layout_ = other.layout_;
      mapping_ = std::move(other.mapping_);
    }
    return *this;
  }
  ~Segment();

  // Removes the name; the mappings stay valid until unmapped.
  void unlink();

  [[nodiscard]] SegmentHeader* header() const {
    return reinterpret_cast<SegmentHeader*>(mapping_.get());
  }
  [[nodiscard]] FifoElem* fifo() const {
    return reinterpret_cast<FifoElem*>(mapping_.bytes() + layout_.fifo_offset);
  }
  [[nodiscard]] BounceHeader* bounce(std::uint32_t slot) const {
    return reinterpret_cast<BounceHeader*>(mapping_.bytes() + layout_.bounce_offset +
                                           slot * layout_.bounce_stride);
  }
  [[nodiscard]] std::byte* bounce_data(std::uint32_t slot) const {
    return reinterpret_cast<std::byte*>(bounce(slot)) + kBounceHeaderSize;
  }
  [[nodiscard]] const Layout& layout() const { return layout_; }
  [[nodiscard]] const std::string& name() const { return name_; }

 private:
  std::string name_;
  bool owner_ = false;
  Layout layout_;
  util::Mapping mapping_;
};

}  // namespace ferry::transport::shm
