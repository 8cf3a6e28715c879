// MPI on ferry: the environment, communicators, datatypes and point-to-point functions of
// mpi.h, on ferry's public API (collectives.cpp has the collectives).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "mpi/runtime.hpp"

using ferry::mpi::Comm;
using ferry::mpi::PendingRequest;
using ferry::mpi::Runtime;
using ferry::mpi::Type;

namespace ferry::mpi {

int check_comm(const char* what, MPI_Comm handle, Comm** out) {
  Runtime& rt = Runtime::get();
  if (!rt.initialized || rt.finalized) {
    return rt.fail(MPI_COMM_NULL, MPI_ERR_OTHER,
                   std::string(what) + ": called " +
                       (rt.finalized ? "after MPI_Finalize" : "before MPI_Init"));
  }
  *out = rt.comm(handle);
  if (*out == nullptr) {
    return rt.fail(MPI_COMM_NULL, MPI_ERR_COMM,
                   std::string(what) + ": " + std::to_string(handle) +
                       " is not a communicator (MPI_COMM_NULL, freed, or never made)");
  }
  return MPI_SUCCESS;
}

int check_type(const char* what, MPI_Comm comm, MPI_Datatype handle, int count, Type** out) {
  Runtime& rt = Runtime::get();
  *out = rt.type(handle);
  if (*out == nullptr) {
    return rt.fail(comm, MPI_ERR_TYPE,
                   std::string(what) + ": " + std::to_string(handle) + " is not a datatype");
  }
  if (!(*out)->committed) {
    return rt.fail(comm, MPI_ERR_TYPE,
                   std::string(what) + ": the datatype is not committed (MPI_Type_commit)");
  }
  if (count < 0) {
    return rt.fail(comm, MPI_ERR_COUNT,
                   std::string(what) + ": negative count " + std::to_string(count));
  }
  return MPI_SUCCESS;
}

void fill_status(MPI_Status* status, int source, int tag, int error, std::size_t bytes) {
  if (status == MPI_STATUS_IGNORE) return;
  status->MPI_SOURCE = source;
  status->MPI_TAG = tag;
  status->MPI_ERROR = error;
  status->ferry_cancelled = 0;
  status->ferry_bytes = static_cast<long long>(bytes);
}

}  // namespace ferry::mpi

using namespace ferry::mpi;  // NOLINT(google-build-using-namespace): the C functions below

