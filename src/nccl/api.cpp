// NCCL's API on ferry: every function of nccl.h 2.28 (and the host calls of nccl_device.h that
// PyTorch imports), as pnccl… with nccl… aliases, as NCCL exports them. See docs/design/nccl.md.
#include <cuda.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "api/access.hpp"
#include "cuda/driver.hpp"
#include "nccl/state.hpp"
#include "proto/engine.hpp"

using ferry::Communicator;
using ferry::Status;
using ferry::nccl::fail;
using ferry::nccl::process;

namespace {

using ferry::nccl::Rank;

constexpr unsigned kConfigMagic = 0xcafebeef;
constexpr unsigned kSimInfoMagic = 0x74685283;

std::string hex(std::uint64_t value) {
  char text[17];
  std::snprintf(text, sizeof(text), "%016llx", static_cast<unsigned long long>(value));
  return text;
}

// The CUDA device current in the calling thread (NCCL binds a communicator to it), 0 where no
// context is current yet (cudaGetDevice's answer then), -1 without a driver.
// The CUDA context current in the calling thread, or null (none, or no driver).
CUcontext current_context() {
  const ferry::cuda::Driver* d = ferry::cuda::driver();
  CUcontext context = nullptr;
  if (d != nullptr && d->cuCtxGetCurrent(&context) != CUDA_SUCCESS) context = nullptr;
  return context;
}

int current_device() {
  const ferry::cuda::Driver* d = ferry::cuda::driver();
  if (d == nullptr) return -1;
  CUdevice device = 0;
  if (current_context() == nullptr) return 0;
  return d->cuCtxGetDevice(&device) == CUDA_SUCCESS ? static_cast<int>(device) : 0;
}

ncclResult_t check_config(const ncclConfig_t* config, const char* what, bool* blocking) {
  if (config == nullptr) return ncclSuccess;
  if (config->magic != kConfigMagic || config->size < offsetof(ncclConfig_t, cgaClusterSize)) {
    return fail(ncclInvalidArgument,
                std::string(what) + ": the config was not set up with NCCL_CONFIG_INITIALIZER");
  }
  if (config->blocking != NCCL_CONFIG_UNDEF_INT) *blocking = config->blocking != 0;
  return ncclSuccess;
}

// An operation made inside a group: run at the group's end, by a thread of its rank's.
// What an operation leaves to do once it is enqueued (an integer ncclAvg's division): inside a
// group, after the group's end enqueued it.
using Afterwards = std::function<Status()>;

struct Deferred {
  ncclComm_t comm;
  const char* what;
  std::function<Status(Communicator&, Afterwards*)> call;
  CUcontext context;  // current when it was made (the legacy stream is that context's)
};

// The calling thread's group (NCCL's groups are per thread): how deep, the operations and inits
// it defers to its end. There each rank's operations go to its Context inside a group of the
// Context's, all ranks side by side: a thread that drives several ranks of a job (nccl-tests -g)
// would otherwise wait in one rank's first collective, which sets up the device path with the
// others, for ranks it has not reached yet.
struct ThreadGroup {
  int depth = 0;
  std::vector<Deferred> operations;
  std::vector<ncclComm_t> inits;
};
thread_local ThreadGroup t_group;

// Runs `work(i)` for i < count, each in a thread of its own when there are several: ranks of one
// job in this process wait for each other inside it (init, a group's first collective, finalize).
template <typename Work>
void side_by_side(std::size_t count, Work&& work) {
  if (count == 1) {
    work(std::size_t{0});
    return;
  }
  std::vector<std::thread> threads;
  for (std::size_t i = 0; i < count; ++i) threads.emplace_back([&work, i] { work(i); });
  for (auto& t : threads) t.join();
}

// Waits for a non-blocking init that still runs.
void settle(ncclComm_t comm) {
  if (comm->init_thread.joinable()) comm->init_thread.join();
}

// The GPU of `comm`'s Context, or why there is none.
Status gpu_of(ncclComm_t comm, ferry::cuda::Cuda** gpu) {
  ferry::coll::Group* group = ferry::CommunicatorAccess::group(comm->comm);
  if (group == nullptr || group->detached()) {
    return Status(ferry::Code::kInvalidArgument, "the communicator's Context has ended");
  }
  *gpu = group->engine()->cuda();
  if (*gpu == nullptr) {
    return Status(ferry::Code::kUnsupported,
                  "this rank has no CUDA driver (the operation needs a stream to go on)");
  }
  return Status();
}

// The device `comm`'s work goes on (the one current at its init; 0 where none was).
int device_of(ncclComm_t comm) { return std::max(comm->device, 0); }

// `scale` of `count` elements of `type` from `in` to `out`, on `stream` after what is there.
Status scale_on(ncclComm_t comm, cudaStream_t stream, void* out, const void* in, std::size_t count,
                ferry::DataType type, const ferry::cuda::Cuda::Scale& scale) {
  ferry::cuda::Cuda* gpu = nullptr;
  if (Status s = gpu_of(comm, &gpu); !s) return s;
  return gpu->scale_on_stream(reinterpret_cast<void*>(stream), device_of(comm), out, in, count,
                              type, scale);
}

// Device memory of at least `bytes` for operations of `comm` on `stream` (ncclComm::scratch): the
// largest it has for that stream, else a new one of at least twice that (the older ones stay:
// what is enqueued, or captured, may still use them).
Status scratch_for(ncclComm_t comm, cudaStream_t stream, std::size_t bytes, void** out) {
  std::lock_guard guard(process().lock);
  std::size_t largest = 0;
  for (const ncclComm::Scratch& s : comm->scratch) {
    if (s.stream != stream || s.bytes < largest) continue;
    largest = s.bytes;
    *out = s.memory;
  }
  if (largest >= bytes) return Status();
  ferry::cuda::Cuda* gpu = nullptr;
  if (Status s = gpu_of(comm, &gpu); !s) return s;
  const std::size_t size = std::max(bytes, 2 * largest);
  const int mode = gpu->relax_capture();  // an allocation is no stream work: allowed in a capture
  Status s = gpu->allocate(device_of(comm), size, out);
  gpu->restore_capture(mode);
  if (!s) return s;
  comm->scratch.push_back({stream, *out, size});
  return Status();
}

// The scratch memory goes with its communicator (a free waits for the GPU's work on it).
void free_scratch(ncclComm_t comm) {
  if (comm->scratch.empty()) return;
  ferry::cuda::Cuda* gpu = nullptr;
  if (gpu_of(comm, &gpu).is_ok()) {
    for (const ncclComm::Scratch& s : comm->scratch) gpu->release(device_of(comm), s.memory);
  }
  comm->scratch.clear();
}

// Lets a communicator go. Once no communicator of the job is left in this process, its ranks'
// Contexts finalize, side by side (they wait for each other). Takes the process lock.
void release(ncclComm_t comm) {
  settle(comm);
  free_scratch(comm);
  auto& p = process();
  std::vector<Rank*> finished;
  {
    std::lock_guard guard(p.lock);
    Rank* owner = comm->owner;
    delete comm;
    if (owner == nullptr) return;
    --owner->comms;
    for (const Rank& r : p.ranks) {
      if (r.job == owner->job && r.comms > 0) return;
    }
    for (Rank& r : p.ranks) {
      if (r.job == owner->job) finished.push_back(&r);
    }
  }
  ferry::nccl::info("last communicator of job %s here: finalizing %zu rank(s)",
                    hex(finished.front()->job).c_str(), finished.size());
  for (Rank* r : finished) r->worker.reset();
  side_by_side(finished.size(), [&](std::size_t i) { finished[i]->context.reset(); });
  std::lock_guard guard(p.lock);
  p.ranks.remove_if([&](const Rank& r) {
    return std::find(finished.begin(), finished.end(), &r) != finished.end();
  });
}

// Makes the Context of `comm`'s pending init (without the process lock: the job's other ranks in
// this process may be joining at the same time, in other threads).
ncclResult_t make_rank(ncclComm_t comm, const char* what) {
  const ncclComm::Pending pending = *comm->pending;
  auto& p = process();
  Rank* rank = nullptr;
  {
    std::lock_guard guard(p.lock);
    for (const Rank& r : p.ranks) {
      if (r.job == pending.job && r.rank == pending.rank) {
        comm->pending.reset();
        return fail(ncclInvalidUsage, std::string(what) + ": rank " + std::to_string(pending.rank) +
                                          " of this unique id is in this process already");
      }
    }
    rank = &p.ranks.emplace_back();
    rank->job = pending.job;
    rank->rank = pending.rank;
    rank->comms = 1;  // this one, from the start: a release meanwhile must not take it
  }
  ferry::Options options;
  const std::string job = "nccl" + hex(pending.job);
  if (pending.nranks == 1) {
    options.config = {{"BOOTSTRAP", "single"}, {"SIZE", "1"}, {"RANK", "0"}, {"JOB_ID", job}};
  } else {
    options.config = {{"BOOTSTRAP", "store"},
                      {"STORE", pending.store},
                      {"RANK", std::to_string(pending.rank)},
                      {"SIZE", std::to_string(pending.nranks)},
                      {"LOCAL_RANK", "-1"},
                      {"LOCAL_SIZE", "0"},
                      {"JOB_ID", job}};
  }
  std::optional<ferry::Context> context;
  std::string error;
  try {
    context.emplace(ferry::Context::init(options));
  } catch (const ferry::Error& e) {
    error = e.what();
  }
  std::lock_guard guard(p.lock);
  if (!context) {
    p.ranks.remove_if([&](const Rank& r) { return &r == rank; });
    comm->pending.reset();
    return fail(ncclSystemError, std::string(what) + ": " + error);
  }
  rank->context = std::move(context);
  comm->comm = rank->context->world();
  comm->owner = rank;
  comm->pending.reset();
  ferry::nccl::info("%s: rank %d of %d on CUDA device %d, job %s, store %s", what, pending.rank,
                    pending.nranks, comm->device, hex(pending.job).c_str(), pending.store.c_str());
  for (int r = 0; r < pending.nranks && pending.nranks <= 16; ++r) {
    if (r == pending.rank) continue;
    ferry::nccl::info("  rank %d to rank %d: %s", pending.rank, r,
                      rank->context->describe_peer(r).c_str());
  }
  return ncclSuccess;
}

ncclResult_t init_rank(ncclComm_t* out, int nranks, const ncclUniqueId& raw, int rank,
                       const ncclConfig_t* config, const char* what, int device = -2) {
  if (out == nullptr) return fail(ncclInvalidArgument, std::string(what) + ": comm is NULL");
  *out = nullptr;
  if (nranks < 1 || rank < 0 || rank >= nranks) {
    return fail(ncclInvalidArgument, std::string(what) + ": rank " + std::to_string(rank) + " of " +
                                         std::to_string(nranks) + " ranks");
  }
  bool blocking = true;
  if (ncclResult_t r = check_config(config, what, &blocking); r != ncclSuccess) return r;
  ferry::nccl::UniqueId id;
  if (!ferry::nccl::decode(raw, &id)) {
    return fail(ncclInvalidArgument,
                std::string(what) +
                    ": the unique id is not one of ferry's NCCL (made by ncclGetUniqueId of this "
                    "library, and passed to every rank unchanged?)");
  }
  auto* comm = new ncclComm;
  comm->device = device == -2 ? current_device() : device;
  comm->blocking = blocking;
  comm->pending =
      ncclComm::Pending{nranks, rank, id.host + ":" + std::to_string(id.port), id.nonce};
  if (t_group.depth > 0) {
    // Inside a group (one thread making several ranks of a job): made at the group's end, side
    // by side.
    t_group.inits.push_back(comm);
    *out = comm;
    return ncclSuccess;
  }
  if (!blocking) {
    // Made on a thread of its own; ncclCommGetAsyncError says ncclInProgress until it is done.
    comm->initializing.store(true);
    comm->init_thread = std::thread([comm, what] {
      comm->init_result = make_rank(comm, what);
      if (comm->init_result != ncclSuccess) comm->init_error = ferry::nccl::last_error();
      comm->initializing.store(false, std::memory_order_release);
    });
    *out = comm;
    return ncclInProgress;
  }
  if (ncclResult_t r = make_rank(comm, what); r != ncclSuccess) {
    delete comm;
    return r;
  }
  *out = comm;
  return ncclSuccess;
}

// `what` failed: NCCL's result, the message kept for ncclGetLastError.
ncclResult_t failed(const char* what, const Status& status) {
  return fail(Status(status.code(), std::string(what) + ": " + status.message()));
}

// A communicator that was made (not one whose init waits for its group's end, or failed there).
ncclResult_t made(const char* what, const ncclComm* comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(what) + ": comm is NULL");
  if (comm->initializing.load(std::memory_order_acquire)) {
    return fail(ncclInProgress, std::string(what) +
                                    ": the communicator is still being made (a non-blocking "
                                    "init: ncclCommGetAsyncError says when it is ready)");
  }
  if (comm->pending || comm->owner == nullptr) {
    return fail(ncclInvalidUsage, std::string(what) +
                                      ": the communicator is not made yet (its ncclCommInitRank "
                                      "was in a group that has not ended) or its init failed");
  }
  return ncclSuccess;
}

