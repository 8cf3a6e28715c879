// MPI on ferry: groups, and one-sided windows on ferry's registered memory (Context::iput, iget,
// iatomic, flush). Each member registers its window memory and allocates a small control region
// of two words (its lock word, and the word that serialises accumulates into its window); the
// members exchange the keys of both by an allgather when the window is made.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mpi/runtime.hpp"

using namespace ferry::mpi;  // NOLINT(google-build-using-namespace): the C functions below

namespace {

// A lock word: bits 0-31 count the shared holders (and shared lockers that are backing off), bit
// 62 says an exclusive holder has it, and bits 32-61 name that holder (its member number + 1), so
// that a waiter can tell whether the holder died.
constexpr std::uint64_t kExclusive = std::uint64_t{1} << 62;
constexpr int kHolderShift = 32;
constexpr std::uint64_t kHolderMask = (std::uint64_t{1} << 30) - 1;
constexpr std::uint64_t kLockWord = 0;  // offsets in the control region
constexpr std::uint64_t kAccumulateWord = 8;
constexpr std::size_t kKeySlot = 240;  // bytes per member in the key exchange

struct Window {
  MPI_Comm comm = MPI_COMM_NULL;
  ferry::MemoryRegion memory;   // this member's window (none when its size is 0)
  ferry::MemoryRegion control;  // its lock and accumulate words
  void* base = nullptr;
  std::size_t size = 0;
  bool allocated = false;                  // MPI_Win_allocate: the memory is the region's
  std::vector<ferry::RemoteKey> keys;      // by member; invalid for a size-0 window
  std::vector<ferry::RemoteKey> controls;  // by member
  std::vector<int> disp_units;             // by member
  std::vector<std::size_t> sizes;          // by member
  std::vector<int> locks;                  // by member: 0, MPI_LOCK_SHARED or MPI_LOCK_EXCLUSIVE
  std::vector<int> post_group;             // PSCW: the origins this target exposed to
  std::vector<int> start_group;            // PSCW: the targets this origin accesses
  bool live = false;
};

struct Group {
  std::vector<int> world;  // world ranks, in group order
  bool live = false;
};

std::vector<Window>& windows() {
  static std::vector<Window> all(1);  // MPI_WIN_NULL
  return all;
}

std::vector<Group>& groups() {
  static std::vector<Group> all(2);  // MPI_GROUP_NULL, MPI_GROUP_EMPTY
  all[1].live = true;
  return all;
}

Window* window(MPI_Win handle) {
  auto& all = windows();
  if (handle <= 0 || static_cast<std::size_t>(handle) >= all.size()) return nullptr;
  return all[static_cast<std::size_t>(handle)].live ? &all[static_cast<std::size_t>(handle)]
                                                    : nullptr;
}

Group* group(MPI_Group handle) {
  auto& all = groups();
  if (handle <= 0 || static_cast<std::size_t>(handle) >= all.size()) return nullptr;
  return all[static_cast<std::size_t>(handle)].live ? &all[static_cast<std::size_t>(handle)]
                                                    : nullptr;
}

MPI_Group add_group(std::vector<int> world) {
  auto& all = groups();
  all.push_back({std::move(world), true});
  return static_cast<MPI_Group>(all.size() - 1);
}

int bad_window(const char* what, MPI_Win handle) {
  return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_WIN,
                             std::string(what) + ": " + std::to_string(handle) +
                                 " is not a window (MPI_WIN_NULL, freed, or never made)");
}

int fail(const Window& w, const char* what, const ferry::Status& s) {
  return Runtime::get().fail(w.comm, what, s);
}

// The window's members are its communicator's; `target` is checked against them.
int check_target(const char* what, const Window& w, int target) {
  const int n = static_cast<int>(w.keys.size());
  if (target >= 0 && target < n) return MPI_SUCCESS;
  return Runtime::get().fail(w.comm, MPI_ERR_RANK,
                             std::string(what) + ": rank " + std::to_string(target) +
                                 " is not a member of the window's group");
}

