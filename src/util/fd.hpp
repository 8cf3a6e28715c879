// Owning wrappers for OS resources: file descriptors and memory mappings. A failing constructor
// leaves nothing behind; moving transfers ownership; destruction releases.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <utility>

namespace ferry::util {

class Fd {
 public:
  Fd() noexcept = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) reset(std::exchange(other.fd_, -1));
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { reset(); }

  [[nodiscard]] int get() const noexcept { return fd_; }
  [[nodiscard]] bool valid() const noexcept { return fd_ >= 0; }
  int release() noexcept { return std::exchange(fd_, -1); }
  void reset(int fd = -1) noexcept {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

class Mapping {
 public:
  Mapping() noexcept = default;
  Mapping(void* address, std::size_t length) noexcept : address_(address), length_(length) {}
  Mapping(Mapping&& other) noexcept
      : address_(std::exchange(other.address_, nullptr)),
        length_(std::exchange(other.length_, 0)) {}
  Mapping& operator=(Mapping&& other) noexcept {
    if (this != &other) {
      reset();
      address_ = std::exchange(other.address_, nullptr);
      length_ = std::exchange(other.length_, 0);
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { reset(); }

  [[nodiscard]] void* get() const noexcept { return address_; }
  [[nodiscard]] std::byte* bytes() const noexcept { return static_cast<std::byte*>(address_); }
  [[nodiscard]] std::size_t length() const noexcept { return length_; }
  void reset() noexcept {
    if (address_ != nullptr) ::munmap(address_, length_);
    address_ = nullptr;
    length_ = 0;
  }

 private:
  void* address_ = nullptr;
  std::size_t length_ = 0;
};

}  // namespace ferry::util
