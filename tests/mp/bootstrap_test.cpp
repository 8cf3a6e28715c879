// The bootstrap alone, under whatever launcher started this process (no Context): each rank puts
// a value, including one far over PMI-1's 1024-byte value limit; after a barrier every rank gets
// every other rank's keys; an allgather of blobs of different sizes (one empty) comes back in
// rank order; a get of a key nobody put times out. Prints "bootstrap ok" or what failed.
#include "bootstrap/bootstrap.hpp"

#include <cstdio>
#include <string>
#include <vector>

#include "util/config.hpp"

namespace {

using ferry::bootstrap::Blob;

Blob blob_of(const std::string& text) {
  auto bytes = std::as_bytes(std::span<const char>(text.data(), text.size()));
  return Blob(bytes.begin(), bytes.end());
}

std::string pattern(int rank, std::size_t bytes) {
  std::string text(bytes, '\0');
  for (std::size_t i = 0; i < bytes; ++i) text[i] = static_cast<char>((i * 31 + rank * 7) & 0xff);
  return text;
}

}  // namespace

int main() {
  std::unique_ptr<ferry::bootstrap::Bootstrap> boot;
  try {
    boot = ferry::bootstrap::create(ferry::util::Config::load());
  } catch (const ferry::Error& e) {
    std::printf("bootstrap failed: %s\n", e.what());
    return 1;
  }
  const int rank = boot->rank(), size = boot->size();
  int failures = 0;
  auto expect = [&](bool ok, const std::string& what) {
    if (!ok) {
      ++failures;
      std::printf("rank %d: FAIL %s\n", rank, what.c_str());
    }
  };
  const std::string small = "rank" + std::to_string(rank);
  const std::string large = pattern(rank, 5000);
  expect(boot->put("small." + std::to_string(rank), blob_of(small)).is_ok(), "put small");
  expect(boot->put("large." + std::to_string(rank), blob_of(large)).is_ok(), "put large");
  expect(boot->barrier().is_ok(), "barrier");
  for (int r = 0; r < size; ++r) {
    Blob value;
    ferry::Status s = boot->get("small." + std::to_string(r), &value);
    expect(s.is_ok() && value == blob_of("rank" + std::to_string(r)),
           "get small of " + std::to_string(r) + ": " + s.to_string());
    s = boot->get("large." + std::to_string(r), &value);
    expect(s.is_ok() && value == blob_of(pattern(r, 5000)),
           "get large of " + std::to_string(r) + ": " + s.to_string());
  }
  std::vector<Blob> all;
  const std::string mine = rank == 1 ? std::string() : pattern(rank, 100 + 900 * rank);
  ferry::Status s = boot->allgather(blob_of(mine), &all);
  expect(s.is_ok() && all.size() == static_cast<std::size_t>(size), "allgather: " + s.to_string());
  for (int r = 0; s.is_ok() && r < size; ++r) {
    const std::string want = r == 1 ? std::string() : pattern(r, 100 + 900 * r);
    expect(all[static_cast<std::size_t>(r)] == blob_of(want),
           "allgather slot " + std::to_string(r));
  }
  expect(boot->barrier().is_ok(), "second barrier");
  std::printf("rank %d: bootstrap %s (%s, %d ranks, %zu on this node)\n", rank,
              failures == 0 ? "ok" : "FAILED", boot->name().c_str(), size,
              boot->local_ranks().size());
  return failures == 0 ? 0 : 1;
}
