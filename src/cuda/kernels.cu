// Device code of ferry's CUDA module: the element-wise reductions of the collectives on device
// buffers, the copy kernel, the one-shot, two-shot and resident allreduce kernels, the mesh
// allgather and reduce-scatter, and stream send/receive (the parts in kernels/, one translation
// unit). nvcc compiles it into a fatbin (sm_90 code and PTX) that libferry embeds and loads
// through the driver (cuModuleLoadData), so the library needs no CUDA runtime.
//
// The arithmetic is the host kernels' (src/coll/reduce.cpp), element by element: integers wrap,
// float min/max are IEEE 754-2019 minimum/maximum (-0 below +0, a NaN operand gives NaN), and
// float16/bfloat16 combine in float and round to nearest even. So a collective gives the same bits
// on device buffers as on host buffers, NaN payloads aside (the GPU makes a canonical NaN).
// Built without fast-math flags: denormals are kept and nothing is contracted into an FMA.
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/elements.cuh"

// out = a op b over `count` elements of `type`. The caller checked (type, op).
extern "C" __global__ void __launch_bounds__(512)
    ferry_reduce(void* out, const void* a, const void* b, unsigned long long count, int type,
                 int op) {
  with_element(type, [&](auto element, bool bitwise) {
    with_op(op, bitwise,
            [&](auto kOp) { reduce_elements<decltype(element), kOp>(out, a, b, count); });
  });
}

// dst = src over `bytes` bytes of device memory (either may be a peer's IPC mapping): the copy
// engine's work done by the SMs, where the engine's start-up per copy shows
// (FERRY_CUDA_IPC_KERNEL_COPY).
namespace {

// dst = src over `bytes`, this thread taking units first, first + stride, ...: four 16-byte loads
// in flight per thread before their stores where both are 16-byte aligned, else byte by byte.
__device__ __forceinline__ void strided_copy(void* dst, const void* src, std::size_t bytes,
                                             std::size_t first, std::size_t stride) {
  auto* out = static_cast<unsigned char*>(dst);
  const auto* in = static_cast<const unsigned char*>(src);
  std::size_t tail = 0;
  if (((reinterpret_cast<std::uintptr_t>(dst) | reinterpret_cast<std::uintptr_t>(src)) & 15) == 0) {
    const std::size_t units = bytes / 16;
    auto* o = static_cast<uint4*>(dst);
    const auto* i = static_cast<const uint4*>(src);
    std::size_t k = first;
    for (; k + 3 * stride < units; k += 4 * stride) {
      const uint4 a = i[k];
      const uint4 b = i[k + stride];
      const uint4 c = i[k + 2 * stride];
      const uint4 d = i[k + 3 * stride];
      o[k] = a;
      o[k + stride] = b;
      o[k + 2 * stride] = c;
      o[k + 3 * stride] = d;
    }
    for (; k < units; k += stride) o[k] = i[k];
    tail = units * 16;
  }
  for (std::size_t t = tail + first; t < bytes; t += stride) out[t] = in[t];
}

}  // namespace

extern "C" __global__ void __launch_bounds__(512)
    ferry_copy(void* dst, const void* src, unsigned long long bytes) {
  strided_copy(dst, src, bytes, static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x,
               static_cast<std::size_t>(gridDim.x) * blockDim.x);
}

// In this order: each part uses those before it.
#include "kernels/oneshot.cuh"
// (the two-shot kernel)
#include "kernels/twoshot.cuh"
// (allgather and reduce-scatter among three or more)
#include "kernels/mesh.cuh"
// (the on-stream kernel: LL, and the one-shot blocks)
#include "kernels/on_stream.cuh"
// (the resident kernel)
#include "kernels/resident.cuh"
// (stream send and receive)
#include "kernels/p2p.cuh"