// An operation on a communicator whose non-blocking init still runs waits for it.
ncclResult_t usable(const char* what, ncclComm_t comm) {
  if (comm != nullptr) settle(comm);
  return made(what, comm);
}

// What NCCL_DEBUG_SUBSYS=COLL prints of a call besides its name.
struct Traced {
  std::size_t count;
  cudaStream_t stream;
};

// The checks every operation shares; then `call` with ferry's type, now or (inside a group) at
// the group's end. `call` keeps copies of what it needs.
template <typename Call>
ncclResult_t operation(const char* what, Traced traced, ncclComm_t comm, ncclDataType_t type,
                       Call call) {
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(what) + ": comm is NULL");
  ferry::DataType ferry_type{};
  if (ncclResult_t r = ferry::nccl::to_ferry(type, &ferry_type); r != ncclSuccess) return r;
  if (ncclResult_t r = usable(what, comm); r != ncclSuccess) return r;
  if (ferry::nccl::tracing_calls()) {
    ferry::nccl::info("%s: comm %p rank %d of %d, count %zu, type %d, stream %p%s", what,
                      static_cast<void*>(comm), comm->comm.rank(), comm->comm.size(), traced.count,
                      static_cast<int>(type), static_cast<void*>(traced.stream),
                      t_group.depth > 0 ? ", in a group" : "");
  }
  auto run = [call, ferry_type](Communicator& c, Afterwards* after) {
    if constexpr (std::is_invocable_v<Call, Communicator&, ferry::DataType, Afterwards*>) {
      return call(c, ferry_type, after);
    } else {
      return call(c, ferry_type);
    }
  };
  if (t_group.depth > 0) {
    t_group.operations.push_back({comm, what, run, current_context()});
    return ncclSuccess;
  }
  Afterwards after;
  Status s = run(comm->comm, &after);
  if (s.is_ok() && after) s = after();
  return s.is_ok() ? ncclSuccess : failed(what, s);
}

