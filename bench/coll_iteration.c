/* One collective, then MPI_Barrier, in a loop, as OSU's osu_bcast, osu_reduce, ... time it, but
 * timing both parts on every rank: OSU reports the collective's part alone, averaged over the
 * ranks, and where a collective ends depends on the order in which the barrier before it let the
 * ranks go (a broadcast's readers that leave the barrier after the root find its data there, a
 * reduce's root that leaves it last finds the others' inputs there), so that part moves between
 * the collective and the barrier from one MPI to another while the iteration does not.
 * Prints, for rank 0: the collective's and the barrier's time per iteration averaged over the
 * ranks, their sum, and each rank's collective time.
 *   coll_iteration bcast|reduce|allreduce|allgather|reduce_scatter BYTES [ITERATIONS] */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  if (argc < 3) {
    if (rank == 0) fprintf(stderr, "usage: coll_iteration COLLECTIVE BYTES [ITERATIONS]\n");
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  const char* what = argv[1];
  const int bytes = atoi(argv[2]);
  const int iterations = argc > 3 ? atoi(argv[3]) : 10000;
  const int skip = iterations / 10;
  const int count = bytes / 4 > 0 ? bytes / 4 : 1; /* floats, as OSU's reductions */
  float* in = calloc((size_t)count * size, sizeof(float));
  float* out = calloc((size_t)count * size, sizeof(float));
  double in_call = 0, in_barrier = 0;
  for (int i = 0; i < iterations + skip; ++i) {
    const double t0 = MPI_Wtime();
    if (strcmp(what, "bcast") == 0) {
      MPI_Bcast(in, bytes, MPI_CHAR, 0, MPI_COMM_WORLD);
    } else if (strcmp(what, "reduce") == 0) {
      MPI_Reduce(in, out, count, MPI_FLOAT, MPI_SUM, 0, MPI_COMM_WORLD);
    } else if (strcmp(what, "allreduce") == 0) {
      MPI_Allreduce(in, out, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    } else if (strcmp(what, "allgather") == 0) {
      MPI_Allgather(in, bytes, MPI_CHAR, out, bytes, MPI_CHAR, MPI_COMM_WORLD);
    } else if (strcmp(what, "reduce_scatter") == 0) {
      MPI_Reduce_scatter_block(in, out, count / size > 0 ? count / size : 1, MPI_FLOAT, MPI_SUM,
                               MPI_COMM_WORLD);
    } else {
      if (rank == 0) fprintf(stderr, "coll_iteration: unknown collective %s\n", what);
      MPI_Abort(MPI_COMM_WORLD, 2);
    }
    const double t1 = MPI_Wtime();
    MPI_Barrier(MPI_COMM_WORLD);
    const double t2 = MPI_Wtime();
    if (i >= skip) {
      in_call += t1 - t0;
      in_barrier += t2 - t1;
    }
  }
  double mine[2] = {in_call * 1e6 / iterations, in_barrier * 1e6 / iterations};
  double* all = malloc(sizeof(double) * 2 * (size_t)size);
  MPI_Gather(mine, 2, MPI_DOUBLE, all, 2, MPI_DOUBLE, 0, MPI_COMM_WORLD);
  if (rank == 0) {
    double call = 0, barrier = 0;
    for (int r = 0; r < size; ++r) {
      call += all[2 * r] / size;
      barrier += all[2 * r + 1] / size;
    }
    printf("%s %d call %.3f barrier %.3f iteration %.3f ranks", what, bytes, call, barrier,
           call + barrier);
    for (int r = 0; r < size; ++r) printf(" %.3f", all[2 * r]);
    printf("\n");
  }
  free(all);
  free(in);
  free(out);
  MPI_Finalize();
  return 0;
}
