// MPI on ferry: the collectives of mpi.h, blocking and non-blocking, on ferry's Communicator.
// Data-moving collectives move bytes (their types must be contiguous); reductions need a type
// of one of ferry's element types and one of its operations.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "mpi/runtime.hpp"

using namespace ferry::mpi;  // NOLINT(google-build-using-namespace): the C functions below

namespace {

// The communicator, and `count` elements of `type` as ferry's elements: bytes (kUint8) for the
// collectives that move data, the element type for reductions.
struct Call {
  Comm* comm = nullptr;
  std::size_t bytes = 0;  // count * size
  ferry::DataType element = ferry::DataType::kUint8;
  std::size_t elements = 0;   // of `element`
  std::ptrdiff_t extent = 0;  // of one element of the MPI type
};

int prepare(const char* what, MPI_Comm handle, MPI_Datatype type, int count, bool reduction,
            Call* call) {
  Type* t = nullptr;
  if (int e = check_comm(what, handle, &call->comm)) return e;
  if (int e = check_type(what, handle, type, count, &t)) return e;
  Runtime& rt = Runtime::get();
  if (!t->contiguous()) {
    return rt.fail(handle, MPI_ERR_UNSUPPORTED_OPERATION,
                   std::string(what) +
                       ": a non-contiguous datatype in a collective is not built "
                       "in ferry's MPI yet");
  }
  call->bytes = static_cast<std::size_t>(count) * t->size;
  call->extent = t->extent;
  call->elements = call->bytes;
  if (reduction) {
    if (!t->element) {
      return rt.fail(handle, MPI_ERR_TYPE,
                     std::string(what) + ": reductions of " + t->name +
                         " are not built in ferry's MPI (integer and floating types are)");
    }
    call->element = *t->element;
    call->elements = static_cast<std::size_t>(count) * t->element_count;
  }
  return MPI_SUCCESS;
}

int operation(const char* what, MPI_Comm handle, MPI_Op op, ferry::ReduceOp* out) {
  switch (op) {
    case MPI_MAX:
      *out = ferry::ReduceOp::kMax;
      return MPI_SUCCESS;
    case MPI_MIN:
      *out = ferry::ReduceOp::kMin;
      return MPI_SUCCESS;
    case MPI_SUM:
      *out = ferry::ReduceOp::kSum;
      return MPI_SUCCESS;
    case MPI_PROD:
      *out = ferry::ReduceOp::kProd;
      return MPI_SUCCESS;
    case MPI_BAND:
      *out = ferry::ReduceOp::kBitAnd;
      return MPI_SUCCESS;
    case MPI_BOR:
      *out = ferry::ReduceOp::kBitOr;
      return MPI_SUCCESS;
    case MPI_BXOR:
      *out = ferry::ReduceOp::kBitXor;
      return MPI_SUCCESS;
    default:
      return Runtime::get().fail(
          handle, op > MPI_OP_NULL && op <= MPI_NO_OP ? MPI_ERR_UNSUPPORTED_OPERATION : MPI_ERR_OP,
          std::string(what) + ": operation " + std::to_string(op) +
              " is not built in ferry's MPI (MAX, MIN, SUM, PROD, BAND, BOR and BXOR are)");
  }
}

int check_root(const char* what, const Call& call, MPI_Comm handle, int root) {
  if (root >= 0 && root < call.comm->size()) return MPI_SUCCESS;
  return Runtime::get().fail(
      handle, MPI_ERR_ROOT,
      std::string(what) + ": root " + std::to_string(root) + " is not a member");
}

// The outcome of a blocking collective, or its request.
int end(const char* what, MPI_Comm handle, ferry::Status status) {
  return Runtime::get().fail(handle, what, status);
}
int started(ferry::Request request, MPI_Comm handle, MPI_Request* out,
            std::vector<std::byte> keep = {}) {
  PendingRequest r;
  r.kind = PendingRequest::kCollective;
  r.comm = handle;
  r.request = std::move(request);
  r.packed = std::move(keep);
  *out = Runtime::get().add_request(std::move(r));
  return MPI_SUCCESS;
}

const void* in_place(const void* send, const void* recv) {
  return send == MPI_IN_PLACE ? recv : send;
}

// The send and receive sides of a gather-like call move the same bytes per member.
int same_bytes(const char* what, MPI_Comm handle, const Call& send, const Call& recv) {
  if (send.bytes == recv.bytes) return MPI_SUCCESS;
  return Runtime::get().fail(handle, MPI_ERR_TRUNCATE,
                             std::string(what) + ": " + std::to_string(send.bytes) +
                                 " bytes sent per member but " + std::to_string(recv.bytes) +
                                 " received (the type signatures differ)");
}

int reduce(const char* what, const void* sendbuf, void* recvbuf, int count, MPI_Datatype type,
           MPI_Op op, int root, MPI_Comm handle, MPI_Request* request) {
  Call call;
  ferry::ReduceOp o{};
  if (int e = prepare(what, handle, type, count, true, &call)) return e;
  if (int e = operation(what, handle, op, &o)) return e;
  if (int e = check_root(what, call, handle, root)) return e;
  const void* send = in_place(sendbuf, recvbuf);
  if (request != nullptr) {
    return started(call.comm->coll.ireduce(send, recvbuf, call.elements, call.element, o, root),
                   handle, request);
  }
  return end(what, handle,
             call.comm->coll.reduce(send, recvbuf, call.elements, call.element, o, root));
}

int allreduce(const char* what, const void* sendbuf, void* recvbuf, int count, MPI_Datatype type,
              MPI_Op op, MPI_Comm handle, MPI_Request* request) {
  Call call;
  ferry::ReduceOp o{};
  if (int e = prepare(what, handle, type, count, true, &call)) return e;
  if (int e = operation(what, handle, op, &o)) return e;
  const void* send = in_place(sendbuf, recvbuf);
  if (request != nullptr) {
    return started(call.comm->coll.iallreduce(send, recvbuf, call.elements, call.element, o),
                   handle, request);
  }
  return end(what, handle,
             call.comm->coll.allreduce(send, recvbuf, call.elements, call.element, o));
}

int bcast(const char* what, void* buffer, int count, MPI_Datatype type, int root, MPI_Comm handle,
          MPI_Request* request) {
  Call call;
  if (int e = prepare(what, handle, type, count, false, &call)) return e;
  if (int e = check_root(what, call, handle, root)) return e;
  if (request != nullptr) {
    return started(call.comm->coll.ibroadcast(buffer, call.bytes, ferry::DataType::kUint8, root),
                   handle, request);
  }
  return end(what, handle,
             call.comm->coll.broadcast(buffer, call.bytes, ferry::DataType::kUint8, root));
}

int allgather(const char* what, const void* sendbuf, int sendcount, MPI_Datatype sendtype,
              void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm handle,
              MPI_Request* request) {
  Call recv;
  if (int e = prepare(what, handle, recvtype, recvcount, false, &recv)) return e;
  const void* send = static_cast<const std::byte*>(recvbuf) +
                     static_cast<std::ptrdiff_t>(recv.comm->rank()) * recvcount * recv.extent;
  if (sendbuf != MPI_IN_PLACE) {
    Call s;
    if (int e = prepare(what, handle, sendtype, sendcount, false, &s)) return e;
    if (int e = same_bytes(what, handle, s, recv)) return e;
    send = sendbuf;
  }
  if (request != nullptr) {
    return started(recv.comm->coll.iallgather(send, recvbuf, recv.bytes, ferry::DataType::kUint8),
                   handle, request);
  }
  return end(what, handle,
             recv.comm->coll.allgather(send, recvbuf, recv.bytes, ferry::DataType::kUint8));
}

int alltoall(const char* what, const void* sendbuf, int sendcount, MPI_Datatype sendtype,
             void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm handle,
             MPI_Request* request) {
  Call recv;
  if (int e = prepare(what, handle, recvtype, recvcount, false, &recv)) return e;
  std::vector<std::byte> copy;
  const void* send = sendbuf;
  if (sendbuf == MPI_IN_PLACE) {  // the data goes from a copy of the receive buffer
    copy.resize(recv.bytes * static_cast<std::size_t>(recv.comm->size()));
    std::memcpy(copy.data(), recvbuf, copy.size());
    send = copy.data();
  } else {
    Call s;
    if (int e = prepare(what, handle, sendtype, sendcount, false, &s)) return e;
    if (int e = same_bytes(what, handle, s, recv)) return e;
  }
  if (request != nullptr) {
    return started(recv.comm->coll.ialltoall(send, recvbuf, recv.bytes, ferry::DataType::kUint8),
                   handle, request, std::move(copy));
  }
  return end(what, handle,
             recv.comm->coll.alltoall(send, recvbuf, recv.bytes, ferry::DataType::kUint8));
}

int gather(const char* what, const void* sendbuf, int sendcount, MPI_Datatype sendtype,
           void* recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm handle,
           MPI_Request* request) {
  Comm* comm = nullptr;
  if (int e = check_comm(what, handle, &comm)) return e;
  const bool at_root = comm->rank() == root;
  Call recv;
  Call s;
  const void* send = sendbuf;
  if (at_root) {
    if (int e = prepare(what, handle, recvtype, recvcount, false, &recv)) return e;
    if (sendbuf == MPI_IN_PLACE) {
      send = static_cast<const std::byte*>(recvbuf) +
             static_cast<std::ptrdiff_t>(root) * recvcount * recv.extent;
      s = recv;
    }
  }
  if (send == sendbuf) {
    if (int e = prepare(what, handle, sendtype, sendcount, false, &s)) return e;
    if (at_root) {
      if (int e = same_bytes(what, handle, s, recv)) return e;
    }
  }
  if (int e = check_root(what, s, handle, root)) return e;
  if (request != nullptr) {
    return started(comm->coll.igather(send, recvbuf, s.bytes, ferry::DataType::kUint8, root),
                   handle, request);
  }
  return end(what, handle,
             comm->coll.gather(send, recvbuf, s.bytes, ferry::DataType::kUint8, root));
}

int scatter(const char* what, const void* sendbuf, int sendcount, MPI_Datatype sendtype,
            void* recvbuf, int recvcount, MPI_Datatype recvtype, int root, MPI_Comm handle,
            MPI_Request* request) {
  Comm* comm = nullptr;
  if (int e = check_comm(what, handle, &comm)) return e;
  const bool at_root = comm->rank() == root;
  Call send;
  Call r;
  void* recv = recvbuf;
  if (at_root) {
    if (int e = prepare(what, handle, sendtype, sendcount, false, &send)) return e;
    if (recvbuf == MPI_IN_PLACE) {
      recv = const_cast<std::byte*>(static_cast<const std::byte*>(sendbuf)) +
             static_cast<std::ptrdiff_t>(root) * sendcount * send.extent;
      r = send;
    }
  }
  if (recv == recvbuf) {
    if (int e = prepare(what, handle, recvtype, recvcount, false, &r)) return e;
    if (at_root) {
      if (int e = same_bytes(what, handle, send, r)) return e;
    }
  }
  if (int e = check_root(what, r, handle, root)) return e;
  if (request != nullptr) {
    return started(comm->coll.iscatter(sendbuf, recv, r.bytes, ferry::DataType::kUint8, root),
                   handle, request);
  }
  return end(what, handle,
             comm->coll.scatter(sendbuf, recv, r.bytes, ferry::DataType::kUint8, root));
}

int reduce_scatter_block(const char* what, const void* sendbuf, void* recvbuf, int recvcount,
                         MPI_Datatype type, MPI_Op op, MPI_Comm handle, MPI_Request* request) {
  Call call;
  ferry::ReduceOp o{};
  if (int e = prepare(what, handle, type, recvcount, true, &call)) return e;
  if (int e = operation(what, handle, op, &o)) return e;
  std::vector<std::byte> copy;
  const void* send = sendbuf;
  if (sendbuf == MPI_IN_PLACE) {  // the input is the whole receive buffer
    copy.resize(call.bytes * static_cast<std::size_t>(call.comm->size()));
    std::memcpy(copy.data(), recvbuf, copy.size());
    send = copy.data();
  }
  if (request != nullptr) {
    return started(call.comm->coll.ireduce_scatter(send, recvbuf, call.elements, call.element, o),
                   handle, request, std::move(copy));
  }
  return end(what, handle,
             call.comm->coll.reduce_scatter(send, recvbuf, call.elements, call.element, o));
}

// Counts and displacements in elements of a contiguous type, as bytes.
std::vector<std::size_t> as_bytes(const int* values, int n, std::size_t unit) {
  std::vector<std::size_t> out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i)
    out[static_cast<std::size_t>(i)] = static_cast<std::size_t>(values[i]) * unit;
  return out;
}

