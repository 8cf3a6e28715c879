// How a two-shot allreduce among the GPUs of a mesh (float sum) moves its data, as variants of
// one kernel, to choose the library's: one process drives every GPU of the machine (peer access
// between all pairs), each GPU's areas mapped by the others as the library maps them by IPC.
//
//   mesh_allreduce_probe [bytes...]        (default 8m 16m 64m 256m)
//
// Every variant: member m owns part m of the call; each member writes part j of its input into
// member j's area (writes over NVLink), the owner reduces its part from its input and those
// copies, then the results reach the others. Variants:
//   fetch   the others read the result from the owner's area (the library's kernel today);
//   push    the owner writes the result into every other member's area, each copies it out;
//   direct  the owner writes the result straight into every other member's output (the ceiling:
//           the library cannot reach an application's output buffer of another process);
//   over    the owner writes the result over its own copy of the other's part in that member's
//           area (no area of results), once that member has said it reduced the block (a third
//           set of flags), and each copies it out.
// `chunk` cuts each block's share of a part into pieces that follow one another through the
// steps (piece c written while piece c - 1 is reduced and piece c - 2 fetched), with per-block
// counters as flags; chunk 0 = the whole share at once (no pipeline). GB/s is bus bandwidth
// (2 (n - 1) / n x bytes / time), of 20 calls launched back to back on every GPU.
// Built by bench/gpu_run.sh pack with nvcc (CUDA runtime, not part of the library).
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#define CHECK(x)                                                                             \
  do {                                                                                       \
    cudaError_t e = (x);                                                                     \
    if (e != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e)); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

constexpr int kMaxMembers = 8;
constexpr int kMaxBlocks = 256;

struct Ptrs {
  unsigned char* p[kMaxMembers];
};

enum Variant { kFetch = 0, kPush = 1, kDirect = 2, kOver = 3 };