namespace {

int check_peer(const char* what, const Comm& comm, MPI_Comm handle, int rank, bool any) {
  if (rank == MPI_PROC_NULL || (any && rank == MPI_ANY_SOURCE)) return MPI_SUCCESS;
  if (rank < 0 || rank >= comm.size()) {
    return Runtime::get().fail(handle, MPI_ERR_RANK,
                               std::string(what) + ": rank " + std::to_string(rank) +
                                   " is not a member (the communicator has " +
                                   std::to_string(comm.size()) + ")");
  }
  return MPI_SUCCESS;
}

int check_tag(const char* what, MPI_Comm handle, int tag, bool any) {
  if (tag >= 0 || (any && tag == MPI_ANY_TAG)) return MPI_SUCCESS;
  return Runtime::get().fail(handle, MPI_ERR_TAG,
                             std::string(what) + ": tag " + std::to_string(tag) +
                                 " is negative (tags are 0 to MPI_TAG_UB)");
}

int world_source(const Comm& comm, int source) {
  return source == MPI_ANY_SOURCE ? ferry::kAnySource
                                  : comm.world_of[static_cast<std::size_t>(source)];
}

int mpi_tag(ferry::Tag tag) { return static_cast<int>(static_cast<std::uint32_t>(tag)); }

void empty_status(MPI_Status* status);
int complete_request(PendingRequest& r, MPI_Status* status, bool test);

int member(const Comm* comm, int world) {
  return comm != nullptr && world >= 0 ? comm->member_of[static_cast<std::size_t>(world)]
                                       : MPI_ANY_SOURCE;
}

// Starts request `r` as the send or receive its fields describe (checked already): a packed
// copy of a non-contiguous type's data, then ferry's isend or irecv.
void start(PendingRequest& r) {
  Runtime& rt = Runtime::get();
  const Comm& comm = *rt.comm(r.comm);
  const Type& t = *rt.type(r.type);
  const std::size_t bytes = static_cast<std::size_t>(r.count) * t.size;
  if (r.peer == MPI_PROC_NULL) {
    r.started_done = true;
    fill_status(&r.done, MPI_PROC_NULL, MPI_ANY_TAG, MPI_SUCCESS, 0);
    return;
  }
  r.started_done = false;
  void* data = r.user;
  if (!t.contiguous() && bytes > 0) {
    r.packed.resize(bytes);
    if (r.kind == PendingRequest::kSend) pack(t, r.user, r.count, r.packed.data());
    data = r.packed.data();
  }
  if (r.kind == PendingRequest::kSend) {
    const int to = comm.world_of[static_cast<std::size_t>(r.peer)];
    const ferry::Tag tag = Runtime::wire_tag(comm, r.tag);
    r.request = r.synchronous ? rt.context->issend(data, bytes, to, tag)
                              : rt.context->isend(data, bytes, to, tag);
  } else {
    r.request = rt.context->irecv(data, bytes, world_source(comm, r.peer),
                                  Runtime::wire_tag(comm, r.tag), Runtime::wire_mask(r.tag));
  }
}

// The checks of a send's or receive's arguments one by one, each failure with its message.
[[gnu::cold, gnu::noinline]] int diagnose(const char* what, bool is_send, int count,
                                          MPI_Datatype type, int peer, int tag, MPI_Comm handle,
                                          Comm** comm, Type** t) {
  if (int e = check_comm(what, handle, comm)) return e;
  if (int e = check_type(what, handle, type, count, t)) return e;
  if (int e = check_peer(what, **comm, handle, peer, !is_send)) return e;
  return check_tag(what, handle, tag, !is_send);
}

// Checks a send's or receive's arguments: what every call passes (a live communicator, a
// committed type, a member or a wildcard, a tag) in a few compares, inline; diagnose() finds
// what is wrong otherwise. Inlined: a call cost more than the compares (its prologue saved six
// registers), twice per ping-pong message.
[[gnu::always_inline]] inline int check(const char* what, bool is_send, int count,
                                        MPI_Datatype type, int peer, int tag, MPI_Comm handle,
                                        Comm** comm, Type** t) {
  Runtime& rt = Runtime::get();
  Comm* c = rt.initialized && !rt.finalized ? rt.comm(handle) : nullptr;
  Type* ty = rt.type(type);
  if (c != nullptr && ty != nullptr && ty->committed && count >= 0 &&
      ((peer >= 0 && peer < c->size()) || peer == MPI_PROC_NULL ||
       (!is_send && peer == MPI_ANY_SOURCE)) &&
      (tag >= 0 || (!is_send && tag == MPI_ANY_TAG))) {
    *comm = c;
    *t = ty;
    return MPI_SUCCESS;
  }
  return diagnose(what, is_send, count, type, peer, tag, handle, comm, t);
}

// Checks a send's or receive's arguments and makes its request (not started).
int prepare(const char* what, bool is_send, void* buf, int count, MPI_Datatype type, int peer,
            int tag, MPI_Comm handle, PendingRequest* r) {
  Comm* comm = nullptr;
  Type* t = nullptr;
  if (int e = check(what, is_send, count, type, peer, tag, handle, &comm, &t)) return e;
  r->kind = is_send ? PendingRequest::kSend : PendingRequest::kRecv;
  r->comm = handle;
  r->user = buf;
  r->type = type;
  r->count = count;
  r->peer = peer;
  r->tag = tag;
  return MPI_SUCCESS;
}

// A send of `count` elements: blocking (request null) or not; `synchronous` completes once
// matched (MPI_Ssend, MPI_Issend).
int send(const char* what, const void* buf, int count, MPI_Datatype type, int dest, int tag,
         MPI_Comm handle, MPI_Request* request, bool synchronous = false) {
  Runtime& rt = Runtime::get();
  if (request == nullptr) {  // blocking, contiguous: ferry's blocking send, no request
    Comm* comm = nullptr;
    Type* t = nullptr;
    if (int e = check(what, true, count, type, dest, tag, handle, &comm, &t)) return e;
    if (dest == MPI_PROC_NULL) return MPI_SUCCESS;
    if (t->contiguous()) {
      const std::size_t bytes = static_cast<std::size_t>(count) * t->size;
      const int to = comm->world_of[static_cast<std::size_t>(dest)];
      const ferry::Tag wire = Runtime::wire_tag(*comm, tag);
      return rt.fail(handle, what,
                     synchronous ? rt.context->ssend(buf, bytes, to, wire)
                                 : rt.context->send(buf, bytes, to, wire));
    }
  }
  PendingRequest r;
  if (int e = prepare(what, true, const_cast<void*>(buf), count, type, dest, tag, handle, &r)) {
    return e;
  }
  r.synchronous = synchronous;
  start(r);
  if (request == nullptr) return complete_request(r, MPI_STATUS_IGNORE, false);
  *request = rt.add_request(std::move(r));
  return MPI_SUCCESS;
}

int recv(const char* what, void* buf, int count, MPI_Datatype type, int source, int tag,
         MPI_Comm handle, MPI_Status* status, MPI_Request* request) {
  Runtime& rt = Runtime::get();
  if (request == nullptr) {  // blocking, contiguous: ferry's blocking receive, no request
    Comm* comm = nullptr;
    Type* t = nullptr;
    if (int e = check(what, false, count, type, source, tag, handle, &comm, &t)) return e;
    if (t->contiguous() && source != MPI_PROC_NULL) {
      ferry::MessageInfo info;
      const ferry::Status s = rt.context->recv(
          buf, static_cast<std::size_t>(count) * t->size, world_source(*comm, source),
          Runtime::wire_tag(*comm, tag), &info, Runtime::wire_mask(tag));
      const int error = s.is_ok() ? MPI_SUCCESS : rt.fail(handle, what, s);
      fill_status(status, member(comm, info.source), mpi_tag(info.tag), error, info.bytes);
      return error;
    }
  }
  PendingRequest r;
  if (int e = prepare(what, false, buf, count, type, source, tag, handle, &r)) return e;
  start(r);
  if (request == nullptr) return complete_request(r, status, false);
  *request = rt.add_request(std::move(r));
  return MPI_SUCCESS;
}

void empty_status(MPI_Status* status) {
  fill_status(status, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_SUCCESS, 0);
}

// Completes a started request (waits, or only looks when `test`; false then: not yet) and
// fills `status`; unpacks a non-contiguous receive. Returns the MPI code, or -1 for "not yet".
int complete_request(PendingRequest& r, MPI_Status* status, bool test) {
  Runtime& rt = Runtime::get();
  if (r.kind == PendingRequest::kDone || r.started_done || (r.persistent && !r.active)) {
    if (r.persistent && !r.active) {
      empty_status(status);
      return MPI_SUCCESS;
    }
    r.active = false;
    if (status != MPI_STATUS_IGNORE) *status = r.done;
    return r.done.MPI_ERROR;
  }
  for (ferry::Request& part : r.parts) {
    if (test && !part.test()) return -1;
  }
  // A request of several parts (the v- and w-collectives) has no request of its own.
  const bool whole = r.parts.empty();
  if (test && whole && !r.request.test()) return -1;
  ferry::Status s;
  for (ferry::Request& part : r.parts) {
    const ferry::Status p = test ? part.status() : part.wait();
    if (s.is_ok()) s = p;
  }
  if (whole) {
    const ferry::Status main = test ? r.request.status() : r.request.wait();
    if (s.is_ok()) s = main;
  }
  r.active = false;
  if (r.kind == PendingRequest::kRecv) {
    const ferry::MessageInfo info = r.request.info();
    if (!r.packed.empty() && (s.is_ok() || s.code() == ferry::Code::kTruncated)) {
      unpack(*rt.type(r.type), r.packed.data(), std::min(info.bytes, r.packed.size()), r.user);
    }
    const bool canceled = s.code() == ferry::Code::kCanceled && r.cancel_requested;
    r.cancel_requested = false;
    const int error = canceled ? MPI_SUCCESS : rt.fail(r.comm, "MPI_Recv", s);
    fill_status(status, member(rt.comm(r.comm), info.source), mpi_tag(info.tag), error, info.bytes);
    if (status != MPI_STATUS_IGNORE && canceled) status->ferry_cancelled = 1;
    return error;
  }
  if (s.is_ok() && r.after) r.after();
  const int error = rt.fail(r.comm, r.kind == PendingRequest::kSend ? "MPI_Send" : "collective", s);
  fill_status(status, MPI_ANY_SOURCE, MPI_ANY_TAG, error, 0);
  return error;
}

// Whether a request would complete without waiting.
bool ready(PendingRequest& r) {
  if (!r.live || r.kind == PendingRequest::kDone || r.started_done) return true;
  if (r.persistent && !r.active) return true;
  for (ferry::Request& part : r.parts) {
    if (!part.test()) return false;
  }
  return !r.parts.empty() || r.request.test();
}

// MPI_Wait/MPI_Test of request handle `*handle`: `flag` null waits. A completed request is
// freed (a persistent one only goes inactive).
int complete(MPI_Request* handle, MPI_Status* status, int* flag) {
  Runtime& rt = Runtime::get();
  if (flag != nullptr) *flag = 1;
  if (*handle == MPI_REQUEST_NULL) {
    empty_status(status);
    return MPI_SUCCESS;
  }
  if (*handle < 0 || static_cast<std::size_t>(*handle) >= rt.requests.size() ||
      !rt.requests[static_cast<std::size_t>(*handle)].live) {
    return rt.fail(MPI_COMM_WORLD, MPI_ERR_REQUEST,
                   "MPI_Wait/MPI_Test: " + std::to_string(*handle) + " is not a request");
  }
  PendingRequest& r = rt.requests[static_cast<std::size_t>(*handle)];
  const int error = complete_request(r, status, flag != nullptr);
  if (error == -1) {
    *flag = 0;
    return MPI_SUCCESS;
  }
  if (!r.persistent) {
    rt.release_request(*handle);
    *handle = MPI_REQUEST_NULL;
  }
  return error;
}

}  // namespace

