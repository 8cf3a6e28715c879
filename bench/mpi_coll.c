/* The reference side of bench/coll_compare.sh: the same collective loops as ferry-perf's
 * allreduce, broadcast, allgather, reduce_scatter and reduce modes, written against MPI, so both
 * are measured the same way in one run.
 *   mpirun -np N mpi_coll allreduce|broadcast|allgather|reduce_scatter|reduce|barrier SIZE
 *     ITERATIONS (barrier: SIZE is unused, give 1)
 *     -> prints "LATENCY_US BUSBW_GBPS"
 * allreduce: MPI_Allreduce of SIZE/4 floats (MPI_SUM), separate send and receive buffers;
 * broadcast: MPI_Bcast of SIZE bytes from rank 0; allgather: MPI_Allgather in place of SIZE/N
 * bytes per rank (rounded down, as ferry-perf's); reduce_scatter: MPI_Reduce_scatter_block of
 * SIZE/4 floats into SIZE/4/N per rank;
 * reduce: MPI_Reduce of SIZE/4 floats (MPI_SUM) to rank 0. Warmup max(1, ITERATIONS/10), a barrier,
 * then ITERATIONS timed; the time per operation is the maximum over the ranks. Bus bandwidth as
 * NCCL defines it (1 GB = 1e9 bytes): allreduce SIZE/t * 2(N-1)/N, broadcast SIZE/t, allgather and
 * reduce_scatter SIZE/t * (N-1)/N. */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank, nranks;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &nranks);
  const int allreduce = argc >= 4 && strcmp(argv[1], "allreduce") == 0;
  const int broadcast = argc >= 4 && strcmp(argv[1], "broadcast") == 0;
  const int allgather = argc >= 4 && strcmp(argv[1], "allgather") == 0;
  const int reduce_scatter = argc >= 4 && strcmp(argv[1], "reduce_scatter") == 0;
  const int reduce = argc >= 4 && strcmp(argv[1], "reduce") == 0;
  const int barrier = argc >= 4 && strcmp(argv[1], "barrier") == 0; /* SIZE unused */
  const long size = argc >= 4 ? atol(argv[2]) : 0;
  const long iters = argc >= 4 ? atol(argv[3]) : 0;
  if ((!allreduce && !broadcast && !allgather && !reduce_scatter && !reduce && !barrier) ||
      size <= 0 || size > 0x7fffffffL || iters <= 0 ||
      ((allreduce || reduce_scatter || reduce) && size % 4 != 0) || (allgather && size < nranks) ||
      (reduce_scatter && size / 4 < nranks)) {
    if (rank == 0)
      fprintf(stderr,
              "usage: mpi_coll allreduce|broadcast|allgather|reduce_scatter|reduce|barrier SIZE "
              "ITERATIONS"
              " (SIZE > 0, a multiple of 4 for the reductions, at least N elements)\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const long warmup = iters / 10 > 0 ? iters / 10 : 1;
  const int count = (int)(size / 4);
  const long block = size / nranks; /* allgather: each rank's part */
  char* out = calloc(size, 1);
  char* in = calloc(size, 1);
  if (out == NULL || in == NULL) {
    fprintf(stderr, "mpi_coll: out of memory\n");
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  /* Small integers, so that N times them is exact in float. */
  if (allreduce || reduce_scatter || reduce) {
    for (int i = 0; i < count; ++i) ((float*)out)[i] = (float)(i % 13 + 1);
  } else if (allgather) {
    for (long i = 0; i < block; ++i) out[rank * block + i] = (char)((i + rank) % 251);
  } else {
    for (long i = 0; i < size; ++i) out[i] = rank == 0 ? (char)(i % 251) : 0;
  }

  double start = 0;
  for (long i = -warmup; i < iters; ++i) {
    if (i == 0) {
      MPI_Barrier(MPI_COMM_WORLD);
      start = MPI_Wtime();
    }
    if (barrier) {
      MPI_Barrier(MPI_COMM_WORLD);
    } else if (allreduce) {
      MPI_Allreduce(out, in, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (reduce) {
      MPI_Reduce(out, in, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    } else if (reduce_scatter) {
      MPI_Reduce_scatter_block(out, in, count / nranks, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (allgather) {
      MPI_Allgather(MPI_IN_PLACE, 0, MPI_BYTE, out, (int)block, MPI_BYTE, MPI_COMM_WORLD);
    } else {
      MPI_Bcast(out, (int)size, MPI_BYTE, 0, MPI_COMM_WORLD);
    }
  }
  const double per_op = (MPI_Wtime() - start) / (double)iters;

  int bad = 0;
  if (allreduce || reduce) {
    const int results = reduce && rank != 0 ? 0 : count; /* reduce: the root's only */
    for (int i = 0; i < results && !bad; ++i) bad = ((float*)in)[i] != (float)nranks * (i % 13 + 1);
  } else if (reduce_scatter) {
    const int first = rank * (count / nranks);
    for (int i = 0; i < count / nranks && !bad; ++i) {
      bad = ((float*)in)[i] != (float)nranks * ((first + i) % 13 + 1);
    }
  } else if (allgather) {
    for (long i = 0; i < block * nranks && !bad; ++i) {
      bad = out[i] != (char)((i % block + i / block) % 251);
    }
  } else if (!barrier) {
    for (long i = 0; i < size && !bad; ++i) bad = out[i] != (char)(i % 251);
  }
  if (bad) {
    fprintf(stderr, "mpi_coll: rank %d: wrong %s result\n", rank, argv[1]);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }

  double max_per_op = 0;
  MPI_Reduce(&per_op, &max_per_op, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    double busbw = (double)size / max_per_op / 1e9;
    if (allreduce) busbw *= 2.0 * (nranks - 1) / nranks;
    if (allgather || reduce_scatter) busbw *= (double)(nranks - 1) / nranks;
    printf("%.4f %.4f\n", max_per_op * 1e6, busbw);
  }
  free(out);
  free(in);
  MPI_Finalize();
  return 0;
}
