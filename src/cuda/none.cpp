// Cuda::create_driver for a build without the CUDA headers: every buffer is host memory.
#include "cuda/cuda.hpp"

namespace ferry::cuda {

std::unique_ptr<Cuda> Cuda::create_driver(const util::Config& /*config*/, std::string* why) {
  *why = "this libferry was built without CUDA support (no cuda.h at configure time)";
  return nullptr;
}

}  // namespace ferry::cuda
