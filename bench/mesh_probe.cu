// What the links of a GPU mesh carry, by the copy engines and by the SMs, to one peer and to all:
// the ceiling the device collectives are measured against. One process drives every GPU of the
// machine (peer access enabled between all pairs); each GPU moves `bytes` to or from each of
// `peers` others (GPU g's peers are g+1, g+2, ... mod n), all GPUs at once or GPU 0 alone.
//
//   mesh_probe [bytes per peer...]        (default 2m 16m 128m)
//
// Modes: ce_write (cudaMemcpyPeerAsync on a stream per peer), sm_read / sm_write (a copy kernel,
// its blocks split between the peers, `unroll` 16-byte loads in flight per thread), sm_sum (each
// thread loads its unit from every peer and the local buffer and stores the sum: the two-shot
// reduce step). GB/s = bytes over this GPU's links / time, the slowest GPU's.
// Built by bench/gpu_run.sh pack with nvcc (CUDA runtime, not part of the library).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                      \
  do {                                                                                \
    cudaError_t e = (x);                                                              \
    if (e != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                   \
    }                                                                                 \
  } while (0)

constexpr int kMaxPeers = 7;
struct Ptrs {
  uint4* p[kMaxPeers + 1];
};

// Blocks split between the peers: block b copies for peer b % peers.
template <int kUnroll>
__global__ void __launch_bounds__(512) copy_split(Ptrs dst, Ptrs src, int peers,
                                                 unsigned long long units) {
  const int peer = blockIdx.x % peers;
  const unsigned long long blocks = gridDim.x / peers;
  const unsigned long long stride = blocks * blockDim.x;
  const uint4* in = src.p[peer];
  uint4* out = dst.p[peer];
  unsigned long long k = (blockIdx.x / peers) * blockDim.x + threadIdx.x;
  for (; k + (kUnroll - 1) * stride < units; k += kUnroll * stride) {
    uint4 v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) v[u] = in[k + u * stride];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) out[k + u * stride] = v[u];
  }
  for (; k < units; k += stride) out[k] = in[k];
}

// out[i] = local[i] + sum over peers of src.p[p][i], as 32-bit integers.
template <int kUnroll>
__global__ void __launch_bounds__(512) sum_all(uint4* out, const uint4* local, Ptrs src,
                                              int peers, unsigned long long units) {
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  unsigned long long k = static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; k + (kUnroll - 1) * stride < units; k += kUnroll * stride) {
    uint4 acc[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) acc[u] = local[k + u * stride];
    for (int p = 0; p < peers; ++p) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = src.p[p][k + u * stride];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        acc[u].x += v[u].x;
        acc[u].y += v[u].y;
        acc[u].z += v[u].z;
        acc[u].w += v[u].w;
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) out[k + u * stride] = acc[u];
  }
}

// `rounds` barriers among `members` GPUs, one block each: thread j < members raises this GPU's
// flag in GPU j's array (flags[j][me], 128 bytes apart) with the round's number, then waits for
// every flag of its own array to show it. kFence: a system-scope fence before the raise (what the
// collectives' kernels do, so that the data before a flag is visible with it).
template <bool kFence>
__global__ void barrier_rounds(Ptrs flags, int members, int me, int rounds) {
  const int j = threadIdx.x;
  for (int r = 1; r <= rounds; ++r) {
    if (j < members && j != me) {
      if (kFence) __threadfence_system();
      auto* flag = reinterpret_cast<unsigned long long*>(flags.p[j]) + 16 * me;
      asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(flag), "l"(
                       static_cast<unsigned long long>(r))
                   : "memory");
      const auto* mine = reinterpret_cast<unsigned long long*>(flags.p[me]) + 16 * j;
      unsigned long long seen = 0;
      do {
        asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(seen) : "l"(mine) : "memory");
      } while (seen < static_cast<unsigned long long>(r));
    }
    __syncwarp();
  }
}

struct Gpu {
  uint4* local = nullptr;                   // what this GPU sends / where it receives
  std::vector<uint4*> inbox;                // a buffer per peer slot, read or written by peers
  std::vector<cudaStream_t> streams;        // one per peer (copy engines), [0] for kernels
  cudaEvent_t start = nullptr, stop = nullptr;
};

