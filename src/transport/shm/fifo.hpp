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

// A producer's claim record, in its own segment: which element of which FIFO it is claiming or
// has claimed and not yet published. A producer that dies between claim and publish leaves a hole
// the consumer cannot pass; the record lets the consumer prove the hole is the dead one's.
//   bits 48..63: the receiver's local index + 1; bits 0..47: the element's index + 1.
inline constexpr std::uint64_t kClaimIndexMask = (std::uint64_t{1} << 48) - 1;
inline std::uint64_t claim_record(std::uint32_t receiver, std::uint64_t index) {
  return (std::uint64_t{receiver + 1} << 48) | ((index + 1) & kClaimIndexMask);
}

class FifoProducer {
 public:
  FifoProducer() = default;
  // `record`: this producer's claim record; `receiver`: the FIFO owner's local index.
  FifoProducer(FifoControl* control, FifoElem* elems, std::uint32_t size,
               std::atomic<std::uint64_t>* record = nullptr, std::uint32_t receiver = 0)
      : control_(control), elems_(elems), mask_(size - 1), record_(record), receiver_(receiver) {}

  // Claims the next slot, or returns a claim with elem == nullptr when the FIFO is full.
  [[gnu::always_inline]] inline FifoClaim claim() {
    std::uint64_t head = control_->head.load(std::memory_order_relaxed);
    for (;;) {
      if (head - tail_cache_ > mask_) {
        tail_cache_ = control_->tail.load(std::memory_order_acquire);
        if (head - tail_cache_ > mask_) {
          clear_record();  // a lost CAS may have left it naming another's element
          return {};
        }
      }
      // The record names the element before the CAS can take it: if we die right after a
      // successful CAS, the record already says which element is ours. (A record naming an
      // element whose CAS failed is told apart by the consumer: its real claimant is alive and
      // says so, or has published.) The locked CAS orders this store before it (x86 TSO).
      if (record_ != nullptr) {
        record_->store(claim_record(receiver_, head), std::memory_order_release);
      }
      if (control_->head.compare_exchange_weak(head, head + 1, std::memory_order_acq_rel,
                                               std::memory_order_relaxed)) {
        return {&elems_[head & mask_], head};
      }
    }
  }
  // Makes a filled element visible to the consumer, then clears the claim record.
  [[gnu::always_inline]] inline void publish(const FifoClaim& claim) {
    claim.elem->sequence.store(static_cast<std::uint32_t>(claim.index + 1),
                               std::memory_order_release);
    if (record_ != nullptr) record_->store(0, std::memory_order_release);
  }
  void clear_record() {
    if (record_ != nullptr) record_->store(0, std::memory_order_release);
  }

 private:
  FifoControl* control_ = nullptr;
  FifoElem* elems_ = nullptr;
  std::uint64_t mask_ = 0;
  std::uint64_t tail_cache_ = 0;  // this producer's last view of the tail
  std::atomic<std::uint64_t>* record_ = nullptr;
  std::uint32_t receiver_ = 0;
};

// Whether the consumer may step over the unpublished element it waits on: some dead producer's
// record names it and no live producer's does (a live claimant publishes; then it is no hole).
// The caller re-checks that the element is still unpublished after reading the records.
struct ProducerView {
  std::uint64_t record;
  bool dead;
};
inline bool is_hole_of_dead_producer(const ProducerView* producers, std::size_t count,
                                     std::uint64_t wanted) {
  bool dead = false;
  for (std::size_t i = 0; i < count; ++i) {
    if (producers[i].record != wanted) continue;
    if (!producers[i].dead) return false;
    dead = true;
  }
  return dead;
}

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
  // Where the consumer waits: the index of the next element, and whether it is published.
  [[nodiscard]] std::uint64_t position() const { return read_; }
  [[nodiscard]] bool head_published() const { return peek() != nullptr; }
  // Whether the tail says every element popped so far is free again.
  [[nodiscard]] bool all_released() const { return released_ == read_; }
  // Done with the element peek returned (or with a hole: see is_hole_of_dead_producer); the
  // tail moves every `batch` elements.
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
