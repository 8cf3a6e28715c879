// The NCCL side of the GPU comparison: the same two tests as `ferry-perf -m cuda:cuda`, with
// NCCL's send/recv between ranks 0 and 1 (one GPU each where there are several). Run it under
// ferryrun, which also carries NCCL's unique id:
//   ferryrun -n 2 nccl_perf [--sizes 8,64k,4m] [--iterations N]
// latency: ping-pong (send then recv on one stream, synchronised each round), half round trip.
// bandwidth: a window of 64 sends in one group, the receiver's 64 receives, then a 1-byte ack.
// With --allreduce (any number of ranks): ncclAllReduce of float32 sums, out of place, timed two
// ways: each call waited for (cudaStreamSynchronize, as a blocking ferry allreduce returns), and
// back to back with one wait at the end (as NCCL's all_reduce_perf times it). Bus bandwidth is
// NCCL's: size / time * 2 (n - 1) / n.
#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"

namespace {

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "nccl_perf: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess) {
    std::fprintf(stderr, "nccl_perf: %s: %s\n", what, ncclGetErrorString(r));
    std::exit(1);
  }
}

std::size_t parse_size(const std::string& t) {
  std::size_t v = std::stoull(t);
  char s = t.back();
  if (s == 'k' || s == 'K') v <<= 10;
  if (s == 'm' || s == 'M') v <<= 20;
  if (s == 'g' || s == 'G') v <<= 30;
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes;
  long fixed_iterations = 0;
  const int window = 64;
  bool allreduce = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--allreduce") {
      allreduce = true;
    } else if (a == "--sizes" && i + 1 < argc) {
      std::string list = argv[++i];
      for (std::size_t p = 0; p <= list.size();) {
        std::size_t c = std::min(list.find(',', p), list.size());
        if (c > p) sizes.push_back(parse_size(list.substr(p, c - p)));
        p = c + 1;
      }
    } else if (a == "--iterations" && i + 1 < argc) {
      fixed_iterations = std::atol(argv[++i]);
    }
  }
  if (sizes.empty()) sizes = {8, 65536, 1 << 20, 4 << 20, 64 << 20};
  ferry::Context ctx = ferry::Context::init();
  if (ctx.size() != 2 && !allreduce) {
    std::fprintf(stderr, "nccl_perf: run with ferryrun -n 2\n");
    return 2;
  }
  int devices = 0;
  cuda_check(cudaGetDeviceCount(&devices), "cudaGetDeviceCount");
  cuda_check(cudaSetDevice(ctx.local_rank() % devices), "cudaSetDevice");
  ncclUniqueId id;
  if (ctx.rank() == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (!ctx.world().broadcast(&id, sizeof id, ferry::DataType::kUint8, 0)) return 1;
  ncclComm_t comm;
  nccl_check(ncclCommInitRank(&comm, ctx.size(), id, ctx.rank()), "ncclCommInitRank");
  cudaStream_t stream;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
  using Clock = std::chrono::steady_clock;
  if (allreduce) {
    int version = 0;
    ncclGetVersion(&version);
    const double n = ctx.size();
    if (ctx.rank() == 0) {
      std::printf("# nccl_perf --allreduce: NCCL %d, %d ranks on %d GPU(s), float32 sum\n", version,
                  ctx.size(), devices);
      std::printf("%-10s %12s %11s %12s %12s %12s %12s\n", "test", "size", "iterations", "sync_us",
                  "busbw_GBps", "pipelined_us", "busbw_GBps");
    }
    for (std::size_t size : sizes) {
      const std::size_t count = std::max<std::size_t>(size / 4, 1);
      const double bytes = static_cast<double>(std::max<std::size_t>(size, 64));
      long iters = fixed_iterations > 0 ? fixed_iterations
                                        : std::clamp(static_cast<long>(1e9 / bytes), 20L, 2000L);
      void *in = nullptr, *out = nullptr;
      cuda_check(cudaMalloc(&in, count * 4), "cudaMalloc");
      cuda_check(cudaMalloc(&out, count * 4), "cudaMalloc");
      double us[2] = {0, 0};
      for (int pipelined = 0; pipelined < 2; ++pipelined) {
        for (long i = 0; i < 5; ++i) {
          nccl_check(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, stream), "warm");
        }
        cuda_check(cudaStreamSynchronize(stream), "sync");
        if (!ctx.world().barrier()) return 1;
        const Clock::time_point start = Clock::now();
        for (long i = 0; i < iters; ++i) {
          nccl_check(ncclAllReduce(in, out, count, ncclFloat32, ncclSum, comm, stream),
                     "allreduce");
          if (pipelined == 0) cuda_check(cudaStreamSynchronize(stream), "sync");
        }
        cuda_check(cudaStreamSynchronize(stream), "sync");
        double mine = std::chrono::duration<double, std::micro>(Clock::now() - start).count() /
                      static_cast<double>(iters);
        if (!ctx.world().allreduce(&mine, &us[pipelined], 1, ferry::DataType::kFloat64,
                                   ferry::ReduceOp::kMax)) {
          return 1;
        }
      }
      if (ctx.rank() == 0) {
        const double factor = 2 * (n - 1) / n * static_cast<double>(count * 4) / 1e3;
        std::printf("%-10s %12zu %11ld %12.3f %12.3f %12.3f %12.3f\n", "allreduce", count * 4,
                    iters, us[0], factor / us[0], us[1], factor / us[1]);
        std::fflush(stdout);
      }
      cudaFree(in);
      cudaFree(out);
    }
    ncclCommDestroy(comm);
    (void)ctx.barrier();
    return 0;
  }
  const int peer = 1 - ctx.rank();
  int version = 0;
  ncclGetVersion(&version);
  if (ctx.rank() == 0) {
    std::printf("# nccl_perf: NCCL %d, ranks 0 and 1 on %d GPU(s)\n", version, devices);
    std::printf("%-10s %12s %11s %12s %15s\n", "test", "size", "iterations", "latency_us",
                "bandwidth_GBps");
  }
  for (const char* test : {"latency", "bandwidth"}) {
    for (std::size_t size : sizes) {
      const bool lat = std::string(test) == "latency";
      const double bytes = static_cast<double>(std::max<std::size_t>(size, 64));
      long iters = fixed_iterations > 0 ? fixed_iterations
                   : lat                ? std::clamp(static_cast<long>(1e9 / bytes), 20L, 20000L)
                         : std::clamp(static_cast<long>(1e9 / (bytes * window)), 2L, 2000L);
      iters = std::min(iters, lat ? 5000L : 2000L);
      const long warmup = std::max(1L, iters / 10);
      const std::size_t n = std::max<std::size_t>(size, 1);
      void *out = nullptr, *in = nullptr, *ack = nullptr;
      cuda_check(cudaMalloc(&out, n), "cudaMalloc");
      cuda_check(cudaMalloc(&in, n), "cudaMalloc");
      cuda_check(cudaMalloc(&ack, 64), "cudaMalloc");
      Clock::time_point start;
      for (long i = -warmup; i < iters; ++i) {
        if (i == 0) start = Clock::now();
        if (lat) {
          if (ctx.rank() == 0) {
            nccl_check(ncclSend(out, size, ncclInt8, peer, comm, stream), "send");
            nccl_check(ncclRecv(in, size, ncclInt8, peer, comm, stream), "recv");
          } else {
            nccl_check(ncclRecv(in, size, ncclInt8, peer, comm, stream), "recv");
            nccl_check(ncclSend(out, size, ncclInt8, peer, comm, stream), "send");
          }
        } else {
          nccl_check(ncclGroupStart(), "group");
          for (int w = 0; w < window; ++w) {
            if (ctx.rank() == 0) {
              nccl_check(ncclSend(out, size, ncclInt8, peer, comm, stream), "send");
            } else {
              nccl_check(ncclRecv(in, size, ncclInt8, peer, comm, stream), "recv");
            }
          }
          nccl_check(ncclGroupEnd(), "group");
          if (ctx.rank() == 0) {
            nccl_check(ncclRecv(ack, 1, ncclInt8, peer, comm, stream), "ack");
          } else {
            nccl_check(ncclSend(ack, 1, ncclInt8, peer, comm, stream), "ack");
          }
        }
        cuda_check(cudaStreamSynchronize(stream), "sync");
      }
      const double us = std::chrono::duration<double, std::micro>(Clock::now() - start).count();
      if (ctx.rank() == 0) {
        if (lat) {
          std::printf("%-10s %12zu %11ld %12.3f %15s\n", test, size, iters,
                      us / (2.0 * static_cast<double>(iters)), "-");
        } else {
          std::printf("%-10s %12zu %11ld %12s %15.3f\n", test, size, iters, "-",
                      static_cast<double>(size) * window * static_cast<double>(iters) / us / 1e3);
        }
        std::fflush(stdout);
      }
      cudaFree(out);
      cudaFree(in);
      cudaFree(ack);
    }
  }
  ncclCommDestroy(comm);
  (void)ctx.barrier();
  return 0;
}
