#!/usr/bin/env python3
"""PyTorch's NCCL backend on a libnccl.so.2 (ferry's by LD_PRELOAD, or the one torch ships).

Run on a machine with two GPUs (or one, which both ranks share), in a Python with torch:
    python torch_check.py [--ferry LIB] [--rounds N] [check] [ddp] [kill]
Each part starts two processes of this script (ranks 0 and 1, one GPU each) and prints one
line per finding; the exit status is 0 only if every part passed.
  check  all_reduce (sum, max, min, product; five types; 1 to 4 Mi elements; avg and
         pre-multiplied sums), reduce_scatter_tensor avg, broadcast from
         each root, all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single,
         send/recv and batch_isend_irecv, barrier: each result compared with gloo's on the
         same inputs (reduce_scatter_tensor and all_to_all_single, which gloo lacks, with the
         result computed from every rank's inputs).
  ddp    a DDP training step of a small model, 30 steps, on ferry's library and on torch's own
         NCCL in turn (--rounds times): the losses must be equal bit for bit, and the median
         step time of ferry's within 1.05 of NCCL's (printed; a miss is reported, not failed).
  kill   rank 1 exits (SIGKILL) in the middle of a loop of all_reduces; rank 0 must leave
         with a Python exception within 10 s, not hang (ferry's library only).
With --ferry LIB the parts run with LD_PRELOAD=LIB (check and kill), and ddp compares it with
torch's own library.
"""
import argparse
import faulthandler
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(part, lib, extra_env=None, timeout=180):
    """Runs `part` on two ranks; returns (returncodes, outputs)."""
    timeout = int(os.environ.get("TORCH_CHECK_TIMEOUT", timeout))
    port = free_port()
    procs = []
    workdir = tempfile.mkdtemp(prefix="torch_check_")
    for rank in range(2):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCH_CHECK_DIR=workdir,
                   TORCH_CHECK_STACKS=str(max(5, timeout - 15)))
        env.pop("LD_PRELOAD", None)
        if lib:
            env["LD_PRELOAD"] = lib
        env.update(extra_env or {})
        procs.append(subprocess.Popen([sys.executable, __file__, "--worker", part], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs, codes = [], []
    deadline = time.time() + timeout
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1, deadline - time.time()))
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
            out += "\n[torch_check: killed after %d s: HANG]\n" % timeout
        outputs.append(out)
        codes.append(p.returncode)
    return codes, outputs


# ---- the workers ----

def libnccl_mapped():
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if "libnccl" in line})


def setup():
    # A rank that hangs shows where before the parent's timeout ends it.
    faulthandler.dump_traceback_later(float(os.environ.get("TORCH_CHECK_STACKS", "150")))
    import torch
    import torch.distributed as dist
    rank = int(os.environ["RANK"])
    index = rank % torch.cuda.device_count()  # one GPU: both ranks share it
    torch.cuda.set_device(index)
    dev = torch.device("cuda", index)
    dist.init_process_group("nccl", device_id=dev)
    return torch, dist, rank, dev