// A reduction: operation() with NCCL's op as ferry runs it (ncclAvg and pre-multiplied sums: the
// scaling around ferry's sum, Reduction).
template <typename Call>
ncclResult_t reduction(const char* what, Traced traced, ncclComm_t comm, ncclDataType_t type,
                       ncclRedOp_t op, Call call) {
  if (comm == nullptr) return fail(ncclInvalidArgument, std::string(what) + ": comm is NULL");
  ferry::DataType checked{};
  if (ncclResult_t r = ferry::nccl::to_ferry(type, &checked); r != ncclSuccess) return r;
  if (ncclResult_t r = usable(what, comm); r != ncclSuccess) return r;
  ferry::nccl::Reduction how;
  if (ncclResult_t r = ferry::nccl::to_ferry(op, type, *comm, &how); r != ncclSuccess) {
    return fail(r, std::string(what) + ": " + ferry::nccl::last_error());
  }
  return operation(what, traced, comm, type,
                   [call, how](Communicator& c, ferry::DataType t, Afterwards* after) {
                     return call(c, t, how, after);
                   });
}

// A registration or window handle goes (it was made by `new char`).
ncclResult_t forget(std::set<void*>* handles, void* handle, const std::string& what) {
  std::lock_guard guard(process().lock);
  if (handles->erase(handle) == 0) {
    return fail(ncclInvalidArgument, what + " was not registered on this communicator");
  }
  delete static_cast<char*>(handle);
  return ncclSuccess;
}

ferry::CudaStream to_stream(cudaStream_t stream) {
  return reinterpret_cast<ferry::CudaStream>(stream);
}

// A new communicator of `parent`'s rank.
ncclComm_t adopt(ncclComm_t parent, Communicator comm, bool blocking) {
  std::lock_guard guard(process().lock);
  auto* made = new ncclComm;
  made->comm = std::move(comm);
  made->owner = parent->owner;
  made->device = parent->device;
  made->blocking = blocking;
  ++parent->owner->comms;
  return made;
}

}  // namespace

extern "C" {

ncclResult_t pncclGetVersion(int* version) {
  if (version == nullptr) return fail(ncclInvalidArgument, "ncclGetVersion: version is NULL");
  *version = NCCL_VERSION_CODE;
  return ncclSuccess;
}

const char* pncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (ncclGetLastError says which call)";
    case ncclSystemError:
      return "unhandled system error (ncclGetLastError says which call)";
    case ncclInternalError:
      return "internal error - please report this issue to the ferry developers";
    case ncclInvalidArgument:
      return "invalid argument (ncclGetLastError says which)";
    case ncclInvalidUsage:
      return "invalid usage, or not built in ferry's NCCL (ncclGetLastError says which)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* pncclGetLastError(ncclComm_t) { return ferry::nccl::last_error(); }

ncclResult_t pncclGetUniqueId(ncclUniqueId* unique_id) {
  if (unique_id == nullptr) return fail(ncclInvalidArgument, "ncclGetUniqueId: uniqueId is NULL");
  ferry::nccl::UniqueId id;
  if (ncclResult_t r = ferry::nccl::make_unique_id(&id); r != ncclSuccess) return r;
  ferry::nccl::encode(id, unique_id);
  ferry::nccl::info("unique id: store at %s:%d, job %s", id.host.c_str(), id.port,
                    hex(id.nonce).c_str());
  return ncclSuccess;
}

ncclResult_t pncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank,
                                     ncclConfig_t* config) {
  return init_rank(comm, nranks, comm_id, rank, config, "ncclCommInitRankConfig");
}