static std::size_t parse(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  if (*end == 'k' || *end == 'K') v *= 1024;
  if (*end == 'm' || *end == 'M') v *= 1024 * 1024;
  if (*end == 'g' || *end == 'G') v *= 1024.0 * 1024 * 1024;
  return static_cast<std::size_t>(v);
}

int main(int argc, char** argv) {
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(parse(argv[i]));
  if (sizes.empty()) sizes = {2u << 20, 16u << 20, 128u << 20};
  const std::size_t most = *std::max_element(sizes.begin(), sizes.end());
  int sms = 0;
  CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::printf("mesh_probe: %d GPUs, %d SMs each\n", n, sms);
  if (n < 2) return 0;
  const int max_peers = std::min(n - 1, kMaxPeers);
  std::vector<Gpu> gpus(n);
  for (int g = 0; g < n; ++g) {
    CHECK(cudaSetDevice(g));
    for (int h = 0; h < n; ++h) {
      if (h != g) CHECK(cudaDeviceEnablePeerAccess(h, 0));
    }
    CHECK(cudaMalloc(&gpus[g].local, most * max_peers));
    CHECK(cudaMemset(gpus[g].local, 1, most * max_peers));
    gpus[g].inbox.resize(max_peers);
    gpus[g].streams.resize(max_peers);
    for (int p = 0; p < max_peers; ++p) {
      CHECK(cudaMalloc(&gpus[g].inbox[p], most));
      CHECK(cudaMemset(gpus[g].inbox[p], 2, most));
      CHECK(cudaStreamCreateWithFlags(&gpus[g].streams[p], cudaStreamNonBlocking));
    }
    CHECK(cudaEventCreate(&gpus[g].start));
    CHECK(cudaEventCreate(&gpus[g].stop));
  }
  // GPU g's p-th peer, and the slot of g in that peer's inbox.
  const auto peer = [&](int g, int p) { return (g + 1 + p) % n; };
  std::printf("%-9s %-6s %5s %6s %6s %10s %10s %8s\n", "mode", "active", "peers", "blocks",
              "unroll", "bytes/peer", "us", "GB/s");
  const auto run = [&](const std::string& mode, bool all, int peers, int blocks, int unroll,
                       std::size_t bytes) {
    const int active = all ? n : 1;
    const int iters = bytes >= (64u << 20) ? 5 : 20;
    const unsigned long long units = bytes / 16;
    const auto launch = [&](int g) {
      Gpu& me = gpus[g];
      Ptrs dst{}, src{};
      for (int p = 0; p < peers; ++p) {
        const int h = peer(g, p);
        const int slot = (g - h - 1 + 2 * n) % n;  // p' with peer(h, p') == g
        uint4* mine = me.local + static_cast<std::size_t>(p) * (bytes / 16);
        if (mode == "sm_write" || mode == "ce_write") {
          dst.p[p] = gpus[h].inbox[slot];
          src.p[p] = mine;
        } else {
          dst.p[p] = mine;
          src.p[p] = gpus[h].inbox[slot];
        }
      }
      if (mode == "ce_write") {
        for (int p = 0; p < peers; ++p) {
          CHECK(cudaMemcpyPeerAsync(dst.p[p], peer(g, p), src.p[p], g, bytes, me.streams[p]));
        }
        return;
      }
      const int grid = blocks / peers * peers;
      if (mode == "sm_sum") {
        switch (unroll) {
          case 1: sum_all<1><<<blocks, 512, 0, me.streams[0]>>>(me.local, me.inbox[0], src, peers, units); break;
          case 2: sum_all<2><<<blocks, 512, 0, me.streams[0]>>>(me.local, me.inbox[0], src, peers, units); break;
          default: sum_all<4><<<blocks, 512, 0, me.streams[0]>>>(me.local, me.inbox[0], src, peers, units); break;
        }
      } else {
        switch (unroll) {
          case 1: copy_split<1><<<grid, 512, 0, me.streams[0]>>>(dst, src, peers, units); break;
          case 2: copy_split<2><<<grid, 512, 0, me.streams[0]>>>(dst, src, peers, units); break;
          case 4: copy_split<4><<<grid, 512, 0, me.streams[0]>>>(dst, src, peers, units); break;
          default: copy_split<8><<<grid, 512, 0, me.streams[0]>>>(dst, src, peers, units); break;
        }
      }
      CHECK(cudaGetLastError());
    };
    const auto sync_all = [&] {
      for (int g = 0; g < active; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaDeviceSynchronize());
      }
    };
    for (int g = 0; g < active; ++g) {  // warm-up
      CHECK(cudaSetDevice(g));
      launch(g);
    }
    sync_all();
    for (int g = 0; g < active; ++g) {
      CHECK(cudaSetDevice(g));
      Gpu& me = gpus[g];
      CHECK(cudaEventRecord(me.start, me.streams[0]));
      for (int p = 1; p < peers && mode == "ce_write"; ++p) {
        CHECK(cudaStreamWaitEvent(me.streams[p], me.start, 0));
      }
    }
    for (int i = 0; i < iters; ++i) {
      for (int g = 0; g < active; ++g) {
        CHECK(cudaSetDevice(g));
        launch(g);
      }
    }
    float slowest = 0;
    for (int g = 0; g < active; ++g) {
      CHECK(cudaSetDevice(g));
      Gpu& me = gpus[g];
      for (int p = 1; p < peers && mode == "ce_write"; ++p) {
        cudaEvent_t joined;
        CHECK(cudaEventCreate(&joined));
        CHECK(cudaEventRecord(joined, me.streams[p]));
        CHECK(cudaStreamWaitEvent(me.streams[0], joined, 0));
        CHECK(cudaEventDestroy(joined));
      }
      CHECK(cudaEventRecord(me.stop, me.streams[0]));
    }
    sync_all();
    for (int g = 0; g < active; ++g) {
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, gpus[g].start, gpus[g].stop));
      slowest = std::max(slowest, ms);
    }
    const double us = slowest * 1000.0 / iters;
    std::printf("%-9s %-6s %5d %6d %6d %10zu %10.1f %8.1f\n", mode.c_str(), all ? "all" : "gpu0",
                peers, mode == "ce_write" ? 0 : blocks, mode == "ce_write" ? 0 : unroll, bytes,
                us, static_cast<double>(bytes) * peers / (us * 1e3));
    std::fflush(stdout);
  };
  // Barriers first: flags in each GPU's last inbox, zeroed before each run.
  for (bool fence : {false, true}) {
    const int rounds = 20000;
    Ptrs flags{};
    for (int g = 0; g < n && g <= kMaxPeers; ++g) flags.p[g] = gpus[g].inbox[max_peers - 1];
    for (int g = 0; g < n && g <= kMaxPeers; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaMemset(flags.p[g], 0, 4096));
      CHECK(cudaDeviceSynchronize());
    }
    for (int g = 0; g < n && g <= kMaxPeers; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaEventRecord(gpus[g].start, gpus[g].streams[0]));
      if (fence) {
        barrier_rounds<true><<<1, 32, 0, gpus[g].streams[0]>>>(flags, n, g, rounds);
      } else {
        barrier_rounds<false><<<1, 32, 0, gpus[g].streams[0]>>>(flags, n, g, rounds);
      }
      CHECK(cudaEventRecord(gpus[g].stop, gpus[g].streams[0]));
    }
    float slowest = 0;
    for (int g = 0; g < n && g <= kMaxPeers; ++g) {
      CHECK(cudaSetDevice(g));
      CHECK(cudaDeviceSynchronize());
      float ms = 0;
      CHECK(cudaEventElapsedTime(&ms, gpus[g].start, gpus[g].stop));
      slowest = std::max(slowest, ms);
    }
    std::printf("barrier among %d GPUs%s: %.2f us a round\n", n,
                fence ? " (system fence before each raise)" : "", slowest * 1000.0 / rounds);
  }
  for (std::size_t bytes : sizes) {
    for (int peers : {1, max_peers}) {
      for (bool all : {false, true}) {
        run("ce_write", all, peers, 0, 0, bytes);
        for (const char* mode : {"sm_read", "sm_write"}) {
          for (int blocks : {32, 64, sms, 2 * sms}) {
            for (int unroll : {1, 4, 8}) run(mode, all, peers, blocks, unroll, bytes);
          }
        }
        if (peers > 1) {
          for (int blocks : {64, sms, 2 * sms}) {
            for (int unroll : {1, 2, 4}) run("sm_sum", all, peers, blocks, unroll, bytes);
          }
        }
      }
    }
  }
  return 0;
}