def worker_check():
    torch, dist, rank, dev = setup()
    gloo = dist.new_group(backend="gloo")
    print("rank %d libnccl: %s" % (rank, " ".join(libnccl_mapped())), flush=True)
    failures = []

    def inputs(r, n, dtype, salt):
        g = torch.Generator().manual_seed(1000 * r + salt)
        if dtype.is_floating_point:
            return (torch.rand(n, generator=g, dtype=torch.float32) * 4 - 2).to(dtype)
        return torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)

    def same(what, got, want):
        if os.environ.get("TORCH_CHECK_VERBOSE"):
            print("rank %d done %s" % (rank, what), flush=True)
        if not torch.equal(got.cpu(), want.cpu()):
            bad = (got.cpu() != want.cpu()).nonzero()
            failures.append("%s: %d elements differ (first at %s)" % (what, len(bad), bad[0].tolist()))

    types = [torch.float32, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.float64]
    ops = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "min": dist.ReduceOp.MIN,
           "product": dist.ReduceOp.PRODUCT}
    salt = 0
    for dtype in types:
        for n in [1, 1000, 65536, 1 << 20, 4 << 20]:
            for name, op in ops.items():
                if name == "product" and n > 1000:
                    continue
                salt += 1
                x = inputs(rank, n, dtype, salt)
                got = x.to(dev)
                dist.all_reduce(got, op=op)
                want = x.clone()
                dist.all_reduce(want, op=op, group=gloo)
                same("all_reduce %s %s %d" % (name, dtype, n), got, want)
    # ReduceOp.AVG (ncclAvg) and pre-multiplied sums (FSDP's; a host factor and a device one),
    # against gloo's sum: with two ranks the factors (1/2, 2) are powers of two, so scaling each
    # input or the sum agrees to the bit; an integer average truncates the sum.
    premul = getattr(dist, "_make_nccl_premul_sum", None)
    for dtype in [torch.float32, torch.bfloat16, torch.int64]:
        for n in [1, 65536, 1 << 20]:
            salt += 1
            x = inputs(rank, n, dtype, salt)
            total = x.clone()
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=gloo)
            got = x.to(dev)
            dist.all_reduce(got, op=dist.ReduceOp.AVG)
            want = total / 2 if dtype.is_floating_point else torch.div(total, 2,
                                                                        rounding_mode="trunc")
            same("all_reduce avg %s %d" % (dtype, n), got, want)
            # Pre-multiplied sums of float32 only: for a bfloat16 op PyTorch hands the factor as
            # a float (unpackPreMulSum<float, ncclBfloat16>), of which NCCL reads two bytes, as
            # ferry does.
            if premul is None or dtype != torch.float32:
                continue
            for name, factor in [("host", 2.0), ("device", torch.tensor([2.0], device=dev))]:
                got = x.to(dev)
                dist.all_reduce(got, op=premul(factor))
                same("all_reduce premul %s %s %d" % (name, dtype, n), got, total * 2)
        salt += 1
        every = [inputs(r, 2 * 4096, dtype, salt) for r in range(2)]
        got = torch.empty(4096, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(got, every[rank].to(dev), op=dist.ReduceOp.AVG)
        both = (every[0] + every[1])[rank * 4096:(rank + 1) * 4096]
        same("reduce_scatter_tensor avg %s" % dtype, got,
             both / 2 if dtype.is_floating_point else torch.div(both, 2, rounding_mode="trunc"))
    for n in [1, 4097, 1 << 22]:
        for root in range(2):
            salt += 1
            x = inputs(rank, n, torch.float32, salt)
            got = x.to(dev)
            dist.broadcast(got, src=root)
            want = x.clone()
            dist.broadcast(want, src=root, group=gloo)
            same("broadcast root %d %d" % (root, n), got, want)
        salt += 1
        x = inputs(rank, n, torch.bfloat16, salt)
        got = torch.empty(2 * n, dtype=x.dtype, device=dev)
        dist.all_gather_into_tensor(got, x.to(dev))
        parts = [torch.empty_like(x) for _ in range(2)]
        dist.all_gather(parts, x, group=gloo)
        same("all_gather_into_tensor %d" % n, got, torch.cat(parts))
        salt += 1
        every = [inputs(r, 2 * n, torch.float32, salt) for r in range(2)]
        got = torch.empty(n, dtype=torch.float32, device=dev)
        dist.reduce_scatter_tensor(got, every[rank].to(dev))
        same("reduce_scatter_tensor %d" % n, got, (every[0] + every[1])[rank * n:(rank + 1) * n])
        salt += 1
        every = [inputs(r, 2 * n, torch.int64, salt) for r in range(2)]
        got = torch.empty(2 * n, dtype=torch.int64, device=dev)
        dist.all_to_all_single(got, every[rank].to(dev))
        same("all_to_all_single %d" % n, got,
             torch.cat([every[r][rank * n:(rank + 1) * n] for r in range(2)]))
        salt += 1
        x = inputs(rank, n, torch.float32, salt)
        peer = 1 - rank
        got = torch.empty_like(x, device=dev)
        if rank == 0:
            dist.send(x.to(dev), peer)
            dist.recv(got, peer)
        else:
            dist.recv(got, peer)
            dist.send(x.to(dev), peer)
        same("send/recv %d" % n, got, inputs(peer, n, torch.float32, salt))
        got2 = torch.empty_like(x, device=dev)
        reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, x.to(dev), peer),
                                       dist.P2POp(dist.irecv, got2, peer)])
        for r in reqs:
            r.wait()
        same("batch_isend_irecv %d" % n, got2, inputs(peer, n, torch.float32, salt))
    dist.barrier()
    torch.cuda.synchronize()
    for f in failures:
        print("rank %d FAIL %s" % (rank, f), flush=True)
    print("rank %d check: %s (%d failures)" % (rank, "PASS" if not failures else "FAIL",
                                               len(failures)), flush=True)
    dist.destroy_process_group()
    sys.exit(1 if failures else 0)