__device__ __forceinline__ unsigned long long load_acquire(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void store_release(unsigned long long* p, unsigned long long v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" : : "l"(p), "l"(v) : "memory");
}

// Thread 0: this member's flag for `block` in set `set` of every peer's area.
__device__ void raise(const Ptrs& areas, std::size_t flags, int set, int members, int me,
                      int block, unsigned long long value) {
  __threadfence_system();
  for (int j = 0; j < members; ++j) {
    if (j == me) continue;
    auto* f = reinterpret_cast<unsigned long long*>(areas.p[j] + flags) +
              ((static_cast<std::size_t>(set) * kMaxMembers + me) * kMaxBlocks + block) * 2;
    store_release(f, value);
  }
}
__device__ void wait_all(const Ptrs& areas, std::size_t flags, int set, int members, int me,
                         int block, unsigned long long value) {
  for (int j = 0; j < members; ++j) {
    if (j == me) continue;
    const auto* f = reinterpret_cast<const unsigned long long*>(areas.p[me] + flags) +
                    ((static_cast<std::size_t>(set) * kMaxMembers + j) * kMaxBlocks + block) * 2;
    while (load_acquire(f) < value) {
    }
  }
}

__device__ __forceinline__ void copy16(uint4* dst, const uint4* src, std::size_t units) {
  std::size_t k = threadIdx.x;
  for (; k + 3 * blockDim.x < units; k += 4 * blockDim.x) {
    uint4 v0 = src[k], v1 = src[k + blockDim.x], v2 = src[k + 2 * blockDim.x],
          v3 = src[k + 3 * blockDim.x];
    dst[k] = v0;
    dst[k + blockDim.x] = v1;
    dst[k + 2 * blockDim.x] = v2;
    dst[k + 3 * blockDim.x] = v3;
  }
  for (; k < units; k += blockDim.x) dst[k] = src[k];
}

// The call: `count` floats (a multiple of 4 * members); part j = [j * part, (j + 1) * part).
// Area of member m: [push: members x part][result: members x part][flags]; for one generation.
__global__ void __launch_bounds__(512)
    allreduce(float* out, const float* in, std::size_t count, int members, int me, Ptrs areas,
              Ptrs outs, std::size_t chunk_units, int variant, unsigned long long call) {
  const std::size_t part = count / members;          // floats
  const std::size_t part_units = part / 4;           // 16-byte units
  const std::size_t part_bytes = part * 4;
  const std::size_t result_at = members * part_bytes;
  const std::size_t flags = 2 * members * part_bytes;
  const int b = blockIdx.x;
  const std::size_t per_block = (part_units + gridDim.x - 1) / gridDim.x;
  const std::size_t first = per_block * b < part_units ? per_block * b : part_units;
  const std::size_t last = first + per_block < part_units ? first + per_block : part_units;
  const std::size_t share = last - first;
  const std::size_t piece = chunk_units == 0 || chunk_units > share ? share : chunk_units;
  const std::size_t pieces = piece == 0 ? 0 : (share + piece - 1) / piece;
  const unsigned long long base = call << 20;
  const auto piece_range = [&](std::size_t c, std::size_t* lo, std::size_t* n) {
    *lo = first + c * piece;
    *n = *lo + piece < last ? piece : last - *lo;
  };
  for (std::size_t s = 0; s < pieces + 2; ++s) {
    if (s < pieces) {  // write piece s of every other part into its owner's area
      std::size_t lo, n;
      piece_range(s, &lo, &n);
      for (int k = 1; k < members; ++k) {
        const int j = (me + k) % members;
        copy16(reinterpret_cast<uint4*>(areas.p[j] + me * part_bytes) + lo,
               reinterpret_cast<const uint4*>(in + j * part) + lo, n);
      }
      __syncthreads();
      if (threadIdx.x == 0) raise(areas, flags, 0, members, me, b, base + s + 1);
    }
    if (s >= 1 && s <= pieces) {  // reduce piece s - 1 of the own part
      const std::size_t c = s - 1;
      std::size_t lo, n;
      piece_range(c, &lo, &n);
      __syncthreads();
      if (threadIdx.x == 0) wait_all(areas, flags, 0, members, me, b, base + c + 1);
      __syncthreads();
      const uint4* src[kMaxMembers];
      for (int m = 0; m < members; ++m) {
        src[m] = m == me ? reinterpret_cast<const uint4*>(in + me * part)
                         : reinterpret_cast<const uint4*>(areas.p[me] + m * part_bytes);
      }
      uint4* o = reinterpret_cast<uint4*>(out + me * part);
      uint4* mine = reinterpret_cast<uint4*>(areas.p[me] + result_at + me * part_bytes);
      for (std::size_t u = lo + threadIdx.x; u < lo + n; u += blockDim.x) {
        float4 acc = reinterpret_cast<const float4*>(src[0])[u];
        for (int m = 1; m < members; ++m) {
          const float4 v = reinterpret_cast<const float4*>(src[m])[u];
          acc.x += v.x;
          acc.y += v.y;
          acc.z += v.z;
          acc.w += v.w;
        }
        const uint4 z = *reinterpret_cast<uint4*>(&acc);
        o[u] = z;
        if (variant == kFetch) {
          mine[u] = z;
        } else if (variant == kOver) {
          // kept in the output until the others have reduced
        } else {
          for (int k = 1; k < members; ++k) {
            const int j = (me + k) % members;
            if (variant == kPush) {
              reinterpret_cast<uint4*>(areas.p[j] + result_at + me * part_bytes)[u] = z;
            } else {
              reinterpret_cast<uint4*>(outs.p[j] + me * part_bytes)[u] = z;
            }
          }
        }
      }
      if (variant == kOver) {
        __syncthreads();
        if (threadIdx.x == 0) {
          raise(areas, flags, 2, members, me, b, base + c + 1);
          wait_all(areas, flags, 2, members, me, b, base + c + 1);
        }
        __syncthreads();
        // Every other member has reduced this piece: its area's copy of this member's part of
        // the input is free for the result.
        for (int k = 1; k < members; ++k) {
          const int j = (me + k) % members;
          copy16(reinterpret_cast<uint4*>(areas.p[j] + me * part_bytes) + lo, o + lo, n);
        }
      }
      __syncthreads();
      if (threadIdx.x == 0) raise(areas, flags, 1, members, me, b, base + c + 1);
    }
    if (s >= 2) {  // piece s - 2 of every other part's result
      const std::size_t c = s - 2;
      std::size_t lo, n;
      piece_range(c, &lo, &n);
      __syncthreads();
      if (threadIdx.x == 0) wait_all(areas, flags, 1, members, me, b, base + c + 1);
      __syncthreads();
      if (variant != kDirect) {
        for (int k = 1; k < members; ++k) {
          const int j = (me + k) % members;
          const unsigned char* from = variant == kFetch  ? areas.p[j] + result_at + j * part_bytes
                                      : variant == kOver ? areas.p[me] + j * part_bytes
                                                         : areas.p[me] + result_at + j * part_bytes;
          copy16(reinterpret_cast<uint4*>(out + j * part) + lo,
                 reinterpret_cast<const uint4*>(from) + lo, n);
        }
      }
    }
  }
}

// A flag barrier of one block (what a small call's kernel pays): thread 0 raises this member's
// flag in every peer's area and waits for every peer's. How: 0 = __threadfence_system and
// st.release.sys (the library's raise_flags), 1 = st.release.sys alone, 2 = __threadfence (GPU
// scope) and st.volatile, 3 = st.release.gpu, 4 = one fence.acq_rel.sys and st.relaxed.sys.
// Waits: ld.acquire.sys (0, 1), ld.volatile (2, 3), ld.relaxed.sys then one fence.acq_rel.sys
// (4).
__global__ void barrier(Ptrs areas, int members, int me, unsigned long long first, int reps,
                        int how) {
  if (threadIdx.x != 0) return;
  for (unsigned long long call = first; call < first + reps; ++call) {
  for (int j = 0; j < members; ++j) {
    if (j == me) continue;
    auto* f = reinterpret_cast<unsigned long long*>(areas.p[j]) + 2 * me;
    if (how == 0) {
      if (j == (me + 1) % members) __threadfence_system();
      store_release(f, call);
    } else if (how == 1) {
      store_release(f, call);
    } else if (how == 2) {
      if (j == (me + 1) % members) __threadfence();
      asm volatile("st.volatile.global.u64 [%0], %1;" : : "l"(f), "l"(call) : "memory");
    } else if (how == 3) {
      asm volatile("st.release.gpu.global.u64 [%0], %1;" : : "l"(f), "l"(call) : "memory");
    } else {
      if (j == (me + 1) % members) asm volatile("fence.acq_rel.sys;" ::: "memory");
      asm volatile("st.relaxed.sys.global.u64 [%0], %1;" : : "l"(f), "l"(call) : "memory");
    }
  }
  for (int j = 0; j < members; ++j) {
    if (j == me) continue;
    const auto* f = reinterpret_cast<const unsigned long long*>(areas.p[me]) + 2 * j;
    if (how <= 1) {
      while (load_acquire(f) < call) {
      }
    } else if (how == 4) {
      unsigned long long v;
      do {
        asm volatile("ld.relaxed.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(f) : "memory");
      } while (v < call);
      if (j == (me + members - 1) % members) asm volatile("fence.acq_rel.sys;" ::: "memory");
    } else {
      unsigned long long v;
      do {
        asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(v) : "l"(f) : "memory");
      } while (v < call);
    }
  }
  }
}

__global__ void fill(float* p, std::size_t count, int me) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < count;
       i += static_cast<std::size_t>(gridDim.x) * blockDim.x) {
    p[i] = static_cast<float>((i % 1000) + me);
  }
}