int allgatherv(const char* what, const void* sendbuf, int sendcount, MPI_Datatype sendtype,
               void* recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype,
               MPI_Comm handle, MPI_Request* request) {
  Call recv;
  if (int e = prepare(what, handle, recvtype, 1, false, &recv)) return e;
  const int n = recv.comm->size();
  const int me = recv.comm->rank();
  const void* send = static_cast<const std::byte*>(recvbuf) +
                     static_cast<std::ptrdiff_t>(displs[me]) * recv.extent;
  if (sendbuf != MPI_IN_PLACE) {
    Call s;
    if (int e = prepare(what, handle, sendtype, sendcount, false, &s)) return e;
    if (s.bytes != static_cast<std::size_t>(recvcounts[me]) * recv.bytes) {
      return Runtime::get().fail(handle, MPI_ERR_TRUNCATE,
                                 std::string(what) + ": sendcount does not match recvcounts[rank]");
    }
    send = sendbuf;
  }
  const std::vector<std::size_t> counts = as_bytes(recvcounts, n, recv.bytes);
  const std::vector<std::size_t> at = as_bytes(displs, n, static_cast<std::size_t>(recv.extent));
  if (request != nullptr) {
    return started(recv.comm->coll.iallgatherv(send, recvbuf, counts, at, ferry::DataType::kUint8),
                   handle, request);
  }
  return end(what, handle,
             recv.comm->coll.allgatherv(send, recvbuf, counts, at, ferry::DataType::kUint8));
}

