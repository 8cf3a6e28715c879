// NCCL's API on ferry (libnccl.so.2): what the entry points share. Each rank of a job that lives
// in this process is a ferry Context, made by ncclCommInitRank from a unique id (the TCP store the
// id names) and let go with the job's last communicator here; each ncclComm is a ferry
// Communicator of one of them. See docs/design/nccl.md.
#pragma once

#include <nccl.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda/cuda.hpp"
#include "ferry/ferry.hpp"

namespace ferry::nccl {
struct Rank;

// A reduction ncclRedOpCreatePreMulSum made: each member's input times its scalar, then summed.
struct PreMulSum {
  ncclDataType_t type;
  // The scalar: read at each operation from device memory where `device` (ncclScalarDevice),
  // else the value at creation (ncclScalarHostImmediate), as the low bytes of `bits`.
  const void* device;
  std::uint64_t bits;
};

// A reduction as ferry runs it: ferry's op, and what ncclAvg or a pre-multiplied sum adds around
// it (NCCL's own way: a float average multiplies each input by 1/n, an integer one divides the
// sum by n).
struct Reduction {
  ReduceOp op = ReduceOp::kSum;
  bool pre_multiply = false;  // each member's input times `scale` first
  bool post_divide = false;   // the result divided by the member count afterwards
  cuda::Cuda::Scale scale;
};
}  // namespace ferry::nccl

// NCCL's handle: a communicator of one rank's Context. One made by ncclCommInitRank inside a group
// is made at the group's end (`pending` until then).
struct ncclComm {
  ferry::Communicator comm;
  ferry::nccl::Rank* owner = nullptr;
  int device = -1;  // the CUDA device current at init (ncclCommCuDevice)
  bool blocking = true;
  // Revoked by ncclCommRevoke here (a member's revoke reaches the stream operations, whose
  // failure is the async error).
  std::atomic<bool> revoked{false};
  // ncclRedOpCreatePreMulSum's reductions, by their ncclRedOp_t (ncclNumOps and up).
  std::map<int, ferry::nccl::PreMulSum> premul_sums;
  // Device memory a pre-multiplied input goes through where the receive buffer cannot hold it (a
  // reduce-scatter's, a reduce's), one per stream so that operations on two streams never share
  // one; kept until the communicator goes (a captured graph keeps using it).
  struct Scratch {
    cudaStream_t stream;
    void* memory;
    std::size_t bytes;
  };
  std::vector<Scratch> scratch;
  std::set<void*> registrations;  // ncclCommRegister's handles
  std::set<void*> windows;        // ncclCommWindowRegister's handles
  struct Pending {
    int nranks;
    int rank;
    std::string store;
    std::uint64_t job;
  };
  std::optional<Pending> pending;
  ncclResult_t init_result = ncclSuccess;  // of a pending init, once the group ended
  // A non-blocking init (config.blocking = 0) runs on a thread of its own: `initializing` until
  // it is done, then init_result and init_error (ncclGetLastError's is the calling thread's) say
  // how it went.
  std::atomic<bool> initializing{false};
  std::thread init_thread;
  std::string init_error;
};

namespace ferry::nccl {

// What the first ncclGetUniqueId of a job chose: where rank 0 serves the job's store, and a
// number that names the job (its shared-memory files) and tells ids apart.
struct UniqueId {
  std::string host;
  int port = 0;
  std::uint64_t nonce = 0;
};
// Packs into / reads NCCL's 128 opaque bytes; decode fails (false) on bytes that are not an id of
// ferry's (another library's id, uninitialised memory).
void encode(const UniqueId& id, ncclUniqueId* out);
bool decode(const ncclUniqueId& in, UniqueId* out);
// A new id: NCCL_COMM_ID (HOST:PORT) where set, as NCCL reads it; else this host's address on
// NCCL_SOCKET_IFNAME (or its first interface that is up and not loopback, else 127.0.0.1) and a
// port the kernel hands out now.
ncclResult_t make_unique_id(UniqueId* out);

// A rank of a job in this process: its Context, and how many communicators use it. Its Context
// goes once no communicator of any rank of its job in this process is left (the job's ranks here
// finalize together: one thread that destroys its communicators one by one would otherwise wait
// in the first rank's finalize for the next).
// A thread that runs one task at a time for a rank: where one thread drives several ranks, each
// rank's part of a group runs on its own, without a thread made per group (two H200s: 80-180 us
// an 8-byte allreduce through nccl-tests -g 2 with a thread made per rank and call). Both sides
// poll for kSpin before they sleep, so calls back to back hand over without a wake-up (one
// costs several microseconds on a VM).
class Worker {
 public:
  Worker();
  ~Worker();  // finishes the task it has, then joins
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;
  void post(std::function<void()> task);
  void wait();  // until the task posted last is done

 private:
  static constexpr std::chrono::microseconds kSpin{50};
  void loop();
  std::mutex lock_;
  std::condition_variable changed_;
  std::function<void()> task_;
  std::atomic<bool> busy_{false};  // a task posted and not done (set under lock_)
  bool stop_ = false;
  std::thread thread_;
};

struct Rank {
  std::uint64_t job = 0;  // the nonce of the id the Context was made from
  int rank = -1;
  std::optional<Context> context;
  int comms = 0;
  std::unique_ptr<Worker> worker;  // made when a thread first drives it beside another rank
};

// The process's ranks, behind one lock (ferry's Contexts are thread-safe by themselves).
struct Process {
  std::mutex lock;
  std::list<Rank> ranks;
};
Process& process();

// The result of a ferry Status as NCCL names it, keeping its message for ncclGetLastError.
ncclResult_t fail(const Status& status);
// The result alone.
ncclResult_t result_of(const Status& status);
// The result, made the thread's last error (and logged) only where it is not that already: what
// an error that is polled for reports (ncclCommGetAsyncError).
ncclResult_t report(const Status& status);
ncclResult_t fail(ncclResult_t result, const std::string& message);
const char* last_error();
// NCCL_DEBUG=INFO (or TRACE): lines "ferry-nccl INFO ..." on stderr.
void info(const char* format, ...) __attribute__((format(printf, 1, 2)));
// NCCL_DEBUG=INFO with NCCL_DEBUG_SUBSYS naming COLL (or ALL): a line for every operation.
bool tracing_calls();
// ncclResetDebugInit: NCCL_DEBUG is read again at the next line.
void reread_debug();

// NCCL's element types and reductions in ferry's terms; an error (kept) for those ferry has not
// (fp8 reductions) or that are no value of NCCL's.
ncclResult_t to_ferry(ncclDataType_t type, DataType* out);
ncclResult_t to_ferry(ncclRedOp_t op, ReduceOp* out);
// `op` on `type` in `comm` (ncclAvg and its pre-multiplied sums included), or the error kept.
ncclResult_t to_ferry(ncclRedOp_t op, ncclDataType_t type, const ncclComm& comm, Reduction* out);

}  // namespace ferry::nccl
