// MPI on ferry: what the C functions of mpi.h share: the Context, the tables behind the int
// handles (communicators, datatypes, requests), and errors that carry ferry's reason.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "ferry/ferry.hpp"
#include "mpi/mpi.h"

namespace ferry::mpi {

// A communicator: ferry's for the collectives, and for point-to-point the world ranks of its
// members and a context id, which forms the top half of every message tag (the MPI tag is the
// bottom half), so that messages of different communicators never match.
struct Comm {
  Communicator coll;
  std::uint32_t context = 0;
  std::vector<int> world_of;   // member -> world rank
  std::vector<int> member_of;  // world rank -> member (-1: not a member)
  MPI_Errhandler errhandler = MPI_ERRORS_ARE_FATAL;
  std::map<int, void*> attributes;  // by keyval (MPI_Comm_set_attr)
  bool live = false;
  [[nodiscard]] int rank() const { return coll.rank(); }
  [[nodiscard]] int size() const { return static_cast<int>(world_of.size()); }
};

// A datatype: its size and extent, and its layout as blocks of bytes within one element. A
// predefined type (and a derived one of a single basic type) also names ferry's element type,
// which the reductions need.
struct Type {
  std::size_t size = 0;
  std::ptrdiff_t lb = 0;
  std::ptrdiff_t extent = 0;
  struct Block {
    std::ptrdiff_t offset;
    std::size_t bytes;
  };
  std::vector<Block> blocks;        // sorted by offset, merged
  std::optional<DataType> element;  // homogeneous: ferry's element type
  std::size_t element_count = 0;    // elements of `element` per element of this type
  const char* name = "derived";
  bool predefined = false;
  bool committed = false;
  bool live = false;
  // One block at offset 0 as large as the extent: a buffer of n elements is n * size bytes.
  [[nodiscard]] bool contiguous() const {
    return blocks.size() == 1 && blocks[0].offset == 0 && blocks[0].bytes == size &&
           static_cast<std::ptrdiff_t>(size) == extent && lb == 0;
  }
};

// A non-blocking operation: ferry's request, and what to do with the data when it ends (a
// receive of a non-contiguous type lands in `packed` and is unpacked into the user's buffer).
// A persistent one (MPI_Send_init, MPI_Recv_init) keeps its arguments and is started again by
// MPI_Start; a collective made of several transfers keeps them in `parts`, and `after` runs
// once all have ended well (a copy out of a temporary buffer).
struct PendingRequest {
  Request request;
  std::vector<Request> parts;
  std::function<void()> after;
  enum Kind { kNone, kSend, kRecv, kCollective, kDone } kind = kNone;
  MPI_Comm comm = MPI_COMM_NULL;
  void* user = nullptr;
  MPI_Datatype type = MPI_DATATYPE_NULL;
  int count = 0;
  int peer = MPI_PROC_NULL;
  int tag = 0;
  std::vector<std::byte> packed;
  MPI_Status done{};          // kDone or started_done: the status to report
  bool started_done = false;  // a send or receive of MPI_PROC_NULL: done when started
  bool persistent = false;
  bool synchronous = false;  // MPI_Issend: completes once matched (Context::issend)
  bool active = false;       // persistent: started and not yet completed
  bool live = false;
  // MPI_Cancel was called: a receive that ends kCanceled then completes as canceled (MPI_SUCCESS,
  // MPI_Test_cancelled true); one that ends so by itself (its sender finalized) fails.
  bool cancel_requested = false;
};

class Runtime {
 public:
  // The one runtime of the process (inline: every MPI call starts here).
  static Runtime& get() {
    static Runtime runtime;
    return runtime;
  }