ncclResult_t pncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId comm_id, int rank) {
  return init_rank(comm, nranks, comm_id, rank, nullptr, "ncclCommInitRank");
}

ncclResult_t pncclCommInitRankScalable(ncclComm_t* comm, int nranks, int rank, int id_count,
                                       ncclUniqueId* ids, ncclConfig_t* config) {
  if (id_count < 1 || ids == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommInitRankScalable: no unique id given");
  }
  // Every id names the same job's store when ncclGetUniqueId made them in one process; the first
  // is enough for ferry's store, which serves any number of ranks.
  return init_rank(comm, nranks, ids[0], rank, config, "ncclCommInitRankScalable");
}

ncclResult_t pncclCommInitAll(ncclComm_t* comms, int ndev, const int* devlist) {
  if (comms == nullptr || ndev < 1) {
    return fail(ncclInvalidArgument, "ncclCommInitAll: no communicators asked for");
  }
  ncclUniqueId id;
  if (ncclResult_t r = pncclGetUniqueId(&id); r != ncclSuccess) return r;
  // ndev ranks of one job in this process, made side by side (each waits for the others).
  std::vector<ncclResult_t> results(static_cast<std::size_t>(ndev), ncclSuccess);
  std::vector<std::string> errors(static_cast<std::size_t>(ndev));
  side_by_side(static_cast<std::size_t>(ndev), [&](std::size_t i) {
    const int device = devlist != nullptr ? devlist[i] : static_cast<int>(i);
    results[i] =
        init_rank(&comms[i], ndev, id, static_cast<int>(i), nullptr, "ncclCommInitAll", device);
    errors[i] = ferry::nccl::last_error();
  });
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i] == ncclSuccess) continue;
    for (std::size_t j = 0; j < results.size(); ++j) {
      if (comms[j] != nullptr) release(comms[j]);
      comms[j] = nullptr;
    }
    return fail(results[i], errors[i]);
  }
  return ncclSuccess;
}

ncclResult_t pncclCommFinalize(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommFinalize: comm is NULL");
  // Stream operations complete on their streams by themselves (ferry's thread or kernels): there
  // is nothing of the communicator's left to flush.
  return ncclSuccess;
}

ncclResult_t pncclCommDestroy(ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommDestroy: comm is NULL");
  release(comm);
  return ncclSuccess;
}

ncclResult_t pncclCommAbort(ncclComm_t comm) {
  if (comm == nullptr) return ncclSuccess;  // as NCCL: aborting nothing is no error
  settle(comm);
  // Operations of the communicator that wait, here or on any member, fail at once (kRevoked).
  if (comm->owner != nullptr && !comm->pending) static_cast<void>(comm->comm.revoke());
  release(comm);
  return ncclSuccess;
}

ncclResult_t pncclCommRevoke(ncclComm_t comm, int flags) {
  if (ncclResult_t r = usable("ncclCommRevoke", comm); r != ncclSuccess) return r;
  if (flags != NCCL_REVOKE_DEFAULT) {
    return fail(ncclInvalidArgument, "ncclCommRevoke: revokeFlags must be NCCL_REVOKE_DEFAULT");
  }
  Status s = comm->comm.revoke();
  comm->revoked.store(true);
  return s.is_ok() ? ncclSuccess : failed("ncclCommRevoke", s);
}

ncclResult_t pncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                            ncclConfig_t* config) {
  if (comm == nullptr || newcomm == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommSplit: comm or newcomm is NULL");
  }
  if (ncclResult_t r = usable("ncclCommSplit", comm); r != ncclSuccess) return r;
  *newcomm = nullptr;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) {
    return fail(ncclInvalidArgument, "ncclCommSplit: color " + std::to_string(color) +
                                         " (a color is >= 0, or NCCL_SPLIT_NOCOLOR)");
  }
  bool blocking = comm->blocking;
  if (ncclResult_t r = check_config(config, "ncclCommSplit", &blocking); r != ncclSuccess) return r;
  Communicator part;
  try {
    part = comm->comm.split(color == NCCL_SPLIT_NOCOLOR ? Communicator::kUndefined : color, key);
  } catch (const ferry::Error& e) {
    return failed("ncclCommSplit", Status(e.code(), e.what()));
  }
  if (!part.valid()) return ncclSuccess;  // NCCL_SPLIT_NOCOLOR: no communicator
  *newcomm = adopt(comm, std::move(part), blocking);
  return ncclSuccess;
}

