// Allreduce on device buffers: the same call as on host buffers, with pointers from cudaMalloc.
// Data written by a CUDA stream must be ready (synchronise the stream) before the call. Each rank
// uses GPU local_rank % device count. Exits 77 (skipped) without a GPU.
// Run: ferryrun -n 2 build/examples/allreduce_device
#include <cuda_runtime.h>

#include <cstdio>
#include <vector>

#include "ferry/ferry.hpp"

int main() {
  try {
    int gpus = 0;
    if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
      std::printf("allreduce_device: no GPU here; skipped\n");
      return 77;
    }
    ferry::Context ctx = ferry::Context::init();
    cudaSetDevice(ctx.local_rank() % gpus);
    const std::size_t count = 1 << 22;
    std::vector<float> host(count, static_cast<float>(ctx.rank() + 1));
    float* data = nullptr;
    if (cudaMalloc(&data, count * sizeof(float)) != cudaSuccess) return 1;
    cudaMemcpy(data, host.data(), count * sizeof(float), cudaMemcpyHostToDevice);
    cudaDeviceSynchronize();  // ready before ferry reads it
    ferry::Status s =
        ctx.world().allreduce(data, data, count, ferry::DataType::kFloat32, ferry::ReduceOp::kSum);
    cudaMemcpy(host.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost);
    cudaFree(data);
    const int n = ctx.size();
    const float expected = static_cast<float>(n * (n + 1) / 2);
    if (!s || host.front() != expected || host.back() != expected) {
      std::fprintf(stderr, "rank %d: %s, got %g\n", ctx.rank(), s.to_string().c_str(),
                   host.front());
      return 1;
    }
    if (ctx.rank() == 0) std::printf("%d GPUs: sum %g over %zu floats\n", n, expected, count);
    return 0;
  } catch (const ferry::Error& e) {
    std::fprintf(stderr, "allreduce_device: %s\n", e.what());
    return 1;
  }
}
