// ferry-perf's collective benchmarks over every rank.
#include "perf.hpp"

namespace ferry::perf {

Record collective(ferry::Context& ctx, ferry::Communicator& world, const Args& args, Space& space,
                  const std::string& test, std::size_t size, long iters, long warmup) {
  const auto n = static_cast<std::size_t>(world.size());
  const std::size_t floats = size / 4;
  // The buffers are in the space of --mem (host or this rank's GPU); data goes in and out
  // through their host shadows.
  Buffer in(space, size);
  Buffer out(space, size);
  if (test == "allreduce" || test == "reduce_scatter" || test == "reduce") {
    std::fill_n(reinterpret_cast<float*>(in.shadow()), floats,
                static_cast<float>(world.rank() + 1));
  } else if (test == "allgather") {
    std::fill_n(out.shadow(), size, std::byte{0});
    for (std::size_t i = 0; i < size / n; ++i) {
      out.shadow()[static_cast<std::size_t>(world.rank()) * (size / n) + i] =
          pattern(i, world.rank(), 1);
    }
    out.push(0, size);
  } else if (test == "sendrecv" || test == "send") {
    fill(in.shadow(), size, world.rank());
  } else {
    std::fill_n(out.shadow(), size, std::byte{0});
    if (world.rank() == 0) fill(out.shadow(), size, 1);
    out.push(0, size);
  }
  in.push(0, size);
  // --in-flight: a result buffer per call in flight (calls in flight may not share one), each
  // starting as `out` does.
  std::vector<std::unique_ptr<Buffer>> more;
  for (long k = 1; !args.stream && k < args.in_flight; ++k) {
    more.push_back(std::make_unique<Buffer>(space, size));
    if (size > 0) std::memcpy(more.back()->shadow(), out.shadow(), size);
    more.back()->push(0, size);
  }
  // The test is picked once: the timed loop holds the call alone.
  const int kind = test == "allreduce"        ? 0
                   : test == "reduce_scatter" ? 1
                   : test == "allgather"      ? 2
                   : test == "reduce"         ? 4
                   : test == "sendrecv"       ? 5
                   : test == "barrier"        ? 6
                   : test == "send"           ? 7
                                              : 3;
  std::byte* my_block = out.data() + static_cast<std::size_t>(world.rank()) * (size / n);
  const int next = (world.rank() + 1) % world.size();
  const int previous = (world.rank() + world.size() - 1) % world.size();
  // With a stream (a CudaStream argument) the stream-ordered form, else the blocking one.
  auto once = [&](auto... stream) {
    switch (kind) {
      case 0:
        return world.allreduce(in.data(), out.data(), floats, ferry::DataType::kFloat32,
                               ferry::ReduceOp::kSum, stream...);
      case 1:
        return world.reduce_scatter(in.data(), out.data(), floats / n, ferry::DataType::kFloat32,
                                    ferry::ReduceOp::kSum, stream...);
      case 2:
        return world.allgather(my_block, out.data(), size / n, ferry::DataType::kUint8, stream...);
      case 4:
        return world.reduce(in.data(), out.data(), floats, ferry::DataType::kFloat32,
                            ferry::ReduceOp::kSum, 0, stream...);
      case 5:
        if constexpr (sizeof...(stream) == 1) {
          ctx.group_start();
          require(world.send(in.data(), size, next, stream...), "send");
          require(world.recv(out.data(), size, previous, stream...), "recv");
          return ctx.group_end();
        } else {
          return ferry::Status(ferry::Code::kUnsupported, "sendrecv needs --stream");
        }
      case 6:
        return world.barrier(stream...);
      case 7:
        // One direction, rank 0 to rank 1 (the others idle): the stream path's bandwidth;
        // --group messages of the same bytes in one group.
        if constexpr (sizeof...(stream) == 1) {
          if (world.rank() > 1) return ferry::Status();
          if (args.group == 1) {
            return world.rank() == 0 ? world.send(in.data(), size, 1, stream...)
                                     : world.recv(out.data(), size, 0, stream...);
          }
          ctx.group_start();
          for (long k = 0; k < args.group; ++k) {
            require(world.rank() == 0 ? world.send(in.data(), size, 1, stream...)
                                      : world.recv(out.data(), size, 0, stream...),
                    "send");
          }
          return ctx.group_end();
        } else {
          return ferry::Status(ferry::Code::kUnsupported, "send needs --stream");
        }
      default:
        return world.broadcast(out.data(), size, ferry::DataType::kUint8, 0, stream...);
    }
  };
  // The non-blocking form (--in-flight), the k-th call in flight.
  auto post = [&](long k) -> ferry::Request {
    std::byte* result = k == 0 ? out.data() : more[static_cast<std::size_t>(k - 1)]->data();
    switch (kind) {
      case 0:
        return world.iallreduce(in.data(), result, floats, ferry::DataType::kFloat32,
                                ferry::ReduceOp::kSum);
      case 1:
        return world.ireduce_scatter(in.data(), result, floats / n, ferry::DataType::kFloat32,
                                     ferry::ReduceOp::kSum);
      case 2:
        return world.iallgather(result + static_cast<std::size_t>(world.rank()) * (size / n),
                                result, size / n, ferry::DataType::kUint8);
      case 4:
        return world.ireduce(in.data(), result, floats, ferry::DataType::kFloat32,
                             ferry::ReduceOp::kSum, 0);
      case 6:
        return world.ibarrier();
      default:
        return world.ibroadcast(result, size, ferry::DataType::kUint8, 0);
    }
  };
  // `calls` calls, args.in_flight at a time; returns the calls made (rounded up).
  auto in_batches = [&](long calls) {
    std::vector<ferry::Request> requests;
    long made = 0;
    while (made < calls) {
      requests.clear();
      for (long k = 0; k < args.in_flight; ++k) requests.push_back(post(k));
      require(ferry::Request::wait_all(requests), test.c_str());
      made += args.in_flight;
    }
    return made;
  };
  double mine = 0;
  if (args.in_flight > 1 && !args.stream) {
    if (kind == 5 || kind == 7) {
      require(ferry::Status(ferry::Code::kUnsupported, test + " needs --stream"), "");
    }
    if (warmup > 0) in_batches(warmup);
    require(world.barrier(), "barrier");
    const Clock::time_point start = Clock::now();
    iters = in_batches(iters);
    mine = std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(iters);
  } else if (args.stream) {
    auto enqueue = [&](ferry::CudaStream stream) { require(once(stream), test.c_str()); };
    space.forget_graphs();
    if (warmup > 0) space.on_stream(warmup, args.graph, enqueue);
    require(world.barrier(), "barrier");
    const Clock::time_point start = Clock::now();
    iters = space.on_stream(iters, args.graph, enqueue);
    mine = std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(iters);
    require(ctx.async_error(), (test + " on the stream").c_str());
  } else {
    for (long i = 0; i < warmup; ++i) require(once(), test.c_str());
    require(world.barrier(), "barrier");
    const Clock::time_point start = Clock::now();
    for (long i = 0; i < iters; ++i) require(once(), test.c_str());
    mine = std::chrono::duration<double>(Clock::now() - start).count() / static_cast<double>(iters);
  }
  double slowest = 0;
  require(world.allreduce(&mine, &slowest, 1, ferry::DataType::kFloat64, ferry::ReduceOp::kMax),
          "allreduce of the times");
  if (args.check && kind != 6) {
    out.pull(0, size);
    const std::byte* got = out.shadow();
    const float sum = static_cast<float>(n * (n + 1) / 2);
    bool ok = true;
    if (test == "allreduce" || test == "reduce_scatter" || test == "reduce") {
      // reduce: only the root's result is defined.
      const std::size_t results = test == "reduce_scatter"                ? floats / n
                                  : test == "reduce" && world.rank() != 0 ? 0
                                                                          : floats;
      for (std::size_t i = 0; i < results && ok; ++i) {
        float v;
        std::memcpy(&v, got + i * 4, 4);
        ok = v == sum;
      }
    } else if (test == "allgather") {
      for (std::size_t r = 0; r < n && ok; ++r) {
        for (std::size_t i = 0; i < size / n; ++i) {
          ok = ok && got[r * (size / n) + i] == pattern(i, static_cast<long>(r), 1);
        }
      }
    } else if (test == "sendrecv") {
      verify(got, size, previous, "sendrecv");
    } else if (test == "send") {
      if (world.rank() == 1) verify(got, size, 0, "send");
    } else {
      verify(got, size, 1, "broadcast");
    }
    if (!ok) {
      std::fprintf(stderr, "ferry-perf: %s: data check failed on rank %d\n", test.c_str(),
                   world.rank());
      std::exit(1);
    }
  }
  const double nd = static_cast<double>(n);
  const double factor = test == "allreduce" ? 2 * (nd - 1) / nd
                        : test == "send"    ? static_cast<double>(args.group)
                        : test == "broadcast" || test == "reduce" || test == "sendrecv"
                            ? 1
                            : (nd - 1) / nd;
  return {test, size, iters, slowest * 1e6, static_cast<double>(size) / slowest / 1e9 * factor};
}

}  // namespace ferry::perf
