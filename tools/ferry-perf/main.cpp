// ferry-perf: OSU-style point-to-point benchmarks between ranks 0 and 1: latency (ping-pong, half
// round trip), bandwidth (a window of non-blocking sends, then an ack) and bibw (both directions).
// Run under ferryrun: `ferryrun -n 2 ferry-perf [latency|bandwidth|bibw] [options]`.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::vector<std::string> tests;
  std::vector<std::size_t> sizes;
  long iterations = 0;  // 0: chosen by size
  long warmup = -1;     // -1: a tenth of the iterations
  int window = 64;
  bool check = false;
  enum { kTable, kJson, kCsv } format = kTable;
};

struct Record {
  std::string test;
  std::size_t size;
  long iterations;
  double latency_us;      // < 0 when it does not apply
  double bandwidth_GBps;  // < 0 when it does not apply
};

[[noreturn]] void usage(const char* error) {
  if (error != nullptr) std::fprintf(stderr, "ferry-perf: %s\n", error);
  std::fprintf(error ? stderr : stdout,
               "usage: ferryrun -n 2 ferry-perf [latency|bandwidth|bibw]... [options]\n"
               "  --sizes LIST       message sizes, e.g. 8,4k,4m (default: 1 B ... 64 MiB)\n"
               "  --iterations N     timed iterations per size (default: by size)\n"
               "  --warmup N         untimed iterations first (default: a tenth)\n"
               "  --window W         sends in flight in bandwidth tests (default 64)\n"
               "  --check            verify every byte received\n"
               "  --json | --csv     machine-readable output (default: a table)\n"
               "With no test named it runs latency and bandwidth.\n");
  std::exit(error ? 2 : 0);
}

std::size_t parse_size(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (errno != 0 || end == text.c_str() || text[0] == '-')
    usage(("bad size '" + text + "'").c_str());
  std::string suffix(end);
  if (suffix == "k" || suffix == "K")
    v <<= 10;
  else if (suffix == "m" || suffix == "M")
    v <<= 20;
  else if (suffix == "g" || suffix == "G")
    v <<= 30;
  else if (!suffix.empty())
    usage(("bad size '" + text + "'").c_str());
  if (v > (1ULL << 32)) usage(("size '" + text + "' is over 4 GiB").c_str());
  return v;
}

long parse_count(const char* flag, const char* text, long min) {
  char* end = nullptr;
  long v = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || v < min) {
    usage((std::string("bad value for ") + flag + ": '" + text + "'").c_str());
  }
  return v;
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "latency" || a == "bandwidth" || a == "bibw") {
      args.tests.push_back(a);
    } else if (a == "--sizes") {
      std::string list = value();
      std::size_t start = 0;
      while (start <= list.size()) {
        std::size_t comma = list.find(',', start);
        if (comma == std::string::npos) comma = list.size();
        if (comma > start) args.sizes.push_back(parse_size(list.substr(start, comma - start)));
        start = comma + 1;
      }
      if (args.sizes.empty()) usage("--sizes needs at least one size");
    } else if (a == "--iterations") {
      args.iterations = parse_count("--iterations", value(), 1);
    } else if (a == "--warmup") {
      args.warmup = parse_count("--warmup", value(), 0);
    } else if (a == "--window") {
      args.window = static_cast<int>(parse_count("--window", value(), 1));
    } else if (a == "--check") {
      args.check = true;
    } else if (a == "--json") {
      args.format = Args::kJson;
    } else if (a == "--csv") {
      args.format = Args::kCsv;
    } else if (a == "-h" || a == "--help") {
      usage(nullptr);
    } else {
      usage(("unknown argument '" + a + "'").c_str());
    }
  }
  if (args.tests.empty()) args.tests = {"latency", "bandwidth"};
  if (args.sizes.empty()) {
    for (std::size_t s = 1; s <= (64u << 20); s *= 2) args.sizes.push_back(s);
  }
  return args;
}

// The byte at `i` of message number `seq` of size `size`: differs per byte, message and size.
inline std::byte pattern(std::size_t i, long seq, std::size_t size) {
  return static_cast<std::byte>((i * 131 + static_cast<std::size_t>(seq) * 7 + size) & 0xff);
}

void fill(std::byte* p, std::size_t size, long seq) {
  for (std::size_t i = 0; i < size; ++i) p[i] = pattern(i, seq, size);
}

void verify(const std::byte* p, std::size_t size, long seq, const char* test) {
  for (std::size_t i = 0; i < size; ++i) {
    if (p[i] != pattern(i, seq, size)) {
      std::fprintf(stderr, "ferry-perf: %s: data check failed at byte %zu of a %zu-byte message\n",
                   test, i, size);
      std::exit(1);
    }
  }
}

void require(const ferry::Status& status, const char* what) {
  if (!status) {
    std::fprintf(stderr, "ferry-perf: %s failed: %s\n", what, status.to_string().c_str());
    std::exit(1);
  }
}

struct Bench {
  ferry::Context& ctx;
  const Args& args;
  int peer;

  long iterations_for(const std::string& test, std::size_t size) const {
    if (args.iterations > 0) return args.iterations;
    const double bytes = static_cast<double>(std::max<std::size_t>(size, 64));
    if (test == "latency") return std::clamp(static_cast<long>(1e9 / bytes), 20L, 20000L);
    return std::clamp(static_cast<long>(1e9 / (bytes * args.window)), 2L, 2000L);
  }

