// What the stream-ordered operations (proto/stream_ops.hpp) ask of the driver about an
// application's stream: its GPU and graph capture, the hand-off to ferry's proxy thread by stream
// memory operations, and a graph's hold on what it uses.
#pragma once

#include <cuda.h>

#include <cstdint>

#include "cuda/cuda.hpp"
#include "cuda/driver.hpp"

namespace ferry::cuda::streams {

Status info(const Driver* d, CUstream stream, Cuda::StreamInfo* info);
Status handoff(const Driver* d, CUstream stream, void* start, void* done, std::uint32_t value,
               bool reset);
Status wait(const Driver* d, CUstream stream, void* done, std::uint32_t value);
Status retain(const Driver* d, CUgraph graph, void (*release)(void*), void* arg);
Status copy(const Driver* d, CUstream stream, void* dst, const void* src, std::size_t bytes);
// Sets the calling thread's capture mode (-1: relaxed) and returns the one it had.
int exchange_capture_mode(const Driver* d, int mode);

}  // namespace ferry::cuda::streams