// Bytes of `count` elements of a contiguous type, or an error.
int contiguous_bytes(const char* what, const Window& w, MPI_Datatype type, int count,
                     std::size_t* bytes, Type** t = nullptr) {
  Type* found = nullptr;
  if (int e = check_type(what, w.comm, type, count, &found)) return e;
  if (!found->contiguous()) {
    return Runtime::get().fail(w.comm, MPI_ERR_UNSUPPORTED_OPERATION,
                               std::string(what) +
                                   ": a non-contiguous datatype is not built for "
                                   "one-sided operations yet");
  }
  *bytes = static_cast<std::size_t>(count) * found->size;
  if (t != nullptr) *t = found;
  return MPI_SUCCESS;
}

// One atomic on a member's control word, waited for.
ferry::Status atomic(const Window& w, int target, std::uint64_t offset, ferry::AtomicOp op,
                     std::uint64_t operand, std::uint64_t* old, std::uint64_t compare = 0) {
  ferry::Request r = Runtime::get().context->iatomic(
      op, 8, w.controls[static_cast<std::size_t>(target)], offset, operand, old, compare);
  return r.wait();
}

// What an exclusive lock by member `me` writes in the word (and takes away again).
std::uint64_t exclusive_by(int me) {
  return kExclusive | static_cast<std::uint64_t>(me + 1) << kHolderShift;
}

// Takes `target`'s word at `offset` as a lock: exclusive (0 -> exclusive_by(me)) or shared (a
// count beside the writer bit). Gives up where the exclusive holder died, or, waiting for shared
// holders (which the word does not name), where any member died.
ferry::Status acquire(const Window& w, int target, std::uint64_t offset, bool exclusive) {
  Runtime& rt = Runtime::get();
  const ferry::Communicator& comm = rt.comm(w.comm)->coll;
  for (int attempt = 0;; ++attempt) {
    std::uint64_t old = 0;
    if (exclusive) {
      if (ferry::Status s = atomic(w, target, offset, ferry::AtomicOp::kCompareSwap,
                                   exclusive_by(comm.rank()), &old, 0);
          !s.is_ok() || old == 0) {
        return s;
      }
    } else {
      if (ferry::Status s = atomic(w, target, offset, ferry::AtomicOp::kAdd, 1, &old);
          !s.is_ok() || (old & kExclusive) == 0) {
        return s;
      }
      if (ferry::Status s =
              atomic(w, target, offset, ferry::AtomicOp::kAdd, ~std::uint64_t{0}, nullptr);
          !s.is_ok()) {
        return s;
      }
    }
    if (attempt > 16) rt.context->progress();
    // A member that died holding the word would never let it go.
    if (attempt % 64 == 63) {
      const std::vector<int> failed = comm.failed_ranks();
      if (failed.empty()) continue;
      if ((old & kExclusive) != 0) {
        const int holder = static_cast<int>(old >> kHolderShift & kHolderMask) - 1;
        if (std::find(failed.begin(), failed.end(), holder) != failed.end()) {
          return ferry::Status(ferry::Code::kPeerFailed,
                               "member " + std::to_string(holder) +
                                   " of the window died holding the exclusive lock on member " +
                                   std::to_string(target));
        }
      } else {
        return ferry::Status(ferry::Code::kPeerFailed,
                             "member " + std::to_string(failed.front()) +
                                 " of the window died, and the lock on member " +
                                 std::to_string(target) +
                                 " has shared holders that may include it (never let go)");
      }
    }
  }
}

// An exclusive holder takes its own bits away (not a swap to 0: a shared locker backing off may
// have its count in the word for a moment, and takes it away after).
ferry::Status release(const Window& w, int target, std::uint64_t offset, bool exclusive) {
  const std::uint64_t mine = exclusive ? exclusive_by(Runtime::get().comm(w.comm)->rank()) : 1;
  return atomic(w, target, offset, ferry::AtomicOp::kAdd, ~mine + 1, nullptr);
}

