// ferry-perf: OSU-style point-to-point benchmarks between ranks 0 and 1: latency (ping-pong, half
// round trip), bandwidth (a window of non-blocking sends, then an ack) and bibw (both directions);
// and collectives over every rank (allreduce, broadcast, allgather, reduce_scatter, reduce): the
// mean time of one call, the slowest rank's, and NCCL's bus bandwidth. Run under ferryrun:
// `ferryrun -n 2 ferry-perf [latency|bandwidth|bibw|allreduce|...] [options]`.
// The parts are in perf.hpp.
#include "perf.hpp"

using namespace ferry::perf;

int main(int argc, char** argv) {
  Args args = parse(argc, argv);
  try {
    ferry::Context ctx = ferry::Context::init();
    const bool point_to_point = !std::all_of(args.tests.begin(), args.tests.end(), is_collective);
    if (ctx.size() < 2 && point_to_point) {
      std::fprintf(stderr, "ferry-perf: needs 2 ranks (run it as `ferryrun -n 2 ferry-perf`)\n");
      return 2;
    }
    std::vector<Record> records;
    ferry::Communicator world = ctx.world();
    Space space(args.mem[std::min(ctx.rank(), 1)], ctx.local_rank());
    Bench bench{ctx, args, 1 - ctx.rank(), space};
    for (const std::string& test : args.tests) {
      for (std::size_t size : args.sizes) {
        long iters = bench.iterations_for(test, size);
        long warmup = args.warmup >= 0 ? args.warmup : std::max(1L, iters / 10);
        if (is_collective(test)) {
          records.push_back(collective(ctx, world, args, space, test, size, iters, warmup));
          continue;
        }
        if (ctx.rank() > 1) continue;  // point to point: ranks 0 and 1 only
        if (is_one_sided(test) && size == 0) continue;
        if (test == "atomic_add" && size != args.sizes.front()) continue;  // 8 bytes, once
        if (test == "atomic_add") size = 8;
        Record r{test, size, iters, -1, -1};
        if (is_one_sided(test)) {
          r.latency_us = bench.one_sided(test, size, iters, warmup, &r.bandwidth_GBps);
          if (test == "put_bw" || test == "get_bw") r.latency_us = -1;
        } else if (test == "latency") {
          r.latency_us = bench.latency(size, iters, warmup);
        } else {
          r.bandwidth_GBps = bench.bandwidth(size, iters, warmup, test == "bibw");
        }
        records.push_back(r);
      }
    }
    if (ctx.rank() == 0) print(args, records, ctx);
    std::fflush(stdout);
    require(ctx.barrier(), "barrier");
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "ferry-perf: %s\n", e.what());
    return 1;
  }
  return 0;
}