extern "C" int MPI_Comm_delete_attr(MPI_Comm comm, int keyval);

namespace {

// Every attribute of `handle` deleted (its delete function run), as MPI_Comm_free and
// MPI_Finalize (for MPI_COMM_SELF, first) do.
int delete_attributes(MPI_Comm handle) {
  Runtime& rt = Runtime::get();
  while (Comm* comm = rt.comm(handle)) {
    if (comm->attributes.empty()) break;
    if (int e = MPI_Comm_delete_attr(handle, comm->attributes.begin()->first)) return e;
  }
  return MPI_SUCCESS;
}

}  // namespace

extern "C" {

// ---- Environment ----

int MPI_Init(int* argc, char*** argv) {
  int provided = 0;
  return MPI_Init_thread(argc, argv, MPI_THREAD_SINGLE, &provided);
}

int MPI_Init_thread(int* /*argc*/, char*** /*argv*/, int required, int* provided) {
  Runtime& rt = Runtime::get();
  if (rt.initialized) {
    return rt.fail(MPI_COMM_NULL, MPI_ERR_OTHER, "MPI_Init: called twice");
  }
  try {
    rt.context.emplace(ferry::Context::init());
  } catch (const ferry::Error& e) {
    return rt.fail(MPI_COMM_NULL, MPI_ERR_OTHER, std::string("MPI_Init: ") + e.what());
  }
  rt.initialized = true;
  // ferry serialises its own calls; MPI_THREAD_MULTIPLE is granted as serialized.
  rt.thread_level = std::min(required, MPI_THREAD_SERIALIZED);
  *provided = rt.thread_level;
  const int size = rt.context->size();
  Comm world;
  world.coll = rt.context->world();
  world.context = 1;
  for (int r = 0; r < size; ++r) world.world_of.push_back(r);
  world.member_of = world.world_of;
  world.live = true;
  Comm self;
  try {
    self.coll = world.coll.split(rt.context->rank(), 0);
  } catch (const ferry::Error& e) {
    return rt.fail(MPI_COMM_NULL, MPI_ERR_OTHER, std::string("MPI_Init: ") + e.what());
  }
  self.context = 2;
  self.world_of = {rt.context->rank()};
  self.member_of.assign(static_cast<std::size_t>(size), -1);
  self.member_of[static_cast<std::size_t>(rt.context->rank())] = 0;
  self.live = true;
  rt.comms[MPI_COMM_WORLD] = std::move(world);
  rt.comms[MPI_COMM_SELF] = std::move(self);
  return MPI_SUCCESS;
}

int MPI_Initialized(int* flag) {
  *flag = Runtime::get().initialized ? 1 : 0;
  return MPI_SUCCESS;
}

int MPI_Finalized(int* flag) {
  *flag = Runtime::get().finalized ? 1 : 0;
  return MPI_SUCCESS;
}

int MPI_Finalize(void) {
  Runtime& rt = Runtime::get();
  if (!rt.initialized || rt.finalized) {
    return rt.fail(MPI_COMM_NULL, MPI_ERR_OTHER, "MPI_Finalize: MPI is not initialized");
  }
  // MPI_COMM_SELF's attributes are deleted first (libraries hang their clean-up there).
  delete_attributes(MPI_COMM_SELF);
  // Every member has finished its communication before any lets go (MPI_Finalize is collective).
  const ferry::Status s = rt.context->barrier();
  rt.requests.clear();
  rt.requests.resize(1);
  rt.free_requests.clear();
  for (Comm& c : rt.comms) c = Comm{};
  rt.context.reset();
  rt.finalized = true;
  return rt.fail(MPI_COMM_NULL, "MPI_Finalize", s);
}

int MPI_Abort(MPI_Comm /*comm*/, int errorcode) {
  Runtime& rt = Runtime::get();
  std::fprintf(stderr, "ferry-mpi[%d]: MPI_Abort with error code %d: ending the job\n",
               rt.context ? rt.context->rank() : -1, errorcode);
  rt.abort(errorcode);
}

int MPI_Query_thread(int* provided) {
  *provided = Runtime::get().thread_level;
  return MPI_SUCCESS;
}

int MPI_Is_thread_main(int* flag) {
  *flag = 1;
  return MPI_SUCCESS;
}

int MPI_Get_processor_name(char* name, int* resultlen) {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::snprintf(name, MPI_MAX_PROCESSOR_NAME, "%s", host);
  *resultlen = static_cast<int>(std::strlen(name));
  return MPI_SUCCESS;
}

int MPI_Get_version(int* version, int* subversion) {
  *version = MPI_VERSION;
  *subversion = MPI_SUBVERSION;
  return MPI_SUCCESS;
}

int MPI_Get_library_version(char* version, int* resultlen) {
  std::snprintf(version, MPI_MAX_LIBRARY_VERSION_STRING, "ferry MPI (MPI %d.%d subset)",
                MPI_VERSION, MPI_SUBVERSION);
  *resultlen = static_cast<int>(std::strlen(version));
  return MPI_SUCCESS;
}

double MPI_Wtime(void) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double MPI_Wtick(void) { return 1e-9; }

int MPI_Alloc_mem(MPI_Aint size, MPI_Info /*info*/, void* baseptr) {
  void* memory = std::malloc(size > 0 ? static_cast<std::size_t>(size) : 1);
  if (memory == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_NO_MEM,
                               "MPI_Alloc_mem: " + std::to_string(size) + " bytes: no memory");
  }
  *static_cast<void**>(baseptr) = memory;
  return MPI_SUCCESS;
}

