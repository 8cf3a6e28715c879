// ferry-perf's command line and output.
#include <cerrno>

#include "perf.hpp"

namespace ferry::perf {

[[noreturn]] void usage(const char* error) {
  if (error != nullptr) std::fprintf(stderr, "ferry-perf: %s\n", error);
  std::fprintf(
      error ? stderr : stdout,
      "usage: ferryrun -n 2 ferry-perf [latency|bandwidth|bibw]... [options]\n"
      "       ferryrun -n 2 ferry-perf [put_lat|get_lat|put_bw|get_bw|atomic_add]... [options]\n"
      "  (one-sided, on memory from allocate_memory, or with -m cuda on registered device\n"
      "  memory: put_lat (host only) is a ping-pong of puts, each\n"
      "  side polling its memory for the\n"
      "  other's last byte; get_lat a blocking get; the _bw tests a window then a flush;\n"
      "  atomic_add a window of 8-byte adds: latency_us is the time per add)\n"
      "       ferryrun -n N ferry-perf [allreduce|broadcast|allgather|reduce_scatter|reduce|\n"
      "                                 barrier|sendrecv|send]...\n"
      "  (collectives: SIZE is the bytes of the result; allreduce, reduce_scatter and reduce\n"
      "  add float32, broadcast comes from rank 0, reduce goes to it; -m cuda puts every rank's\n"
      "  buffers on its GPU; barrier ignores SIZE; sendrecv (with --stream): each rank sends to "
      "the next and receives\n"
      "  from the previous; send (with --stream): rank 0 sends to rank 1, one direction)\n"
      "  --sizes LIST       message sizes, e.g. 8,4k,4m (default: 1 B ... 64 MiB)\n"
      "  --iterations N     timed iterations per size (default: by size)\n"
      "  --warmup N         untimed iterations first (default: a tenth)\n"
      "  --window W         sends in flight in bandwidth tests (default 64)\n"
      "  --check            verify every byte received\n"
      "  --stream           collectives by their stream-ordered forms on a CUDA stream, timed\n"
      "                     from the first enqueue until the stream is done\n"
      "  --graph N          as --stream, captured in CUDA graphs of N calls that are replayed\n"
      "  --group G          send: G messages a call, the same bytes, in one group (a window\n"
      "                     of sends as OSU's NCCL bandwidth test; default 1)\n"
      "  --in-flight K      collectives by their non-blocking forms, K posted before they are\n"
      "                     waited for (as nccl-tests times its iterations; default 1: blocking)\n"
      "  --register         one-sided on host memory: the exposed buffer is the program's own,\n"
      "                     given to register_memory (reached by CMA on this node)\n"
      "  -m, --mem A[:B]    buffers in host, pinned (host memory page-locked by CUDA) or cuda\n"
      "                     memory on rank 0 (A) and rank 1 (B, default A; in collectives every\n"
      "                     rank after 0 uses B); cuda uses GPU local_rank %% device count\n"
      "  --json | --csv     machine-readable output (default: a table)\n"
      "With no test named it runs latency and bandwidth.\n");
  std::exit(error ? 2 : 0);
}

namespace {

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

}  // namespace

bool is_one_sided(const std::string& test) {
  return test == "put_lat" || test == "get_lat" || test == "put_bw" || test == "get_bw" ||
         test == "atomic_add";
}

bool is_collective(const std::string& test) {
  return test == "allreduce" || test == "broadcast" || test == "allgather" ||
         test == "reduce_scatter" || test == "reduce" || test == "sendrecv" || test == "send" ||
         test == "barrier";
}

Args parse(int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> const char* {
      if (i + 1 >= argc) usage((a + " needs a value").c_str());
      return argv[++i];
    };
    if (a == "latency" || a == "bandwidth" || a == "bibw" || is_collective(a) || is_one_sided(a)) {
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
    } else if (a == "--group") {
      args.group = parse_count("--group", value(), 1);
    } else if (a == "--window") {
      args.window = static_cast<int>(parse_count("--window", value(), 1));
    } else if (a == "-m" || a == "--mem") {
      std::string spec = value();
      std::size_t colon = spec.find(':');
      args.mem[0] = spec.substr(0, colon);
      args.mem[1] = colon == std::string::npos ? args.mem[0] : spec.substr(colon + 1);
      for (const std::string& m : args.mem) {
        if (m != "host" && m != "cuda" && m != "pinned")
          usage(("bad memory kind '" + m + "' (host, pinned or cuda)").c_str());
      }
    } else if (a == "--check") {
      args.check = true;
    } else if (a == "--stream") {
      args.stream = true;
    } else if (a == "--in-flight") {
      args.in_flight = parse_count("--in-flight", value(), 1);
    } else if (a == "--graph") {
      args.graph = parse_count("--graph", value(), 1);
      args.stream = true;
    } else if (a == "--register") {
      args.register_host = true;
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
  for (const std::string& t : args.tests) {
    if (args.stream && !is_collective(t)) usage(("--stream takes collectives, not " + t).c_str());
    if (!args.stream && (t == "sendrecv" || t == "send")) usage((t + " needs --stream").c_str());
  }
  if (args.sizes.empty()) {
    for (std::size_t s = 1; s <= (64u << 20); s *= 2) args.sizes.push_back(s);
  }
  return args;
}

void print(const Args& args, const std::vector<Record>& records, const ferry::Context& ctx) {
  if (args.format == Args::kJson) {
    std::printf("[");
    for (std::size_t i = 0; i < records.size(); ++i) {
      const Record& r = records[i];
      std::printf("%s\n  {\"test\": \"%s\", \"size\": %zu, \"iterations\": %ld", i ? "," : "",
                  r.test.c_str(), r.size, r.iterations);
      if (r.latency_us >= 0) std::printf(", \"latency_us\": %.4f", r.latency_us);
      if (r.bandwidth_GBps >= 0) std::printf(", \"bandwidth_GBps\": %.4f", r.bandwidth_GBps);
      std::printf("}");
    }
    std::printf("\n]\n");
    return;
  }
  if (args.format == Args::kCsv) {
    std::printf("test,size,iterations,latency_us,bandwidth_GBps\n");
    for (const Record& r : records) {
      std::printf("%s,%zu,%ld,", r.test.c_str(), r.size, r.iterations);
      if (r.latency_us >= 0) std::printf("%.4f", r.latency_us);
      std::printf(",");
      if (r.bandwidth_GBps >= 0) std::printf("%.4f", r.bandwidth_GBps);
      std::printf("\n");
    }
    return;
  }
  const std::string mode =
      args.graph > 0 ? "; stream-ordered, graphs of " + std::to_string(args.graph) + " calls"
      : args.stream  ? "; stream-ordered"
                     : "";
  std::printf(
      "# ferry-perf %s: ranks 0 and 1 of %d (collectives: all); memory %s:%s; rank 1 via "
      "%s%s%s\n",
      FERRY_VERSION_STRING, ctx.size(), args.mem[0].c_str(), args.mem[1].c_str(),
      ctx.size() > 1 ? ctx.describe_peer(1).c_str() : "-", args.check ? "; data checked" : "",
      mode.c_str());
  std::printf("%-10s %12s %11s %12s %15s\n", "test", "size", "iterations", "latency_us",
              "bandwidth_GBps");
  for (const Record& r : records) {
    std::printf("%-10s %12zu %11ld ", r.test.c_str(), r.size, r.iterations);
    if (r.latency_us >= 0) {
      std::printf("%12.3f ", r.latency_us);
    } else {
      std::printf("%12s ", "-");
    }
    if (r.bandwidth_GBps >= 0) {
      std::printf("%15.3f\n", r.bandwidth_GBps);
    } else {
      std::printf("%15s\n", "-");
    }
  }
}

}  // namespace ferry::perf
