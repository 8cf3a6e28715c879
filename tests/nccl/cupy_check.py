#!/usr/bin/env python3
"""CuPy's cupy.cuda.nccl on a libnccl.so.2 (ferry's by LD_PRELOAD, or the one CuPy finds).

Run on a machine with two GPUs, in a Python with CuPy:
    LD_PRELOAD=.../libnccl.so.2 python cupy_check.py
Two processes (one GPU each, the unique id passed through a file) make a NcclCommunicator and
check allReduce (sum and max, float32 and int64, 1 to 4 Mi elements), bcast, reduce, allGather,
reduceScatter, and send/recv both ways inside groupStart/groupEnd; then one process makes two
communicators with NcclCommunicator.initAll over both GPUs and checks an allReduce on each.
Exit status 0 only if every check passed.
"""
import os
import subprocess
import sys
import tempfile
import time


def libnccl_mapped():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libnccl" in line})


def worker(rank, workdir):
    import cupy as cp
    from cupy.cuda import nccl
    cp.cuda.Device(rank).use()
    idfile = os.path.join(workdir, "id")
    if rank == 0:
        uid = nccl.get_unique_id()
        with open(idfile + ".tmp", "w") as f:
            f.write(repr(uid))
        os.rename(idfile + ".tmp", idfile)
    else:
        while not os.path.exists(idfile):
            time.sleep(0.01)
        with open(idfile) as f:
            uid = eval(f.read())  # a tuple of ints, written above
    comm = nccl.NcclCommunicator(2, uid, rank)
    print("rank %d libnccl: %s; version %d" % (rank, " ".join(libnccl_mapped()),
                                               nccl.get_version()), flush=True)
    stream = cp.cuda.Stream(non_blocking=True)
    failures = []

    def data(r, n, dtype, salt):
        rs = cp.random.RandomState(1000 * r + salt)
        return (rs.randint(-1000, 1000, n)).astype(dtype)

    def check(what, got, want):
        stream.synchronize()
        if not bool(cp.array_equal(got, want)):
            failures.append(what)

    types = {cp.float32: nccl.NCCL_FLOAT32, cp.int64: nccl.NCCL_INT64}
    salt = 0
    for dtype, ntype in types.items():
        for n in [1, 1000, 1 << 20, 4 << 20]:
            for opname, op, fold in (("sum", nccl.NCCL_SUM, lambda a, b: a + b),
                                     ("max", nccl.NCCL_MAX, cp.maximum)):
                salt += 1
                x = data(rank, n, dtype, salt)
                y = cp.empty_like(x)
                comm.allReduce(x.data.ptr, y.data.ptr, n, ntype, op, stream.ptr)
                check("allReduce %s %s %d" % (opname, dtype.__name__, n), y,
                      fold(data(0, n, dtype, salt), data(1, n, dtype, salt)))
    for n in [1, 4097, 1 << 22]:
        salt += 1
        every = [data(r, n, cp.float32, salt) for r in range(2)]
        for root in range(2):
            x = every[rank].copy()
            comm.bcast(x.data.ptr, n, nccl.NCCL_FLOAT32, root, stream.ptr)
            check("bcast root %d %d" % (root, n), x, every[root])
            y = cp.zeros(n, cp.float32)
            comm.reduce(every[rank].data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                        root, stream.ptr)
            if rank == root:
                check("reduce root %d %d" % (root, n), y, every[0] + every[1])
        y = cp.empty(2 * n, cp.float32)
        comm.allGather(every[rank].data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, stream.ptr)
        check("allGather %d" % n, y, cp.concatenate(every))
        salt += 1
        big = [data(r, 2 * n, cp.float32, salt) for r in range(2)]
        y = cp.empty(n, cp.float32)
        comm.reduceScatter(big[rank].data.ptr, y.data.ptr, n, nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                           stream.ptr)
        check("reduceScatter %d" % n, y, (big[0] + big[1])[rank * n:(rank + 1) * n])
        y = cp.empty(n, cp.float32)
        peer = 1 - rank
        nccl.groupStart()
        comm.send(every[rank].data.ptr, n, nccl.NCCL_FLOAT32, peer, stream.ptr)
        comm.recv(y.data.ptr, n, nccl.NCCL_FLOAT32, peer, stream.ptr)
        nccl.groupEnd()
        check("send/recv %d" % n, y, every[peer])
    print("rank %d cupy: %s%s" % (rank, "PASS" if not failures else "FAIL ",
                                 ", ".join(failures)), flush=True)
    comm.destroy()
    return 0 if not failures else 1


def init_all():
    import cupy as cp
    from cupy.cuda import nccl
    comms = nccl.NcclCommunicator.initAll([0, 1])
    xs, ys, streams = [], [], []
    for d in range(2):
        with cp.cuda.Device(d):
            xs.append(cp.full(1 << 20, d + 1, cp.float32))
            ys.append(cp.empty(1 << 20, cp.float32))
            streams.append(cp.cuda.Stream(non_blocking=True))
    nccl.groupStart()
    for d in range(2):
        comms[d].allReduce(xs[d].data.ptr, ys[d].data.ptr, 1 << 20, nccl.NCCL_FLOAT32,
                           nccl.NCCL_SUM, streams[d].ptr)
    nccl.groupEnd()
    ok = True
    for d in range(2):
        with cp.cuda.Device(d):
            streams[d].synchronize()
            ok &= bool((ys[d] == 3).all())
        comms[d].destroy()
    print("initAll over two GPUs, one process: %s" % ("PASS" if ok else "FAIL"), flush=True)
    return 0 if ok else 1


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        sys.exit(worker(int(sys.argv[2]), os.environ["CUPY_CHECK_DIR"]))
    if len(sys.argv) == 2 and sys.argv[1] == "--init-all":
        sys.exit(init_all())
    workdir = tempfile.mkdtemp(prefix="cupy_check_")
    env = dict(os.environ, CUPY_CHECK_DIR=workdir)
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", str(r)], env=env)
             for r in range(2)]
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=180))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append("HANG")
    one = subprocess.run([sys.executable, __file__, "--init-all"], timeout=120).returncode
    ok = codes == [0, 0] and one == 0
    print("cupy: %s (ranks %s, initAll %s)" % ("PASS" if ok else "FAIL", codes, one))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