int MPI_Free_mem(void* base) {
  std::free(base);
  return MPI_SUCCESS;
}

// ---- Errors ----

int MPI_Error_string(int errorcode, char* string, int* resultlen) {
  std::snprintf(string, MPI_MAX_ERROR_STRING, "%s", Runtime::get().message(errorcode).c_str());
  *resultlen = static_cast<int>(std::strlen(string));
  return MPI_SUCCESS;
}

int MPI_Error_class(int errorcode, int* errorclass) {
  *errorclass = errorcode & 0xff;
  return MPI_SUCCESS;
}

int MPI_Comm_set_errhandler(MPI_Comm handle, MPI_Errhandler errhandler) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_set_errhandler", handle, &comm)) return e;
  if (errhandler < MPI_ERRORS_ARE_FATAL || errhandler > MPI_ERRORS_ABORT) {
    return Runtime::get().fail(handle, MPI_ERR_ARG,
                               "MPI_Comm_set_errhandler: " + std::to_string(errhandler) +
                                   " is not MPI_ERRORS_ARE_FATAL, MPI_ERRORS_RETURN or "
                                   "MPI_ERRORS_ABORT (user handlers are not built yet)");
  }
  comm->errhandler = errhandler;
  return MPI_SUCCESS;
}

int MPI_Comm_get_errhandler(MPI_Comm handle, MPI_Errhandler* errhandler) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_get_errhandler", handle, &comm)) return e;
  *errhandler = comm->errhandler;
  return MPI_SUCCESS;
}

int MPI_Errhandler_free(MPI_Errhandler* errhandler) {
  *errhandler = MPI_ERRHANDLER_NULL;
  return MPI_SUCCESS;
}

// ---- Communicators ----

int MPI_Comm_rank(MPI_Comm handle, int* rank) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_rank", handle, &comm)) return e;
  *rank = comm->rank();
  return MPI_SUCCESS;
}

int MPI_Comm_size(MPI_Comm handle, int* size) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_size", handle, &comm)) return e;
  *size = comm->size();
  return MPI_SUCCESS;
}

int MPI_Comm_split(MPI_Comm handle, int color, int key, MPI_Comm* newcomm) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_split", handle, &comm)) return e;
  Runtime& rt = Runtime::get();
  if (color < 0 && color != MPI_UNDEFINED) {
    return rt.fail(handle, MPI_ERR_ARG,
                   "MPI_Comm_split: color " + std::to_string(color) +
                       " is negative (colors are >= 0, or MPI_UNDEFINED)");
  }
  // The new communicator's context id: one that none of its members uses yet.
  std::uint32_t context = rt.next_context;
  if (ferry::Status s = comm->coll.allreduce(&context, &context, 1, ferry::DataType::kUint32,
                                             ferry::ReduceOp::kMax);
      !s.is_ok()) {
    return rt.fail(handle, "MPI_Comm_split", s);
  }
  rt.next_context = context + 1;
  Comm made;
  try {
    made.coll =
        comm->coll.split(color == MPI_UNDEFINED ? ferry::Communicator::kUndefined : color, key);
  } catch (const ferry::Error& e) {
    return rt.fail(handle, MPI_ERR_OTHER, std::string("MPI_Comm_split: ") + e.what());
  }
  if (!made.coll.valid()) {
    *newcomm = MPI_COMM_NULL;
    return MPI_SUCCESS;
  }
  made.context = context;
  made.errhandler = comm->errhandler;
  made.member_of.assign(static_cast<std::size_t>(rt.context->size()), -1);
  for (int r = 0; r < made.coll.size(); ++r) {
    const int world = made.coll.world_rank(r);
    made.world_of.push_back(world);
    made.member_of[static_cast<std::size_t>(world)] = r;
  }
  *newcomm = rt.add_comm(std::move(made));
  return MPI_SUCCESS;
}

int MPI_Comm_dup(MPI_Comm handle, MPI_Comm* newcomm) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_dup", handle, &comm)) return e;
  if (int e = MPI_Comm_split(handle, 0, comm->rank(), newcomm)) return e;
  // The attributes go with the copy where their keys' copy functions say so.
  Runtime& rt = Runtime::get();
  const std::map<int, void*> attributes = rt.comm(handle)->attributes;
  for (const auto& [keyval, value] : attributes) {
    const Runtime::Keyval& key = rt.keyvals[static_cast<std::size_t>(keyval)];
    void* copied = nullptr;
    int flag = 0;
    if (key.copy != nullptr) {
      if (int e = key.copy(handle, keyval, key.extra, value, &copied, &flag)) return e;
    }
    if (flag != 0) rt.comm(*newcomm)->attributes[keyval] = copied;
  }
  return MPI_SUCCESS;
}

