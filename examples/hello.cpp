// Hello, ferry: rank 0 sends a greeting to every other rank, each answers, and rank 0 prints the
// answers. Run: ferryrun -n 3 build/examples/hello
#include <cstdio>
#include <string>

#include "ferry/ferry.hpp"

int main() {
  try {
    ferry::Context ctx = ferry::Context::init();  // ferryrun's environment, or a job of one
    constexpr ferry::Tag kGreeting = 1, kAnswer = 2;
    if (ctx.rank() == 0) {
      const std::string hello = "hello from rank 0";
      for (int peer = 1; peer < ctx.size(); ++peer) {
        if (ferry::Status s = ctx.send(hello.data(), hello.size() + 1, peer, kGreeting); !s) {
          std::fprintf(stderr, "send to rank %d: %s\n", peer, s.to_string().c_str());
          return 1;
        }
      }
      for (int answers = 1; answers < ctx.size(); ++answers) {
        char text[64] = {};
        ferry::MessageInfo info;
        // From whichever rank answers first.
        if (ferry::Status s = ctx.recv(text, sizeof(text), ferry::kAnySource, kAnswer, &info); !s) {
          std::fprintf(stderr, "receive: %s\n", s.to_string().c_str());
          return 1;
        }
        std::printf("rank %d says: %s\n", info.source, text);
      }
    } else {
      char text[64] = {};
      ferry::Status s = ctx.recv(text, sizeof(text), 0, kGreeting);
      const std::string answer = "got '" + std::string(text) + "'";
      if (s) s = ctx.send(answer.data(), answer.size() + 1, 0, kAnswer);
      if (!s) {
        std::fprintf(stderr, "rank %d: %s\n", ctx.rank(), s.to_string().c_str());
        return 1;
      }
    }
    return 0;
  } catch (const ferry::Error& e) {  // set-up failures throw, saying what failed and why
    std::fprintf(stderr, "hello: %s\n", e.what());
    return 1;
  }
}
