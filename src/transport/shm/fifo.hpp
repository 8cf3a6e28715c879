// The shared-memory receive FIFO: many producers (the node's other processes), one consumer (the
// owner). Producers claim a slot by CAS on head and publish it by storing the slot's sequence
// number last (the owner bit of uct/mm, widened to a sequence so a stale element is never misread).
// The consumer releases the tail in batches, so producers rarely touch the consumer's cache line.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace ferry::transport::shm {

inline constexpr std::size_t kFifoElemSize = 128;

struct FifoControl {
  alignas(64) std::atomic<std::uint64_t> head;  // next index to claim (producers)
  alignas(64) std::atomic<std::uint64_t> tail;  // everything below was consumed (consumer)
};

enum ElemFlags : std::uint8_t { kElemInline = 1, kElemBounce = 2 };

struct alignas(64) FifoElem {
  std::atomic<std::uint32_t> sequence;  // low 32 bits of (index + 1) once published
  std::uint8_t am_id;
  std::uint8_t flags;
  std::uint16_t source;  // sender's local index
  std::uint32_t length;  // bytes of header + payload
  std::uint32_t bounce;  // slot in the sender's bounce pool (kElemBounce)
  std::byte data[kFifoElemSize - 16];
};
static_assert(sizeof(FifoElem) == kFifoElemSize);
inline constexpr std::size_t kInlineCapacity = sizeof(FifoElem::data);

// Producer side: a claimed, not yet published element.
struct FifoClaim {
  FifoElem* elem = nullptr;
  std::uint64_t index = 0;
};

class FifoProducer {
 public:
  FifoProducer() = default;
  FifoProducer(FifoControl* control, FifoElem* elems, std::uint32_t size)
      : control_(control), elems_(elems), mask_(size - 1) {}

  // Claims the next slot, or returns a claim with elem == nullptr when the FIFO is full.
  [[gnu::always_inline]] inline FifoClaim claim() {
    std::uint64_t head = control_->head.load(std::memory_order_relaxed);
    for (;;) {
      if (head - tail_cache_ > mask_) {
        tail_cache_ = control_->tail.load(std::memory_order_acquire);
        if (head - tail_cache_ > mask_) return {};
      }
      if (control_->head.compare_exchange_weak(head, head + 1, std::memory_order_acq_rel,
                                               std::memory_order_relaxed)) {
        return {&elems_[head & mask_], head};
      }
    }
  }
  // Makes a filled element visible to the consumer.
  [[gnu::always_inline]] static inline void publish(const FifoClaim& claim) {
    claim.elem->sequence.store(static_cast<std::uint32_t>(claim.index + 1),
                               std::memory_order_release);
  }

 private:
  FifoControl* control_ = nullptr;
  FifoElem* elems_ = nullptr;
  std::uint64_t mask_ = 0;
  std::uint64_t tail_cache_ = 0;  // this producer's last view of the tail
};

class FifoConsumer {
 public:
  FifoConsumer() = default;
  FifoConsumer(FifoControl* control, FifoElem* elems, std::uint32_t size, std::uint32_t batch)
      : control_(control), elems_(elems), mask_(size - 1), batch_mask_(batch - 1) {}

  // The next published element, or nullptr.
  [[gnu::always_inline]] inline FifoElem* peek() const {
    FifoElem* elem = &elems_[read_ & mask_];
    if (elem->sequence.load(std::memory_order_acquire) != static_cast<std::uint32_t>(read_ + 1)) {
      return nullptr;
    }
    return elem;
  }
  // Done with the element peek returned; the tail moves every `batch` elements.
  [[gnu::always_inline]] inline void pop() {
    ++read_;
    if ((read_ & batch_mask_) == 0) release();
  }
  // Publishes the tail now (when idle, so producers are never held back by a partial batch).
  void release() {
    if (released_ != read_) {
      control_->tail.store(read_, std::memory_order_release);
      released_ = read_;
    }
  }

 private:
  FifoControl* control_ = nullptr;
  FifoElem* elems_ = nullptr;
  std::uint64_t mask_ = 0;
  std::uint64_t batch_mask_ = 0;
  std::uint64_t read_ = 0;
  std::uint64_t released_ = 0;
};

}  // namespace ferry::transport::shm
