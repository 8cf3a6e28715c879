// What every build of the CUDA module shares: the stand-in tests put in the driver's place.
#include "cuda/cuda.hpp"

#include <atomic>

namespace ferry::cuda {
namespace {
std::atomic<Cuda::Factory> g_factory{nullptr};
}  // namespace

void Cuda::set_factory_for_tests(Factory factory) { g_factory.store(factory); }

std::unique_ptr<Cuda> Cuda::create(const util::Config& config, std::string* why) {
  if (Factory factory = g_factory.load(); factory != nullptr) return factory();
  return create_driver(config, why);
}

}  // namespace ferry::cuda
