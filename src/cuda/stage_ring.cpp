#include "cuda/stage_ring.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <cctype>
#include <cerrno>
#include <cstring>

#include "cuda/cuda.hpp"

namespace ferry::cuda {
namespace {

[[noreturn]] void fail(Code code, const std::string& name, const std::string& what, int err) {
  throw Error(code, "staging ring /dev/shm" + name + ": " + what + ": " + std::strerror(err));
}

}  // namespace

std::string StageRing::name(const std::string& job_id, int sender, int receiver) {
  std::string clean;
  for (char c : job_id) clean += (std::isalnum(static_cast<unsigned char>(c)) != 0) ? c : '_';
  return "/ferry-" + clean + "-" + std::to_string(sender) + "-stage-" + std::to_string(receiver);
}

std::unique_ptr<StageRing> StageRing::create(Cuda* cuda, const std::string& name,
                                             std::size_t bytes) {
  ::shm_unlink(name.c_str());  // a ring left by an earlier context of this rank
  util::Fd fd(::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600));
  if (!fd.valid()) fail(Code::kIoError, name, "shm_open failed", errno);
  std::unique_ptr<StageRing> ring(new StageRing());
  ring->cuda_ = cuda;
  ring->name_ = name;
  ring->linked_ = true;  // from here on, the destructor removes the name
  int err = ::posix_fallocate(fd.get(), 0, static_cast<off_t>(bytes));
  if (err != 0) {
    fail(err == ENOSPC ? Code::kNoResources : Code::kIoError, name,
         "reserving " + std::to_string(bytes) + " bytes failed", err);
  }
  void* address = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) fail(Code::kNoResources, name, "mmap failed", errno);
  ring->mapping_ = util::Mapping(address, bytes);
  if (cuda != nullptr) {  // a host-only sender fills the ring with the CPU
    Status status = cuda->register_host(address, bytes);
    if (!status) {
      throw Error(Code::kNoResources, "staging ring /dev/shm" + name + ": " + status.message());
    }
    ring->registered_ = true;
  }
  return ring;
}

std::unique_ptr<StageRing> StageRing::open(Cuda* cuda, const std::string& name,
                                           std::size_t max_bytes) {
  util::Fd fd(::shm_open(name.c_str(), O_RDWR, 0));
  if (!fd.valid()) fail(Code::kIoError, name, "opening the sender's ring failed", errno);
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) fail(Code::kIoError, name, "fstat failed", errno);
  const auto bytes = static_cast<std::size_t>(st.st_size);
  if (bytes == 0 || bytes > max_bytes) {
    throw Error(Code::kProtocolError, "staging ring /dev/shm" + name + " has " +
                                          std::to_string(bytes) + " bytes (at most " +
                                          std::to_string(max_bytes) + " allowed)");
  }
  std::unique_ptr<StageRing> ring(new StageRing());
  ring->cuda_ = cuda;
  ring->name_ = name;
  void* address = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
  if (address == MAP_FAILED) fail(Code::kNoResources, name, "mmap failed", errno);
  ring->mapping_ = util::Mapping(address, bytes);
  if (cuda != nullptr) {
    Status status = cuda->register_host(address, bytes);
    if (!status)
      throw Error(Code::kNoResources, "staging ring /dev/shm" + name + ": " + status.message());
    ring->registered_ = true;
  }
  return ring;
}

void StageRing::unlink() {
  if (!name_.empty()) ::shm_unlink(name_.c_str());
  linked_ = false;
}

StageRing::~StageRing() {
  if (linked_) unlink();
  if (registered_) cuda_->unregister_host(mapping_.get());
}

}  // namespace ferry::cuda
