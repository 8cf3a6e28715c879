// Tests of ferryrun's store: the frame codec, the server with ranks on threads (put/get, barrier,
// allgather, abort), malformed and refused clients, timeouts, and the single-process bootstrap.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/single.hpp"
#include "bootstrap/store_client.hpp"
#include "bootstrap/store_protocol.hpp"
#include "bootstrap/store_server.hpp"
#include "util/config.hpp"
#include "util/fd.hpp"

namespace ferry::bootstrap {
namespace {

using namespace std::chrono_literals;

Blob blob_of(const std::string& text) {
  auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  return Blob(bytes.begin(), bytes.end());
}

std::string text_of(const Blob& blob) {
  return std::string(reinterpret_cast<const char*>(blob.data()), blob.size());
}

// A store server on its own thread, in a private directory, like ferryrun runs it.
class StoreFixture : public ::testing::Test {
 protected:
  void start(int size) {
    char dir[] = "/tmp/ferry-store-test-XXXXXX";
    ASSERT_NE(::mkdtemp(dir), nullptr);
    dir_ = dir;
    server_ = std::make_unique<StoreServer>(
        dir_ + "/store.sock", size, [this](int rank, int pid, int code, const std::string& why) {
          std::lock_guard lock(mutex_);
          aborts_.push_back(std::to_string(rank) + "/" + std::to_string(pid) + "/" +
                            std::to_string(code) + "/" + why);
        });
    thread_ = std::thread([this] {
      while (!stop_.load()) server_->poll(5);
    });
  }
  void stop_server() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
    server_.reset();
  }
  void TearDown() override {
    stop_server();
    if (!dir_.empty()) ::rmdir(dir_.c_str());
  }
  [[nodiscard]] StoreOptions options(int rank, int size, double timeout_s = 10) const {
    StoreOptions o;
    o.path = dir_ + "/store.sock";
    o.rank = rank;
    o.size = size;
    o.local_rank = rank;
    o.local_size = size;
    o.job_id = "test";
    o.timeout_s = timeout_s;
    return o;
  }
  // A raw connection, for sending frames no StoreBootstrap would send.
  [[nodiscard]] util::Fd connect_raw() const {
    util::Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::string path = dir_ + "/store.sock";
    std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
    EXPECT_EQ(::connect(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    return fd;
  }
  // Sends `bytes` and returns the server's reply; the status is not ok when none came.
  static Status exchange(int fd, const store::Bytes& bytes, store::Frame* reply) {
    auto deadline = store::Clock::now() + 5s;
    Status status = store::send_all(fd, bytes, deadline);
    if (!status) return status;
    store::FrameReader reader;
    return store::receive_frame(fd, &reader, reply, deadline);
  }
  // True when the server closed `fd` (after its error reply, if any).
  static bool closed_by_server(int fd) {
    store::FrameReader reader;
    store::Frame frame;
    Status status;
    do {
      status = store::receive_frame(fd, &reader, &frame, store::Clock::now() + 5s);
    } while (status);
    return status.code() == Code::kPeerFailed;
  }

  std::string dir_;
  std::unique_ptr<StoreServer> server_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::mutex mutex_;
  std::vector<std::string> aborts_;
};

TEST(StoreProtocol, FramesRoundTrip) {
  store::FrameReader reader;
  int fds[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
  util::Fd a(fds[0]), b(fds[1]);
  std::vector<store::Bytes> blobs = {blob_of("zero"), blob_of(""), blob_of("two")};
  auto deadline = store::Clock::now() + 5s;
  ASSERT_TRUE(store::send_all(a.get(), store::encode_hello(2, 3, 77), deadline));
  ASSERT_TRUE(store::send_all(a.get(), store::encode_put("key", blob_of("value")), deadline));
  ASSERT_TRUE(store::send_all(a.get(), store::encode_allgather_done(blobs), deadline));
  ASSERT_TRUE(store::send_all(a.get(), store::encode_abort(5, "why"), deadline));
  ASSERT_TRUE(store::send_all(a.get(), store::encode_error(Code::kPeerFailed, "gone"), deadline));

  store::Frame frame;
  ASSERT_TRUE(store::receive_frame(b.get(), &reader, &frame, deadline));
  store::Hello hello;
  ASSERT_EQ(frame.op, store::Op::kHello);
  ASSERT_TRUE(store::decode_hello(frame.payload, &hello));
  EXPECT_EQ(hello.rank, 2);
  EXPECT_EQ(hello.size, 3);
  EXPECT_EQ(hello.pid, 77);
  ASSERT_TRUE(store::receive_frame(b.get(), &reader, &frame, deadline));
  store::KeyValue kv;
  ASSERT_TRUE(store::decode_put(frame.payload, &kv));
  EXPECT_EQ(kv.key, "key");
  EXPECT_EQ(text_of(Blob(kv.value.begin(), kv.value.end())), "value");
  ASSERT_TRUE(store::receive_frame(b.get(), &reader, &frame, deadline));
  std::vector<store::Bytes> gathered;
  EXPECT_FALSE(store::decode_allgather_done(frame.payload, 2, &gathered));  // wrong count
  ASSERT_TRUE(store::decode_allgather_done(frame.payload, 3, &gathered));
  EXPECT_EQ(gathered, blobs);
  ASSERT_TRUE(store::receive_frame(b.get(), &reader, &frame, deadline));
  store::Abort abort;
  ASSERT_TRUE(store::decode_abort(frame.payload, &abort));
  EXPECT_EQ(abort.code, 5);
  EXPECT_EQ(abort.reason, "why");
  ASSERT_TRUE(store::receive_frame(b.get(), &reader, &frame, deadline));
  store::ErrorReply error;
  ASSERT_TRUE(store::decode_error(frame.payload, &error));
  EXPECT_EQ(error.code, Code::kPeerFailed);
  EXPECT_EQ(error.message, "gone");
}

TEST(StoreProtocol, EveryTruncatedOrPaddedPayloadIsRejected) {
  std::vector<store::Bytes> blobs = {blob_of("a"), blob_of("bc")};
  struct Case {
    store::Bytes frame;
    std::function<bool(std::span<const std::byte>)> decode;
  };
  std::vector<Case> cases = {
      {store::encode_hello(0, 1, 2),
       [](auto p) {
         store::Hello h;
         return store::decode_hello(p, &h);
       }},
      {store::encode_put("k", blob_of("v")),
       [](auto p) {
         store::KeyValue kv;
         return store::decode_put(p, &kv);
       }},
      {store::encode_get("k"),
       [](auto p) {
         std::string k;
         return store::decode_get(p, &k);
       }},
      {store::encode_abort(1, "r"),
       [](auto p) {
         store::Abort a;
         return store::decode_abort(p, &a);
       }},
      {store::encode_allgather_done(blobs),
       [](auto p) {
         std::vector<store::Bytes> b;
         return store::decode_allgather_done(p, 2, &b);
       }},
      {store::encode_error(Code::kTimeout, "m"),
       [](auto p) {
         store::ErrorReply e;
         return store::decode_error(p, &e);
       }},
  };
  for (const auto& c : cases) {
    std::span<const std::byte> payload(c.frame.data() + 5, c.frame.size() - 5);
    EXPECT_TRUE(c.decode(payload));
    for (std::size_t n = 0; n < payload.size(); ++n) EXPECT_FALSE(c.decode(payload.first(n)));
    store::Bytes padded(payload.begin(), payload.end());
    padded.push_back(std::byte{0});
    EXPECT_FALSE(c.decode(padded));
  }
  // A length prefix pointing past the payload.
  store::Bytes lying = {std::byte{0xff}, std::byte{0xff}, std::byte{0xff}, std::byte{0x7f}};
  std::string key;
  EXPECT_FALSE(store::decode_get(lying, &key));
}

TEST(StoreProtocol, OversizedAndEmptyFramesAreProtocolErrors) {
  for (std::uint32_t length : {0u, store::kMaxFrameBytes + 1, 0xffffffffu}) {
    int fds[2];
    ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, fds), 0);
    util::Fd a(fds[0]), b(fds[1]);
    ASSERT_EQ(::write(a.get(), &length, sizeof(length)), 4);
    store::FrameReader reader;
    store::Frame frame;
    Status status = store::receive_frame(b.get(), &reader, &frame, store::Clock::now() + 5s);
    EXPECT_EQ(status.code(), Code::kProtocolError) << length;
  }
}

// The store's clients retry a refused connection; one that reached itself is refused too, and is
// closed so that the port stays free for rank 0 to listen on.
TEST(StoreProtocol, AConnectionToItselfIsSeenAndLeavesThePortFree) {
  auto bound_socket = [](std::uint16_t port) {
    util::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    EXPECT_EQ(::bind(fd.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0)
        << std::strerror(errno);
    return fd;
  };
  auto port_of = [](int fd) {
    sockaddr_in address{};
    socklen_t length = sizeof(address);
    EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length), 0);
    return ntohs(address.sin_port);
  };
  auto connect_to = [](int fd, std::uint16_t port) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    return ::connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address));
  };

  // What the kernel does when it gives the connecting side the port it connects to.
  util::Fd self = bound_socket(0);
  const std::uint16_t port = port_of(self.get());
  ASSERT_EQ(connect_to(self.get(), port), 0) << std::strerror(errno);
  EXPECT_TRUE(store::connected_to_itself(self.get()));
  store::close_without_time_wait(self.get());
  self.reset();
  util::Fd listener = bound_socket(port);  // no SO_REUSEADDR: the port must be wholly free
  ASSERT_EQ(::listen(listener.get(), 1), 0);

  // An ordinary connection, to that listener, is not one.
  util::Fd client(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  ASSERT_EQ(connect_to(client.get(), port), 0) << std::strerror(errno);
  EXPECT_FALSE(store::connected_to_itself(client.get()));
  util::Fd unconnected(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  EXPECT_FALSE(store::connected_to_itself(unconnected.get()));
}

TEST_F(StoreFixture, RanksExchangeThroughPutGetBarrierAndAllgather) {
  constexpr int kSize = 4;
  start(kSize);
  std::vector<std::string> failures(kSize);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kSize; ++rank) {
    ranks.emplace_back([&, rank] {
      auto fail = [&](const std::string& what) { failures[rank] += what + "; "; };
      try {
        StoreBootstrap boot(options(rank, kSize));
        if (boot.local_ranks() != std::vector<int>{0, 1, 2, 3}) fail("local_ranks");
        int idle_calls = 0;
        auto idle = [&] { ++idle_calls; };
        for (int round = 0; round < 3; ++round) {
          std::string suffix = std::to_string(rank) + "." + std::to_string(round);
          if (!boot.put("key" + suffix, blob_of("value" + suffix))) fail("put");
          if (!boot.barrier(idle)) fail("barrier");
          for (int peer = 0; peer < kSize; ++peer) {
            std::string peer_suffix = std::to_string(peer) + "." + std::to_string(round);
            Blob value;
            Status status = boot.get("key" + peer_suffix, &value, idle);
            if (!status) fail(status.to_string());
            if (text_of(value) != "value" + peer_suffix) fail("value of " + peer_suffix);
          }
          std::vector<Blob> all;
          Status status = boot.allgather(blob_of("blob" + suffix), &all, idle);
          if (!status) fail(status.to_string());
          for (int peer = 0; peer < kSize && all.size() == kSize; ++peer) {
            std::string expected = "blob" + std::to_string(peer) + "." + std::to_string(round);
            if (text_of(all[peer]) != expected) fail("allgather slot " + std::to_string(peer));
          }
          if (all.size() != kSize) fail("allgather size");
        }
        if (!boot.barrier()) fail("final barrier");
      } catch (const Error& e) {
        fail(e.what());
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

TEST_F(StoreFixture, LargeBlobsCrossTheStoreIntact) {
  // Replies far larger than a socket buffer: partial sends on both sides, EPOLLOUT in the server.
  constexpr int kSize = 3;
  constexpr std::size_t kBytes = std::size_t{3} << 20;
  start(kSize);
  std::vector<std::string> failures(kSize);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < kSize; ++rank) {
    ranks.emplace_back([&, rank] {
      try {
        StoreBootstrap boot(options(rank, kSize));
        Blob mine(kBytes);
        for (std::size_t i = 0; i < kBytes; ++i) mine[i] = std::byte(i * 7 + rank);
        std::vector<Blob> all;
        Status status = boot.allgather(mine, &all, [] {});
        if (!status) failures[rank] = status.to_string();
        for (int peer = 0; peer < kSize && status; ++peer) {
          const Blob& blob = all[peer];
          bool same = blob.size() == kBytes;
          for (std::size_t i = 0; same && i < kBytes; i += 4093) {
            same = blob[i] == std::byte(i * 7 + peer);
          }
          if (!same) failures[rank] += "blob of rank " + std::to_string(peer) + " differs; ";
        }
        if (!boot.put("big" + std::to_string(rank), mine)) failures[rank] += "put; ";
        Blob value;
        status = boot.get("big" + std::to_string((rank + 1) % kSize), &value);
        if (!status || value.size() != kBytes) failures[rank] += "get; ";
      } catch (const Error& e) {
        failures[rank] = e.what();
      }
    });
  }
  for (auto& t : ranks) t.join();
  for (int rank = 0; rank < kSize; ++rank) EXPECT_EQ(failures[rank], "") << "rank " << rank;
}

TEST_F(StoreFixture, AnAllgatherOverTheFrameLimitFailsOnEveryRank) {
  start(2);
  std::vector<Status> results(2);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 2; ++rank) {
    ranks.emplace_back([&, rank] {
      StoreBootstrap boot(options(rank, 2));
      Blob half_plus(store::kMaxFrameBytes / 2 + 1024);
      std::vector<Blob> all;
      results[rank] = boot.allgather(half_plus, &all);
      // The failed round leaves the connection usable.
      Status next = boot.allgather(blob_of("small"), &all);
      if (!next || all.size() != 2) results[rank] = Status(Code::kInternal, next.to_string());
    });
  }
  for (auto& t : ranks) t.join();
  for (const Status& status : results) {
    EXPECT_EQ(status.code(), Code::kInvalidArgument);
    EXPECT_NE(status.message().find("frame limit"), std::string::npos) << status.message();
  }
}

TEST_F(StoreFixture, GetWaitsForALaterPutAndCallsIdle) {
  start(2);
  StoreBootstrap reader(options(1, 2));
  std::thread writer([&] {
    StoreBootstrap boot(options(0, 2));
    std::this_thread::sleep_for(100ms);
    EXPECT_TRUE(boot.put("late", blob_of("here")));
    EXPECT_TRUE(boot.barrier());
  });
  int idle_calls = 0;
  Blob value;
  Status status = reader.get("late", &value, [&] { ++idle_calls; });
  EXPECT_TRUE(status) << status.to_string();
  EXPECT_EQ(text_of(value), "here");
  EXPECT_GT(idle_calls, 0);
  EXPECT_TRUE(reader.barrier());
  writer.join();
}

TEST_F(StoreFixture, MissingKeyTimesOutInBoundedTime) {
  start(1);
  StoreBootstrap boot(options(0, 1, 0.2));
  int idle_calls = 0;
  Blob value;
  auto begin = std::chrono::steady_clock::now();
  Status status = boot.get("never-put", &value, [&] { ++idle_calls; });
  auto elapsed = std::chrono::steady_clock::now() - begin;
  EXPECT_EQ(status.code(), Code::kTimeout);
  EXPECT_NE(status.message().find("ferryrun store unix:"), std::string::npos) << status.message();
  EXPECT_NE(status.message().find("get of key 'never-put'"), std::string::npos);
  EXPECT_GE(elapsed, 190ms);
  EXPECT_LT(elapsed, 2s);
  EXPECT_GT(idle_calls, 5);
  // A timed-out GET leaves the connection usable, and its late answer is skipped.
  ASSERT_TRUE(boot.put("never-put", blob_of("late")));
  ASSERT_TRUE(boot.put("other", blob_of("x")));
  EXPECT_TRUE(boot.get("other", &value));
  EXPECT_EQ(text_of(value), "x");
  EXPECT_TRUE(boot.barrier());
}

TEST_F(StoreFixture, MalformedFramesAreRejectedAndTheServerKeepsServing) {
  start(2);
  {
    // A length prefix over the limit.
    util::Fd raw = connect_raw();
    std::uint32_t huge = 0xfffffff0u;
    ASSERT_EQ(::write(raw.get(), &huge, sizeof(huge)), 4);
    store::Frame reply;
    ASSERT_TRUE(exchange(raw.get(), {}, &reply));
    store::ErrorReply error;
    ASSERT_EQ(reply.op, store::Op::kError);
    ASSERT_TRUE(store::decode_error(reply.payload, &error));
    EXPECT_EQ(error.code, Code::kProtocolError);
    EXPECT_NE(error.message.find("malformed frame"), std::string::npos) << error.message;
    EXPECT_TRUE(closed_by_server(raw.get()));
  }
  {
    // A request before HELLO, then a HELLO whose payload is cut short.
    util::Fd raw = connect_raw();
    store::Frame reply;
    ASSERT_TRUE(exchange(raw.get(), store::encode_get("k"), &reply));
    EXPECT_EQ(reply.op, store::Op::kError);
    EXPECT_TRUE(closed_by_server(raw.get()));
    util::Fd raw2 = connect_raw();
    store::Bytes hello = store::encode_hello(0, 2, 1);
    hello.erase(hello.end() - 2, hello.end());  // resize() trips a GCC 12 -Wstringop-overflow
    std::uint32_t length = static_cast<std::uint32_t>(hello.size() - 4);
    std::memcpy(hello.data(), &length, sizeof(length));
    ASSERT_TRUE(exchange(raw2.get(), hello, &reply));
    EXPECT_EQ(reply.op, store::Op::kError);
    EXPECT_TRUE(closed_by_server(raw2.get()));
  }
  {
    // After a valid HELLO: an unknown op and a PUT whose value length lies.
    util::Fd raw = connect_raw();
    store::Frame reply;
    ASSERT_TRUE(exchange(raw.get(), store::encode_hello(1, 2, 1), &reply));
    ASSERT_EQ(reply.op, store::Op::kHelloOk);
    store::Bytes put = store::encode_put("k", blob_of("value"));
    std::uint32_t lie = 1000;
    std::memcpy(put.data() + 5 + 4 + 1, &lie, sizeof(lie));  // the value's length field
    ASSERT_TRUE(exchange(raw.get(), put, &reply));
    EXPECT_EQ(reply.op, store::Op::kError);
    EXPECT_TRUE(closed_by_server(raw.get()));
  }
  // The server survived all of that and still accepts ranks.
  util::Fd raw = connect_raw();
  store::Frame reply;
  ASSERT_TRUE(exchange(raw.get(), store::encode_hello(0, 2, 1), &reply));
  EXPECT_EQ(reply.op, store::Op::kHelloOk);
}

TEST_F(StoreFixture, DuplicateAndOutOfRangeRanksAreRefused) {
  start(2);
  StoreBootstrap first(options(0, 2));
  try {
    StoreBootstrap second(options(0, 2));
    ADD_FAILURE() << "a second rank 0 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kBootstrapError);
    EXPECT_NE(std::string(e.what()).find("already connected"), std::string::npos) << e.what();
  }
  for (auto hello : {store::encode_hello(2, 2, 1), store::encode_hello(-1, 2, 1),
                     store::encode_hello(1, 3, 1)}) {
    util::Fd raw = connect_raw();
    store::Frame reply;
    ASSERT_TRUE(exchange(raw.get(), hello, &reply));
    EXPECT_EQ(reply.op, store::Op::kError);
    EXPECT_TRUE(closed_by_server(raw.get()));
  }
  EXPECT_THROW({ StoreBootstrap third(options(2, 2)); }, Error);  // refused before connecting
}

TEST_F(StoreFixture, ARankThatLeavesFailsTheBarrierItNeverJoined) {
  start(3);
  auto leaver = std::make_unique<StoreBootstrap>(options(2, 3));
  std::thread waiter([&] {
    StoreBootstrap boot(options(0, 3));
    Status status = boot.barrier();
    EXPECT_EQ(status.code(), Code::kPeerFailed);
    EXPECT_NE(status.message().find("rank 2"), std::string::npos) << status.message();
  });
  StoreBootstrap boot(options(1, 3));
  std::this_thread::sleep_for(50ms);
  leaver.reset();
  Status status = boot.barrier();
  EXPECT_EQ(status.code(), Code::kPeerFailed) << status.to_string();
  waiter.join();
}

TEST_F(StoreFixture, AClosedStoreIsABootstrapError) {
  start(2);
  StoreBootstrap boot(options(0, 2));
  std::thread closer([&] {
    std::this_thread::sleep_for(100ms);
    stop_server();
  });
  Status status = boot.barrier();
  closer.join();
  EXPECT_EQ(status.code(), Code::kBootstrapError);
  EXPECT_NE(status.message().find("closed the connection during barrier"), std::string::npos)
      << status.message();
  // The connection stays broken with the same explanation.
  Blob value;
  EXPECT_EQ(boot.get("k", &value).message(), status.message());
}

TEST_F(StoreFixture, AbortReachesTheLauncher) {
  start(2);
  {
    StoreBootstrap boot(options(1, 2));
    boot.abort(7, "out of cheese");
  }
  for (int i = 0; i < 200; ++i) {
    {
      std::lock_guard lock(mutex_);
      if (!aborts_.empty()) break;
    }
    std::this_thread::sleep_for(5ms);
  }
  std::lock_guard lock(mutex_);
  ASSERT_EQ(aborts_.size(), 1u);
  EXPECT_EQ(aborts_[0], "1/" + std::to_string(::getpid()) + "/7/out of cheese");
}

TEST(SingleBootstrap, ExchangesWithItself) {
  SingleBootstrap boot;
  EXPECT_EQ(boot.rank(), 0);
  EXPECT_EQ(boot.size(), 1);
  EXPECT_EQ(boot.local_ranks(), std::vector<int>{0});
  EXPECT_NE(boot.job_id().find('x'), std::string::npos);
  EXPECT_NE(boot.job_id(), SingleBootstrap().job_id());
  Blob value;
  EXPECT_EQ(boot.get("k", &value).code(), Code::kBootstrapError);
  ASSERT_TRUE(boot.put("k", blob_of("v")));
  ASSERT_TRUE(boot.get("k", &value));
  EXPECT_EQ(text_of(value), "v");
  std::vector<Blob> all;
  ASSERT_TRUE(boot.allgather(blob_of("mine"), &all));
  ASSERT_EQ(all.size(), 1u);
  EXPECT_EQ(text_of(all[0]), "mine");
  EXPECT_TRUE(boot.barrier());
  EXPECT_EQ(SingleBootstrap("given").job_id(), "given");
}

TEST(BootstrapCreate, PicksFromTheEnvironment) {
  for (const char* name : {"FERRY_STORE", "FERRY_SIZE", "FERRY_RANK", "FERRY_JOB_ID"}) {
    ::unsetenv(name);
  }
  auto single = create(util::Config::load());
  EXPECT_EQ(single->name(), "single process");

  ::setenv("FERRY_SIZE", "4", 1);
  try {
    create(util::Config::load());
    ADD_FAILURE() << "FERRY_SIZE=4 without a store was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), Code::kBootstrapError);
    EXPECT_NE(std::string(e.what()).find("ferryrun -n 4"), std::string::npos) << e.what();
  }
  ::setenv("FERRY_STORE", "tcp:host:1", 1);
  EXPECT_THROW(create(util::Config::load()), Error);
  ::setenv("FERRY_STORE", "unix:/nonexistent/ferry.sock", 1);
  ::setenv("FERRY_RANK", "1", 1);
  ::setenv("FERRY_JOB_ID", "j", 1);
  try {
    create(util::Config::load());
    ADD_FAILURE() << "a missing store socket was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ferryrun store unix:/nonexistent/ferry.sock"),
              std::string::npos)
        << e.what();
  }
  for (const char* name : {"FERRY_STORE", "FERRY_SIZE", "FERRY_RANK", "FERRY_JOB_ID"}) {
    ::unsetenv(name);
  }
}

}  // namespace
}  // namespace ferry::bootstrap
