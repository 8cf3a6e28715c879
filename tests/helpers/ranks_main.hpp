// The main() of the multi-process GoogleTest programs (tests/mp): one Context per rank, which the
// tests reach through ctx() while they run; only rank 0 lists the tests, the others print
// failures only; a rank whose tests failed says so on stderr, and the exit status is the
// number of failures.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <functional>

#include "ferry/ferry.hpp"

namespace ferry::test {

// This rank's Context while run_on_every_rank runs the tests, else null.
inline Context* g_context = nullptr;
inline Context& ctx() { return *g_context; }
inline int me() { return ctx().rank(); }
inline int nranks() { return ctx().size(); }

// `min_ranks`: fewer is a usage error; `before`: the program's own set-up once the Context
// exists.
inline int run_on_every_rank(int argc, char** argv, const char* program, int min_ranks = 1,
                             const std::function<void(Context&)>& before = nullptr) {
  ::testing::InitGoogleTest(&argc, argv);
  try {
    Context made = Context::init();
    if (made.size() < min_ranks) {
      std::fprintf(stderr, "%s needs at least %d ranks\n", program, min_ranks);
      return 1;
    }
    g_context = &made;
    if (before) before(made);
    if (made.rank() != 0) GTEST_FLAG_SET(brief, true);
    const int failed = RUN_ALL_TESTS();
    g_context = nullptr;
    if (failed != 0) std::fprintf(stderr, "rank %d: tests failed\n", made.rank());
    return failed;
  } catch (const Error& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());
    return 1;
  }
}

}  // namespace ferry::test
