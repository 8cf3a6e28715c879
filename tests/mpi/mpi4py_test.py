"""ferry's MPI under mpi4py (built against ferry's mpicc): numpy arrays (or CuPy arrays with
`cupy` as the first argument) through Send/Recv, Isend/Irecv, Bcast, Allreduce, Split and
Gather, and pickled objects. Run under ferryrun (mpiexec) with 2 or more ranks."""
import sys

from mpi4py import MPI

if len(sys.argv) > 1 and sys.argv[1] == "cupy":
    import cupy as xp

    def sync():
        xp.cuda.get_current_stream().synchronize()
else:
    import numpy as xp

    def sync():
        pass

comm = MPI.COMM_WORLD
rank, size = comm.Get_rank(), comm.Get_size()
failures = 0
if xp.__name__ == "cupy":
    # A GPU per rank where there are several (the ranks share one where there is one).
    xp.cuda.Device(rank % xp.cuda.runtime.getDeviceCount()).use()


def check(ok, what):
    global failures
    if not ok:
        failures += 1
        sys.stdout.write(f"rank {rank}: FAILED: {what}\n")
        sys.stdout.flush()


right, left = (rank + 1) % size, (rank - 1) % size
out = xp.arange(1000, dtype="f8") + rank
into = xp.zeros(1000, dtype="f8")
sync()
comm.Sendrecv(out, dest=right, sendtag=3, recvbuf=into, source=left, recvtag=3)
check(bool((into == xp.arange(1000, dtype="f8") + left).all()), "Sendrecv of an array")

big = xp.full(1 << 18, rank, dtype="i4")
got = xp.empty(1 << 18, dtype="i4")
sync()
requests = [comm.Irecv(got, source=left, tag=4), comm.Isend(big, dest=right, tag=4)]
MPI.Request.Waitall(requests)
check(bool((got == left).all()), "Isend/Irecv of 1 MiB")

if rank == 0:
    comm.Send(xp.ones(5, dtype="i8"), dest=1, tag=5)
elif rank == 1:
    status = MPI.Status()
    buf = xp.zeros(5, dtype="i8")
    comm.Recv(buf, source=MPI.ANY_SOURCE, tag=MPI.ANY_TAG, status=status)
    check(status.Get_source() == 0 and status.Get_tag() == 5 and int(buf.sum()) == 5,
          "Recv with wildcards: the status")

b = xp.arange(64, dtype="f4") if rank == 0 else xp.zeros(64, dtype="f4")
sync()
comm.Bcast(b, root=0)
check(bool((b == xp.arange(64, dtype="f4")).all()), "Bcast")

s = xp.full(16, rank + 1, dtype="f8")
total = xp.empty(16, dtype="f8")
sync()
comm.Allreduce(s, total, op=MPI.SUM)
check(bool((total == size * (size + 1) / 2).all()), "Allreduce SUM")

half = comm.Split(color=rank % 2, key=rank)
n = half.allreduce(1, op=MPI.SUM)
check(n == (size + 1 - rank % 2) // 2, "Split, then allreduce of a Python int")
half.Free()

gathered = xp.empty(size * 3, dtype="i4") if rank == 0 else None
mine = xp.full(3, rank, dtype="i4")
sync()
comm.Gather(mine, gathered, root=0)
if rank == 0:
    check(bool((gathered.reshape(size, 3) == xp.arange(size).reshape(size, 1)).all()), "Gather")

obj = comm.bcast({"step": 7, "ranks": list(range(size))} if rank == 0 else None, root=0)
check(obj["step"] == 7 and len(obj["ranks"]) == size, "bcast of a pickled object")
if rank == 0:
    comm.send(("hello", 42), dest=1, tag=9)
elif rank == 1:
    check(comm.recv(source=0, tag=9) == ("hello", 42), "send/recv of a pickled object")

sys.stdout.write(f"mpi4py_test: rank {rank}: {failures} failures\n")  # one write per line
sys.stdout.flush()
sys.exit(1 if failures else 0)