ncclResult_t pncclCommShrink(ncclComm_t comm, int* exclude, int exclude_count, ncclComm_t* newcomm,
                             ncclConfig_t* config, int flags) {
  if (comm == nullptr || newcomm == nullptr || exclude_count < 0 ||
      (exclude_count > 0 && exclude == nullptr)) {
    return fail(ncclInvalidArgument,
                "ncclCommShrink: comm or newcomm is NULL, or the exclude list is not");
  }
  *newcomm = nullptr;
  if (ncclResult_t r = usable("ncclCommShrink", comm); r != ncclSuccess) return r;
  if (flags != NCCL_SHRINK_DEFAULT && flags != NCCL_SHRINK_ABORT) {
    return fail(ncclInvalidArgument, "ncclCommShrink: shrinkFlags " + std::to_string(flags));
  }
  bool blocking = comm->blocking;
  if (ncclResult_t r = check_config(config, "ncclCommShrink", &blocking); r != ncclSuccess) {
    return r;
  }
  const int size = comm->comm.size();
  std::vector<int> excluded(exclude, exclude + exclude_count);
  for (int r : excluded) {
    if (r < 0 || r >= size || r == comm->comm.rank()) {
      return fail(ncclInvalidArgument,
                  "ncclCommShrink: excluded rank " + std::to_string(r) +
                      (r == comm->comm.rank() ? " is the caller" : " is out of range"));
    }
  }
  if (flags == NCCL_SHRINK_ABORT) static_cast<void>(comm->comm.revoke());
  // ferry's shrink keeps every member that is alive, agreed by them all: the excluded ranks must
  // be dead (NCCL's case of ranks that failed). A death is seen within milliseconds on a node and
  // within FERRY_KEEPALIVE across nodes: wait up to a second for those not yet seen.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  std::vector<int> alive;
  for (;;) {
    static_cast<void>(comm->comm.revoked());  // one progress: deaths are learned
    const std::vector<int> failed_ranks = comm->comm.failed_ranks();
    alive.clear();
    for (int r : excluded) {
      if (std::find(failed_ranks.begin(), failed_ranks.end(), r) == failed_ranks.end()) {
        alive.push_back(r);
      }
    }
    if (alive.empty() || std::chrono::steady_clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  if (!alive.empty()) {
    std::string names;
    for (int r : alive) names += (names.empty() ? "" : ", ") + std::to_string(r);
    return fail(ncclInvalidUsage,
                "ncclCommShrink: rank(s) " + names +
                    " are excluded but alive; ferry's NCCL shrinks to the ranks that are alive, "
                    "and leaving out live ones is not built yet (ncclCommSplit with "
                    "NCCL_SPLIT_NOCOLOR on those does it)");
  }
  Communicator survivors;
  try {
    survivors = comm->comm.shrink();
  } catch (const ferry::Error& e) {
    return failed("ncclCommShrink", Status(e.code(), e.what()));
  }
  ferry::nccl::info("ncclCommShrink: %d of %d ranks go on", survivors.size(), size);
  *newcomm = adopt(comm, std::move(survivors), blocking);
  return ncclSuccess;
}

ncclResult_t pncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  if (comm == nullptr || async_error == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommGetAsyncError: comm or asyncError is NULL");
  }
  if (comm->initializing.load(std::memory_order_acquire)) {
    *async_error = ncclInProgress;
    return ncclSuccess;
  }
  settle(comm);  // a non-blocking init that has ended
  if (comm->pending || comm->owner == nullptr) {
    *async_error = comm->pending ? ncclInProgress : comm->init_result;
    // The init's error becomes this thread's last (it was the init thread's).
    if (!comm->pending && comm->init_result != ncclSuccess && !comm->init_error.empty()) {
      static_cast<void>(fail(comm->init_result, comm->init_error));
    }
    return ncclSuccess;
  }
  // Polled often (PyTorch's watchdog thread, every few milliseconds): it reads flags and never
  // takes the engine's lock to drive it, which the threads that wait do.
  Status s = comm->comm.async_error();
  if (s.is_ok() && comm->revoked.load()) {
    s = Status(ferry::Code::kRevoked, "the communicator was revoked");
  }
  // Polled: the error is logged and made the last one once, not at every poll.
  *async_error =
      ferry::nccl::report(s.is_ok() ? s : Status(s.code(), "a stream operation: " + s.message()));
  return ncclSuccess;
}

ncclResult_t pncclCommCount(const ncclComm_t comm, int* count) {
  if (count == nullptr) return fail(ncclInvalidArgument, "ncclCommCount: count is NULL");
  if (ncclResult_t r = made("ncclCommCount", comm); r != ncclSuccess) return r;
  *count = comm->comm.size();
  return ncclSuccess;
}

ncclResult_t pncclCommCuDevice(const ncclComm_t comm, int* device) {
  if (comm == nullptr || device == nullptr) {
    return fail(ncclInvalidArgument, "ncclCommCuDevice: comm or device is NULL");
  }
  *device = comm->device;
  return ncclSuccess;
}

ncclResult_t pncclCommUserRank(const ncclComm_t comm, int* rank) {
  if (rank == nullptr) return fail(ncclInvalidArgument, "ncclCommUserRank: rank is NULL");
  if (ncclResult_t r = made("ncclCommUserRank", comm); r != ncclSuccess) return r;
  *rank = comm->comm.rank();
  return ncclSuccess;
}

// Registration is a hint in NCCL; ferry maps a peer's buffers itself (and keeps them mapped for
// graphs), so a handle only has to be told apart from others.
ncclResult_t pncclCommRegister(const ncclComm_t comm, void* buffer, size_t size, void** handle) {
  if (comm == nullptr || handle == nullptr || (buffer == nullptr && size > 0)) {
    return fail(ncclInvalidArgument, "ncclCommRegister: comm, buff or handle is NULL");
  }
  std::lock_guard guard(process().lock);
  *handle = new char;
  comm->registrations.insert(*handle);
  return ncclSuccess;
}

ncclResult_t pncclCommDeregister(const ncclComm_t comm, void* handle) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommDeregister: comm is NULL");
  return forget(&comm->registrations, handle, "ncclCommDeregister: the handle");
}

ncclResult_t pncclCommWindowRegister(ncclComm_t comm, void* buffer, size_t size,
                                     ncclWindow_t* window, int flags) {
  if (comm == nullptr || window == nullptr || (buffer == nullptr && size > 0)) {
    return fail(ncclInvalidArgument, "ncclCommWindowRegister: comm, buff or win is NULL");
  }
  if ((flags & ~NCCL_WIN_COLL_SYMMETRIC) != 0) {
    return fail(ncclInvalidArgument, "ncclCommWindowRegister: winFlags " + std::to_string(flags));
  }
  std::lock_guard guard(process().lock);
  void* token = new char;
  comm->windows.insert(token);
  *window = static_cast<ncclWindow_t>(token);
  return ncclSuccess;
}

ncclResult_t pncclCommWindowDeregister(ncclComm_t comm, ncclWindow_t window) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclCommWindowDeregister: comm is NULL");
  return forget(&comm->windows, window, "ncclCommWindowDeregister: the window");
}