int MPI_Comm_free(MPI_Comm* handle) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_free", *handle, &comm)) return e;
  if (*handle == MPI_COMM_WORLD || *handle == MPI_COMM_SELF) {
    return Runtime::get().fail(*handle, MPI_ERR_COMM,
                               "MPI_Comm_free: MPI_COMM_WORLD and MPI_COMM_SELF are not freed");
  }
  if (int e = delete_attributes(*handle)) return e;
  *comm = Comm{};
  *handle = MPI_COMM_NULL;
  return MPI_SUCCESS;
}

int MPI_Comm_compare(MPI_Comm a, MPI_Comm b, int* result) {
  Comm* ca = nullptr;
  Comm* cb = nullptr;
  if (int e = check_comm("MPI_Comm_compare", a, &ca)) return e;
  if (int e = check_comm("MPI_Comm_compare", b, &cb)) return e;
  *result = a == b                         ? MPI_IDENT
            : ca->world_of == cb->world_of ? MPI_CONGRUENT
            : std::is_permutation(ca->world_of.begin(), ca->world_of.end(), cb->world_of.begin(),
                                  cb->world_of.end())
                ? MPI_SIMILAR
                : MPI_UNEQUAL;
  return MPI_SUCCESS;
}

int ferry_mpi_comm_null_copy_fn(MPI_Comm, int, void*, void*, void*, int* flag) {
  *flag = 0;
  return MPI_SUCCESS;
}

int ferry_mpi_comm_dup_fn(MPI_Comm, int, void*, void* in, void* out, int* flag) {
  *static_cast<void**>(out) = in;
  *flag = 1;
  return MPI_SUCCESS;
}

int ferry_mpi_comm_null_delete_fn(MPI_Comm, int, void*, void*) { return MPI_SUCCESS; }

int MPI_Comm_create_keyval(MPI_Comm_copy_attr_function* copy_fn,
                           MPI_Comm_delete_attr_function* delete_fn, int* keyval,
                           void* extra_state) {
  Runtime& rt = Runtime::get();
  rt.keyvals.push_back({copy_fn, delete_fn, extra_state, true});
  *keyval = static_cast<int>(rt.keyvals.size() - 1);
  return MPI_SUCCESS;
}

int MPI_Comm_free_keyval(int* keyval) {
  Runtime& rt = Runtime::get();
  if (*keyval < Runtime::kFirstKeyval || static_cast<std::size_t>(*keyval) >= rt.keyvals.size() ||
      !rt.keyvals[static_cast<std::size_t>(*keyval)].live) {
    return rt.fail(MPI_COMM_WORLD, MPI_ERR_ARG,
                   "MPI_Comm_free_keyval: " + std::to_string(*keyval) + " is not a key");
  }
  // Attributes set with it stay until deleted (their delete function still runs then).
  *keyval = MPI_KEYVAL_INVALID;
  return MPI_SUCCESS;
}

int MPI_Comm_set_attr(MPI_Comm handle, int keyval, void* value) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_set_attr", handle, &comm)) return e;
  Runtime& rt = Runtime::get();
  if (keyval < Runtime::kFirstKeyval || static_cast<std::size_t>(keyval) >= rt.keyvals.size() ||
      !rt.keyvals[static_cast<std::size_t>(keyval)].live) {
    return rt.fail(
        handle, MPI_ERR_ARG,
        "MPI_Comm_set_attr: " + std::to_string(keyval) +
            " is not a key of MPI_Comm_create_keyval (the predefined ones are read-only)");
  }
  if (comm->attributes.count(keyval) != 0) {
    if (int e = MPI_Comm_delete_attr(handle, keyval)) return e;
  }
  rt.comm(handle)->attributes[keyval] = value;
  return MPI_SUCCESS;
}

int MPI_Comm_get_attr(MPI_Comm handle, int keyval, void* value, int* flag) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_get_attr", handle, &comm)) return e;
  // The predefined attributes point at values of the library's.
  static int tag_ub = MPI_TAG_UB_VALUE;
  static int host = MPI_PROC_NULL;
  static int io = MPI_ANY_SOURCE;
  static int wtime_is_global = 0;
  static int universe = 0;
  static int last_used_code = MPI_ERR_LASTCODE;
  int* predefined = nullptr;
  switch (keyval) {
    case MPI_TAG_UB:
      predefined = &tag_ub;
      break;
    case MPI_HOST:
      predefined = &host;
      break;
    case MPI_IO:
      predefined = &io;
      break;
    case MPI_WTIME_IS_GLOBAL:
      predefined = &wtime_is_global;
      break;
    case MPI_UNIVERSE_SIZE:
      universe = Runtime::get().context->size();
      predefined = &universe;
      break;
    case MPI_LASTUSEDCODE:
      predefined = &last_used_code;
      break;
    default:
      break;
  }
  if (predefined != nullptr) {
    *static_cast<void**>(value) = predefined;
    *flag = 1;
    return MPI_SUCCESS;
  }
  const auto at = comm->attributes.find(keyval);
  *flag = at != comm->attributes.end() ? 1 : 0;
  if (*flag != 0) *static_cast<void**>(value) = at->second;
  return MPI_SUCCESS;
}

int MPI_Comm_delete_attr(MPI_Comm handle, int keyval) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_delete_attr", handle, &comm)) return e;
  const auto at = comm->attributes.find(keyval);
  if (at == comm->attributes.end()) {
    return Runtime::get().fail(
        handle, MPI_ERR_ARG, "MPI_Comm_delete_attr: no attribute of key " + std::to_string(keyval));
  }
  void* value = at->second;
  comm->attributes.erase(at);
  const Runtime::Keyval& key = Runtime::get().keyvals[static_cast<std::size_t>(keyval)];
  return key.del != nullptr ? key.del(handle, keyval, value, key.extra) : MPI_SUCCESS;
}

int MPI_Comm_test_inter(MPI_Comm handle, int* flag) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Comm_test_inter", handle, &comm)) return e;
  *flag = 0;
  return MPI_SUCCESS;
}

// ---- Point to point ----

int MPI_Send(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  return send("MPI_Send", buf, count, type, dest, tag, comm, nullptr);
}

