// Tests of the launcher bootstraps that need no launcher: the TCP store with ranks on threads,
// the PMI-1 wire codec, and the PMI-1 client against a scripted launcher on a socketpair.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/pmi.hpp"
#include "bootstrap/store_client.hpp"
#include "util/config.hpp"
#include "util/fd.hpp"

namespace ferry::bootstrap {
namespace {

Blob blob_of(const std::string& text) {
  auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  return Blob(bytes.begin(), bytes.end());
}

std::string text_of(const Blob& blob) {
  return std::string(reinterpret_cast<const char*>(blob.data()), blob.size());
}

int free_port() {
  util::Fd socket(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof(address);
  if (::bind(socket.get(), reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
      ::getsockname(socket.get(), reinterpret_cast<sockaddr*>(&address), &length) != 0) {
    return -1;
  }
  return ntohs(address.sin_port);
}

TEST(TcpStore, RanksOnThreadsShareAJobIdAndFindThemselvesOnOneNode) {
  const int port = free_port();
  ASSERT_GT(port, 0);
  constexpr int kRanks = 3;
  std::vector<std::string> job(kRanks), gathered(kRanks), got(kRanks);
  std::vector<std::vector<int>> local(kRanks);
  std::vector<std::string> errors(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r) {
    threads.emplace_back([&, r] {
      try {
        StoreOptions o;
        o.host = "127.0.0.1";
        o.port = port;
        o.rank = r;
        o.size = kRanks;
        o.timeout_s = 20;
        o.linger_s = 5;
        StoreBootstrap boot(o);
        job[r] = boot.job_id();
        local[r] = boot.local_ranks();
        if (r == 2) {
          EXPECT_TRUE(boot.put("from-two", blob_of("two's value")));
        }
        std::vector<Blob> all;
        EXPECT_TRUE(boot.allgather(blob_of("rank" + std::to_string(r)), &all));
        for (const Blob& b : all) gathered[r] += text_of(b) + ",";
        Blob value;
        EXPECT_TRUE(boot.get("from-two", &value));
        got[r] = text_of(value);
        EXPECT_TRUE(boot.barrier());
        EXPECT_EQ(boot.local_rank(), r);
        EXPECT_EQ(boot.local_size(), kRanks);
      } catch (const Error& e) {
        errors[r] = e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(errors[r], "") << "rank " << r;
    EXPECT_EQ(job[r], job[0]);
    EXPECT_EQ(job[r].front(), 't');
    EXPECT_EQ(local[r], (std::vector<int>{0, 1, 2}));
    EXPECT_EQ(gathered[r], "rank0,rank1,rank2,");
    EXPECT_EQ(got[r], "two's value");
  }
}

TEST(TcpStore, AGivenLocalityAndJobIdAreKept) {
  const int port = free_port();
  std::vector<std::thread> threads;
  std::vector<std::vector<int>> local(2);
  std::vector<std::string> job(2);
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      StoreOptions o;
      o.host = "127.0.0.1";
      o.port = port;
      o.rank = r;
      o.size = 2;
      o.local_rank = 0;  // each rank alone on its "node"
      o.local_size = 1;
      o.job_id = "given";
      o.timeout_s = 20;
      StoreBootstrap boot(o);
      local[r] = boot.local_ranks();
      job[r] = boot.job_id();
      EXPECT_TRUE(boot.barrier());
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(local[0], std::vector<int>{0});
  EXPECT_EQ(local[1], std::vector<int>{1});
  EXPECT_EQ(job[1], "given");
}

TEST(PmiWire, ParsesReplyLines) {
  std::vector<std::pair<std::string, std::string>> f;
  ASSERT_TRUE(pmi::parse_line("cmd=get_result rc=0 msg=success value=0a1b", &f));
  ASSERT_EQ(f.size(), 4u);
  EXPECT_EQ(f[0], (std::pair<std::string, std::string>{"cmd", "get_result"}));
  EXPECT_EQ(f[3].second, "0a1b");
  ASSERT_TRUE(pmi::parse_line("cmd=barrier_out", &f));
  EXPECT_TRUE(pmi::parse_line("cmd=maxes  kvsname_max=256 value=", &f));  // an empty value
  EXPECT_FALSE(pmi::parse_line("", &f));
  EXPECT_FALSE(pmi::parse_line("rc=0 cmd=put_result", &f));  // cmd must come first
  EXPECT_FALSE(pmi::parse_line("cmd=x garbage", &f));
  EXPECT_FALSE(pmi::parse_line("cmd=x =value", &f));
}

TEST(PmiWire, HexRoundTripsAndRejectsGarbage) {
  std::vector<std::byte> bytes;
  for (int i = 0; i < 256; ++i) bytes.push_back(static_cast<std::byte>(i));
  const std::string hex = pmi::to_hex(bytes);
  EXPECT_EQ(hex.size(), 512u);
  EXPECT_EQ(hex.substr(0, 6), "000102");
  std::vector<std::byte> back;
  ASSERT_TRUE(pmi::from_hex(hex, &back));
  EXPECT_EQ(back, bytes);
  EXPECT_FALSE(pmi::from_hex("abc", &back));
  EXPECT_FALSE(pmi::from_hex("zz", &back));
  EXPECT_FALSE(pmi::from_hex("0 ", &back));
}

// A launcher speaking PMI-1 for a job of one rank, with a small vallen_max so values are split.
class ScriptedPmi {
 public:
  // big_values: vallen_max 1024 as hydra and Slurm say, so only the 1024-byte line limit splits.
  explicit ScriptedPmi(bool answer_barrier, bool big_values = false)
      : answer_barrier_(answer_barrier), big_values_(big_values) {
    int fds[2];
    if (::socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) std::abort();
    client_.reset(fds[0]);
    server_.reset(fds[1]);
    thread_ = std::thread([this] { serve(); });
  }
  ~ScriptedPmi() {
    ::shutdown(server_.get(), SHUT_RDWR);
    thread_.join();
  }
  int client_fd() const { return client_.get(); }
  int puts() const { return puts_; }

 private:
  void serve() {
    std::string buffer;
    char chunk[4096];
    for (;;) {
      ssize_t n = ::read(server_.get(), chunk, sizeof(chunk));
      if (n <= 0) return;
      buffer.append(chunk, static_cast<std::size_t>(n));
      for (auto nl = buffer.find('\n'); nl != std::string::npos; nl = buffer.find('\n')) {
        std::string line = buffer.substr(0, nl);
        buffer.erase(0, nl + 1);
        std::vector<std::pair<std::string, std::string>> f;
        if (line.size() + 1 > 1024 || !pmi::parse_line(line, &f)) return;  // a launcher's limit
        std::map<std::string, std::string> m(f.begin(), f.end());
        const std::string& cmd = m["cmd"];
        std::string reply;
        if (cmd == "init") {
          reply = "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0";
        } else if (cmd == "get_maxes") {
          reply = std::string("cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=") +
                  (big_values_ ? "1024" : "64");
        } else if (cmd == "get_my_kvsname") {
          reply = "cmd=my_kvsname kvsname=kvs_unit_0";
        } else if (cmd == "put") {
          if (m["value"].size() >= (big_values_ ? 1024u : 64u)) return;  // over vallen_max
          kvs_[m["key"]] = m["value"];
          ++puts_;
          reply = "cmd=put_result rc=0 msg=success";
        } else if (cmd == "get") {
          auto it = kvs_.find(m["key"]);
          reply = it == kvs_.end() ? "cmd=get_result rc=-1 msg=key_not_found"
                                   : "cmd=get_result rc=0 msg=success value=" + it->second;
        } else if (cmd == "barrier_in") {
          if (!answer_barrier_) continue;
          reply = "cmd=barrier_out";
        } else if (cmd == "finalize") {
          reply = "cmd=finalize_ack";
        } else {
          continue;
        }
        reply += "\n";
        if (::write(server_.get(), reply.data(), reply.size()) < 0) return;
      }
    }
  }

  bool answer_barrier_;
  bool big_values_;
  util::Fd client_, server_;
  std::map<std::string, std::string> kvs_;
  std::atomic<int> puts_{0};
  std::thread thread_;
};

std::unique_ptr<Bootstrap> pmi_client(const ScriptedPmi& launcher, const char* timeout) {
  ::setenv("PMI_FD", std::to_string(launcher.client_fd()).c_str(), 1);
  ::setenv("PMI_RANK", "0", 1);
  ::setenv("PMI_SIZE", "1", 1);
  ::setenv("FERRY_BOOTSTRAP_TIMEOUT", timeout, 1);
  auto boot = create_pmi(util::Config::load());
  for (const char* name : {"PMI_FD", "PMI_RANK", "PMI_SIZE", "FERRY_BOOTSTRAP_TIMEOUT"}) {
    ::unsetenv(name);
  }
  return boot;
}

TEST(PmiClient, SplitsLargeValuesWithinTheLaunchersLimit) {
  ScriptedPmi launcher(true);
  auto boot = pmi_client(launcher, "5");
  EXPECT_EQ(boot->size(), 1);
  EXPECT_EQ(boot->local_ranks(), std::vector<int>{0});
  EXPECT_EQ(boot->job_id(), "kvs-unit-0");
  std::string big(1000, 'x');
  for (std::size_t i = 0; i < big.size(); ++i) big[i] = static_cast<char>(i * 7);
  const int before = launcher.puts();
  ASSERT_TRUE(boot->put("big", blob_of(big)));
  EXPECT_GT(launcher.puts() - before, 30);  // 2000 hex digits in chunks of at most 62
  Blob value;
  ASSERT_TRUE(boot->get("big", &value));
  EXPECT_EQ(text_of(value), big);
  const int before_small = launcher.puts();
  ASSERT_TRUE(boot->put("small", blob_of("0123456789")));  // 20 hex digits: inline, one put
  EXPECT_EQ(launcher.puts() - before_small, 1);
  ASSERT_TRUE(boot->get("small", &value));
  EXPECT_EQ(text_of(value), "0123456789");
  std::vector<Blob> all;
  ASSERT_TRUE(boot->allgather(blob_of(""), &all));  // an empty contribution survives
  ASSERT_EQ(all.size(), 1u);
  EXPECT_TRUE(all[0].empty());
}

TEST(PmiClient, KeepsEveryRequestLineWithin1024Bytes) {
  // vallen_max is 1024, but the whole line must fit 1024 bytes too (Slurm refused longer ones).
  ScriptedPmi launcher(true, true);
  auto boot = pmi_client(launcher, "5");
  for (std::size_t bytes : {400u, 500u, 511u, 512u, 5000u}) {
    std::string value(bytes, 'v');
    for (std::size_t i = 0; i < bytes; ++i) value[i] = static_cast<char>(i * 13 + bytes);
    const std::string key = "value-of-" + std::to_string(bytes);
    ASSERT_TRUE(boot->put(key, blob_of(value))) << bytes;  // a longer line ends the launcher
    Blob back;
    ASSERT_TRUE(boot->get(key, &back)) << bytes;
    EXPECT_EQ(text_of(back), value) << bytes;
  }
}

TEST(PmiClient, AMissingKeyAndASilentLauncherTimeOut) {
  {
    ScriptedPmi launcher(true);
    auto boot = pmi_client(launcher, "0.3");
    Blob value;
    const auto start = std::chrono::steady_clock::now();
    Status s = boot->get("never-put", &value);
    EXPECT_EQ(s.code(), Code::kTimeout);
    EXPECT_NE(s.message().find("no rank put that key"), std::string::npos) << s.message();
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
  }
  ScriptedPmi silent(false);
  try {
    pmi_client(silent, "0.3");  // locality's allgather waits for a barrier_out that never comes
    ADD_FAILURE() << "init went on without the launcher's barrier";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("barrier_in timed out"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace ferry::bootstrap