int alltoallv(const char* what, const void* sendbuf, const int sendcounts[], const int sdispls[],
              MPI_Datatype sendtype, void* recvbuf, const int recvcounts[], const int rdispls[],
              MPI_Datatype recvtype, MPI_Comm handle, MPI_Request* request) {
  Call recv;
  Call send;
  if (int e = prepare(what, handle, recvtype, 1, false, &recv)) return e;
  if (sendbuf == MPI_IN_PLACE) {
    return Runtime::get().fail(handle, MPI_ERR_UNSUPPORTED_OPERATION,
                               std::string(what) + ": MPI_IN_PLACE is not built yet");
  }
  if (int e = prepare(what, handle, sendtype, 1, false, &send)) return e;
  const int n = recv.comm->size();
  const std::vector<std::size_t> sc = as_bytes(sendcounts, n, send.bytes);
  const std::vector<std::size_t> sd = as_bytes(sdispls, n, static_cast<std::size_t>(send.extent));
  const std::vector<std::size_t> rc = as_bytes(recvcounts, n, recv.bytes);
  const std::vector<std::size_t> rd = as_bytes(rdispls, n, static_cast<std::size_t>(recv.extent));
  if (request != nullptr) {
    return started(
        recv.comm->coll.ialltoallv(sendbuf, sc, sd, recvbuf, rc, rd, ferry::DataType::kUint8),
        handle, request);
  }
  return end(what, handle,
             recv.comm->coll.alltoallv(sendbuf, sc, sd, recvbuf, rc, rd, ferry::DataType::kUint8));
}