// A synchronous send completes once the receive has matched it (by rendezvous, whatever its
// size); the ready mode is a standard send (docs/design/mpi.md).
int MPI_Ssend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  return send("MPI_Ssend", buf, count, type, dest, tag, comm, nullptr, true);
}

int MPI_Rsend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm) {
  return send("MPI_Rsend", buf, count, type, dest, tag, comm, nullptr);
}

int MPI_Isend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
              MPI_Request* request) {
  return send("MPI_Isend", buf, count, type, dest, tag, comm, request);
}

int MPI_Issend(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
               MPI_Request* request) {
  return send("MPI_Issend", buf, count, type, dest, tag, comm, request, true);
}

int MPI_Recv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
             MPI_Status* status) {
  return recv("MPI_Recv", buf, count, type, source, tag, comm, status, nullptr);
}

int MPI_Irecv(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
              MPI_Request* request) {
  return recv("MPI_Irecv", buf, count, type, source, tag, comm, MPI_STATUS_IGNORE, request);
}

int MPI_Sendrecv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, int dest, int sendtag,
                 void* recvbuf, int recvcount, MPI_Datatype recvtype, int source, int recvtag,
                 MPI_Comm comm, MPI_Status* status) {
  MPI_Request r = MPI_REQUEST_NULL;
  if (int e = recv("MPI_Sendrecv", recvbuf, recvcount, recvtype, source, recvtag, comm,
                   MPI_STATUS_IGNORE, &r)) {
    return e;
  }
  const int sent = send("MPI_Sendrecv", sendbuf, sendcount, sendtype, dest, sendtag, comm, nullptr);
  const int received = complete(&r, status, nullptr);
  return sent != MPI_SUCCESS ? sent : received;
}

int MPI_Iprobe(int source, int tag, MPI_Comm handle, int* flag, MPI_Status* status) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Iprobe", handle, &comm)) return e;
  if (int e = check_peer("MPI_Iprobe", *comm, handle, source, true)) return e;
  if (int e = check_tag("MPI_Iprobe", handle, tag, true)) return e;
  if (source == MPI_PROC_NULL) {
    *flag = 1;
    fill_status(status, MPI_PROC_NULL, MPI_ANY_TAG, MPI_SUCCESS, 0);
    return MPI_SUCCESS;
  }
  const std::optional<ferry::MessageInfo> info = Runtime::get().context->iprobe(
      world_source(*comm, source), Runtime::wire_tag(*comm, tag), Runtime::wire_mask(tag));
  *flag = info.has_value() ? 1 : 0;
  if (info) {
    fill_status(status, comm->member_of[static_cast<std::size_t>(info->source)],
                static_cast<int>(static_cast<std::uint32_t>(info->tag)), MPI_SUCCESS, info->bytes);
  }
  return MPI_SUCCESS;
}

int MPI_Probe(int source, int tag, MPI_Comm handle, MPI_Status* status) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Probe", handle, &comm)) return e;
  if (int e = check_peer("MPI_Probe", *comm, handle, source, true)) return e;
  if (int e = check_tag("MPI_Probe", handle, tag, true)) return e;
  if (source == MPI_PROC_NULL) {
    fill_status(status, MPI_PROC_NULL, MPI_ANY_TAG, MPI_SUCCESS, 0);
    return MPI_SUCCESS;
  }
  Runtime& rt = Runtime::get();
  const ferry::MessageInfo info = rt.context->probe(
      world_source(*comm, source), Runtime::wire_tag(*comm, tag), Runtime::wire_mask(tag));
  if (info.source < 0) {
    return rt.fail(handle, MPIX_ERR_PROC_FAILED,
                   "MPI_Probe: no such message can come any more (its source failed, or "
                   "FERRY_TIMEOUT passed)");
  }
  fill_status(status, comm->member_of[static_cast<std::size_t>(info.source)],
              static_cast<int>(static_cast<std::uint32_t>(info.tag)), MPI_SUCCESS, info.bytes);
  return MPI_SUCCESS;
}

int MPI_Wait(MPI_Request* request, MPI_Status* status) {
  return complete(request, status, nullptr);
}

int MPI_Test(MPI_Request* request, int* flag, MPI_Status* status) {
  const int e = complete(request, status, flag);
  if (*flag == 0) Runtime::get().context->progress();
  return e;
}

int MPI_Waitall(int count, MPI_Request requests[], MPI_Status statuses[]) {
  int error = MPI_SUCCESS;
  for (int i = 0; i < count; ++i) {
    MPI_Status* s = statuses == MPI_STATUSES_IGNORE ? MPI_STATUS_IGNORE : &statuses[i];
    const int e = complete(&requests[i], s, nullptr);
    if (e != MPI_SUCCESS) error = statuses == MPI_STATUSES_IGNORE ? e : MPI_ERR_IN_STATUS;
  }
  return error;
}

int MPI_Testall(int count, MPI_Request requests[], int* flag, MPI_Status statuses[]) {
  Runtime& rt = Runtime::get();
  for (int i = 0; i < count; ++i) {
    const MPI_Request h = requests[i];
    if (h <= MPI_REQUEST_NULL || static_cast<std::size_t>(h) >= rt.requests.size()) continue;
    if (!ready(rt.requests[static_cast<std::size_t>(h)])) {
      *flag = 0;
      rt.context->progress();
      return MPI_SUCCESS;
    }
  }
  *flag = 1;
  return MPI_Waitall(count, requests, statuses);
}

int MPI_Testany(int count, MPI_Request requests[], int* index, int* flag, MPI_Status* status) {
  Runtime& rt = Runtime::get();
  bool any_active = false;
  for (int i = 0; i < count; ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    any_active = true;
    int done = 0;
    const int e = complete(&requests[i], status, &done);
    if (done != 0) {
      *index = i;
      *flag = 1;
      return e;
    }
  }
  *index = MPI_UNDEFINED;
  *flag = any_active ? 0 : 1;
  if (!any_active) empty_status(status);
  if (any_active) rt.context->progress();
  return MPI_SUCCESS;
}

