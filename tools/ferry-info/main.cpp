// ferry-info: the version, the transports this process found and why others are absent, every
// FERRY_* variable with its value and doc, and (under ferryrun, --peers) the path to each peer.
#include <cstdio>
#include <cstring>
#include <string>

#include "ferry/ferry.hpp"
#include "util/config.hpp"

namespace {

void print_config(const ferry::util::Config& config) {
  std::printf("\nVariables (name = value [source]: type; doc):\n");
  for (const auto& entry : config.entries()) {
    const auto& spec = *entry.spec;
    std::string type = ferry::util::type_name(spec.type);
    if (spec.type == ferry::util::VarType::kEnum || spec.type == ferry::util::VarType::kList) {
      type += std::string(" ") + spec.allowed;
    } else if (spec.type == ferry::util::VarType::kInt ||
               spec.type == ferry::util::VarType::kSize ||
               spec.type == ferry::util::VarType::kSeconds) {
      char range[96];
      std::snprintf(range, sizeof(range), " in [%.12g, %.12g]", spec.min, spec.max);
      type += range;
    }
    std::printf("  %s = %s [%s]: %s; %s%s\n", spec.name, entry.value.c_str(), entry.source.c_str(),
                type.c_str(), spec.doc,
                ferry::util::job_wide(spec.id) ? " [job-wide: every rank must set it alike]" : "");
  }
  for (const auto& name : config.unknown()) {
    std::printf("  %s: unknown to ferry (a typo?)\n", name.c_str());
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool peers = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--peers") == 0) {
      peers = true;
    } else if (std::strcmp(argv[i], "-h") == 0 || std::strcmp(argv[i], "--help") == 0) {
      std::printf(
          "usage: ferry-info [--peers]   (under ferryrun, --peers shows every rank's "
          "path to every other)\n");
      return 0;
    } else {
      std::fprintf(stderr, "ferry-info: unknown argument '%s' (try --help)\n", argv[i]);
      return 2;
    }
  }
  try {
    ferry::util::Config config = ferry::util::Config::load();
    ferry::Context ctx = ferry::Context::init();
    if (ctx.rank() == 0) {
      std::printf("ferry %s\n\nTransports (rank 0 of %d):\n", FERRY_VERSION_STRING, ctx.size());
      for (const auto& line : ctx.describe_transports()) std::printf("  %s\n", line.c_str());
      print_config(config);
      std::fflush(stdout);
    }
    if (peers) {
      for (int turn = 0; turn < ctx.size(); ++turn) {
        ctx.barrier();
        if (turn != ctx.rank()) continue;
        std::printf("%sPeers of rank %d:\n", turn == 0 ? "\n" : "", ctx.rank());
        for (int r = 0; r < ctx.size(); ++r) {
          std::printf("  rank %d: %s\n", r, ctx.describe_peer(r).c_str());
        }
        std::fflush(stdout);
      }
    }
    ctx.barrier();
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry-info: %s\n", e.what());
    return 1;
  }
  return 0;
}
