/* The reference side of bench/compare.sh: the same latency (half round trip) and window bandwidth
 * loops as ferry-perf, written against MPI, so both are measured the same way in one run.
 *   mpirun -np 2 mpi_pingpong latency|bandwidth SIZE ITERATIONS [WINDOW]   -> prints one number
 *   (latency in microseconds, bandwidth in GB/s, 1 GB = 1e9 bytes) */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (argc < 4) {
    if (rank == 0)
      fprintf(stderr, "usage: mpi_pingpong latency|bandwidth SIZE ITERATIONS [WINDOW]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const int latency = strcmp(argv[1], "latency") == 0;
  const long size = atol(argv[2]);
  const long iters = atol(argv[3]);
  const int window = argc > 4 ? atoi(argv[4]) : 64;
  const long warmup = iters / 10 > 0 ? iters / 10 : 1;
  const int peer = 1 - rank;
  char* out = calloc(size > 0 ? size : 1, 1);
  char* in = calloc(size > 0 ? size : 1, 1);
  MPI_Request* requests = calloc(window, sizeof(MPI_Request));
  double start = 0;
  for (long i = -warmup; i < iters; ++i) {
    if (i == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
    }
    if (latency) {
      if (rank == 0) {
        MPI_Send(out, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD);
        MPI_Recv(in, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(in, (int)size, MPI_BYTE, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(out, (int)size, MPI_BYTE, peer, 2, MPI_COMM_WORLD);
      }
    } else {
      int ack = 0;
      for (int w = 0; w < window; ++w) {
        if (rank == 0) {
          MPI_Isend(out, (int)size, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &requests[w]);
        } else {
          MPI_Irecv(in, (int)size, MPI_BYTE, peer, 3, MPI_COMM_WORLD, &requests[w]);
        }
      }
      MPI_Waitall(window, requests, MPI_STATUSES_IGNORE);
      if (rank == 0) {
        MPI_Recv(&ack, 1, MPI_INT, peer, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Send(&ack, 1, MPI_INT, peer, 4, MPI_COMM_WORLD);
      }
    }
  }
  double elapsed = MPI_Wtime() - start;
  if (rank == 0) {
    if (latency) {
      printf("%.4f\n", elapsed * 1e6 / (2.0 * iters));
    } else {
      printf("%.4f\n", (double)size * window * iters / elapsed / 1e9);
    }
  }
  free(out);
  free(in);
  free(requests);
  MPI_Finalize();
  return 0;
}