  // ---- Errors ----
  // An error of `error_class` with `why`: a code that carries the message (MPI_Error_string),
  // handled by `comm`'s error handler (fatal: printed, then the job aborts).
  int fail(MPI_Comm comm, int error_class, const std::string& why);
  // A ferry Status as an MPI error of the function `what` (MPI_SUCCESS when it is ok).
  int fail(MPI_Comm comm, const char* what, const Status& status) {
    return status.is_ok() ? MPI_SUCCESS : fail_with(comm, what, status);
  }
  [[nodiscard]] std::string message(int code) const;
  [[noreturn]] void abort(int code);

  // ---- State ----
  bool initialized = false;
  bool finalized = false;
  int thread_level = MPI_THREAD_SINGLE;
  std::optional<Context> context;
  std::vector<Comm> comms;                 // by handle
  std::vector<Type> types;                 // by handle
  std::vector<PendingRequest> requests;    // by handle
  std::vector<MPI_Request> free_requests;  // handles of requests released
  // MPI_Comm_create_keyval's keys, by keyval (from kFirstKeyval).
  struct Keyval {
    MPI_Comm_copy_attr_function* copy = nullptr;
    MPI_Comm_delete_attr_function* del = nullptr;
    void* extra = nullptr;
    bool live = false;
  };
  static constexpr int kFirstKeyval = 16;
  std::vector<Keyval> keyvals = std::vector<Keyval>(kFirstKeyval);
  std::uint32_t next_context = 3;  // agreed among a new communicator's members (max + 1)

  // The live communicator or datatype of `handle`, or null.
  Comm* comm(MPI_Comm handle) {
    if (handle <= 0 || static_cast<std::size_t>(handle) >= comms.size()) return nullptr;
    Comm* c = &comms[static_cast<std::size_t>(handle)];
    return c->live ? c : nullptr;
  }
  Type* type(MPI_Datatype handle) {
    if (handle <= 0 || static_cast<std::size_t>(handle) >= types.size()) return nullptr;
    Type* t = &types[static_cast<std::size_t>(handle)];
    return t->live ? t : nullptr;
  }
  MPI_Comm add_comm(Comm comm);
  MPI_Datatype add_type(Type type);
  // A request's handle: a freed one again (last freed first), else a new one.
  MPI_Request add_request(PendingRequest request);
  // Done with request `handle` (live): its slot goes back to the free ones.
  void release_request(MPI_Request handle);

  // The tag of MPI tag `tag` on `comm`, and the mask that matches it (MPI_ANY_TAG: any).
  static Tag wire_tag(const Comm& comm, int tag) {
    return (Tag{comm.context} << 32) | static_cast<std::uint32_t>(tag);
  }
  static Tag wire_mask(int tag) { return tag == MPI_ANY_TAG ? Tag{0xffffffff} << 32 : kFullMask; }
  // The tag of the library's own messages on `comm` (the v- and w-collectives built of sends
  // and receives): a context no application message carries (ids stay below 2^30).
  static Tag internal_tag(const Comm& comm, int kind) {
    return (Tag{comm.context | 0x40000000u} << 32) | static_cast<std::uint32_t>(kind);
  }

 private:
  Runtime();
  int fail_with(MPI_Comm comm, const char* what, const Status& status);
  std::vector<std::string> messages_;  // by slot, a ring
  std::size_t next_message_ = 0;
};

// A type of `old`'s elements placed at `displacements` (bytes), in that order (not committed).
Type derive(const Type& old, const std::vector<std::ptrdiff_t>& displacements);

// Checks shared by the C functions: each returns MPI_SUCCESS or the error code (having run the
// communicator's error handler).
int check_comm(const char* what, MPI_Comm handle, Comm** out);
int check_type(const char* what, MPI_Comm comm, MPI_Datatype handle, int count, Type** out);
void fill_status(MPI_Status* status, int source, int tag, int error, std::size_t bytes);

// Packs `count` elements of `type` at `from` into `to` (count * size bytes), and back.
void pack(const Type& type, const void* from, int count, std::byte* to);
void unpack(const Type& type, const std::byte* from, std::size_t bytes, void* to);

}  // namespace ferry::mpi
