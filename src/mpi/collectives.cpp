// MPI on ferry: the collectives of mpi.h, blocking and non-blocking, on ferry's Communicator.
// Data-moving collectives move bytes (their types must be contiguous); reductions need a type
// of one of ferry's element types and one of its operations.
#include <cstring>
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

}  // namespace

extern "C" {

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
                   MPI_Comm handle) {
  const char* what = "MPI_Allgatherv";
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
  return end(what, handle,
             recv.comm->coll.allgatherv(send, recvbuf, as_bytes(recvcounts, n, recv.bytes),
                                        as_bytes(displs, n, static_cast<std::size_t>(recv.extent)),
                                        ferry::DataType::kUint8));
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
                  MPI_Datatype recvtype, MPI_Comm handle) {
  const char* what = "MPI_Alltoallv";
  Call recv;
  Call send;
  if (int e = prepare(what, handle, recvtype, 1, false, &recv)) return e;
  if (sendbuf == MPI_IN_PLACE) {
    return Runtime::get().fail(handle, MPI_ERR_UNSUPPORTED_OPERATION,
                               std::string(what) + ": MPI_IN_PLACE is not built yet");
  }
  if (int e = prepare(what, handle, sendtype, 1, false, &send)) return e;
  const int n = recv.comm->size();
  return end(what, handle,
             recv.comm->coll.alltoallv(sendbuf, as_bytes(sendcounts, n, send.bytes),
                                       as_bytes(sdispls, n, static_cast<std::size_t>(send.extent)),
                                       recvbuf, as_bytes(recvcounts, n, recv.bytes),
                                       as_bytes(rdispls, n, static_cast<std::size_t>(recv.extent)),
                                       ferry::DataType::kUint8));
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
                       MPI_Datatype type, MPI_Op op, MPI_Comm handle) {
  const char* what = "MPI_Reduce_scatter";
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
    return reduce_scatter_block(what, sendbuf, recvbuf, recvcounts[0], type, op, handle, nullptr);
  }
  // Unequal blocks: the whole reduction on every member, each keeping its block.
  Call call;
  if (int e = prepare(what, handle, type, total, true, &call)) return e;
  std::vector<std::byte> all(call.bytes);
  const void* send = sendbuf == MPI_IN_PLACE ? recvbuf : sendbuf;
  if (int e = allreduce(what, send, all.data(), total, type, op, handle, nullptr)) return e;
  std::size_t offset = 0;
  const std::size_t unit = total > 0 ? call.bytes / static_cast<std::size_t>(total) : 0;
  for (int i = 0; i < comm->rank(); ++i) offset += static_cast<std::size_t>(recvcounts[i]) * unit;
  std::memcpy(recvbuf, all.data() + offset,
              static_cast<std::size_t>(recvcounts[comm->rank()]) * unit);
  return MPI_SUCCESS;
}

}  // extern "C"