// out = out (op) in, for `count` elements of T.
template <typename T>
void combine(MPI_Op op, T* out, const T* in, std::size_t count) {
  for (std::size_t i = 0; i < count; ++i) {
    switch (op) {
      case MPI_SUM:
        out[i] = static_cast<T>(out[i] + in[i]);
        break;
      case MPI_PROD:
        out[i] = static_cast<T>(out[i] * in[i]);
        break;
      case MPI_MIN:
        out[i] = std::min(out[i], in[i]);
        break;
      case MPI_MAX:
        out[i] = std::max(out[i], in[i]);
        break;
      case MPI_REPLACE:
        out[i] = in[i];
        break;
      default:
        if constexpr (std::is_integral_v<T>) {
          if (op == MPI_BAND) out[i] = static_cast<T>(out[i] & in[i]);
          if (op == MPI_BOR) out[i] = static_cast<T>(out[i] | in[i]);
          if (op == MPI_BXOR) out[i] = static_cast<T>(out[i] ^ in[i]);
        }
    }
  }
}

// Applies `op` of `count` elements of ferry type `e`; false where not built.
bool apply(MPI_Op op, ferry::DataType e, void* out, const void* in, std::size_t count) {
  if (op == MPI_NO_OP) return true;
  const bool bitwise = op == MPI_BAND || op == MPI_BOR || op == MPI_BXOR;
  const bool known = op == MPI_SUM || op == MPI_PROD || op == MPI_MIN || op == MPI_MAX ||
                     op == MPI_REPLACE || bitwise;
  if (!known) return false;
  switch (e) {
#define FERRY_COMBINE(code, T)                                           \
  case ferry::DataType::code:                                            \
    combine(op, static_cast<T*>(out), static_cast<const T*>(in), count); \
    return true;
    FERRY_COMBINE(kInt8, std::int8_t)
    FERRY_COMBINE(kInt16, std::int16_t)
    FERRY_COMBINE(kInt32, std::int32_t)
    FERRY_COMBINE(kInt64, std::int64_t)
    FERRY_COMBINE(kUint8, std::uint8_t)
    FERRY_COMBINE(kUint16, std::uint16_t)
    FERRY_COMBINE(kUint32, std::uint32_t)
    FERRY_COMBINE(kUint64, std::uint64_t)
#undef FERRY_COMBINE
    case ferry::DataType::kFloat32:
      if (bitwise) return false;
      combine(op, static_cast<float*>(out), static_cast<const float*>(in), count);
      return true;
    case ferry::DataType::kFloat64:
      if (bitwise) return false;
      combine(op, static_cast<double*>(out), static_cast<const double*>(in), count);
      return true;
    default:
      return false;
  }
}

// Accumulate (and get-accumulate): under the target's accumulate word, read the target's
// elements, keep them in `result` (when given), combine the origin's in and write them back.
int accumulate(const char* what, const void* origin, int count, MPI_Datatype type, void* result,
               int target, MPI_Aint disp, MPI_Op op, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window(what, handle);
  if (target == MPI_PROC_NULL) return MPI_SUCCESS;
  if (int e = check_target(what, *w, target)) return e;
  std::size_t bytes = 0;
  Type* t = nullptr;
  if (int e = contiguous_bytes(what, *w, type, count, &bytes, &t)) return e;
  Runtime& rt = Runtime::get();
  if (!t->element) {
    return rt.fail(w->comm, MPI_ERR_TYPE,
                   std::string(what) + ": accumulates of " + t->name + " are not built yet");
  }
  std::vector<std::byte> current(bytes);
  if (!apply(op, *t->element, current.data(), current.data(), 0)) {  // (of nothing: a check)
    return rt.fail(w->comm, MPI_ERR_UNSUPPORTED_OPERATION,
                   std::string(what) + ": operation " + std::to_string(op) +
                       " is not built for accumulates (SUM, PROD, MIN, MAX, BAND, BOR, BXOR, "
                       "REPLACE, NO_OP are)");
  }
  const auto u = static_cast<std::size_t>(target);
  const std::uint64_t offset =
      static_cast<std::uint64_t>(disp) * static_cast<std::uint64_t>(w->disp_units[u]);
  if (ferry::Status s = acquire(*w, target, kAccumulateWord, true); !s.is_ok()) {
    return fail(*w, what, s);
  }
  ferry::Status s = rt.context->iget(current.data(), bytes, w->keys[u], offset).wait();
  if (s.is_ok()) {
    if (result != nullptr) std::memcpy(result, current.data(), bytes);
    if (op != MPI_NO_OP) {
      apply(op, *t->element, current.data(), origin,
            static_cast<std::size_t>(count) * t->element_count);
      s = rt.context->iput(current.data(), bytes, w->keys[u], offset).wait();
    }
  }
  const ferry::Status released = release(*w, target, kAccumulateWord, true);
  return fail(*w, what, s.is_ok() ? released : s);
}

