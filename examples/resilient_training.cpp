// A training-like loop that loses a rank and carries on: each step every rank sums the gradient
// of the samples it holds and the ranks allreduce it. One rank dies mid-run (SIGKILL, as a
// crashed node would); the survivors see the allreduce fail, revoke the communicator, shrink it
// to the survivors, share the lost rank's samples among themselves and redo the step. Every
// step's gradient is checked against the whole data set's, so a lost or doubled sample shows.
//
//   ferryrun --keep-going -n 4 resilient_training [STEPS] [VICTIM] [STEP_OF_DEATH]
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

constexpr std::int64_t kSamples = 1200;
constexpr std::size_t kWidth = 256;  // gradient elements

// Sample i's contribution to gradient element j at a step.
std::int64_t gradient(std::int64_t i, std::size_t j, int step) {
  return (i * 31 + static_cast<std::int64_t>(j) * 7 + step) % 97;
}

// The gradient of the samples member `rank` of `size` holds: an even share of them, in order.
std::vector<std::int64_t> local_gradient(int rank, int size, int step) {
  std::vector<std::int64_t> g(kWidth, 0);
  for (std::int64_t i = kSamples * rank / size; i < kSamples * (rank + 1) / size; ++i) {
    for (std::size_t j = 0; j < kWidth; ++j) g[j] += gradient(i, j, step);
  }
  return g;
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::atoi(argv[1]) : 20;
  ferry::Context ctx = ferry::Context::init();
  const int victim = argc > 2 ? std::atoi(argv[2]) : ctx.size() - 1;
  const int death_step = argc > 3 ? std::atoi(argv[3]) : steps / 2;
  ferry::Communicator comm = ctx.world();

  for (int step = 0; step < steps; ++step) {
    if (step == death_step && ctx.rank() == victim && ctx.size() > 1) std::raise(SIGKILL);
    const std::vector<std::int64_t> mine = local_gradient(comm.rank(), comm.size(), step);
    std::vector<std::int64_t> sum(kWidth);
    ferry::Status s = comm.allreduce(mine.data(), sum.data(), kWidth, ferry::DataType::kInt64,
                                     ferry::ReduceOp::kSum);
    if (s.code() == ferry::Code::kPeerFailed || s.code() == ferry::Code::kRevoked) {
      // Someone is gone: make sure every survivor stops using this communicator (one still
      // waiting in it, or about to call it, fails at once), agree on who is left, and take
      // over the lost samples.
      const auto start = std::chrono::steady_clock::now();
      const int before = comm.size();
      comm.revoke();
      comm = comm.shrink();  // throws ferry::Error if the survivors cannot agree (FERRY_TIMEOUT)
      // The survivors may be a step apart: one finished a step before the death showed while
      // another still waited in it. All go back to the earliest (a real code would restore
      // that step's state) and redo it together.
      const std::int64_t here = step;
      std::int64_t resume = 0;
      s = comm.allreduce(&here, &resume, 1, ferry::DataType::kInt64, ferry::ReduceOp::kMin);
      if (s.is_ok()) {
        step = static_cast<int>(resume);
        const std::vector<std::int64_t> again = local_gradient(comm.rank(), comm.size(), step);
        s = comm.allreduce(again.data(), sum.data(), kWidth, ferry::DataType::kInt64,
                           ferry::ReduceOp::kSum);
      }
      const double ms =
          std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
              .count();
      if (comm.rank() == 0) {
        std::printf(
            "step %d: lost %d rank(s) (%s); %d carry on; revoke + shrink + allreduce "
            "took %.2f ms\n",
            step, before - comm.size(), s.is_ok() ? "recovered" : "not recovered", comm.size(), ms);
      }
    }
    if (!s.is_ok()) {
      std::fprintf(stderr, "rank %d: step %d: %s\n", ctx.rank(), step, s.to_string().c_str());
      return 1;
    }
    const std::vector<std::int64_t> whole = local_gradient(0, 1, step);
    if (sum != whole) {
      std::fprintf(stderr, "rank %d: step %d: the gradient is wrong (member %d of %d)\n",
                   ctx.rank(), step, comm.rank(), comm.size());
      return 1;
    }
  }
  if (comm.rank() == 0) {
    std::printf("finished %d steps on %d of %d ranks; every step's gradient checked\n", steps,
                comm.size(), ctx.size());
  }
  return 0;
}