// Unequal blocks: the whole reduction on every member, each keeping its block (copied out of
// the whole once it is done).
int reduce_scatter(const char* what, const void* sendbuf, void* recvbuf, const int recvcounts[],
                   MPI_Datatype type, MPI_Op op, MPI_Comm handle, MPI_Request* request) {
  Comm* comm = nullptr;
  if (int e = check_comm(what, handle, &comm)) return e;
  const int n = comm->size();
  bool equal = true;
  int total = 0;
  for (int i = 0; i < n; ++i) {
    equal = equal && recvcounts[i] == recvcounts[0];
    total += recvcounts[i];
  }
  if (equal) {
    return reduce_scatter_block(what, sendbuf, recvbuf, recvcounts[0], type, op, handle, request);
  }
  Call call;
  ferry::ReduceOp o{};
  if (int e = prepare(what, handle, type, total, true, &call)) return e;
  if (int e = operation(what, handle, op, &o)) return e;
  const std::size_t unit = total > 0 ? call.bytes / static_cast<std::size_t>(total) : 0;
  std::size_t offset = 0;
  for (int i = 0; i < comm->rank(); ++i) offset += static_cast<std::size_t>(recvcounts[i]) * unit;
  const std::size_t mine = static_cast<std::size_t>(recvcounts[comm->rank()]) * unit;
  auto all = std::make_shared<std::vector<std::byte>>(call.bytes);
  const void* send = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
  if (request == nullptr) {
    if (int e = end(what, handle,
                    comm->coll.allreduce(send, all->data(), call.elements, call.element, o))) {
      return e;
    }
    std::memcpy(recvbuf, all->data() + offset, mine);
    return MPI_SUCCESS;
  }
  PendingRequest r;
  r.kind = PendingRequest::kCollective;
  r.comm = handle;
  r.request = comm->coll.iallreduce(send, all->data(), call.elements, call.element, o);
  r.after = [all, recvbuf, offset, mine] { std::memcpy(recvbuf, all->data() + offset, mine); };
  *request = Runtime::get().add_request(std::move(r));
  return MPI_SUCCESS;
}