int MPI_Waitany(int count, MPI_Request requests[], int* index, MPI_Status* status) {
  for (;;) {
    int flag = 0;
    const int e = MPI_Testany(count, requests, index, &flag, status);
    if (flag != 0 || e != MPI_SUCCESS) return e;
  }
}

int MPI_Waitsome(int incount, MPI_Request requests[], int* outcount, int indices[],
                 MPI_Status statuses[]) {
  int index = 0;
  MPI_Status first{};
  const int e = MPI_Waitany(incount, requests, &index, &first);
  if (index == MPI_UNDEFINED) {
    *outcount = MPI_UNDEFINED;
    return e;
  }
  *outcount = 1;
  indices[0] = index;
  if (statuses != MPI_STATUSES_IGNORE) statuses[0] = first;
  for (int i = 0; i < incount; ++i) {
    if (requests[i] == MPI_REQUEST_NULL) continue;
    int done = 0;
    MPI_Status* s = statuses == MPI_STATUSES_IGNORE ? MPI_STATUS_IGNORE : &statuses[*outcount];
    complete(&requests[i], s, &done);
    if (done != 0) indices[(*outcount)++] = i;
  }
  return e;
}

int MPI_Request_free(MPI_Request* request) {
  Runtime& rt = Runtime::get();
  if (*request == MPI_REQUEST_NULL) return MPI_SUCCESS;
  if (*request < 0 || static_cast<std::size_t>(*request) >= rt.requests.size() ||
      !rt.requests[static_cast<std::size_t>(*request)].live) {
    return rt.fail(MPI_COMM_WORLD, MPI_ERR_REQUEST,
                   "MPI_Request_free: " + std::to_string(*request) + " is not a request");
  }
  PendingRequest& r = rt.requests[static_cast<std::size_t>(*request)];
  // What must outlive the transfer (a packed copy, parts, a copy out afterwards) or be
  // unpacked where it ends: it completes here. Otherwise ferry lets a dropped Request run to
  // its end (as MPI_Request_free).
  if (!ready(r) && (!r.packed.empty() || !r.parts.empty() || r.after)) {
    complete_request(r, MPI_STATUS_IGNORE, false);
  }
  rt.release_request(*request);
  *request = MPI_REQUEST_NULL;
  return MPI_SUCCESS;
}

int MPI_Send_init(const void* buf, int count, MPI_Datatype type, int dest, int tag, MPI_Comm comm,
                  MPI_Request* request) {
  PendingRequest r;
  if (int e = prepare("MPI_Send_init", true, const_cast<void*>(buf), count, type, dest, tag, comm,
                      &r)) {
    return e;
  }
  r.persistent = true;
  *request = Runtime::get().add_request(std::move(r));
  return MPI_SUCCESS;
}

int MPI_Recv_init(void* buf, int count, MPI_Datatype type, int source, int tag, MPI_Comm comm,
                  MPI_Request* request) {
  PendingRequest r;
  if (int e = prepare("MPI_Recv_init", false, buf, count, type, source, tag, comm, &r)) return e;
  r.persistent = true;
  *request = Runtime::get().add_request(std::move(r));
  return MPI_SUCCESS;
}

int MPI_Start(MPI_Request* request) {
  Runtime& rt = Runtime::get();
  if (*request <= MPI_REQUEST_NULL || static_cast<std::size_t>(*request) >= rt.requests.size() ||
      !rt.requests[static_cast<std::size_t>(*request)].live ||
      !rt.requests[static_cast<std::size_t>(*request)].persistent ||
      rt.requests[static_cast<std::size_t>(*request)].active) {
    return rt.fail(MPI_COMM_WORLD, MPI_ERR_REQUEST,
                   "MPI_Start: " + std::to_string(*request) +
                       " is not an inactive persistent request (MPI_Send_init, MPI_Recv_init)");
  }
  PendingRequest& r = rt.requests[static_cast<std::size_t>(*request)];
  if (rt.comm(r.comm) == nullptr || rt.type(r.type) == nullptr) {
    return rt.fail(MPI_COMM_WORLD, MPI_ERR_REQUEST,
                   "MPI_Start: the request's communicator or datatype was freed");
  }
  r.active = true;
  start(r);
  return MPI_SUCCESS;
}

int MPI_Startall(int count, MPI_Request requests[]) {
  for (int i = 0; i < count; ++i) {
    if (int e = MPI_Start(&requests[i])) return e;
  }
  return MPI_SUCCESS;
}

int MPI_Cancel(MPI_Request* request) {
  Runtime& rt = Runtime::get();
  if (*request == MPI_REQUEST_NULL) return MPI_SUCCESS;
  PendingRequest& r = rt.requests[static_cast<std::size_t>(*request)];
  // A receive that has not matched is canceled; sends are not (MPI lets a cancel fail).
  if (r.kind == PendingRequest::kRecv) {
    r.cancel_requested = true;
    r.request.cancel();
  }
  return MPI_SUCCESS;
}

int MPI_Test_cancelled(const MPI_Status* status, int* flag) {
  *flag = status->ferry_cancelled;
  return MPI_SUCCESS;
}

// ---- Datatypes ----

int MPI_Type_size(MPI_Datatype handle, int* size) {
  Type* t = Runtime::get().type(handle);
  if (t == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE, "MPI_Type_size: not a datatype");
  }
  *size = static_cast<int>(t->size);
  return MPI_SUCCESS;
}

int MPI_Type_size_x(MPI_Datatype handle, MPI_Count* size) {
  int s = 0;
  const int e = MPI_Type_size(handle, &s);
  *size = s;
  return e;
}

int MPI_Type_get_extent(MPI_Datatype handle, MPI_Aint* lb, MPI_Aint* extent) {
  Type* t = Runtime::get().type(handle);
  if (t == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE, "MPI_Type_get_extent: not a datatype");
  }
  *lb = t->lb;
  *extent = t->extent;
  return MPI_SUCCESS;
}

