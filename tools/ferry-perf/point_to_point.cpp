// ferry-perf's point-to-point and one-sided benchmarks between ranks 0 and 1.
#include <atomic>

#include "perf.hpp"

namespace ferry::perf {

long Bench::iterations_for(const std::string& test, std::size_t size) const {
  if (args.iterations > 0) return args.iterations;
  const double bytes = static_cast<double>(std::max<std::size_t>(size, 64));
  if (test == "latency" || test == "put_lat" || test == "get_lat" || is_collective(test)) {
    return std::clamp(static_cast<long>(1e9 / bytes), 20L, 20000L);
  }
  if (test == "atomic_add") return 2000;
  return std::clamp(static_cast<long>(1e9 / (bytes * args.window)), 2L, 2000L);
}

double Bench::latency(std::size_t size, long iters, long warmup) {
  Buffer out(space, size), in(space, size);
  auto fill_out = [&](long seq) {
    fill(out.shadow(), size, seq);
    out.push(0, size);
  };
  auto verify_in = [&](long seq) {
    in.pull(0, size);
    verify(in.shadow(), size, seq, "latency");
  };
  Clock::time_point start;
  for (long i = -warmup; i < iters; ++i) {
    if (i == 0) start = Clock::now();
    if (ctx.rank() == 0) {
      if (args.check) fill_out(i);
      require(ctx.send(out.data(), size, peer, 1), "send");
      require(ctx.recv(in.data(), size, peer, 2), "recv");
      if (args.check) verify_in(i + 1);
    } else {
      require(ctx.recv(in.data(), size, peer, 1), "recv");
      if (args.check) {
        verify_in(i);
        fill_out(i + 1);
      }
      require(ctx.send(out.data(), size, peer, 2), "send");
    }
  }
  double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  return us / (2.0 * static_cast<double>(iters));
}

double Bench::one_sided(const std::string& test, std::size_t size, long iters, long warmup,
                        double* gbps) {
  if (space.device() && test == "put_lat") usage("put_lat takes host memory only");
  const int window = test == "put_lat" || test == "get_lat" ? 1 : args.window;
  const std::size_t bytes = std::max<std::size_t>(size, 8);
  const std::size_t total = bytes * static_cast<std::size_t>(window);  // (atomics: words)
  Buffer local_buffer(space, total);
  Buffer registered(space, space.device() || args.register_host ? total : 0);
  std::byte* local = local_buffer.data();
  ferry::MemoryRegion region;
  if (space.device() || args.register_host) {
    require(ctx.register_memory(registered.data(), total, &region), "register_memory");
  } else {
    require(ctx.allocate_memory(total, &region), "allocate_memory");
  }
  auto* exposed = static_cast<std::byte*>(region.address());
  std::vector<std::byte> mine = region.remote_key(), theirs(mine.size());
  require(ctx.send(mine.data(), mine.size(), peer, 5), "key send");
  require(ctx.recv(theirs.data(), theirs.size(), peer, 5), "key recv");
  ferry::RemoteKey key;
  require(ferry::RemoteKey::unpack(theirs, &key), "unpack");
  {
    std::vector<std::byte> pattern(total);
    fill(pattern.data(), total, 1);
    space.put(local, pattern.data(), total);
  }
  std::vector<ferry::Request> requests;
  requests.reserve(static_cast<std::size_t>(window));
  std::vector<std::uint64_t> results(static_cast<std::size_t>(window));
  // put_lat: the last byte of each message says which iteration it is (1..127, never 0).
  auto mark = [](long i) { return static_cast<std::uint8_t>((i & 0x7f) + 1); };
  std::atomic_ref<std::uint8_t> last(*reinterpret_cast<std::uint8_t*>(&exposed[size - 1]));
  auto await_mark = [&](long i) {
    while (last.load(std::memory_order_acquire) != mark(i)) ctx.progress();
  };
  Clock::time_point start;
  // Decided once: string comparisons in the loop would be timed with the operations.
  const bool put_lat = test == "put_lat", atomic = test == "atomic_add";
  const bool get = test == "get_lat" || test == "get_bw", put_bw = test == "put_bw";
  const bool first = ctx.rank() == 0, active = first || put_lat;
  for (long i = -warmup; active && i < iters; ++i) {
    if (i == 0) start = Clock::now();
    if (put_lat) {
      if (!first) await_mark(i);
      local[size - 1] = static_cast<std::byte>(mark(i));
      ctx.iput(local, size, key, 0);  // completes on its own; the peer's reply says so
      if (first) await_mark(i);
      continue;
    }
    requests.clear();
    for (int w = 0; w < window; ++w) {
      // Bandwidth: every operation of the window on the same bytes (as ucx_perftest does),
      // so memory bandwidth is not what is measured; atomics on words of their own.
      const std::size_t offset = atomic ? static_cast<std::size_t>(w) * bytes : 0;
      if (get) {
        requests.push_back(ctx.iget(local + offset, size, key, offset));
      } else if (put_bw) {
        requests.push_back(ctx.iput(local + offset, size, key, offset));
      } else {
        requests.push_back(ctx.iatomic(ferry::AtomicOp::kAdd, 8, key, offset, 1));
      }
    }
    require(ferry::Request::wait_all(requests), test.c_str());
  }
  double us = 0;
  if (active) {
    require(ctx.flush(peer), "flush");
    us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
  }
  // The passive side progresses in this receive until the active side is done.
  std::uint32_t done = 0;
  if (ctx.rank() == 0) {
    require(ctx.send(&done, sizeof(done), peer, 6), "done send");
  } else {
    require(ctx.recv(&done, sizeof(done), peer, 6), "done recv");
  }
  const double ops = static_cast<double>(iters) * window;
  *gbps = test == "put_bw" || test == "get_bw" ? static_cast<double>(size) * ops / us / 1e3 : -1;
  return test == "put_lat" ? us / (2.0 * static_cast<double>(iters)) : us / ops;
}

double Bench::bandwidth(std::size_t size, long iters, long warmup, bool both) {
  int window = args.window;
  // With --check each message of a window needs its own buffer; keep that under 1 GiB.
  std::size_t slots = args.check ? static_cast<std::size_t>(window) : 1;
  while (slots > 1 && slots * size > (1u << 30)) slots /= 2;
  if (args.check) window = static_cast<int>(slots);
  Buffer out(space, std::max<std::size_t>(size, 1) * slots);
  Buffer in(space, std::max<std::size_t>(size, 1) * slots);
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
      const std::size_t offset = args.check ? static_cast<std::size_t>(w) * size : 0;
      if (args.check) {
        fill(out.shadow() + offset, size, i * window + w);
        out.push(offset, size);
      }
      requests.push_back(ctx.isend(out.data() + offset, size, peer, 3));
    }
    require(ferry::Request::wait_all(requests), "wait_all");
    if (args.check && receiver) {
      in.pull(0, size * static_cast<std::size_t>(window));
      for (int w = 0; w < window; ++w) {
        verify(in.shadow() + static_cast<std::size_t>(w) * size, size, i * window + w, "bandwidth");
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

}  // namespace ferry::perf