std::size_t parse(const std::string& s) {
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (*end == 'k') v *= 1024;
  if (*end == 'm') v *= 1024 * 1024;
  if (*end == 'g') v *= 1024.0 * 1024 * 1024;
  return static_cast<std::size_t>(v);
}

int main(int argc, char** argv) {
  std::vector<std::size_t> sizes;
  for (int i = 1; i < argc; ++i) sizes.push_back(parse(argv[i]));
  if (sizes.empty()) sizes = {8u << 20, 16u << 20, 64u << 20, 256u << 20};
  int n = 0;
  CHECK(cudaGetDeviceCount(&n));
  if (n > kMaxMembers) n = kMaxMembers;
  if (n < 2) {
    std::fprintf(stderr, "needs two GPUs at least\n");
    return 1;
  }
  std::size_t most = 0;
  for (auto s : sizes) most = s > most ? s : most;
  most = (most + 16 * n - 1) / (16 * n) * (16 * n);
  const std::size_t flag_bytes = 3ull * kMaxMembers * kMaxBlocks * 16;
  Ptrs areas[2]{}, outs{};
  std::vector<float*> ins(n), outv(n);
  std::vector<cudaStream_t> streams(n);
  for (int g = 0; g < n; ++g) {
    CHECK(cudaSetDevice(g));
    for (int h = 0; h < n; ++h) {
      if (h != g) CHECK(cudaDeviceEnablePeerAccess(h, 0));
    }
    CHECK(cudaStreamCreateWithFlags(&streams[g], cudaStreamNonBlocking));
    CHECK(cudaMalloc(&ins[g], most));
    CHECK(cudaMalloc(&outv[g], most));
    outs.p[g] = reinterpret_cast<unsigned char*>(outv[g]);
    for (int gen = 0; gen < 2; ++gen) {
      CHECK(cudaMalloc(&areas[gen].p[g], 2 * most + flag_bytes));
      CHECK(cudaMemset(areas[gen].p[g], 0, 2 * most + flag_bytes));
    }
  }
  std::printf("mesh_allreduce_probe: %d GPUs\n%-7s %6s %8s %10s %10s %8s %6s\n", n, "variant",
              "blocks", "chunk", "bytes", "us", "busbw", "check");
  unsigned long long call = 0;
  {
    // Flags of their own, past the areas' data.
    Ptrs flags{};
    for (int g = 0; g < n; ++g) flags.p[g] = areas[0].p[g] + 2 * most;
    const char* hows[] = {"fence.sys+release.sys", "release.sys", "fence.gpu+volatile",
                          "release.gpu", "acq_rel.sys+relaxed.sys"};
    unsigned long long barrier_call = 1;
    for (int how = 0; how < 5; ++how) {
      const int reps = 2000;
      const auto t0 = std::chrono::steady_clock::now();
      for (int g = 0; g < n; ++g) {
        CHECK(cudaSetDevice(g));
        barrier<<<1, 512, 0, streams[g]>>>(flags, n, g, barrier_call, reps, how);
      }
      for (int g = 0; g < n; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaStreamSynchronize(streams[g]));
      }
      barrier_call += reps;
      std::printf("barrier %-22s %8.2f us each (%d in one kernel)\n", hows[how],
                  std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
                          .count() /
                      reps,
                  reps);
    }
  }
  const char* names[] = {"fetch", "push", "direct", "over"};
  for (std::size_t bytes : sizes) {
    const std::size_t count = bytes / 4 / (4 * n) * (4 * n);
    for (int g = 0; g < n; ++g) {
      CHECK(cudaSetDevice(g));
      fill<<<264, 512, 0, streams[g]>>>(ins[g], count, g);
      CHECK(cudaStreamSynchronize(streams[g]));
    }
    struct Config {
      int variant, blocks;
      std::size_t chunk_bytes;
    };
    std::vector<Config> configs;
    for (int variant : {kFetch, kPush, kDirect, kOver}) {
      for (int blocks : {64, 128}) {
        for (std::size_t chunk : {std::size_t{0}}) {
          configs.push_back({variant, blocks, chunk});
        }
      }
    }
    for (const Config& c : configs) {
      const auto launch_all = [&] {
        ++call;
        const Ptrs& a = areas[call & 1];
        for (int g = 0; g < n; ++g) {
          CHECK(cudaSetDevice(g));
          allreduce<<<c.blocks, 512, 0, streams[g]>>>(outv[g], ins[g], count, n, g, a, outs,
                                                       c.chunk_bytes / 16, c.variant, call);
        }
      };
      const auto sync_all = [&] {
        for (int g = 0; g < n; ++g) {
          CHECK(cudaSetDevice(g));
          CHECK(cudaStreamSynchronize(streams[g]));
        }
      };
      for (int g = 0; g < n; ++g) {
        CHECK(cudaSetDevice(g));
        CHECK(cudaMemsetAsync(outv[g], 0, count * 4, streams[g]));
      }
      launch_all();
      sync_all();
      // Check: element i = n * (i % 1000) + n (n - 1) / 2 on every GPU.
      bool ok = true;
      std::vector<float> host(count);
      for (int g = 0; g < n && ok; ++g) {
        CHECK(cudaMemcpy(host.data(), outv[g], count * 4, cudaMemcpyDeviceToHost));
        for (std::size_t i = 0; i < count; i += 97) {
          const float want = static_cast<float>(n * (i % 1000) + n * (n - 1) / 2);
          if (host[i] != want) {
            ok = false;
            break;
          }
        }
      }
      const int iterations = 20;
      const auto t0 = std::chrono::steady_clock::now();
      for (int it = 0; it < iterations; ++it) launch_all();
      sync_all();
      const double us =
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0)
              .count() /
          iterations;
      const double busbw = 2.0 * (n - 1) / n * count * 4 / us / 1e3;
      std::printf("%-7s %6d %8zu %10zu %10.1f %8.1f %6s\n", names[c.variant], c.blocks,
                  c.chunk_bytes, count * 4, us, busbw, ok ? "ok" : "WRONG");
      std::fflush(stdout);
    }
  }
  return 0;
}