int make_window(const char* what, void* base, MPI_Aint size, int disp_unit, MPI_Comm handle,
                bool allocate, void* baseptr, MPI_Win* out) {
  Comm* comm = nullptr;
  if (int e = check_comm(what, handle, &comm)) return e;
  Runtime& rt = Runtime::get();
  if (size < 0 || disp_unit <= 0) {
    return rt.fail(handle, MPI_ERR_ARG,
                   std::string(what) + ": size " + std::to_string(size) + " and disp_unit " +
                       std::to_string(disp_unit) + " (size >= 0, disp_unit > 0)");
  }
  Window w;
  w.comm = handle;
  w.size = static_cast<std::size_t>(size);
  w.allocated = allocate;
  ferry::Status s;
  if (allocate) {
    s = rt.context->allocate_memory(w.size > 0 ? w.size : 1, &w.memory);
    w.base = w.memory.address();
    *static_cast<void**>(baseptr) = w.base;
  } else if (w.size > 0) {
    w.base = base;
    s = rt.context->register_memory(base, w.size, &w.memory);
  }
  if (s.is_ok()) s = rt.context->allocate_memory(16, &w.control);
  if (!s.is_ok()) return rt.fail(handle, what, s);
  // This member's slot: key lengths, keys, disp_unit and size.
  std::vector<std::byte> mine(kKeySlot);
  const std::vector<std::byte> key =
      w.memory.valid() ? w.memory.remote_key() : std::vector<std::byte>();
  const std::vector<std::byte> control = w.control.remote_key();
  const std::uint32_t header[4] = {
      static_cast<std::uint32_t>(key.size()), static_cast<std::uint32_t>(control.size()),
      static_cast<std::uint32_t>(disp_unit), static_cast<std::uint32_t>(w.size)};
  if (sizeof(header) + key.size() + control.size() > kKeySlot) {
    return rt.fail(handle, MPI_ERR_INTERN, std::string(what) + ": keys larger than expected");
  }
  std::memcpy(mine.data(), header, sizeof(header));
  std::memcpy(mine.data() + sizeof(header), key.data(), key.size());
  std::memcpy(mine.data() + sizeof(header) + key.size(), control.data(), control.size());
  const auto n = static_cast<std::size_t>(comm->size());
  std::vector<std::byte> all(n * kKeySlot);
  if (ferry::Status g =
          comm->coll.allgather(mine.data(), all.data(), kKeySlot, ferry::DataType::kUint8);
      !g.is_ok()) {
    return rt.fail(handle, what, g);
  }
  w.keys.resize(n);
  w.controls.resize(n);
  for (std::size_t m = 0; m < n; ++m) {
    const std::byte* slot = all.data() + m * kKeySlot;
    std::uint32_t h[4];
    std::memcpy(h, slot, sizeof(h));
    w.disp_units.push_back(static_cast<int>(h[2]));
    w.sizes.push_back(h[3]);
    ferry::Status k;
    if (h[0] > 0) {
      k = ferry::RemoteKey::unpack({slot + sizeof(h), h[0]}, &w.keys[m]);
    }
    if (k.is_ok()) k = ferry::RemoteKey::unpack({slot + sizeof(h) + h[0], h[1]}, &w.controls[m]);
    if (!k.is_ok()) return rt.fail(handle, what, k);
  }
  w.locks.assign(n, 0);
  w.live = true;
  windows().push_back(std::move(w));
  *out = static_cast<MPI_Win>(windows().size() - 1);
  return MPI_SUCCESS;
}

