// ferryrun: the launcher of ferry jobs on one node. Parses the command line, then hands the job
// to run_job (job.cpp), whose exit status becomes ferryrun's.
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/status.hpp"
#include "ferry/version.hpp"
#include "job.hpp"
#include "util/config.hpp"
#include "util/log.hpp"

namespace {

using ferry::tools::JobOptions;

constexpr int kMaxRanks = 1 << 16;
constexpr double kMaxTimeoutS = 1e7;

constexpr const char* kUsage =
    "usage: ferryrun -n N [--timeout S] [--keep-going] [--] program [args...]\n";

constexpr const char* kHelp =
    "Starts N processes of `program` on this node as one ferry job.\n"
    "\n"
    "options:\n"
    "  -n N, --np N     number of ranks (required, 1 to 65536)\n"
    "  --timeout S      end the job after S seconds (exit status 124)\n"
    "  --keep-going     a rank that fails does not end the job: the others see the failure\n"
    "                   as errors on what involves it (the exit status is still the first\n"
    "                   failure's)\n"
    "  -h, --help       print this help\n"
    "  --version        print ferry's version\n"
    "  --               ends the options (the program may start with '-')\n"
    "\n"
    "Each rank gets FERRY_RANK, FERRY_SIZE, FERRY_LOCAL_RANK, FERRY_LOCAL_SIZE, FERRY_STORE\n"
    "(ferryrun's key-value store, unix:PATH), FERRY_JOB_ID and LOCAL_RANK (as FERRY_LOCAL_RANK,\n"
    "for programs that pick a GPU by it). Rank 0 inherits stdin unless it is\n"
    "a terminal; the other ranks read /dev/null. SIGINT, SIGTERM and SIGHUP are forwarded to the\n"
    "job. SIGUSR1 prints what each rank waits for in ferry (a blocking call that has waited\n"
    "100 ms or more: which call, on which communicator, who has not arrived); so do --timeout and\n"
    "a rank's failure. When a rank exits with a non-zero code, is killed by a signal, calls abort, "
    "or exits\n"
    "with code 0 having started ferry without finalizing it (its Context never destroyed),\n"
    "ferryrun sends SIGTERM to the others (SIGKILL 2 s later) and exits with that first failure's\n"
    "status: the exit code, 128 + the signal number, the abort code, or 1. A rank that exits\n"
    "before it joins fails the others' Context::init at once, naming it. A program that cannot be "
    "run\n"
    "exits 127; bad arguments exit 2. On exit ferryrun removes the store's directory and the\n"
    "job's /dev/shm/ferry-<job id>-* segments.\n";

int usage_error(const std::string& message) {
  std::fprintf(stderr, "ferryrun: %s\n%s(ferryrun --help explains the options)\n", message.c_str(),
               kUsage);
  return ferry::tools::kExitUsage;
}

bool parse_ranks(const std::string& text, int* ranks, std::string* error) {
  errno = 0;
  char* end = nullptr;
  long value = std::strtol(text.c_str(), &end, 10);
  if (text.empty() || errno != 0 || *end != '\0' || value < 1 || value > kMaxRanks) {
    *error = "-n takes a number of ranks from 1 to " + std::to_string(kMaxRanks) + ", not '" +
             text + "'";
    return false;
  }
  *ranks = static_cast<int>(value);
  return true;
}

bool parse_timeout(const std::string& text, double* seconds, std::string* error) {
  errno = 0;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || errno != 0 || *end != '\0' || !std::isfinite(value) || value <= 0 ||
      value > kMaxTimeoutS) {
    *error = "--timeout takes a positive number of seconds (at most 1e7), not '" + text + "'";
    return false;
  }
  *seconds = value;
  return true;
}

// Fills `options` from argv; returns -1 to run the job, or the status to exit with.
int parse(int argc, char** argv, JobOptions* options) {
  std::vector<std::string> args(argv + 1, argv + argc);
  std::string error;
  bool have_ranks = false;
  std::size_t i = 0;
  // The value of an option given as "--opt VALUE", "--opt=VALUE" or (for -n) "-nVALUE".
  auto value_of = [&](std::string_view name, std::string* value) {
    const std::string& arg = args[i];
    if (arg.size() > name.size()) {
      *value = arg.substr(name.size() + (arg[name.size()] == '=' ? 1 : 0));
      return true;
    }
    if (i + 1 >= args.size()) {
      error = std::string(name) + " needs a value";
      return false;
    }
    *value = args[++i];
    return true;
  };
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    std::string value;
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.empty() || arg[0] != '-' || arg == "-") break;  // the program starts here
    if (arg == "-h" || arg == "--help") {
      std::printf("%s\n%s", kUsage, kHelp);
      return 0;
    }
    if (arg == "--version") {
      std::printf("ferryrun (ferry) %s\n", FERRY_VERSION_STRING);
      return 0;
    }
    if (arg.rfind("-n", 0) == 0 && (arg.size() == 2 || arg.rfind("-n=", 0) == 0 ||
                                    arg.find_first_not_of("0123456789", 2) == std::string::npos)) {
      if (!value_of("-n", &value) || !parse_ranks(value, &options->ranks, &error)) {
        return usage_error(error);
      }
      have_ranks = true;
    } else if (arg == "--np" || arg.rfind("--np=", 0) == 0) {
      if (!value_of("--np", &value) || !parse_ranks(value, &options->ranks, &error)) {
        return usage_error(error);
      }
      have_ranks = true;
    } else if (arg == "--keep-going") {
      options->keep_going = true;
    } else if (arg == "--timeout" || arg.rfind("--timeout=", 0) == 0) {
      if (!value_of("--timeout", &value) || !parse_timeout(value, &options->timeout_s, &error)) {
        return usage_error(error);
      }
      options->timeout_text = value;
    } else {
      return usage_error("unknown option '" + arg + "'");
    }
  }
  if (!have_ranks) return usage_error("-n N (the number of ranks) is required");
  options->command.assign(args.begin() + static_cast<std::ptrdiff_t>(i), args.end());
  if (options->command.empty()) return usage_error("no program to run");
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  JobOptions options;
  if (int status = parse(argc, argv, &options); status >= 0) return status;
  // The ranks validate the same FERRY_* variables at init; warning here once says it early.
  try {
    auto config = ferry::util::Config::load();
    ferry::util::set_log_level(
        static_cast<ferry::util::LogLevel>(config.get_int(ferry::util::Var::kLogLevel)));
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferryrun: warning: %s\n", e.what());
  }
  return ferry::tools::run_job(options);
}