ncclResult_t pncclMemAlloc(void** pointer, size_t size) {
  if (pointer == nullptr) return fail(ncclInvalidArgument, "ncclMemAlloc: ptr is NULL");
  *pointer = nullptr;
  if (size == 0) return ncclSuccess;
  std::string why;
  const ferry::cuda::Driver* d = ferry::cuda::driver(&why);
  if (d == nullptr) return fail(ncclUnhandledCudaError, "ncclMemAlloc: no CUDA driver: " + why);
  CUcontext context = nullptr;
  if (d->cuCtxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr) {
    return fail(ncclInvalidUsage, "ncclMemAlloc: no CUDA context is current (cudaSetDevice first)");
  }
  CUdeviceptr memory = 0;
  if (CUresult r = d->cuMemAlloc(&memory, size); r != CUDA_SUCCESS) {
    return fail(ncclUnhandledCudaError, "ncclMemAlloc: cuMemAlloc of " + std::to_string(size) +
                                            " bytes: " + ferry::cuda::error_string(r));
  }
  *pointer = reinterpret_cast<void*>(memory);
  return ncclSuccess;
}

ncclResult_t pncclMemFree(void* pointer) {
  if (pointer == nullptr) return ncclSuccess;
  const ferry::cuda::Driver* d = ferry::cuda::driver();
  if (d == nullptr) return fail(ncclInvalidArgument, "ncclMemFree: no CUDA driver");
  if (CUresult r = d->cuMemFree(reinterpret_cast<CUdeviceptr>(pointer)); r != CUDA_SUCCESS) {
    return fail(ncclInvalidArgument, "ncclMemFree: " + ferry::cuda::error_string(r));
  }
  return ncclSuccess;
}

ncclResult_t pncclRedOpCreatePreMulSum(ncclRedOp_t* op, void* scalar, ncclDataType_t type,
                                       ncclScalarResidence_t residence, ncclComm_t comm) {
  const char* what = "ncclRedOpCreatePreMulSum";
  if (op == nullptr || scalar == nullptr) {
    return fail(ncclInvalidArgument, std::string(what) + ": op or scalar is NULL");
  }
  if (ncclResult_t r = usable(what, comm); r != ncclSuccess) return r;
  ferry::DataType t{};
  if (ncclResult_t r = ferry::nccl::to_ferry(type, &t); r != ncclSuccess) return r;
  if (type == ncclFloat8e4m3 || type == ncclFloat8e5m2) {
    return fail(ncclInvalidUsage, std::string(what) +
                                      ": reductions of the 8-bit float types are not built in "
                                      "ferry's NCCL yet");
  }
  ferry::nccl::PreMulSum made{type, nullptr, 0};
  if (residence == ncclScalarHostImmediate) {
    std::memcpy(&made.bits, scalar, ferry::size_of(t));
  } else if (residence == ncclScalarDevice) {
    made.device = scalar;
  } else {
    return fail(ncclInvalidArgument, std::string(what) + ": residence " +
                                         std::to_string(static_cast<int>(residence)) +
                                         " is no ncclScalarResidence_t");
  }
  std::lock_guard guard(process().lock);
  int value = ncclNumOps;  // the lowest free one
  while (comm->premul_sums.count(value) != 0) ++value;
  comm->premul_sums.emplace(value, made);
  *op = static_cast<ncclRedOp_t>(value);
  return ncclSuccess;
}

ncclResult_t pncclRedOpDestroy(ncclRedOp_t op, ncclComm_t comm) {
  if (comm == nullptr) return fail(ncclInvalidArgument, "ncclRedOpDestroy: comm is NULL");
  std::lock_guard guard(process().lock);
  if (comm->premul_sums.erase(static_cast<int>(op)) == 1) return ncclSuccess;
  return fail(ncclInvalidArgument,
              "ncclRedOpDestroy: reduction " + std::to_string(static_cast<int>(op)) +
                  (op < ncclNumOps ? " is built in"
                                   : " was not made by ncclRedOpCreatePreMulSum on this "
                                     "communicator (or was destroyed)"));
}

ncclResult_t pncclReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                         ncclRedOp_t op, int root, ncclComm_t comm, cudaStream_t stream) {
  return reduction(
      "ncclReduce", {count, stream}, comm, type, op,
      [=](Communicator& c, ferry::DataType t, const ferry::nccl::Reduction& how,
          Afterwards* after) {
        const bool root_here = c.rank() == root;
        const void* in = send;
        if (how.pre_multiply && count > 0) {
          // Scaled into the root's receive buffer, elsewhere into scratch memory.
          void* scaled = recv;
          if (!root_here || recv == nullptr) {
            if (Status s = scratch_for(comm, stream, count * ferry::size_of(t), &scaled); !s) {
              return s;
            }
          }
          if (Status s = scale_on(comm, stream, scaled, send, count, t, how.scale); !s) return s;
          in = scaled;
        }
        Status s = c.reduce(in, recv, count, t, how.op, root, to_stream(stream));
        if (s.is_ok() && how.post_divide && root_here && count > 0) {
          *after = [=] { return scale_on(comm, stream, recv, recv, count, t, how.scale); };
        }
        return s;
      });
}

ncclResult_t pncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t type,
                            int root, ncclComm_t comm, cudaStream_t stream) {
  return operation(
      "ncclBroadcast", {count, stream}, comm, type, [=](Communicator& c, ferry::DataType t) {
        // ferry's broadcast is in place: the root's data goes into its receive buffer first, on the
        // same stream, so the broadcast (enqueued after it, also in a group) sends it from there.
        if (c.rank() == root && send != recv && count > 0) {
          ferry::cuda::Cuda* gpu = nullptr;
          if (Status s = gpu_of(comm, &gpu); !s) return s;
          if (Status s = gpu->copy_on_stream(reinterpret_cast<void*>(stream), device_of(comm), recv,
                                             send, count * ferry::size_of(t));
              !s) {
            return s;
          }
        }
        return c.broadcast(recv, count, t, root, to_stream(stream));
      });
}

ncclResult_t pncclBcast(void* buffer, size_t count, ncclDataType_t type, int root, ncclComm_t comm,
                        cudaStream_t stream) {
  return operation("ncclBcast", {count, stream}, comm, type,
                   [=](Communicator& c, ferry::DataType t) {
                     return c.broadcast(buffer, count, t, root, to_stream(stream));
                   });
}