// A collective built of sends and receives among the members (the v- and w-forms ferry's
// Communicator has not): each transfer a part of one request, the root's own block a message
// to itself (so that device memory moves as any other).
struct Transfers {
  PendingRequest r;
  Comm* comm = nullptr;
  int kind = 0;
  void send(const void* data, std::size_t bytes, int to) {
    r.parts.push_back(Runtime::get().context->isend(data, bytes,
                                                    comm->world_of[static_cast<std::size_t>(to)],
                                                    Runtime::internal_tag(*comm, kind)));
  }
  void recv(void* data, std::size_t bytes, int from) {
    r.parts.push_back(Runtime::get().context->irecv(data, bytes,
                                                    comm->world_of[static_cast<std::size_t>(from)],
                                                    Runtime::internal_tag(*comm, kind)));
  }
  // Blocking (request null): waits for every part; else the request.
  int finish(const char* what, MPI_Comm handle, MPI_Request* request) {
    r.kind = PendingRequest::kCollective;
    r.comm = handle;
    if (request != nullptr) {
      *request = Runtime::get().add_request(std::move(r));
      return MPI_SUCCESS;
    }
    ferry::Status s;
    for (ferry::Request& part : r.parts) {
      const ferry::Status p = part.wait();
      if (s.is_ok()) s = p;
    }
    return end(what, handle, s);
  }
};
enum InternalKind { kGatherv = 1, kScatterv, kAlltoallw };

