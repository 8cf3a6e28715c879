// Allreduce on host buffers: every rank contributes a vector, every rank gets the sum, blocking
// and non-blocking. Run: ferryrun -n 4 build/examples/allreduce
#include <cstdio>
#include <vector>

#include "ferry/ferry.hpp"

int main() {
  try {
    ferry::Context ctx = ferry::Context::init();
    ferry::Communicator world = ctx.world();
    const int n = world.size();
    std::vector<float> gradient(1 << 20, static_cast<float>(world.rank() + 1));
    std::vector<float> sum(gradient.size());
    ferry::Status s = world.allreduce(gradient.data(), sum.data(), gradient.size(),
                                      ferry::DataType::kFloat32, ferry::ReduceOp::kSum);
    if (!s) {
      std::fprintf(stderr, "allreduce: %s\n", s.to_string().c_str());
      return 1;
    }
    const float expected = static_cast<float>(n * (n + 1) / 2);
    // In place and non-blocking: start it, do other work, then wait.
    ferry::Request pending = world.iallreduce(gradient.data(), gradient.data(), gradient.size(),
                                              ferry::DataType::kFloat32, ferry::ReduceOp::kMax);
    s = pending.wait();
    if (!s || sum.front() != expected || sum.back() != expected ||
        gradient.front() != static_cast<float>(n)) {
      std::fprintf(stderr, "rank %d: wrong result or %s\n", ctx.rank(), s.to_string().c_str());
      return 1;
    }
    if (ctx.rank() == 0) {
      std::printf("%d ranks: sum %g, max %g over %zu floats\n", n, sum.front(), gradient.front(),
                  sum.size());
    }
    return 0;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "allreduce: %s\n", e.what());
    return 1;
  }
}