int MPI_Type_get_true_extent(MPI_Datatype handle, MPI_Aint* lb, MPI_Aint* extent) {
  Type* t = Runtime::get().type(handle);
  if (t == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE,
                               "MPI_Type_get_true_extent: not a datatype");
  }
  std::ptrdiff_t low = 0;
  std::ptrdiff_t high = 0;
  for (std::size_t i = 0; i < t->blocks.size(); ++i) {
    const auto& b = t->blocks[i];
    const auto end = b.offset + static_cast<std::ptrdiff_t>(b.bytes);
    low = i == 0 ? b.offset : std::min(low, b.offset);
    high = i == 0 ? end : std::max(high, end);
  }
  *lb = low;
  *extent = high - low;
  return MPI_SUCCESS;
}

int MPI_Type_create_hvector(int count, int blocklength, MPI_Aint stride, MPI_Datatype oldtype,
                            MPI_Datatype* newtype) {
  Runtime& rt = Runtime::get();
  Type* old = rt.type(oldtype);
  if (old == nullptr || count < 0 || blocklength < 0) {
    return rt.fail(MPI_COMM_WORLD, old == nullptr ? MPI_ERR_TYPE : MPI_ERR_COUNT,
                   "MPI_Type_vector/hvector/contiguous: a bad old type or a negative count");
  }
  std::vector<std::ptrdiff_t> displacements;
  for (int i = 0; i < count; ++i) {
    for (int j = 0; j < blocklength; ++j) {
      displacements.push_back(static_cast<std::ptrdiff_t>(i) * stride +
                              static_cast<std::ptrdiff_t>(j) * old->extent);
    }
  }
  *newtype = rt.add_type(derive(*old, displacements));
  return MPI_SUCCESS;
}

int MPI_Type_contiguous(int count, MPI_Datatype oldtype, MPI_Datatype* newtype) {
  Type* old = Runtime::get().type(oldtype);
  return MPI_Type_create_hvector(count, 1, old != nullptr ? old->extent : 0, oldtype, newtype);
}

int MPI_Type_vector(int count, int blocklength, int stride, MPI_Datatype oldtype,
                    MPI_Datatype* newtype) {
  Type* old = Runtime::get().type(oldtype);
  return MPI_Type_create_hvector(count, blocklength,
                                 static_cast<MPI_Aint>(stride) * (old != nullptr ? old->extent : 0),
                                 oldtype, newtype);
}

int MPI_Type_indexed(int count, const int blocklengths[], const int displacements[],
                     MPI_Datatype oldtype, MPI_Datatype* newtype) {
  Runtime& rt = Runtime::get();
  Type* old = rt.type(oldtype);
  if (old == nullptr || count < 0) {
    return rt.fail(MPI_COMM_WORLD, old == nullptr ? MPI_ERR_TYPE : MPI_ERR_COUNT,
                   "MPI_Type_indexed: a bad old type or a negative count");
  }
  std::vector<std::ptrdiff_t> at;
  for (int i = 0; i < count; ++i) {
    if (blocklengths[i] < 0) {
      return rt.fail(MPI_COMM_WORLD, MPI_ERR_COUNT, "MPI_Type_indexed: a negative block length");
    }
    for (int j = 0; j < blocklengths[i]; ++j) {
      at.push_back((static_cast<std::ptrdiff_t>(displacements[i]) + j) * old->extent);
    }
  }
  *newtype = rt.add_type(derive(*old, at));
  return MPI_SUCCESS;
}

int MPI_Type_create_resized(MPI_Datatype oldtype, MPI_Aint lb, MPI_Aint extent,
                            MPI_Datatype* newtype) {
  Runtime& rt = Runtime::get();
  Type* old = rt.type(oldtype);
  if (old == nullptr) {
    return rt.fail(MPI_COMM_WORLD, MPI_ERR_TYPE, "MPI_Type_create_resized: not a datatype");
  }
  Type t = *old;
  t.predefined = false;
  t.committed = false;
  t.name = "derived";
  t.lb = lb;
  t.extent = extent;
  *newtype = rt.add_type(std::move(t));
  return MPI_SUCCESS;
}

int MPI_Type_commit(MPI_Datatype* handle) {
  Type* t = Runtime::get().type(*handle);
  if (t == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE, "MPI_Type_commit: not a datatype");
  }
  t->committed = true;
  return MPI_SUCCESS;
}

int MPI_Type_free(MPI_Datatype* handle) {
  Type* t = Runtime::get().type(*handle);
  if (t == nullptr || t->predefined) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE,
                               "MPI_Type_free: not a derived datatype");
  }
  *t = Type{};
  *handle = MPI_DATATYPE_NULL;
  return MPI_SUCCESS;
}

int MPI_Get_count(const MPI_Status* status, MPI_Datatype handle, int* count) {
  Type* t = Runtime::get().type(handle);
  if (t == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE, "MPI_Get_count: not a datatype");
  }
  const auto bytes = static_cast<std::size_t>(status->ferry_bytes);
  *count = t->size == 0           ? 0
           : bytes % t->size != 0 ? MPI_UNDEFINED
                                  : static_cast<int>(bytes / t->size);
  return MPI_SUCCESS;
}

int MPI_Get_elements(const MPI_Status* status, MPI_Datatype handle, int* count) {
  Type* t = Runtime::get().type(handle);
  if (t == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE, "MPI_Get_elements: not a datatype");
  }
  const auto bytes = static_cast<std::size_t>(status->ferry_bytes);
  const std::size_t unit = t->element ? ferry::size_of(*t->element) : t->size;
  *count = unit == 0 || bytes % unit != 0 ? MPI_UNDEFINED : static_cast<int>(bytes / unit);
  return MPI_SUCCESS;
}

int MPI_Type_get_name(MPI_Datatype handle, char* type_name, int* resultlen) {
  Type* t = Runtime::get().type(handle);
  if (t == nullptr) {
    return Runtime::get().fail(MPI_COMM_WORLD, MPI_ERR_TYPE, "MPI_Type_get_name: not a datatype");
  }
  std::snprintf(type_name, MPI_MAX_OBJECT_NAME, "%s", t->predefined ? t->name : "");
  *resultlen = static_cast<int>(std::strlen(type_name));
  return MPI_SUCCESS;
}

int MPI_Get_address(const void* location, MPI_Aint* address) {
  *address = reinterpret_cast<MPI_Aint>(location);
  return MPI_SUCCESS;
}

}  // extern "C"
