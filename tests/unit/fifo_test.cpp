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
  FifoProducer::publish(claim);
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