// A contiguous type's element size and extent, or an error.
int contiguous(const char* what, MPI_Comm handle, MPI_Datatype type, Type** t) {
  if (int e = check_type(what, handle, type, 0, t)) return e;
  if ((*t)->contiguous()) return MPI_SUCCESS;
  return Runtime::get().fail(handle, MPI_ERR_UNSUPPORTED_OPERATION,
                             std::string(what) +
                                 ": a non-contiguous datatype in a collective is "
                                 "not built in ferry's MPI yet");
}

int gatherv(const char* what, const void* sendbuf, int sendcount, MPI_Datatype sendtype,
            void* recvbuf, const int recvcounts[], const int displs[], MPI_Datatype recvtype,
            int root, MPI_Comm handle, MPI_Request* request) {
  Transfers t;
  t.kind = kGatherv;
  if (int e = check_comm(what, handle, &t.comm)) return e;
  Call root_check;
  root_check.comm = t.comm;
  if (int e = check_root(what, root_check, handle, root)) return e;
  const int me = t.comm->rank();
  Type* st = nullptr;
  if (sendbuf != MPI_IN_PLACE || me != root) {
    if (int e = contiguous(what, handle, sendtype, &st)) return e;
    t.send(sendbuf, static_cast<std::size_t>(sendcount) * st->size, root);
  }
  if (me == root) {
    Type* rt = nullptr;
    if (int e = contiguous(what, handle, recvtype, &rt)) return e;
    for (int r = 0; r < t.comm->size(); ++r) {
      if (r == me && sendbuf == MPI_IN_PLACE) continue;
      t.recv(static_cast<std::byte*>(recvbuf) + static_cast<std::ptrdiff_t>(displs[r]) * rt->extent,
             static_cast<std::size_t>(recvcounts[r]) * rt->size, r);
    }
  }
  return t.finish(what, handle, request);
}

int scatterv(const char* what, const void* sendbuf, const int sendcounts[], const int displs[],
             MPI_Datatype sendtype, void* recvbuf, int recvcount, MPI_Datatype recvtype, int root,
             MPI_Comm handle, MPI_Request* request) {
  Transfers t;
  t.kind = kScatterv;
  if (int e = check_comm(what, handle, &t.comm)) return e;
  Call root_check;
  root_check.comm = t.comm;
  if (int e = check_root(what, root_check, handle, root)) return e;
  const int me = t.comm->rank();
  if (recvbuf != MPI_IN_PLACE || me != root) {
    Type* rt = nullptr;
    if (int e = contiguous(what, handle, recvtype, &rt)) return e;
    t.recv(recvbuf, static_cast<std::size_t>(recvcount) * rt->size, root);
  }
  if (me == root) {
    Type* st = nullptr;
    if (int e = contiguous(what, handle, sendtype, &st)) return e;
    for (int r = 0; r < t.comm->size(); ++r) {
      if (r == me && recvbuf == MPI_IN_PLACE) continue;
      t.send(static_cast<const std::byte*>(sendbuf) +
                 static_cast<std::ptrdiff_t>(displs[r]) * st->extent,
             static_cast<std::size_t>(sendcounts[r]) * st->size, r);
    }
  }
  return t.finish(what, handle, request);
}

// Displacements in bytes, a type per member.
int alltoallw(const char* what, const void* sendbuf, const int sendcounts[], const int sdispls[],
              const MPI_Datatype sendtypes[], void* recvbuf, const int recvcounts[],
              const int rdispls[], const MPI_Datatype recvtypes[], MPI_Comm handle,
              MPI_Request* request) {
  Transfers t;
  t.kind = kAlltoallw;
  if (int e = check_comm(what, handle, &t.comm)) return e;
  if (sendbuf == MPI_IN_PLACE) {
    return Runtime::get().fail(handle, MPI_ERR_UNSUPPORTED_OPERATION,
                               std::string(what) + ": MPI_IN_PLACE is not built yet");
  }
  for (int r = 0; r < t.comm->size(); ++r) {
    Type* rt = nullptr;
    if (int e = contiguous(what, handle, recvtypes[r], &rt)) return e;
    t.recv(static_cast<std::byte*>(recvbuf) + rdispls[r],
           static_cast<std::size_t>(recvcounts[r]) * rt->size, r);
  }
  for (int r = 0; r < t.comm->size(); ++r) {
    Type* st = nullptr;
    if (int e = contiguous(what, handle, sendtypes[r], &st)) return e;
    t.send(static_cast<const std::byte*>(sendbuf) + sdispls[r],
           static_cast<std::size_t>(sendcounts[r]) * st->size, r);
  }
  return t.finish(what, handle, request);
}

}  // namespace