// PSCW's notices: a zero-byte message on the window's communicator's internal context.
enum { kPostNotice = 16, kCompleteNotice = 17 };

ferry::Status notify(const Window& w, const std::vector<int>& members, int kind) {
  Runtime& rt = Runtime::get();
  const Comm& comm = *rt.comm(w.comm);
  std::vector<ferry::Request> sent;
  for (int m : members) {
    sent.push_back(rt.context->isend(nullptr, 0, comm.world_of[static_cast<std::size_t>(m)],
                                     Runtime::internal_tag(comm, kind)));
  }
  return ferry::Request::wait_all(sent);
}

ferry::Status await(const Window& w, const std::vector<int>& members, int kind) {
  Runtime& rt = Runtime::get();
  const Comm& comm = *rt.comm(w.comm);
  std::vector<ferry::Request> got;
  for (int m : members) {
    got.push_back(rt.context->irecv(nullptr, 0, comm.world_of[static_cast<std::size_t>(m)],
                                    Runtime::internal_tag(comm, kind)));
  }
  return ferry::Request::wait_all(got);
}

// A group's members as members of the window's communicator.
int members_of(const char* what, const Window& w, MPI_Group handle, std::vector<int>* out) {
  Runtime& rt = Runtime::get();
  const Group* g = group(handle);
  if (g == nullptr) {
    return rt.fail(w.comm, MPI_ERR_GROUP, std::string(what) + ": not a group");
  }
  const Comm& comm = *rt.comm(w.comm);
  out->clear();
  for (int world : g->world) {
    const int m = comm.member_of[static_cast<std::size_t>(world)];
    if (m < 0) {
      return rt.fail(w.comm, MPI_ERR_GROUP,
                     std::string(what) + ": the group names a rank outside the window");
    }
    out->push_back(m);
  }
  return MPI_SUCCESS;
}

}  // namespace

extern "C" {

// ---- Groups ----

int MPI_Comm_group(MPI_Comm handle, MPI_Group* out) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_group", handle, &comm)) return e;
  *out = add_group(comm->world_of);
  return MPI_SUCCESS;
}

int MPI_Group_size(MPI_Group handle, int* size) {
  const Group* g = group(handle);
  if (g == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_GROUP, "MPI_Group_size: not a group");
  }
  *size = static_cast<int>(g->world.size());
  return MPI_SUCCESS;
}

int MPI_Group_rank(MPI_Group handle, int* rank) {
  const Group* g = group(handle);
  if (g == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_GROUP, "MPI_Group_rank: not a group");
  }
  const auto at = std::find(g->world.begin(), g->world.end(), Runtime::get().context->rank());
  *rank = at == g->world.end() ? MPI_UNDEFINED : static_cast<int>(at - g->world.begin());
  return MPI_SUCCESS;
}

int MPI_Group_incl(MPI_Group handle, int n, const int ranks[], MPI_Group* out) {
  const Group* g = group(handle);
  if (g == nullptr || n < 0) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_GROUP, "MPI_Group_incl: not a group");
  }
  std::vector<int> world;
  for (int i = 0; i < n; ++i) {
    if (ranks[i] < 0 || ranks[i] >= static_cast<int>(g->world.size())) {
      return Runtime::get().fail(
          MPI_COMM_WORLD, MPI_ERR_RANK,
          "MPI_Group_incl: rank " + std::to_string(ranks[i]) + " is not in the group");
    }
    world.push_back(g->world[static_cast<std::size_t>(ranks[i])]);
  }
  *out = add_group(std::move(world));
  return MPI_SUCCESS;
}

