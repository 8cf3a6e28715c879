// The resident one-shot allreduce kernel (kernels.cu, ferry_allreduce_resident) as the host drives
// it: a mailbox in mapped host memory per communicator, calls posted into it, and the kernel
// launched again whenever it left (idle, or stopped) with a call still waiting.
#pragma once

#include <memory>
#include <vector>

#include "cuda/impl/devices.hpp"

namespace ferry::cuda {

class Residents {
 public:
  explicit Residents(Devices& devices) : devices_(devices), d_(devices.driver()) {}

  // Tickets of resident kernels carry this bit in their stream number.
  static constexpr std::uint32_t kTicket = 0x80000000u;

  // Cuda::resident_open, _post, _outcome and _close.
  Status open(int ordinal, const Cuda::OneShot& shape, std::uint64_t idle_us, int* id);
  Status post(int id, const Cuda::OneShot& call, Ticket* ticket);
  Status outcome(int id);
  void close(int id);
  // Whether a ticket of post() is done; launches the kernel again if it left without the call.
  bool done(const Ticket& ticket);

 private:
  // The mailbox in host memory (kernels.cu, Mailbox): the first line written by the host, the
  // second by the kernel.
  struct alignas(64) Box {
    std::uint64_t field[8];  // out, in, count, shape, sequence; the call's number in the top byte
    std::uint64_t done;
    std::uint64_t exited;
    std::uint64_t spare[6];
  };
  static_assert(sizeof(Box) == 128);
  struct Resident {
    int device = 0;
    Cuda::OneShot shape;
    std::uint64_t idle_ns = 0;
    Box* box = nullptr;
    void* box_device = nullptr;
    CUstream stream = nullptr;
    std::uint64_t epoch = 0;   // launches so far
    std::uint64_t posted = 0;  // calls posted so far
    Status failure;            // a relaunch that failed, for outcome()
  };
  static constexpr std::uint64_t kFieldMask = (std::uint64_t{1} << 56) - 1;

  Status launch(Resident& r);

  Devices& devices_;
  const Driver* d_;
  std::vector<std::unique_ptr<Resident>> residents_;  // by open()'s id; null: closed
};

}  // namespace ferry::cuda
