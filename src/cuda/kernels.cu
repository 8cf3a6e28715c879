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

// out = in * factor as kProd multiplies (factor one element of `type`: read from `device_factor`
// where that is not null, else the low bytes of `factor_bits`), or, for an integer type where
// `divisor` is not 0, out = in / divisor truncated toward zero (Cuda::scale_on_stream: NCCL's
// ncclAvg and pre-multiplied sums). Each thread reads its elements before writing them, so out may
// be in; where both are 16-byte aligned the body goes in 16-byte loads and stores.
extern "C" __global__ void __launch_bounds__(512)
    ferry_scale(void* out_buffer, const void* in_buffer, unsigned long long count, int type,
                const void* device_factor, unsigned long long factor_bits,
                unsigned long long divisor) {
  with_element(type, [&](auto element, bool integer) {
    using E = decltype(element);
    using T = typename E::Storage;
    T factor;
    if (device_factor != nullptr) {
      factor = *static_cast<const T*>(device_factor);
    } else {
      memcpy(&factor, &factor_bits, sizeof(T));  // little-endian: the low bytes
    }
    auto apply = [&](T x) -> T {
      if (divisor == 0 || !integer) return E::template combine<kProd>(x, factor);
      if constexpr (std::is_integral<T>::value) {
        // In 64 bits of T's signedness: a divisor above T's range is still exact. (float16 and
        // bfloat16 are stored as uint16 but are not integers: never here.)
        if constexpr (std::is_signed<T>::value) {
          return static_cast<T>(static_cast<long long>(x) / static_cast<long long>(divisor));
        } else {
          return static_cast<T>(static_cast<unsigned long long>(x) / divisor);
        }
      }
      return x;
    };
    constexpr std::size_t kVector = 16 / sizeof(T);
    auto* out = static_cast<T*>(out_buffer);
    const auto* in = static_cast<const T*>(in_buffer);
    const std::size_t first = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
    const bool aligned =
        ((reinterpret_cast<std::uintptr_t>(out) | reinterpret_cast<std::uintptr_t>(in)) & 15) == 0;
    const std::size_t vectors = aligned ? count / kVector : 0;
    for (std::size_t v = first; v < vectors; v += stride) {
      union Lanes {
        uint4 whole;
        T item[kVector];
      } x;
      x.whole = reinterpret_cast<const uint4*>(in)[v];
#pragma unroll
      for (std::size_t j = 0; j < kVector; ++j) x.item[j] = apply(x.item[j]);
      reinterpret_cast<uint4*>(out)[v] = x.whole;
    }
    for (std::size_t i = vectors * kVector + first; i < count; i += stride) out[i] = apply(in[i]);
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