  double latency(std::size_t size, long iters, long warmup) {
    std::vector<std::byte> out(std::max<std::size_t>(size, 1)), in(out.size());
    Clock::time_point start;
    for (long i = -warmup; i < iters; ++i) {
      if (i == 0) start = Clock::now();
      if (ctx.rank() == 0) {
        if (args.check) fill(out.data(), size, i);
        require(ctx.send(out.data(), size, peer, 1), "send");
        require(ctx.recv(in.data(), size, peer, 2), "recv");
        if (args.check) verify(in.data(), size, i + 1, "latency");
      } else {
        require(ctx.recv(in.data(), size, peer, 1), "recv");
        if (args.check) {
          verify(in.data(), size, i, "latency");
          fill(out.data(), size, i + 1);
        }
        require(ctx.send(out.data(), size, peer, 2), "send");
      }
    }
    double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
    return us / (2.0 * static_cast<double>(iters));
  }

  // Returns GB/s. `both`: bibw (each side sends and receives a window).
  double bandwidth(std::size_t size, long iters, long warmup, bool both) {
    int window = args.window;
    // With --check each message of a window needs its own buffer; keep that under 1 GiB.
    std::size_t slots = args.check ? static_cast<std::size_t>(window) : 1;
    while (slots > 1 && slots * size > (1u << 30)) slots /= 2;
    if (args.check) window = static_cast<int>(slots);
    std::vector<std::byte> out(std::max<std::size_t>(size, 1) * slots);
    std::vector<std::byte> in(out.size());
    std::vector<ferry::Request> requests;
    requests.reserve(static_cast<std::size_t>(2 * window));
    const bool sender = both || ctx.rank() == 0;
    const bool receiver = both || ctx.rank() == 1;
    std::uint32_t ack = 0;
    Clock::time_point start;
    for (long i = -warmup; i < iters; ++i) {
      if (i == 0) start = Clock::now();
      requests.clear();
      for (int w = 0; receiver && w < window; ++w) {
        std::byte* p = in.data() + (args.check ? static_cast<std::size_t>(w) * size : 0);
        requests.push_back(ctx.irecv(p, size, peer, 3));
      }
      for (int w = 0; sender && w < window; ++w) {
        std::byte* p = out.data() + (args.check ? static_cast<std::size_t>(w) * size : 0);
        if (args.check) fill(p, size, i * window + w);
        requests.push_back(ctx.isend(p, size, peer, 3));
      }
      require(ferry::Request::wait_all(requests), "wait_all");
      if (args.check && receiver) {
        for (int w = 0; w < window; ++w) {
          verify(in.data() + static_cast<std::size_t>(w) * size, size, i * window + w, "bandwidth");
        }
      }
      if (!both) {
        if (ctx.rank() == 0) {
          require(ctx.recv(&ack, sizeof(ack), peer, 4), "ack recv");
        } else {
          require(ctx.send(&ack, sizeof(ack), peer, 4), "ack send");
        }
      }
    }
    double s = std::chrono::duration<double>(Clock::now() - start).count();
    double bytes = static_cast<double>(size) * window * static_cast<double>(iters) * (both ? 2 : 1);
    return bytes / s / 1e9;
  }
};

void print(const Args& args, const std::vector<Record>& records, const ferry::Context& ctx) {
  if (args.format == Args::kJson) {
    std::printf("[");
    for (std::size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      std::printf("%s\n  {\"test\": \"%s\", \"size\": %zu, \"iterations\": %ld, ", i ? "," : "",
                  r.test.c_str(), r.size, r.iterations);
      if (r.latency_us >= 0) {
        std::printf("\"latency_us\": %.4f}", r.latency_us);
      } else {
        std::printf("\"bandwidth_GBps\": %.4f}", r.bandwidth_GBps);
      }
    }
    std::printf("\n]\n");
    return;
  }
  if (args.format == Args::kCsv) {
    std::printf("test,size,iterations,latency_us,bandwidth_GBps\n");
    for (const Record& r : records) {
      std::printf("%s,%zu,%ld,", r.test.c_str(), r.size, r.iterations);
      if (r.latency_us >= 0)
        std::printf("%.4f,\n", r.latency_us);
      else
        std::printf(",%.4f\n", r.bandwidth_GBps);
    }
    return;
  }
  std::printf("# ferry-perf %s: ranks 0 and 1 of %d; rank 1 via %s%s\n", FERRY_VERSION_STRING,
              ctx.size(), ctx.describe_peer(1).c_str(), args.check ? "; data checked" : "");
  std::printf("%-10s %12s %11s %12s %15s\n", "test", "size", "iterations", "latency_us",
              "bandwidth_GBps");
  for (const Record& r : records) {
    std::printf("%-10s %12zu %11ld ", r.test.c_str(), r.size, r.iterations);
    if (r.latency_us >= 0)
      std::printf("%12.3f %15s\n", r.latency_us, "-");
    else
      std::printf("%12s %15.3f\n", "-", r.bandwidth_GBps);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    ferry::Context ctx = ferry::Context::init();
    if (ctx.size() < 2) {
      std::fprintf(stderr, "ferry-perf: needs 2 ranks (run it as `ferryrun -n 2 ferry-perf`)\n");
      return 2;
    }
    std::vector<Record> records;
    if (ctx.rank() <= 1) {
      Bench bench{ctx, args, 1 - ctx.rank()};
      for (const std::string& test : args.tests) {
        for (std::size_t size : args.sizes) {
          long iters = bench.iterations_for(test, size);
          long warmup = args.warmup >= 0 ? args.warmup : std::max(1L, iters / 10);
          Record r{test, size, iters, -1, -1};
          if (test == "latency") {
            r.latency_us = bench.latency(size, iters, warmup);
          } else {
            r.bandwidth_GBps = bench.bandwidth(size, iters, warmup, test == "bibw");
          }
          records.push_back(r);
        }
      }
    }
    if (ctx.rank() == 0) print(args, records, ctx);
    std::fflush(stdout);
    require(ctx.barrier(), "barrier");
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry-perf: %s\n", e.what());
    return 1;
  }
  return 0;
}