int MPI_Group_translate_ranks(MPI_Group a, int n, const int ranks[], MPI_Group b, int out[]) {
  const Group* ga = group(a);
  const Group* gb = group(b);
  if (ga == nullptr || gb == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_GROUP,
                               "MPI_Group_translate_ranks: not a group");
  }
  for (int i = 0; i < n; ++i) {
    const int world = ga->world[static_cast<std::size_t>(ranks[i])];
    const auto at = std::find(gb->world.begin(), gb->world.end(), world);
    out[i] = at == gb->world.end() ? MPI_UNDEFINED : static_cast<int>(at - gb->world.begin());
  }
  return MPI_SUCCESS;
}

int MPI_Group_free(MPI_Group* handle) {
  Group* g = group(*handle);
  if (g != nullptr && *handle != MPI_GROUP_EMPTY) *g = Group{};
  *handle = MPI_GROUP_NULL;
  return MPI_SUCCESS;
}

// ---- Windows ----

int MPI_Win_create(void* base, MPI_Aint size, int disp_unit, MPI_Info /*info*/, MPI_Comm comm,
                   MPI_Win* win) {
  return make_window("MPI_Win_create", base, size, disp_unit, comm, false, nullptr, win);
}

int MPI_Win_allocate(MPI_Aint size, int disp_unit, MPI_Info /*info*/, MPI_Comm comm, void* baseptr,
                     MPI_Win* win) {
  return make_window("MPI_Win_allocate", nullptr, size, disp_unit, comm, true, baseptr, win);
}

int MPI_Win_free(MPI_Win* handle) {
  Window* w = window(*handle);
  if (w == nullptr) return bad_window("MPI_Win_free", *handle);
  Runtime& rt = Runtime::get();
  // Collective: every member's accesses are done before any member's memory goes.
  ferry::Status s = rt.context->flush_all();
  if (ferry::Status b = rt.comm(w->comm)->coll.barrier(); s.is_ok()) s = b;
  const MPI_Comm comm = w->comm;
  *w = Window{};
  *handle = MPI_WIN_NULL;
  return rt.fail(comm, "MPI_Win_free", s);
}

int MPI_Put(const void* origin, int origin_count, MPI_Datatype origin_type, int target,
            MPI_Aint disp, int target_count, MPI_Datatype target_type, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Put", handle);
  if (target == MPI_PROC_NULL) return MPI_SUCCESS;
  if (int e = check_target("MPI_Put", *w, target)) return e;
  std::size_t bytes = 0;
  std::size_t target_bytes = 0;
  if (int e = contiguous_bytes("MPI_Put", *w, origin_type, origin_count, &bytes)) return e;
  if (int e = contiguous_bytes("MPI_Put", *w, target_type, target_count, &target_bytes)) return e;
  const auto u = static_cast<std::size_t>(target);
  // Done at the target by the next flush, unlock, fence or complete (ferry's flush waits for
  // dropped requests too).
  Runtime::get().context->iput(
      origin, std::min(bytes, target_bytes), w->keys[u],
      static_cast<std::uint64_t>(disp) * static_cast<std::uint64_t>(w->disp_units[u]));
  return MPI_SUCCESS;
}

int MPI_Get(void* origin, int origin_count, MPI_Datatype origin_type, int target, MPI_Aint disp,
            int target_count, MPI_Datatype target_type, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Get", handle);
  if (target == MPI_PROC_NULL) return MPI_SUCCESS;
  if (int e = check_target("MPI_Get", *w, target)) return e;
  std::size_t bytes = 0;
  std::size_t target_bytes = 0;
  if (int e = contiguous_bytes("MPI_Get", *w, origin_type, origin_count, &bytes)) return e;
  if (int e = contiguous_bytes("MPI_Get", *w, target_type, target_count, &target_bytes)) return e;
  const auto u = static_cast<std::size_t>(target);
  Runtime::get().context->iget(
      origin, std::min(bytes, target_bytes), w->keys[u],
      static_cast<std::uint64_t>(disp) * static_cast<std::uint64_t>(w->disp_units[u]));
  return MPI_SUCCESS;
}

