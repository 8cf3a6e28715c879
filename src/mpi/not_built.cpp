// MPI on ferry: the functions mpi.h declares for the programs that name them (OSU's utility code
// links them all) but that are not built yet: each fails with MPI_ERR_UNSUPPORTED_OPERATION,
// its message naming the function, through MPI_COMM_WORLD's error handler.
#include <string>

#include "mpi/runtime.hpp"

#pragma GCC diagnostic ignored "-Wunused-parameter"

namespace {

int not_built(const char* name) {
  return ferry::mpi::Runtime::get().fail(
      MPI_COMM_WORLD, MPI_ERR_UNSUPPORTED_OPERATION,
      std::string(name) + ": not built in ferry's MPI yet (docs/design/mpi.md lists what is)");
}

}  // namespace

extern "C" {

int MPI_Dims_create(int nnodes, int ndims, int dims[]) { return not_built("MPI_Dims_create"); }

int MPI_Cart_create(MPI_Comm comm, int ndims, const int dims[], const int periods[], int reorder,
                    MPI_Comm* comm_cart) {
  return not_built("MPI_Cart_create");
}

int MPI_Cart_rank(MPI_Comm comm, const int coords[], int* rank) {
  return not_built("MPI_Cart_rank");
}

int MPI_Cart_coords(MPI_Comm comm, int rank, int maxdims, int coords[]) {
  return not_built("MPI_Cart_coords");
}

int MPI_Dist_graph_create_adjacent(MPI_Comm comm, int indegree, const int sources[],
                                   const int sourceweights[], int outdegree,
                                   const int destinations[], const int destweights[], MPI_Info info,
                                   int reorder, MPI_Comm* comm_dist_graph) {
  return not_built("MPI_Dist_graph_create_adjacent");
}

int MPI_Dist_graph_neighbors(MPI_Comm comm, int maxindegree, int sources[], int sourceweights[],
                             int maxoutdegree, int destinations[], int destweights[]) {
  return not_built("MPI_Dist_graph_neighbors");
}

int MPI_Neighbor_allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                           int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  return not_built("MPI_Neighbor_allgather");
}

int MPI_Neighbor_allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                            void* recvbuf, const int recvcounts[], const int displs[],
                            MPI_Datatype recvtype, MPI_Comm comm) {
  return not_built("MPI_Neighbor_allgatherv");
}

int MPI_Neighbor_alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                          int recvcount, MPI_Datatype recvtype, MPI_Comm comm) {
  return not_built("MPI_Neighbor_alltoall");
}

int MPI_Neighbor_alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[],
                           MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                           const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm) {
  return not_built("MPI_Neighbor_alltoallv");
}

int MPI_Neighbor_alltoallw(const void* sendbuf, const int sendcounts[], const MPI_Aint sdispls[],
                           const MPI_Datatype sendtypes[], void* recvbuf, const int recvcounts[],
                           const MPI_Aint rdispls[], const MPI_Datatype recvtypes[],
                           MPI_Comm comm) {
  return not_built("MPI_Neighbor_alltoallw");
}

int MPI_Ineighbor_allgather(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                            void* recvbuf, int recvcount, MPI_Datatype recvtype, MPI_Comm comm,
                            MPI_Request* request) {
  return not_built("MPI_Ineighbor_allgather");
}

int MPI_Ineighbor_allgatherv(const void* sendbuf, int sendcount, MPI_Datatype sendtype,
                             void* recvbuf, const int recvcounts[], const int displs[],
                             MPI_Datatype recvtype, MPI_Comm comm, MPI_Request* request) {
  return not_built("MPI_Ineighbor_allgatherv");
}

int MPI_Ineighbor_alltoall(const void* sendbuf, int sendcount, MPI_Datatype sendtype, void* recvbuf,
                           int recvcount, MPI_Datatype recvtype, MPI_Comm comm,
                           MPI_Request* request) {
  return not_built("MPI_Ineighbor_alltoall");
}

int MPI_Ineighbor_alltoallv(const void* sendbuf, const int sendcounts[], const int sdispls[],
                            MPI_Datatype sendtype, void* recvbuf, const int recvcounts[],
                            const int rdispls[], MPI_Datatype recvtype, MPI_Comm comm,
                            MPI_Request* request) {
  return not_built("MPI_Ineighbor_alltoallv");
}

int MPI_Ineighbor_alltoallw(const void* sendbuf, const int sendcounts[], const MPI_Aint sdispls[],
                            const MPI_Datatype sendtypes[], void* recvbuf, const int recvcounts[],
                            const MPI_Aint rdispls[], const MPI_Datatype recvtypes[], MPI_Comm comm,
                            MPI_Request* request) {
  return not_built("MPI_Ineighbor_alltoallw");
}

int MPI_Win_create_dynamic(MPI_Info info, MPI_Comm comm, MPI_Win* win) {
  return not_built("MPI_Win_create_dynamic");
}

int MPI_Win_attach(MPI_Win win, void* base, MPI_Aint size) { return not_built("MPI_Win_attach"); }

}  // extern "C"
