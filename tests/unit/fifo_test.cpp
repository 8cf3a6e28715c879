// The shm FIFO on its own: ordering, full detection, wrap-around, and many producer threads.
#include "transport/shm/fifo.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <thread>
#include <vector>

namespace ferry::transport::shm {
namespace {

struct TestFifo {
  explicit TestFifo(std::uint32_t size, std::uint32_t batch = 4)
      : control(std::make_unique<FifoControl>()), elems(size) {
    control->head.store(0);
    control->tail.store(0);
    consumer = FifoConsumer(control.get(), elems.data(), size, batch);
  }
  FifoProducer producer(std::uint32_t size) {
    return FifoProducer(control.get(), elems.data(), size);
  }
  std::unique_ptr<FifoControl> control;
  std::vector<FifoElem> elems;
  FifoConsumer consumer;
};

bool push(FifoProducer& producer, std::uint32_t source, std::uint64_t value) {
  FifoClaim claim = producer.claim();
  if (claim.elem == nullptr) return false;
  claim.elem->source = static_cast<std::uint16_t>(source);
  claim.elem->length = sizeof(value);
  std::memcpy(claim.elem->data, &value, sizeof(value));
  producer.publish(claim);
  return true;
}

std::uint64_t value_of(const FifoElem* elem) {
  std::uint64_t value;
  std::memcpy(&value, elem->data, sizeof(value));
  return value;
}

TEST(ShmFifo, DeliversInOrderAndReportsEmpty) {
  TestFifo fifo(16);
  FifoProducer producer = fifo.producer(16);
  EXPECT_EQ(fifo.consumer.peek(), nullptr);
  for (std::uint64_t i = 0; i < 10; ++i) ASSERT_TRUE(push(producer, 0, i));
  for (std::uint64_t i = 0; i < 10; ++i) {
    FifoElem* elem = fifo.consumer.peek();
    ASSERT_NE(elem, nullptr);
    EXPECT_EQ(value_of(elem), i);
    fifo.consumer.pop();
  }
  EXPECT_EQ(fifo.consumer.peek(), nullptr);
}

TEST(ShmFifo, FullFifoRefusesUntilTheTailIsReleased) {
  TestFifo fifo(16, 4);
  FifoProducer producer = fifo.producer(16);
  for (std::uint64_t i = 0; i < 16; ++i) ASSERT_TRUE(push(producer, 0, i));
  EXPECT_FALSE(push(producer, 0, 99)) << "a full FIFO must refuse, not overwrite";
  // Consuming fewer than a batch does not yet free room; releasing does.
  fifo.consumer.pop();
  EXPECT_FALSE(push(producer, 0, 99));
  fifo.consumer.release();
  EXPECT_TRUE(push(producer, 0, 16));
  EXPECT_FALSE(push(producer, 0, 17));
}

TEST(ShmFifo, WrapsAroundManyTimes) {
  TestFifo fifo(16, 2);
  FifoProducer producer = fifo.producer(16);
  std::uint64_t next_read = 0;
  for (std::uint64_t i = 0; i < 10000; ++i) {
    while (!push(producer, 0, i)) {
      FifoElem* elem = fifo.consumer.peek();
      ASSERT_NE(elem, nullptr);
      ASSERT_EQ(value_of(elem), next_read++);
      fifo.consumer.pop();
      fifo.consumer.release();
    }
  }
  while (FifoElem* elem = fifo.consumer.peek()) {
    ASSERT_EQ(value_of(elem), next_read++);
    fifo.consumer.pop();
  }
  EXPECT_EQ(next_read, 10000u);
}

TEST(ShmFifo, ManyProducerThreadsLoseNothingAndKeepEachProducersOrder) {
  constexpr std::uint32_t kSize = 64;
  constexpr int kProducers = 4;
  constexpr std::uint64_t kPerProducer = 200000;
  TestFifo fifo(kSize, 8);
  std::vector<std::thread> threads;
  for (int p = 0; p < kProducers; ++p) {
    threads.emplace_back([&fifo, p] {
      FifoProducer producer = fifo.producer(kSize);
      for (std::uint64_t i = 0; i < kPerProducer; ++i) {
        while (!push(producer, static_cast<std::uint32_t>(p), i)) std::this_thread::yield();
      }
    });
  }
  std::vector<std::uint64_t> next(kProducers, 0);
  std::uint64_t received = 0;
  while (received < kProducers * kPerProducer) {
    FifoElem* elem = fifo.consumer.peek();
    if (elem == nullptr) {
      fifo.consumer.release();
      std::this_thread::yield();
      continue;
    }
    ASSERT_LT(elem->source, kProducers);
    ASSERT_EQ(value_of(elem), next[elem->source]) << "producer " << elem->source;
    ++next[elem->source];
    fifo.consumer.pop();
    ++received;
  }
  for (auto& t : threads) t.join();
  for (int p = 0; p < kProducers; ++p) EXPECT_EQ(next[p], kPerProducer);
  EXPECT_EQ(fifo.consumer.peek(), nullptr);
}

}  // namespace
}  // namespace ferry::transport::shm

namespace ferry::transport::shm {
namespace {

TEST(ShmFifo, ClaimRecordNamesTheElementUntilPublished) {
  TestFifo fifo(16);
  std::atomic<std::uint64_t> record{0};
  FifoProducer producer(fifo.control.get(), fifo.elems.data(), 16, &record, /*receiver=*/3);
  FifoClaim claim = producer.claim();
  ASSERT_NE(claim.elem, nullptr);
  EXPECT_EQ(record.load(), claim_record(3, claim.index));
  producer.publish(claim);
  EXPECT_EQ(record.load(), 0u) << "a published element must not look claimed";
}

TEST(ShmFifo, ConsumerStepsOverTheHoleOfADeadProducerOnly) {
  // Producer A claims element 0 and dies before publishing it; producer B publishes element 1.
  TestFifo fifo(16);
  std::atomic<std::uint64_t> record_a{0}, record_b{0};
  FifoProducer a(fifo.control.get(), fifo.elems.data(), 16, &record_a, 0);
  FifoProducer b(fifo.control.get(), fifo.elems.data(), 16, &record_b, 0);
  FifoClaim lost = a.claim();
  ASSERT_NE(lost.elem, nullptr);
  ASSERT_TRUE(push(b, 2, 77));
  EXPECT_EQ(fifo.consumer.peek(), nullptr) << "the hole blocks what follows it";
  const std::uint64_t wanted = claim_record(0, fifo.consumer.position());

  // While A is alive its claim is honoured: it may still publish.
  ProducerView alive[] = {{record_a.load(), false}, {record_b.load(), false}};
  EXPECT_FALSE(is_hole_of_dead_producer(alive, 2, wanted));
  // A dead, B not claiming that element: a hole.
  ProducerView dead[] = {{record_a.load(), true}, {record_b.load(), false}};
  ASSERT_TRUE(is_hole_of_dead_producer(dead, 2, wanted));
  fifo.consumer.pop();
  FifoElem* next = fifo.consumer.peek();
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(value_of(next), 77u);
  EXPECT_EQ(next->source, 2);

  // A dead producer whose record names an element that a live producer claims (A lost the CAS
  // for it and died): the live claimant's record wins.
  ProducerView both[] = {{wanted, true}, {wanted, false}};
  EXPECT_FALSE(is_hole_of_dead_producer(both, 2, wanted));
  ProducerView none[] = {{0, true}, {0, false}};
  EXPECT_FALSE(is_hole_of_dead_producer(none, 2, wanted));
}

}  // namespace
}  // namespace ferry::transport::shm