int MPI_Accumulate(const void* origin, int origin_count, MPI_Datatype origin_type, int target,
                   MPI_Aint disp, int /*target_count*/, MPI_Datatype /*target_type*/, MPI_Op op,
                   MPI_Win win) {
  return accumulate("MPI_Accumulate", origin, origin_count, origin_type, nullptr, target, disp, op,
                    win);
}

int MPI_Get_accumulate(const void* origin, int origin_count, MPI_Datatype origin_type, void* result,
                       int /*result_count*/, MPI_Datatype /*result_type*/, int target,
                       MPI_Aint disp, int /*target_count*/, MPI_Datatype /*target_type*/, MPI_Op op,
                       MPI_Win win) {
  return accumulate("MPI_Get_accumulate", origin, origin_count, origin_type, result, target, disp,
                    op, win);
}

int MPI_Fetch_and_op(const void* origin, void* result, MPI_Datatype type, int target, MPI_Aint disp,
                     MPI_Op op, MPI_Win win) {
  return accumulate("MPI_Fetch_and_op", origin, 1, type, result, target, disp, op, win);
}

int MPI_Compare_and_swap(const void* origin, const void* compare, void* result, MPI_Datatype type,
                         int target, MPI_Aint disp, MPI_Win handle) {
  const char* what = "MPI_Compare_and_swap";
  Window* w = window(handle);
  if (w == nullptr) return bad_window(what, handle);
  if (target == MPI_PROC_NULL) return MPI_SUCCESS;
  if (int e = check_target(what, *w, target)) return e;
  std::size_t bytes = 0;
  if (int e = contiguous_bytes(what, *w, type, 1, &bytes)) return e;
  // Under the accumulate word, as the other accumulates, so that they are atomic together.
  Runtime& rt = Runtime::get();
  const auto u = static_cast<std::size_t>(target);
  const std::uint64_t offset =
      static_cast<std::uint64_t>(disp) * static_cast<std::uint64_t>(w->disp_units[u]);
  if (ferry::Status s = acquire(*w, target, kAccumulateWord, true); !s.is_ok()) {
    return fail(*w, what, s);
  }
  std::vector<std::byte> current(bytes);
  ferry::Status s = rt.context->iget(current.data(), bytes, w->keys[u], offset).wait();
  if (s.is_ok()) {
    std::memcpy(result, current.data(), bytes);
    if (std::memcmp(current.data(), compare, bytes) == 0) {
      s = rt.context->iput(origin, bytes, w->keys[u], offset).wait();
    }
  }
  const ferry::Status released = release(*w, target, kAccumulateWord, true);
  return fail(*w, what, s.is_ok() ? released : s);
}

int MPI_Win_fence(int /*assert*/, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_fence", handle);
  Runtime& rt = Runtime::get();
  ferry::Status s = rt.context->flush_all();
  if (ferry::Status b = rt.comm(w->comm)->coll.barrier(); s.is_ok()) s = b;
  return fail(*w, "MPI_Win_fence", s);
}

int MPI_Win_lock(int lock_type, int target, int /*assert*/, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_lock", handle);
  if (target == MPI_PROC_NULL) return MPI_SUCCESS;
  if (int e = check_target("MPI_Win_lock", *w, target)) return e;
  if (lock_type != MPI_LOCK_SHARED && lock_type != MPI_LOCK_EXCLUSIVE) {
    return Runtime::get().fail(w->comm, MPI_ERR_ARG,
                               "MPI_Win_lock: the lock type is not MPI_LOCK_SHARED or "
                               "MPI_LOCK_EXCLUSIVE");
  }
  int& held = w->locks[static_cast<std::size_t>(target)];
  if (held != 0) {
    return Runtime::get().fail(w->comm, MPI_ERR_ARG,
                               "MPI_Win_lock: this rank holds a lock on rank " +
                                   std::to_string(target) + " of the window already");
  }
  if (ferry::Status s = acquire(*w, target, kLockWord, lock_type == MPI_LOCK_EXCLUSIVE);
      !s.is_ok()) {
    return fail(*w, "MPI_Win_lock", s);
  }
  held = lock_type;
  return MPI_SUCCESS;
}