ncclResult_t pncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t type,
                            ncclRedOp_t op, ncclComm_t comm, cudaStream_t stream) {
  return reduction("ncclAllReduce", {count, stream}, comm, type, op,
                   [=](Communicator& c, ferry::DataType t, const ferry::nccl::Reduction& how,
                       Afterwards* after) {
                     const void* in = send;
                     if (how.pre_multiply && count > 0) {
                       // Scaled into the receive buffer, then reduced there in place.
                       if (Status s = scale_on(comm, stream, recv, send, count, t, how.scale); !s)
                         return s;
                       in = recv;
                     }
                     Status s = c.allreduce(in, recv, count, t, how.op, to_stream(stream));
                     if (s.is_ok() && how.post_divide && count > 0) {
                       *after = [=] {
                         return scale_on(comm, stream, recv, recv, count, t, how.scale);
                       };
                     }
                     return s;
                   });
}

ncclResult_t pncclReduceScatter(const void* send, void* recv, size_t recv_count,
                                ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                                cudaStream_t stream) {
  return reduction(
      "ncclReduceScatter", {recv_count, stream}, comm, type, op,
      [=](Communicator& c, ferry::DataType t, const ferry::nccl::Reduction& how,
          Afterwards* after) {
        const void* in = send;
        if (how.pre_multiply && recv_count > 0) {
          // Every member's blocks, scaled into scratch memory.
          const std::size_t count = recv_count * static_cast<std::size_t>(c.size());
          void* scaled = nullptr;
          if (Status s = scratch_for(comm, stream, count * ferry::size_of(t), &scaled); !s) {
            return s;
          }
          if (Status s = scale_on(comm, stream, scaled, send, count, t, how.scale); !s) return s;
          in = scaled;
        }
        Status s = c.reduce_scatter(in, recv, recv_count, t, how.op, to_stream(stream));
        if (s.is_ok() && how.post_divide && recv_count > 0) {
          *after = [=] { return scale_on(comm, stream, recv, recv, recv_count, t, how.scale); };
        }
        return s;
      });
}

ncclResult_t pncclAllGather(const void* send, void* recv, size_t send_count, ncclDataType_t type,
                            ncclComm_t comm, cudaStream_t stream) {
  return operation("ncclAllGather", {send_count, stream}, comm, type,
                   [=](Communicator& c, ferry::DataType t) {
                     return c.allgather(send, recv, send_count, t, to_stream(stream));
                   });
}

ncclResult_t pncclAlltoAll(const void* send, void* recv, size_t count, ncclDataType_t type,
                           ncclComm_t comm, cudaStream_t stream) {
  return operation("ncclAlltoAll", {count, stream}, comm, type,
                   [=](Communicator& c, ferry::DataType t) {
                     return c.alltoall(send, recv, count, t, to_stream(stream));
                   });
}

ncclResult_t pncclGather(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                         ncclComm_t comm, cudaStream_t stream) {
  return operation("ncclGather", {count, stream}, comm, type,
                   [=](Communicator& c, ferry::DataType t) {
                     return c.gather(send, recv, count, t, root, to_stream(stream));
                   });
}

ncclResult_t pncclScatter(const void* send, void* recv, size_t count, ncclDataType_t type, int root,
                          ncclComm_t comm, cudaStream_t stream) {
  return operation("ncclScatter", {count, stream}, comm, type,
                   [=](Communicator& c, ferry::DataType t) {
                     return c.scatter(send, recv, count, t, root, to_stream(stream));
                   });
}

ncclResult_t pncclSend(const void* send, size_t count, ncclDataType_t type, int peer,
                       ncclComm_t comm, cudaStream_t stream) {
  return operation("ncclSend", {count, stream}, comm, type,
                   [=](Communicator& c, ferry::DataType t) {
                     return c.send(send, count * ferry::size_of(t), peer, to_stream(stream));
                   });
}

ncclResult_t pncclRecv(void* recv, size_t count, ncclDataType_t type, int peer, ncclComm_t comm,
                       cudaStream_t stream) {
  return operation("ncclRecv", {count, stream}, comm, type,
                   [=](Communicator& c, ferry::DataType t) {
                     return c.recv(recv, count * ferry::size_of(t), peer, to_stream(stream));
                   });
}

// Groups are the calling thread's, as NCCL's. The first operation on a rank inside a group tells
// its Context (ferry's groups are the Context's); the outermost end makes the inits it deferred,
// then ends the Contexts' groups, side by side where there are several (a thread driving several
// ranks of a job: their first collectives wait for each other).
ncclResult_t pncclGroupStart() {
  ++t_group.depth;
  return ncclSuccess;
}

