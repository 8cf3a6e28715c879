// Owners of what opening an ofi endpoint makes: each libfabric object (fabric, domain, queues,
// endpoint, registrations) closes when its owner goes, so a failure half-way through closes what
// was opened, newest first, and nothing outlives the transport. Handles() counts the objects
// open in this process, for tests that check nothing leaks.
#pragma once

#include <rdma/fabric.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <utility>

#include "transport/ofi/fabric.hpp"

namespace ferry::transport::ofi {

namespace detail {
inline std::atomic<int> open_handles{0};
}  // namespace detail

// libfabric objects open in this process through Fid owners.
inline int open_handles() { return detail::open_handles.load(std::memory_order_relaxed); }

// One libfabric object (fid_fabric, fid_domain, fid_cq, fid_av, fid_ep, fid_mr): used where the
// raw pointer is, closed by fi_close when the owner goes or is reset.
template <typename T>
class Fid {
 public:
  Fid() = default;
  ~Fid() { reset(); }
  Fid(Fid&& other) noexcept : object_(std::exchange(other.object_, nullptr)) {}
  Fid& operator=(Fid&& other) noexcept {
    if (this != &other) {
      reset();
      object_ = std::exchange(other.object_, nullptr);
    }
    return *this;
  }
  Fid(const Fid&) = delete;
  Fid& operator=(const Fid&) = delete;

  // Runs `make(T**)` (an fi_* call that opens an object) and owns what it made; its result.
  template <typename Make>
  int open(Make&& make) {
    reset();
    T* made = nullptr;
    const int ret = std::forward<Make>(make)(&made);
    if (ret == 0 && made != nullptr) {
      object_ = made;
      detail::open_handles.fetch_add(1, std::memory_order_relaxed);
    }
    return ret;
  }
  void reset() {
    if (object_ == nullptr) return;
    fi_close(&std::exchange(object_, nullptr)->fid);
    detail::open_handles.fetch_sub(1, std::memory_order_relaxed);
  }
  // Lets go of the object without closing it (it stays counted as open): for an object that
  // cannot be closed safely.
  void abandon() { object_ = nullptr; }
  [[nodiscard]] T* get() const { return object_; }
  operator T*() const { return object_; }  // NOLINT(google-explicit-constructor): fi_* calls
  T* operator->() const { return object_; }
  explicit operator bool() const { return object_ != nullptr; }

 private:
  T* object_ = nullptr;
};

// An fi_info list (fi_getinfo, fi_dupinfo), freed by fi_freeinfo.
struct InfoFree {
  void operator()(fi_info* info) const {
    if (const Fabric* fi = fabric()) fi->freeinfo(info);
  }
};
using Info = std::unique_ptr<fi_info, InfoFree>;

// Memory from std::aligned_alloc.
struct Free {
  void operator()(void* memory) const { std::free(memory); }
};

}  // namespace ferry::transport::ofi