extern "C" {

int MPI_Gatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
                MPI_Comm comm) {
  return gatherv("MPI_Gatherv", sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs, recvtype,
                 root, comm, nullptr);
}

int MPI_Igatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                 const int recvcounts[], const int displs[], MPI_Datatype recvtype, int root,
                 MPI_Comm comm, MPI_Request* request) {
  return gatherv("MPI_Igatherv", sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                 recvtype, root, comm, request);
}

int MPI_Scatterv(const void* sendbuf, const int sendcounts[], const int displs[],
                 MPI_Datatype sendtype, void* recvbuf, int recvcount, MPI_Datatype recvtype,
                 int root, MPI_Comm comm) {
  return scatterv("MPI_Scatterv", sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount,
                  recvtype, root, comm, nullptr);
}

int MPI_Iscatterv(const void* sendbuf, const int sendcounts[], const int displs[],
                  MPI_Datatype sendtype, void* recvbuf, int recvcount, MPI_Datatype recvtype,
                  int root, MPI_Comm comm, MPI_Request* request) {
  return scatterv("MPI_Iscatterv", sendbuf, sendcounts, displs, sendtype, recvbuf, recvcount,
                  recvtype, root, comm, request);
}

int MPI_Alltoallw(const void* sendbuf, const int sendcounts[], const int sdispls[],
                  const MPI_Datatype sendtypes[], void* recvbuf, const int recvcounts[],
                  const int rdispls[], const MPI_Datatype recvtypes[], MPI_Comm comm) {
  return alltoallw("MPI_Alltoallw", sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                   rdispls, recvtypes, comm, nullptr);
}

int MPI_Ialltoallw(const void* sendbuf, const int sendcounts[], const int sdispls[],
                   const MPI_Datatype sendtypes[], void* recvbuf, const int recvcounts[],
                   const int rdispls[], const MPI_Datatype recvtypes[], MPI_Comm comm,
                   MPI_Request* request) {
  return alltoallw("MPI_Ialltoallw", sendbuf, sendcounts, sdispls, sendtypes, recvbuf, recvcounts,
                   rdispls, recvtypes, comm, request);
}

int MPI_Barrier(MPI_Comm handle) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Barrier", handle, &comm)) return e;
  return end("MPI_Barrier", handle, comm->coll.barrier());
}

int MPI_Ibarrier(MPI_Comm handle, MPI_Request* request) {
  Comm* comm = nullptr;
  if (int e = check_comm("MPI_Ibarrier", handle, &comm)) return e;
  return started(comm->coll.ibarrier(), handle, request);
}

int MPI_Bcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm) {
  return bcast("MPI_Bcast", buffer, count, type, root, comm, nullptr);
}

int MPI_Ibcast(void* buffer, int count, MPI_Datatype type, int root, MPI_Comm comm,
               MPI_Request* request) {
  return bcast("MPI_Ibcast", buffer, count, type, root, comm, request);
}

int MPI_Reduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
               int root, MPI_Comm comm) {
  return reduce("MPI_Reduce", sendbuf, recvbuf, count, type, op, root, comm, nullptr);
}

int MPI_Ireduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
                int root, MPI_Comm comm, MPI_Request* request) {
  return reduce("MPI_Ireduce", sendbuf, recvbuf, count, type, op, root, comm, request);
}