int MPI_Win_unlock(int target, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_unlock", handle);
  if (target == MPI_PROC_NULL) return MPI_SUCCESS;
  if (int e = check_target("MPI_Win_unlock", *w, target)) return e;
  int& held = w->locks[static_cast<std::size_t>(target)];
  if (held == 0) {
    return Runtime::get().fail(w->comm, MPI_ERR_ARG,
                               "MPI_Win_unlock: no lock on rank " + std::to_string(target));
  }
  Runtime& rt = Runtime::get();
  ferry::Status s = rt.context->flush(rt.comm(w->comm)->world_of[static_cast<std::size_t>(target)]);
  const ferry::Status r = release(*w, target, kLockWord, held == MPI_LOCK_EXCLUSIVE);
  held = 0;
  return fail(*w, "MPI_Win_unlock", s.is_ok() ? r : s);
}

int MPI_Win_lock_all(int assert, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_lock_all", handle);
  for (int m = 0; m < static_cast<int>(w->keys.size()); ++m) {
    if (int e = MPI_Win_lock(MPI_LOCK_SHARED, m, assert, handle)) return e;
  }
  return MPI_SUCCESS;
}

int MPI_Win_unlock_all(MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_unlock_all", handle);
  for (int m = 0; m < static_cast<int>(w->keys.size()); ++m) {
    if (int e = MPI_Win_unlock(m, handle)) return e;
  }
  return MPI_SUCCESS;
}

int MPI_Win_flush(int target, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_flush", handle);
  if (target == MPI_PROC_NULL) return MPI_SUCCESS;
  if (int e = check_target("MPI_Win_flush", *w, target)) return e;
  Runtime& rt = Runtime::get();
  return fail(*w, "MPI_Win_flush",
              rt.context->flush(rt.comm(w->comm)->world_of[static_cast<std::size_t>(target)]));
}

int MPI_Win_flush_all(MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_flush_all", handle);
  return fail(*w, "MPI_Win_flush_all", Runtime::get().context->flush_all());
}

// Local completion is not told apart from remote completion: both wait for the target.
int MPI_Win_flush_local(int target, MPI_Win handle) { return MPI_Win_flush(target, handle); }
int MPI_Win_flush_local_all(MPI_Win handle) { return MPI_Win_flush_all(handle); }

int MPI_Win_post(MPI_Group origins, int /*assert*/, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_post", handle);
  if (int e = members_of("MPI_Win_post", *w, origins, &w->post_group)) return e;
  return fail(*w, "MPI_Win_post", notify(*w, w->post_group, kPostNotice));
}

int MPI_Win_start(MPI_Group targets, int /*assert*/, MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_start", handle);
  if (int e = members_of("MPI_Win_start", *w, targets, &w->start_group)) return e;
  return fail(*w, "MPI_Win_start", await(*w, w->start_group, kPostNotice));
}

int MPI_Win_complete(MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_complete", handle);
  Runtime& rt = Runtime::get();
  ferry::Status s;
  for (int m : w->start_group) {
    const ferry::Status f =
        rt.context->flush(rt.comm(w->comm)->world_of[static_cast<std::size_t>(m)]);
    if (s.is_ok()) s = f;
  }
  if (ferry::Status n = notify(*w, w->start_group, kCompleteNotice); s.is_ok()) s = n;
  w->start_group.clear();
  return fail(*w, "MPI_Win_complete", s);
}

int MPI_Win_wait(MPI_Win handle) {
  Window* w = window(handle);
  if (w == nullptr) return bad_window("MPI_Win_wait", handle);
  const ferry::Status s = await(*w, w->post_group, kCompleteNotice);
  w->post_group.clear();
  return fail(*w, "MPI_Win_wait", s);
}

}  // extern "C"