ncclResult_t pncclGroupEnd() {
  if (t_group.depth == 0) {
    return fail(ncclInvalidUsage, "ncclGroupEnd: no group was started (ncclGroupStart)");
  }
  if (--t_group.depth > 0) return ncclSuccess;
  ThreadGroup group = std::move(t_group);
  t_group = ThreadGroup{};
  if (ferry::nccl::tracing_calls()) {
    ferry::nccl::info("ncclGroupEnd: %zu operations, %zu inits", group.operations.size(),
                      group.inits.size());
  }
  std::vector<ncclResult_t> results(group.inits.size(), ncclSuccess);
  std::vector<std::string> errors(group.inits.size());
  side_by_side(group.inits.size(), [&](std::size_t i) {
    results[i] = make_rank(group.inits[i], "ncclCommInitRank");
    group.inits[i]->init_result = results[i];
    errors[i] = ferry::nccl::last_error();
  });
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i] != ncclSuccess) return fail(results[i], errors[i]);
  }
  // Each rank's operations, in the order they were made, inside a group of its Context.
  std::vector<Rank*> ranks;
  for (const Deferred& op : group.operations) {
    if (std::find(ranks.begin(), ranks.end(), op.comm->owner) == ranks.end()) {
      ranks.push_back(op.comm->owner);
    }
  }
  results.assign(ranks.size(), ncclSuccess);
  errors.assign(ranks.size(), std::string());
  const bool threads = ranks.size() > 1;
  const CUcontext caller = threads ? current_context() : nullptr;
  auto run = [&](std::size_t i) {
    ferry::Context& context = *ranks[i]->context;
    CUcontext now = i == 0 ? caller : nullptr;
    context.group_start();
    std::vector<std::pair<const char*, Afterwards>> afters;  // enqueued after the group's end
    for (Deferred& op : group.operations) {
      if (op.comm->owner != ranks[i]) continue;
      if (threads && op.context != nullptr && op.context != now) {
        ferry::cuda::driver()->cuCtxSetCurrent(op.context);  // as the thread that made it
        now = op.context;
      }
      Afterwards after;
      Status s = op.call(op.comm->comm, &after);
      if (!s.is_ok() && results[i] == ncclSuccess) {
        results[i] = failed(op.what, s);
        errors[i] = ferry::nccl::last_error();
      }
      if (s.is_ok() && after) afters.emplace_back(op.what, std::move(after));
    }
    Status s = context.group_end();
    if (!s.is_ok() && results[i] == ncclSuccess) {
      results[i] = failed("ncclGroupEnd", s);
      errors[i] = ferry::nccl::last_error();
    }
    for (auto& [what, after] : afters) {
      if (!s.is_ok()) break;
      if (Status a = after(); !a.is_ok() && results[i] == ncclSuccess) {
        results[i] = failed(what, a);
        errors[i] = ferry::nccl::last_error();
      }
    }
  };
  // The first rank's part here, the others' on their workers, side by side.
  for (std::size_t i = 1; i < ranks.size(); ++i) {
    if (!ranks[i]->worker) ranks[i]->worker = std::make_unique<ferry::nccl::Worker>();
    ranks[i]->worker->post([&run, i] { run(i); });
  }
  if (!ranks.empty()) run(0);
  if (threads && caller != current_context()) ferry::cuda::driver()->cuCtxSetCurrent(caller);
  for (std::size_t i = 1; i < ranks.size(); ++i) ranks[i]->worker->wait();
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (results[i] != ncclSuccess) return fail(results[i], errors[i]);
  }
  return ncclSuccess;
}

ncclResult_t pncclGroupSimulateEnd(ncclSimInfo_t* info) {
  if (info == nullptr || info->magic != kSimInfoMagic) {
    return fail(ncclInvalidArgument,
                "ncclGroupSimulateEnd: simInfo was not set up with NCCL_SIM_INFO_INITIALIZER");
  }
  return fail(ncclInvalidUsage,
              "ncclGroupSimulateEnd: ferry's NCCL has no cost model to simulate a group with; "
              "the group is still open");
}

// nccl_device.h's host calls (the device API: symmetric kernels written against NCCL's device
// headers). Their types are pointers here: the ABI is the same.
ncclResult_t pncclDevCommCreate(ncclComm_t, const void*, void*) {
  return fail(ncclInvalidUsage,
              "ncclDevCommCreate: NCCL's device API is not built in ferry's NCCL");
}
ncclResult_t pncclDevCommDestroy(ncclComm_t, const void*) {
  return fail(ncclInvalidUsage,
              "ncclDevCommDestroy: NCCL's device API is not built in ferry's NCCL");
}

void pncclResetDebugInit() { ferry::nccl::reread_debug(); }
void ncclResetDebugInit() __attribute__((alias("pncclResetDebugInit")));

// NCCL's names for the same functions (pnccl… stay for profilers that wrap them).
#define FERRY_NCCL_ALIAS(name) decltype(p##name) name __attribute__((alias("p" #name)));
FERRY_NCCL_ALIAS(ncclGetVersion)
FERRY_NCCL_ALIAS(ncclGetErrorString)
FERRY_NCCL_ALIAS(ncclGetLastError)
FERRY_NCCL_ALIAS(ncclGetUniqueId)
FERRY_NCCL_ALIAS(ncclCommInitRankConfig)
FERRY_NCCL_ALIAS(ncclCommInitRank)
FERRY_NCCL_ALIAS(ncclCommInitRankScalable)
FERRY_NCCL_ALIAS(ncclCommInitAll)
FERRY_NCCL_ALIAS(ncclCommFinalize)
FERRY_NCCL_ALIAS(ncclCommDestroy)
FERRY_NCCL_ALIAS(ncclCommAbort)
FERRY_NCCL_ALIAS(ncclCommRevoke)
FERRY_NCCL_ALIAS(ncclCommSplit)
FERRY_NCCL_ALIAS(ncclCommShrink)
FERRY_NCCL_ALIAS(ncclCommGetAsyncError)
FERRY_NCCL_ALIAS(ncclCommCount)
FERRY_NCCL_ALIAS(ncclCommCuDevice)
FERRY_NCCL_ALIAS(ncclCommUserRank)
FERRY_NCCL_ALIAS(ncclCommRegister)
FERRY_NCCL_ALIAS(ncclCommDeregister)
FERRY_NCCL_ALIAS(ncclCommWindowRegister)
FERRY_NCCL_ALIAS(ncclCommWindowDeregister)
FERRY_NCCL_ALIAS(ncclMemAlloc)
FERRY_NCCL_ALIAS(ncclMemFree)
FERRY_NCCL_ALIAS(ncclRedOpCreatePreMulSum)
FERRY_NCCL_ALIAS(ncclRedOpDestroy)
FERRY_NCCL_ALIAS(ncclReduce)
FERRY_NCCL_ALIAS(ncclBcast)
FERRY_NCCL_ALIAS(ncclBroadcast)
FERRY_NCCL_ALIAS(ncclAllReduce)
FERRY_NCCL_ALIAS(ncclReduceScatter)
FERRY_NCCL_ALIAS(ncclAllGather)
FERRY_NCCL_ALIAS(ncclAlltoAll)
FERRY_NCCL_ALIAS(ncclGather)
FERRY_NCCL_ALIAS(ncclScatter)
FERRY_NCCL_ALIAS(ncclSend)
FERRY_NCCL_ALIAS(ncclRecv)
FERRY_NCCL_ALIAS(ncclGroupStart)
FERRY_NCCL_ALIAS(ncclGroupEnd)
FERRY_NCCL_ALIAS(ncclGroupSimulateEnd)
FERRY_NCCL_ALIAS(ncclDevCommCreate)
FERRY_NCCL_ALIAS(ncclDevCommDestroy)
#undef FERRY_NCCL_ALIAS

}  // extern "C"
