/* ferry's MPI, as an MPI program sees it: point-to-point (matching, wildcards, statuses,
 * truncation, derived types), every collective and its non-blocking forms, communicators, and
 * the error handlers. Run under ferryrun (mpiexec) with 2 or more ranks; `mpi_test fatal`
 * checks that an error under MPI_ERRORS_ARE_FATAL ends the job with ferry's reason. */
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int rank, size, checks, failures;

static void check(int ok, const char* what) {
  ++checks;
  if (!ok) {
    ++failures;
    fprintf(stderr, "rank %d: FAILED: %s\n", rank, what);
  }
}

static int error_class(int code) {
  int c = 0;
  MPI_Error_class(code, &c);
  return c;
}

static void point_to_point(void) {
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  {
    /* A receive canceled before it matched completes, canceled, without an error (the default
     * handler is fatal: an error would end the job); one that matched is not canceled. */
    int x = 0, flag = -1;
    MPI_Request r;
    MPI_Status st;
    MPI_Irecv(&x, 1, MPI_INT, MPI_ANY_SOURCE, 99, MPI_COMM_WORLD, &r);
    MPI_Cancel(&r);
    const int e = MPI_Wait(&r, &st);
    MPI_Test_cancelled(&st, &flag);
    check(e == MPI_SUCCESS && flag == 1 && r == MPI_REQUEST_NULL, "MPI_Cancel of a receive");
    int y = rank;
    MPI_Irecv(&x, 1, MPI_INT, left, 98, MPI_COMM_WORLD, &r);
    MPI_Send(&y, 1, MPI_INT, right, 98, MPI_COMM_WORLD);
    MPI_Wait(&r, &st);
    MPI_Cancel(&r); /* MPI_REQUEST_NULL: nothing */
    MPI_Test_cancelled(&st, &flag);
    check(flag == 0 && x == left, "a matched receive is not canceled");
  }
  const int counts[] = {0, 1, 1000, 300000}; /* eager and rendezvous */
  for (int i = 0; i < 4; ++i) {
    const int n = counts[i];
    int* out = malloc(sizeof(int) * (size_t)(n + 1));
    int* in = malloc(sizeof(int) * (size_t)(n + 1));
    for (int k = 0; k < n; ++k) out[k] = rank * 1000003 + k;
    MPI_Request r;
    MPI_Status st;
    MPI_Irecv(in, n, MPI_INT, left, 7, MPI_COMM_WORLD, &r);
    MPI_Send(out, n, MPI_INT, right, 7, MPI_COMM_WORLD);
    MPI_Wait(&r, &st);
    int got = -1, ok = 1;
    MPI_Get_count(&st, MPI_INT, &got);
    for (int k = 0; k < n; ++k) ok = ok && in[k] == left * 1000003 + k;
    check(ok && got == n && st.MPI_SOURCE == left && st.MPI_TAG == 7 && r == MPI_REQUEST_NULL,
          "ring send/recv: data, count, source, tag");
    free(out);
    free(in);
  }

  /* MPI_Issend of a small message: not complete until the receiver has matched it (MPI_Isend's
   * of the same size completes alone: eager); MPI_Ssend to a receiver that posts later. */
  {
    int out = rank, in = -1, eager = rank + 50, got = -1, done = 0, eager_done = 0;
    MPI_Request s, e;
    MPI_Issend(&out, 1, MPI_INT, right, 11, MPI_COMM_WORLD, &s);
    MPI_Isend(&eager, 1, MPI_INT, right, 12, MPI_COMM_WORLD, &e);
    MPI_Barrier(MPI_COMM_WORLD); /* every send is out; no receive is posted yet */
    const double until = MPI_Wtime() + 0.05;
    int early = 0;
    while (MPI_Wtime() < until) {
      if (!done) MPI_Test(&s, &done, MPI_STATUS_IGNORE);
      if (done) early = 1;
      if (!eager_done) MPI_Test(&e, &eager_done, MPI_STATUS_IGNORE);
    }
    /* However slow the run (a sanitizer), the standard send ends without its receive. */
    const double limit = MPI_Wtime() + 20;
    while (!eager_done && MPI_Wtime() < limit) MPI_Test(&e, &eager_done, MPI_STATUS_IGNORE);
    check(!early, "MPI_Issend: not complete before its receive is posted");
    check(eager_done, "MPI_Isend of 4 bytes: complete without its receive (eager)");
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Recv(&in, 1, MPI_INT, left, 11, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Recv(&got, 1, MPI_INT, left, 12, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    if (!done) MPI_Wait(&s, MPI_STATUS_IGNORE);
    if (!eager_done) MPI_Wait(&e, MPI_STATUS_IGNORE);
    check(in == left && got == left + 50, "MPI_Issend/MPI_Isend: data");
    /* Alone, a synchronous send to itself would wait for a receive it has not posted. */
    if (size > 1) {
      int one = rank * 3, back = -1;
      if (rank == 0) {
        MPI_Ssend(&one, 1, MPI_INT, right, 13, MPI_COMM_WORLD);
        MPI_Recv(&back, 1, MPI_INT, left, 13, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(&back, 1, MPI_INT, left, 13, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Ssend(&one, 1, MPI_INT, right, 13, MPI_COMM_WORLD);
      }
      check(back == left * 3, "MPI_Ssend around the ring");
    }
  }

  /* Wildcards: rank 0 takes one message from each other rank, by any source and any tag. */
  if (rank == 0) {
    int seen = 0;
    for (int i = 1; i < size; ++i) {
      int v = -1;
      MPI_Status st;
      MPI_Recv(&v, 1, MPI_INT, MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
      check(v == st.MPI_SOURCE * 10 && st.MPI_TAG == 100 + st.MPI_SOURCE,
            "MPI_ANY_SOURCE/MPI_ANY_TAG: the status names the sender and its tag");
      seen |= 1 << st.MPI_SOURCE;
    }
    check(seen == ((1 << size) - 2), "one message from each rank");
  } else {
    int v = rank * 10;
    MPI_Send(&v, 1, MPI_INT, 0, 100 + rank, MPI_COMM_WORLD);
  }
  MPI_Barrier(MPI_COMM_WORLD); /* no later message meets those wildcards */

  /* Probe, then receive what it announced. */
  if (rank == 1) {
    double d[5] = {1, 2, 3, 4, 5};
    MPI_Send(d, 5, MPI_DOUBLE, 0, 3, MPI_COMM_WORLD);
  } else if (rank == 0) {
    MPI_Status st;
    int flag = 0, n = 0;
    MPI_Probe(1, 3, MPI_COMM_WORLD, &st);
    MPI_Get_count(&st, MPI_DOUBLE, &n);
    MPI_Iprobe(1, 3, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE);
    double d[5] = {0};
    MPI_Recv(d, n, MPI_DOUBLE, st.MPI_SOURCE, st.MPI_TAG, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    check(n == 5 && flag == 1 && d[4] == 5.0, "MPI_Probe and MPI_Iprobe see the message");
  }

  /* MPI_PROC_NULL: nothing moves, the status says so. */
  {
    int v = 1;
    MPI_Status st;
    MPI_Send(&v, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD);
    MPI_Recv(&v, 1, MPI_INT, MPI_PROC_NULL, 0, MPI_COMM_WORLD, &st);
    int n = -1;
    MPI_Get_count(&st, MPI_INT, &n);
    check(st.MPI_SOURCE == MPI_PROC_NULL && n == 0 && v == 1, "MPI_PROC_NULL");
  }

  /* Truncation under MPI_ERRORS_RETURN. */
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  if (rank == 0) {
    int v[10] = {0};
    MPI_Send(v, 10, MPI_INT, 1, 9, MPI_COMM_WORLD);
  } else if (rank == 1) {
    int v[5];
    MPI_Status st;
    const int e = MPI_Recv(v, 5, MPI_INT, 0, 9, MPI_COMM_WORLD, &st);
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(e, text, &len);
    check(error_class(e) == MPI_ERR_TRUNCATE && len > 0, "a too small receive: MPI_ERR_TRUNCATE");
  }
  {
    int v = 0;
    const int e = MPI_Send(&v, 1, MPI_INT, size, 0, MPI_COMM_WORLD);
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(e, text, &len);
    check(error_class(e) == MPI_ERR_RANK && strstr(text, "MPI_Send") != NULL,
          "a send to a rank out of range: MPI_ERR_RANK naming the function");
  }

  /* A derived type: the column of a 4x4 matrix goes out as 4 ints and comes back as a column. */
  {
    MPI_Datatype column;
    MPI_Type_vector(4, 1, 4, MPI_INT, &column);
    MPI_Type_commit(&column);
    int size_bytes = 0;
    MPI_Aint lb = 0, extent = 0;
    MPI_Type_size(column, &size_bytes);
    MPI_Type_get_extent(column, &lb, &extent);
    check(size_bytes == 16 && extent == 13 * 4, "MPI_Type_vector's size and extent");
    int m[16], flat[4], back[16];
    for (int k = 0; k < 16; ++k) m[k] = rank * 100 + k, back[k] = -1;
    MPI_Sendrecv(m + 1, 1, column, right, 11, flat, 4, MPI_INT, left, 11, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    check(flat[0] == left * 100 + 1 && flat[3] == left * 100 + 13, "a column sent as a vector");
    MPI_Sendrecv(flat, 4, MPI_INT, right, 12, back + 2, 1, column, left, 12, MPI_COMM_WORLD,
                 MPI_STATUS_IGNORE);
    const int l2 = (rank + size - 2) % size;
    check(back[2] == l2 * 100 + 1 && back[14] == l2 * 100 + 13 && back[3] == -1 && back[0] == -1,
          "received into a vector: the column only");
    MPI_Type_free(&column);
  }
}

static void collectives(MPI_Comm comm) {
  int me, n;
  MPI_Comm_rank(comm, &me);
  MPI_Comm_size(comm, &n);
  check(MPI_Barrier(comm) == MPI_SUCCESS, "MPI_Barrier");

  double b[100];
  const int root = 1 % n;
  for (int k = 0; k < 100; ++k) b[k] = me == root ? k * 0.5 : -1;
  MPI_Bcast(b, 100, MPI_DOUBLE, root, comm);
  check(b[0] == 0 && b[99] == 49.5, "MPI_Bcast");

  int v = me + 1, sum = 0;
  MPI_Reduce(&v, &sum, 1, MPI_INT, MPI_SUM, 0, comm);
  if (me == 0) check(sum == n * (n + 1) / 2, "MPI_Reduce SUM");
  double x = me, mx = -1, mn = -1;
  MPI_Allreduce(&x, &mx, 1, MPI_DOUBLE, MPI_MAX, comm);
  MPI_Allreduce(&x, &mn, 1, MPI_DOUBLE, MPI_MIN, comm);
  long long s = me;
  MPI_Allreduce(MPI_IN_PLACE, &s, 1, MPI_LONG_LONG, MPI_SUM, comm);
  check(mx == n - 1 && mn == 0 && s == (long long)n * (n - 1) / 2, "MPI_Allreduce MAX/MIN/SUM");

  int* all = malloc(sizeof(int) * (size_t)n * 2);
  int pair[2] = {me, -me};
  MPI_Allgather(pair, 2, MPI_INT, all, 2, MPI_INT, comm);
  int ok = 1;
  for (int r = 0; r < n; ++r) ok = ok && all[2 * r] == r && all[2 * r + 1] == -r;
  check(ok, "MPI_Allgather");
  for (int r = 0; r < n; ++r) all[r] = r == me ? me * 7 : -1;
  MPI_Allgather(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, all, 1, MPI_INT, comm);
  ok = 1;
  for (int r = 0; r < n; ++r) ok = ok && all[r] == r * 7;
  check(ok, "MPI_Allgather in place");

  int* to = malloc(sizeof(int) * (size_t)n);
  int* from = malloc(sizeof(int) * (size_t)n);
  for (int r = 0; r < n; ++r) to[r] = me * 100 + r;
  MPI_Alltoall(to, 1, MPI_INT, from, 1, MPI_INT, comm);
  ok = 1;
  for (int r = 0; r < n; ++r) ok = ok && from[r] == r * 100 + me;
  check(ok, "MPI_Alltoall");

  MPI_Gather(&me, 1, MPI_INT, all, 1, MPI_INT, root, comm);
  if (me == root) {
    ok = 1;
    for (int r = 0; r < n; ++r) ok = ok && all[r] == r;
    check(ok, "MPI_Gather");
  }
  for (int r = 0; r < n; ++r) to[r] = r * 3;
  int got = -1;
  MPI_Scatter(to, 1, MPI_INT, &got, 1, MPI_INT, root, comm);
  check(got == me * 3, "MPI_Scatter");

  for (int r = 0; r < n; ++r) to[r] = r + me;
  MPI_Reduce_scatter_block(to, &got, 1, MPI_INT, MPI_SUM, comm);
  check(got == n * me + n * (n - 1) / 2, "MPI_Reduce_scatter_block");
  /* Unequal blocks: member r gets r + 1 elements. */
  int total = n * (n + 1) / 2;
  int* counts = malloc(sizeof(int) * (size_t)n);
  int* displs = malloc(sizeof(int) * (size_t)n);
  int* in = malloc(sizeof(int) * (size_t)total);
  int* res = malloc(sizeof(int) * (size_t)total);
  for (int r = 0, d = 0; r < n; ++r) counts[r] = r + 1, displs[r] = d, d += r + 1;
  for (int k = 0; k < total; ++k) in[k] = k;
  MPI_Reduce_scatter(in, res, counts, MPI_INT, MPI_SUM, comm);
  ok = 1;
  for (int k = 0; k < me + 1; ++k) ok = ok && res[k] == n * (displs[me] + k);
  check(ok, "MPI_Reduce_scatter with unequal counts");

  for (int k = 0; k < me + 1; ++k) in[k] = me;
  MPI_Allgatherv(in, me + 1, MPI_INT, res, counts, displs, MPI_INT, comm);
  ok = 1;
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < r + 1; ++k) ok = ok && res[displs[r] + k] == r;
  check(ok, "MPI_Allgatherv");

  /* Non-blocking collectives, two in flight at once. */
  MPI_Request reqs[3];
  double y = me, ysum = 0;
  int bv = me == root ? 42 : 0;
  MPI_Iallreduce(&y, &ysum, 1, MPI_DOUBLE, MPI_SUM, comm, &reqs[0]);
  MPI_Ibcast(&bv, 1, MPI_INT, root, comm, &reqs[1]);
  MPI_Ibarrier(comm, &reqs[2]);
  MPI_Waitall(3, reqs, MPI_STATUSES_IGNORE);
  check(ysum == n * (n - 1) / 2.0 && bv == 42, "MPI_Iallreduce, MPI_Ibcast and MPI_Ibarrier");

  free(all);
  free(to);
  free(from);
  free(counts);
  free(displs);
  free(in);
  free(res);
}

/* Persistent requests, and the v- and w-collectives built of messages. */
static void persistent_and_v(void) {
  const int right = (rank + 1) % size, left = (rank + size - 1) % size;
  int out = 0, in = -1;
  MPI_Request r[2];
  MPI_Recv_init(&in, 1, MPI_INT, left, 21, MPI_COMM_WORLD, &r[0]);
  MPI_Send_init(&out, 1, MPI_INT, right, 21, MPI_COMM_WORLD, &r[1]);
  int ok = 1;
  for (int round = 0; round < 5; ++round) {
    out = rank * 10 + round;
    MPI_Startall(2, r);
    MPI_Waitall(2, r, MPI_STATUSES_IGNORE);
    ok = ok && in == left * 10 + round && r[0] != MPI_REQUEST_NULL;
  }
  MPI_Request_free(&r[0]);
  MPI_Request_free(&r[1]);
  check(ok && r[0] == MPI_REQUEST_NULL, "persistent send and receive, started 5 times");

  /* Member r contributes r + 1 ints, gathered at root at displacements 2 * r * (r + 1) / 2. */
  const int root = size - 1;
  int* counts = malloc(sizeof(int) * (size_t)size);
  int* displs = malloc(sizeof(int) * (size_t)size);
  int total = 0;
  for (int p = 0; p < size; ++p) counts[p] = p + 1, displs[p] = total, total += 2 * (p + 1);
  int* mine = malloc(sizeof(int) * (size_t)(rank + 1));
  int* all = malloc(sizeof(int) * (size_t)total);
  for (int k = 0; k <= rank; ++k) mine[k] = rank * 100 + k;
  for (int k = 0; k < total; ++k) all[k] = -1;
  MPI_Request g;
  MPI_Igatherv(mine, rank + 1, MPI_INT, all, counts, displs, MPI_INT, root, MPI_COMM_WORLD, &g);
  int done = 0;
  while (!done) MPI_Test(&g, &done, MPI_STATUS_IGNORE); /* completed by tests, as OSU does */
  if (rank == root) {
    ok = 1;
    for (int p = 0; p < size; ++p) {
      for (int k = 0; k < 2 * (p + 1); ++k) {
        ok = ok && all[displs[p] + k] == (k <= p ? p * 100 + k : -1);
      }
    }
    check(ok, "MPI_Igatherv: each block at its displacement, nothing else written");
  }
  for (int k = 0; k <= rank; ++k) mine[k] = -1;
  MPI_Scatterv(all, counts, displs, MPI_INT, mine, rank + 1, MPI_INT, root, MPI_COMM_WORLD);
  ok = 1;
  for (int k = 0; k <= rank; ++k) ok = ok && mine[k] == rank * 100 + k;
  check(ok, "MPI_Scatterv back: every member's block");

  /* Alltoallw: to member p, p + 1 shorts; displacements in bytes. */
  short* sw = malloc(sizeof(short) * (size_t)total);
  short* rw = malloc(sizeof(short) * (size_t)(size * (rank + 1)));
  int* sc = malloc(sizeof(int) * (size_t)size);
  int* sd = malloc(sizeof(int) * (size_t)size);
  int* rc = malloc(sizeof(int) * (size_t)size);
  int* rd = malloc(sizeof(int) * (size_t)size);
  MPI_Datatype* types = malloc(sizeof(MPI_Datatype) * (size_t)size);
  for (int p = 0, at = 0; p < size; ++p) {
    sc[p] = p + 1, sd[p] = at * (int)sizeof(short), rc[p] = rank + 1;
    rd[p] = p * (rank + 1) * (int)sizeof(short), types[p] = MPI_SHORT;
    for (int k = 0; k <= p; ++k) sw[at + k] = (short)(rank * 10 + p);
    at += p + 1;
  }
  MPI_Alltoallw(sw, sc, sd, types, rw, rc, rd, types, MPI_COMM_WORLD);
  ok = 1;
  for (int p = 0; p < size; ++p)
    for (int k = 0; k <= rank; ++k) ok = ok && rw[p * (rank + 1) + k] == p * 10 + rank;
  check(ok, "MPI_Alltoallw");

  /* Ireduce_scatter with unequal counts, and Iallgatherv. */
  int* in2 = malloc(sizeof(int) * (size_t)(size * (size + 1) / 2));
  int* res = malloc(sizeof(int) * (size_t)(size * (size + 1) / 2));
  for (int k = 0; k < size * (size + 1) / 2; ++k) in2[k] = k;
  int* cnt = malloc(sizeof(int) * (size_t)size);
  int* dsp = malloc(sizeof(int) * (size_t)size);
  for (int p = 0, d = 0; p < size; ++p) cnt[p] = p + 1, dsp[p] = d, d += p + 1;
  MPI_Request q;
  MPI_Ireduce_scatter(in2, res, cnt, MPI_INT, MPI_SUM, MPI_COMM_WORLD, &q);
  MPI_Wait(&q, MPI_STATUS_IGNORE);
  ok = 1;
  for (int k = 0; k <= rank; ++k) ok = ok && res[k] == size * (dsp[rank] + k);
  check(ok, "MPI_Ireduce_scatter with unequal counts");
  for (int k = 0; k <= rank; ++k) in2[k] = rank;
  MPI_Iallgatherv(in2, rank + 1, MPI_INT, res, cnt, dsp, MPI_INT, MPI_COMM_WORLD, &q);
  MPI_Wait(&q, MPI_STATUS_IGNORE);
  ok = 1;
  for (int p = 0; p < size; ++p)
    for (int k = 0; k <= p; ++k) ok = ok && res[dsp[p] + k] == p;
  check(ok, "MPI_Iallgatherv");
  free(counts), free(displs), free(mine), free(all), free(sw), free(rw), free(sc), free(sd);
  free(rc), free(rd), free(types), free(in2), free(res), free(cnt), free(dsp);
}

/* One-sided: windows made both ways, each synchronisation form, accumulates and atomics. */
static void one_sided(void) {
  int* mem = NULL;
  MPI_Win win;
  MPI_Win_allocate((MPI_Aint)(sizeof(int) * (size_t)size), sizeof(int), MPI_INFO_NULL,
                   MPI_COMM_WORLD, &mem, &win);
  for (int p = 0; p < size; ++p) mem[p] = -1;
  MPI_Win_fence(0, win);
  for (int p = 0; p < size; ++p) MPI_Put(&rank, 1, MPI_INT, p, rank, 1, MPI_INT, win);
  MPI_Win_fence(0, win);
  int ok = 1;
  for (int p = 0; p < size; ++p) ok = ok && mem[p] == p;
  check(ok, "MPI_Win_allocate, MPI_Put between fences: every member's slot");
  int got = -1;
  const int right = (rank + 1) % size;
  MPI_Win_lock(MPI_LOCK_SHARED, right, 0, win);
  MPI_Get(&got, 1, MPI_INT, right, rank, 1, MPI_INT, win);
  MPI_Win_unlock(right, win);
  check(got == rank, "MPI_Get under a shared lock");
  MPI_Win_free(&win);
  check(win == MPI_WIN_NULL, "MPI_Win_free");

  /* A window over the caller's memory: accumulates from every member into rank 0's. */
  long acc[4] = {0, 0, 0, 0};
  MPI_Win wa;
  MPI_Win_create(acc, sizeof(acc), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &wa);
  long add[4] = {rank + 1, rank + 1, 2, 1};
  MPI_Win_lock_all(0, wa);
  MPI_Accumulate(add, 4, MPI_LONG, 0, 0, 4, MPI_LONG, MPI_SUM, wa);
  MPI_Win_unlock_all(wa);
  MPI_Barrier(MPI_COMM_WORLD);
  if (rank == 0) {
    check(acc[0] == (long)size * (size + 1) / 2 && acc[2] == 2L * size && acc[3] == size,
          "MPI_Accumulate SUM from every member");
  }
  MPI_Barrier(MPI_COMM_WORLD);
  long one = 1, before = -1;
  MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, wa);
  MPI_Fetch_and_op(&one, &before, MPI_LONG, 0, 3, MPI_SUM, wa);
  MPI_Win_unlock(0, wa);
  /* Every member fetched a different old value, size..2*size-1: their sum says so. */
  long sum = 0;
  MPI_Allreduce(&before, &sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
  check(sum == (long)size * size + (long)size * (size - 1) / 2,
        "MPI_Fetch_and_op: each member saw a different value");
  long zero = 0, mine = rank + 1, old = -1;
  MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, wa);
  MPI_Compare_and_swap(&mine, &zero, &old, MPI_LONG, 0, 1, wa); /* acc[1] is not 0 */
  MPI_Win_unlock(0, wa);
  check(old == (long)size * (size + 1) / 2, "MPI_Compare_and_swap returns the old value");
  MPI_Win_free(&wa);

  /* PSCW: rank 0 exposes its window to the others, which each put their rank. */
  int slots[64];
  for (int p = 0; p < 64; ++p) slots[p] = -1;
  MPI_Win wp;
  MPI_Win_create(slots, sizeof(slots), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &wp);
  MPI_Group world, peers;
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  if (rank == 0) {
    int* others = malloc(sizeof(int) * (size_t)size);
    for (int p = 1; p < size; ++p) others[p - 1] = p;
    MPI_Group_incl(world, size - 1, others, &peers);
    MPI_Win_post(peers, 0, wp);
    MPI_Win_wait(wp);
    ok = 1;
    for (int p = 1; p < size; ++p) ok = ok && slots[p] == p * 3;
    check(ok, "MPI_Win_post/start/complete/wait: the origins' puts are there at wait");
    free(others);
  } else {
    const int zero_rank = 0;
    int value = rank * 3;
    MPI_Group_incl(world, 1, &zero_rank, &peers);
    MPI_Win_start(peers, 0, wp);
    MPI_Put(&value, 1, MPI_INT, 0, rank, 1, MPI_INT, wp);
    MPI_Win_complete(wp);
  }
  MPI_Group_free(&peers);
  MPI_Group_free(&world);
  MPI_Win_free(&wp);
}

/* Exclusive and shared locks on one member at once: even ranks take it exclusive and bump a
 * counter there by a get and a put (not atomic: only the lock keeps every bump), odd ranks take it
 * shared and read. Every bump must count and no locker may wait for ever. (An exclusive unlock
 * once swapped the lock word to 0 while a shared locker backing off still had its 1 in it; the
 * word then ended at all ones and every later lock waited for ever.) */
static void lock_contention(void) {
  long* counter = NULL;
  MPI_Win win;
  MPI_Win_allocate(sizeof(long), sizeof(long), MPI_INFO_NULL, MPI_COMM_WORLD, &counter, &win);
  *counter = 0;
  MPI_Barrier(MPI_COMM_WORLD);
  int bumps = 0;
  for (int i = 0; i < 3000; ++i) {
    long v = -1;
    if (rank % 2 == 0) {
      MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
      MPI_Get(&v, 1, MPI_LONG, 0, 0, 1, MPI_LONG, win);
      MPI_Win_flush(0, win);
      v += 1;
      MPI_Put(&v, 1, MPI_LONG, 0, 0, 1, MPI_LONG, win);
      MPI_Win_unlock(0, win);
      ++bumps;
    } else {
      MPI_Win_lock(MPI_LOCK_SHARED, 0, 0, win);
      MPI_Get(&v, 1, MPI_LONG, 0, 0, 1, MPI_LONG, win);
      MPI_Win_unlock(0, win);
    }
  }
  int total = 0;
  MPI_Allreduce(&bumps, &total, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) {
    long v = -1;
    MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
    MPI_Get(&v, 1, MPI_LONG, 0, 0, 1, MPI_LONG, win);
    MPI_Win_unlock(0, win);
    check(v == total, "exclusive locks beside shared ones: every bump counted");
  }
  MPI_Win_free(&win);
}

static int deleted;
static int count_delete(MPI_Comm comm, int keyval, void* value, void* extra) {
  (void)comm, (void)keyval, (void)extra;
  deleted += *(int*)value;
  return MPI_SUCCESS;
}

/* Attributes: the predefined MPI_TAG_UB, a key's value copied by MPI_Comm_dup (MPI_COMM_DUP_FN)
 * and deleted (its delete function) by MPI_Comm_free and MPI_Comm_delete_attr. */
static void attributes(void) {
  int* ub = NULL;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  check(flag == 1 && ub != NULL && *ub >= 32767, "MPI_TAG_UB is an attribute of the world");
  int key = MPI_KEYVAL_INVALID;
  static int value = 5;
  MPI_Comm_create_keyval(MPI_COMM_DUP_FN, count_delete, &key, NULL);
  MPI_Comm a, b;
  MPI_Comm_dup(MPI_COMM_WORLD, &a);
  MPI_Comm_set_attr(a, key, &value);
  MPI_Comm_dup(a, &b);
  int* got = NULL;
  MPI_Comm_get_attr(b, key, &got, &flag);
  check(flag == 1 && got == &value, "MPI_Comm_dup copies an attribute by MPI_COMM_DUP_FN");
  deleted = 0;
  MPI_Comm_free(&b);
  MPI_Comm_delete_attr(a, key);
  MPI_Comm_get_attr(a, key, &got, &flag);
  check(deleted == 10 && flag == 0,
        "MPI_Comm_free and MPI_Comm_delete_attr run the delete function");
  MPI_Comm_free(&a);
  MPI_Comm_free_keyval(&key);
  check(key == MPI_KEYVAL_INVALID, "MPI_Comm_free_keyval");
}

static void communicators(void) {
  MPI_Comm half, dup;
  MPI_Comm_split(MPI_COMM_WORLD, rank % 2, -rank, &half);
  int hr, hs;
  MPI_Comm_rank(half, &hr);
  MPI_Comm_size(half, &hs);
  check(hs == (size + 1 - rank % 2) / 2, "MPI_Comm_split: the size of each half");
  collectives(half);

  /* A message on a duplicate never matches a receive on the original, and the other way. */
  MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  int result = -1;
  MPI_Comm_compare(MPI_COMM_WORLD, dup, &result);
  check(result == MPI_CONGRUENT, "MPI_Comm_compare: a duplicate is congruent");
  if (rank == 0) {
    int a = 1, b = 2;
    MPI_Send(&a, 1, MPI_INT, 1, 5, dup);
    MPI_Send(&b, 1, MPI_INT, 1, 5, MPI_COMM_WORLD);
  } else if (rank == 1) {
    int a = 0, b = 0;
    MPI_Recv(&b, 1, MPI_INT, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    MPI_Recv(&a, 1, MPI_INT, 0, 5, dup, MPI_STATUS_IGNORE);
    check(a == 1 && b == 2, "messages of two communicators do not mix");
  }
  MPI_Comm none;
  MPI_Comm_split(MPI_COMM_WORLD, rank == 0 ? MPI_UNDEFINED : 1, 0, &none);
  check((rank == 0) == (none == MPI_COMM_NULL), "MPI_UNDEFINED gives MPI_COMM_NULL");
  if (none != MPI_COMM_NULL) MPI_Comm_free(&none);
  MPI_Comm_free(&half);
  MPI_Comm_free(&dup);
  check(half == MPI_COMM_NULL, "MPI_Comm_free sets MPI_COMM_NULL");
}

static void not_built(void) {
  MPI_Win win;
  const int e = MPI_Win_create_dynamic(MPI_INFO_NULL, MPI_COMM_WORLD, &win);
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(e, text, &len);
  check(error_class(e) == MPI_ERR_UNSUPPORTED_OPERATION &&
            strstr(text, "MPI_Win_create_dynamic") != NULL,
        "a function not built: MPI_ERR_UNSUPPORTED_OPERATION naming it");
  int v = 1, out = 0;
  const int m = MPI_Allreduce(&v, &out, 1, MPI_INT, MPI_MINLOC, MPI_COMM_WORLD);
  check(error_class(m) == MPI_ERR_UNSUPPORTED_OPERATION, "an operation not built: refused");
}

int main(int argc, char** argv) {
  int provided = -1;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  int flag = 0;
  MPI_Initialized(&flag);
  check(flag == 1 && provided == MPI_THREAD_FUNNELED, "MPI_Init_thread");
  if (size < 2) {
    /* Every part exchanges with rank 1: alone, the first receive from it would wait for ever. */
    fprintf(stderr, "mpi_test: needs 2 ranks or more (mpiexec -n 2), got %d\n", size);
    MPI_Finalize();
    return 2;
  }
  if (argc > 1 && strcmp(argv[1], "lock-holder-dies") == 0) {
    /* Rank 1 takes rank 0's window lock and is killed holding it: rank 0's own lock attempt
     * fails with MPIX_ERR_PROC_FAILED instead of waiting for ever. With 3 ranks, rank 2 dies
     * first, holding nothing, and rank 0's lock waits for rank 1's unlock (1.5 s later) and
     * takes it: a death elsewhere in the window does not fail it. */
    int* mem = NULL;
    MPI_Win win;
    MPI_Win_allocate(sizeof(int), sizeof(int), MPI_INFO_NULL, MPI_COMM_WORLD, &mem, &win);
    MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
    int token = 0;
    if (rank == 2) {
      MPI_Send(&token, 1, MPI_INT, 0, 2, MPI_COMM_WORLD);
      raise(SIGKILL);
    }
    if (rank == 1) {
      if (size >= 3) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
        MPI_Send(&token, 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
        usleep(1500000);
        MPI_Win_unlock(0, win);
        MPI_Recv(&token, 1, MPI_INT, 0, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      }
      MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
      MPI_Send(&token, 1, MPI_INT, 0, 1, MPI_COMM_WORLD);
      raise(SIGKILL);
    }
    if (rank == 0) {
      if (size >= 3) {
        MPI_Recv(&token, 1, MPI_INT, 2, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Recv(&token, 1, MPI_INT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        const int e = MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
        check(e == MPI_SUCCESS, "a lock held by a live rank, another rank dead: taken");
        if (e == MPI_SUCCESS) MPI_Win_unlock(0, win);
        printf("rank 0: lock held by a live rank while another died: %s\n",
               e == MPI_SUCCESS ? "taken once let go" : "failed");
        MPI_Send(&token, 1, MPI_INT, 1, 3, MPI_COMM_WORLD);
      }
      MPI_Recv(&token, 1, MPI_INT, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      const int e = MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
      check(error_class(e) == MPIX_ERR_PROC_FAILED, "a lock held by a dead rank: PROC_FAILED");
      printf("rank 0: lock held by a dead rank: %s\n",
             failures == 0 ? "released with an error" : "wrong error");
    }
    return failures == 0 ? 0 : 1;
  }
  if (argc > 1 && strcmp(argv[1], "fatal") == 0) {
    /* The default handler: the job ends, saying why. */
    int v = 0;
    MPI_Send(&v, 1, MPI_INT, size + 5, 0, MPI_COMM_WORLD);
    printf("rank %d: still running after a fatal error\n", rank);
    return 0;
  }
  point_to_point();
  collectives(MPI_COMM_WORLD);
  persistent_and_v();
  one_sided();
  lock_contention();
  attributes();
  communicators();
  not_built();
  MPI_Finalize();
  MPI_Finalized(&flag);
  check(flag == 1, "MPI_Finalized");
  printf("mpi_test: rank %d: %d checks, %d failures\n", rank, checks, failures);
  return failures == 0 ? 0 : 1;
}