int MPI_Allreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
                  MPI_Comm comm) {
  return allreduce("MPI_Allreduce", sendbuf, recvbuf, count, type, op, comm, nullptr);
}

int MPI_Iallreduce(const void* sendbuf, void* recvbuf, int count, MPI_Datatype type, MPI_Op op,
                   MPI_Comm comm, MPI_Request* request) {
  return allreduce("MPI_Iallreduce", sendbuf, recvbuf, count, type, op, comm, request);
}

int MPI_Allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  return allgather("MPI_Allgather", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                   comm, nullptr);
}

int MPI_Iallgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                   int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  return allgather("MPI_Iallgather", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype,
                   comm, request);
}

int MPI_Allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                   const int recvcounts[], const int displs[], MPI_Datatype recvtype,
                   MPI_Comm comm) {
  return allgatherv("MPI_Allgatherv", sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                    recvtype, comm, nullptr);
}

int MPI_Iallgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                    const int recvcounts[], const int displs[], MPI_Datatype recvtype,
                    MPI_Comm comm, MPI_Request* request) {
  return allgatherv("MPI_Iallgatherv", sendbuf, sendcount, sendtype, recvbuf, recvcounts, displs,
                    recvtype, comm, request);
}

int MPI_Alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                 int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  return alltoall("MPI_Alltoall", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                  nullptr);
}

int MPI_Ialltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                  int recvcount, MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  return alltoall("MPI_Ialltoall", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, comm,
                  request);
}

int MPI_Alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[],
                  MPI_Datatype sendtype, void* recvbuf, const int recvcounts[], const int rdispls[],
                  MPI_Datatype recvtype, MPI_Comm comm) {
  return alltoallv("MPI_Alltoallv", sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                   rdispls, recvtype, comm, nullptr);
}

int MPI_Ialltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[],
                   MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                   const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                   MPI_Request* request) {
  return alltoallv("MPI_Ialltoallv", sendbuf, sendcounts, sdispls, sendtype, recvbuf, recvcounts,
                   rdispls, recvtype, comm, request);
}

int MPI_Gather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
               int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm) {
  return gather("MPI_Gather", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                comm, nullptr);
}

int MPI_Igather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm,
                MPI_Request* request) {
  return gather("MPI_Igather", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                comm, request);
}

int MPI_Scatter(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm) {
  return scatter("MPI_Scatter", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                 comm, nullptr);
}

int MPI_Iscatter(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                 int recvcount, MPI_Datatype recvtype, int root, MPI_Comm comm,
                 MPI_Request* request) {
  return scatter("MPI_Iscatter", sendbuf, sendcount, sendtype, recvbuf, recvcount, recvtype, root,
                 comm, request);
}

int MPI_Reduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype type,
                             MPI_Op op, MPI_Comm comm) {
  return reduce_scatter_block("MPI_Reduce_scatter_block", sendbuf, recvbuf, recvcount, type, op,
                              comm, nullptr);
}

int MPI_Ireduce_scatter_block(const void* sendbuf, void* recvbuf, int recvcount, MPI_Datatype type,
                              MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  return reduce_scatter_block("MPI_Ireduce_scatter_block", sendbuf, recvbuf, recvcount, type, op,
                              comm, request);
}

int MPI_Reduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[],
                       MPI_Datatype type, MPI_Op op, MPI_Comm comm) {
  return reduce_scatter("MPI_Reduce_scatter", sendbuf, recvbuf, recvcounts, type, op, comm,
                        nullptr);
}

int MPI_Ireduce_scatter(const void* sendbuf, void* recvbuf, const int recvcounts[],
                        MPI_Datatype type, MPI_Op op, MPI_Comm comm, MPI_Request* request) {
  return reduce_scatter("MPI_Ireduce_scatter", sendbuf, recvbuf, recvcounts, type, op, comm,
                        request);
}

}  // extern "C"