def worker_ddp():
    torch, dist, rank, dev = setup()
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 4096), torch.nn.ReLU(),
                                torch.nn.Linear(4096, 1024)).to(dev)
    ddp = DDP(model, device_ids=[rank])
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator(device=dev).manual_seed(100 + rank)
    x = torch.randn(64, 1024, device=dev, generator=g)
    y = torch.randn(64, 1024, device=dev, generator=g)
    losses, times = [], []
    for step in range(30):
        torch.cuda.synchronize()
        start = time.perf_counter()
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    if rank == 0:
        print("losses " + " ".join(float(v).hex() for v in losses), flush=True)
        print("step_ms %.4f" % (1e3 * statistics.median(times[5:])), flush=True)
    dist.destroy_process_group()


def worker_kill():
    torch, dist, rank, dev = setup()
    x = torch.ones(1 << 20, device=dev)
    marker = os.path.join(os.environ["TORCH_CHECK_DIR"], "killed_at")
    for step in range(100000):
        if rank == 1 and step == 50:
            with open(marker + ".tmp", "w") as f:
                f.write(repr(time.time()))
            os.rename(marker + ".tmp", marker)
            os.kill(os.getpid(), signal.SIGKILL)
        try:
            dist.all_reduce(x)
            torch.cuda.synchronize()
        except Exception as e:  # what the survivor must see
            now = time.time()
            with open(marker) as f:
                killed = float(f.read())
            print("rank 0 exception %.3f s after the kill: %s: %s" %
                  (now - killed, type(e).__name__, str(e).splitlines()[0][:300]), flush=True)
            # Leave at once: the check is the exception, not the process group's teardown.
            os._exit(0 if now - killed < 10 else 1)
    print("rank %d: no exception" % rank, flush=True)
    os._exit(1)


# ---- the parent ----

def part_check(lib):
    codes, outs = launch("check", lib)
    for out in outs:
        sys.stdout.write(out)
    ok = codes == [0, 0]
    print("check (%s): %s" % (lib or "torch's NCCL", "PASS" if ok else "FAIL rc=%s" % codes))
    return ok


def part_ddp(lib, rounds):
    results = {"ferry": [], "nccl": []}
    losses = {}
    ok = True
    for _ in range(rounds):
        for name, l in (("ferry", lib), ("nccl", None)):
            codes, outs = launch("ddp", l)
            if codes != [0, 0]:
                sys.stdout.write(outs[0] + outs[1])
                print("ddp (%s): FAIL rc=%s" % (name, codes))
                return False
            for line in outs[0].splitlines():
                if line.startswith("losses "):
                    losses.setdefault(name, line)
                    if losses[name] != line:
                        print("ddp (%s): losses differ between rounds" % name)
                        ok = False
                if line.startswith("step_ms "):
                    results[name].append(float(line.split()[1]))
    equal = losses.get("ferry") == losses.get("nccl") and "ferry" in losses
    first = [float.fromhex(v) for v in losses.get("ferry", "losses").split()[1:]]
    print("ddp losses: %s (ferry first/last %s / %s)" %
          ("equal to NCCL's bit for bit" if equal else "DIFFERENT from NCCL's",
           first[0] if first else "-", first[-1] if first else "-"))
    if not equal:
        print("  ferry " + losses.get("ferry", ""))
        print("  nccl  " + losses.get("nccl", ""))
    f, n = statistics.median(results["ferry"]), statistics.median(results["nccl"])
    print("ddp step ms: ferry %s nccl %s; median ratio %.3f (%s)" %
          (results["ferry"], results["nccl"], f / n, "within 1.05" if f / n <= 1.05 else "MISSED 1.05"))
    return ok and equal


def part_kill(lib, env=None, label=""):
    codes, outs = launch("kill", lib, env, timeout=60)
    sys.stdout.write(outs[0])
    ok = codes[0] == 0
    print("kill%s: %s (rank 0 rc=%s, rank 1 rc=%s)" % (label, "PASS" if ok else "FAIL", codes[0], codes[1]))
    return ok


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--worker")
    ap.add_argument("--ferry")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("parts", nargs="*", default=["check", "ddp", "kill"])
    a = ap.parse_args()
    if a.worker:
        {"check": worker_check, "ddp": worker_ddp, "kill": worker_kill}[a.worker]()
        return
    ok = True
    for part in a.parts:
        if part == "check":
            ok &= part_check(a.ferry)
        elif part == "ddp":
            ok &= part_ddp(a.ferry, a.rounds)
        elif part == "kill":
            ok &= part_kill(a.ferry)
            ok &= part_kill(a.ferry, {"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"},
                            " (TORCH_NCCL_ASYNC_ERROR_HANDLING=0)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
