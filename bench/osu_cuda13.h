/* OSU 7.4 calls CUDA 12's cudaMemPrefetchAsync(ptr, bytes, device, stream); CUDA 13 takes a
 * location and flags instead. Included ahead of OSU's sources (CFLAGS=-include), no source change. */
#include <cuda_runtime.h>
#if CUDART_VERSION >= 13000
#define cudaMemPrefetchAsync(p, n, dev, s)                                                  \
  cudaMemPrefetchAsync((p), (n),                                                           \
                       (struct cudaMemLocation){.type = cudaMemLocationTypeDevice, .id = (dev)}, \
                       0, (s))
#endif
