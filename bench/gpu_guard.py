#!/usr/bin/env python3
"""The regression guard of the GPU figures docs/PERFORMANCE.md promises (bench/gpu_run.sh guard).

Each figure is measured against its reference in the same run, round after round (interleaved):
point-to-point by CUDA IPC and allreduce against NCCL, the host-staged path and page-locked host
receives and sends by IPC and staged (FERRY_CUDA_IPC=0) against the copy engine's pinned rate,
one-sided puts and gets on device memory against the copy engine's peer copy, and stream
allreduces and send/recv replayed from graphs against NCCL's (where nccl-tests was packed). The
ratio of each round is taken, and the median over the rounds is compared with the ratio
PERFORMANCE records (RECORDED below): a figure more than TOLERANCE worse is printed BELOW and the
guard exits 1.

Run on a machine of two GPUs, from binaries packed by `bench/gpu_run.sh pack` (in .devbin/bin):
    python3 bench/gpu_guard.py [--rounds N] [--out DIR]
NCCL is taken from the torch venv's nvidia/nccl/lib (or LD_LIBRARY_PATH).
"""
import argparse
import glob
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
BIN = os.path.join(HERE, "..", ".devbin", "bin")
# A ratio this much worse than recorded is a regression: bandwidths move by a few percent between
# runs on these VMs, latencies of a few microseconds by up to 15%.
TOLERANCE = {"bandwidth": 0.10, "latency": 0.20}

# (figure, "higher" when a larger ratio is better, recorded ratio by GPU model). Ratios are
# ferry / reference: NCCL for point-to-point and allreduce, the copy engine's pinned rate for
# host staging, its peer copy over the GPUs' link for one-sided operations. The medians of the
# guard's runs in docs/PERFORMANCE.md ("Regression guard"); None: not recorded on that model yet
# (printed, not judged).
RECORDED = [
    ("p2p ipc latency 8 B / NCCL", "lower", {"H100": 0.85, "H200": 0.78}),
    ("p2p ipc bandwidth 4 MiB / NCCL", "higher", {"H100": 1.47, "H200": 1.30}),
    ("p2p ipc bandwidth 64 MiB / NCCL", "higher", {"H100": 1.07, "H200": 1.07}),
    ("p2p ipc bandwidth 512 MiB / NCCL", "higher", {"H100": 1.06, "H200": 1.07}),
    ("staged bandwidth 64 MiB / pinned copy", "higher", {"H100": 0.97, "H200": 0.97}),
    ("staged bandwidth 256 MiB / pinned copy", "higher", {"H100": 0.97, "H200": 0.97}),
    ("cuda:pinned by IPC 64 MiB / pinned copy", "higher", {"H100": 0.99, "H200": 1.00}),
    ("pinned:cuda by IPC 64 MiB / pinned copy", "higher", {"H100": 0.93, "H200": 1.00}),
    ("pinned:cuda staged 64 MiB / pinned copy", "higher", {"H100": 0.93, "H200": 0.95}),
    ("cuda:pinned staged 64 MiB / pinned copy", "higher", {"H100": 0.90, "H200": 0.93}),
    ("allreduce 8 B / NCCL (each call waited for)", "lower", {"H100": 0.79, "H200": 0.51}),
    ("allreduce 8 MiB busbw / NCCL (each call waited for)", "higher", {"H100": 1.24, "H200": 1.08}),
    ("allreduce 512 MiB busbw / NCCL (each call waited for)", "higher",
     {"H100": 1.01, "H200": 1.04}),
    ("one-sided put 4 MiB / peer copy", "higher", {"H100": 0.68, "H200": 0.67}),
    ("one-sided get 4 MiB / peer copy", "higher", {"H100": 0.63, "H200": 0.64}),
    # Stream-ordered, replayed from graphs of 100 calls, against nccl-tests' all_reduce_perf -G 100
    # (measured where it was packed).
    ("stream allreduce 8 B from graphs / NCCL from graphs", "lower", {"H100": 0.80, "H200": 0.76}),
    ("stream allreduce 64 KiB from graphs / NCCL from graphs", "lower",
     {"H100": 0.80, "H200": 0.76}),
    # The same for send/recv (each rank to the next, from the previous, in a group) against
    # nccl-tests' sendrecv_perf -G 100.
    ("stream sendrecv 8 B from graphs / NCCL from graphs", "lower", {"H100": 0.74, "H200": 0.69}),
    ("stream sendrecv 256 KiB from graphs / NCCL from graphs", "lower",
     {"H100": 0.66, "H200": 0.66}),
]


def run(command, env=None, out=None):
    """Runs a command, returns its stdout (stderr appended), logging both to `out`."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    result = subprocess.run(command, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=600)
    if out is not None:
        with open(out, "a") as log:
            log.write("$ %s %s\n%s\n" % (" ".join("%s=%s" % kv for kv in (env or {}).items()),
                                         " ".join(command), result.stdout))
    return result.stdout


def table(text, test):
    """Rows of a ferry-perf or nccl_perf table whose first column is `test`: size -> columns."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[0] == test and fields[1].isdigit():
            rows[int(fields[1])] = [float(f) if f != "-" else None for f in fields[2:]]
    return rows


def nccl_tests_times(text):
    """An nccl-tests table: size -> the out-of-place time in microseconds."""
    rows = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 8 and fields[0].isdigit() and fields[1].isdigit():
            rows[int(fields[0])] = float(fields[5])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/ferry-gpu-out"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    log = os.path.join(args.out, "guard.log")
    nccl = sorted(glob.glob("/opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib"))
    nccl_env = {"LD_LIBRARY_PATH": ":".join(nccl[:1] + [os.environ.get("LD_LIBRARY_PATH", "")])}
    ferryrun = [os.path.join(BIN, "ferryrun"), "--timeout", "500", "-n", "2"]
    perf = ferryrun + [os.path.join(BIN, "ferry-perf")]
    nccl_perf = ferryrun + [os.path.join(BIN, "nccl_perf")]
    MiB = 1 << 20
    ratios = {name: [] for name, _, _ in RECORDED}
    gpus = run(["nvidia-smi", "-L"])
    model = next((m for m in ("H100", "H200") if m in gpus), None)
    for round_number in range(1, args.rounds + 1):
        print("--- round %d" % round_number, flush=True)
        # References: the copy engine on this machine, then NCCL.
        engine = run([os.path.join(BIN, "pinned_rate"), "0", "64"], out=log)
        pinned = peer = None
        for line in engine.splitlines():
            if line.startswith("registered shared memory"):
                d2h = float(line.split("d2h ")[1].split()[0])
                h2d = float(line.split("h2d ")[1].split()[0])
                pinned = min(d2h, h2d)
            if line.startswith("peer copy"):
                peer = float(line.split()[-2])
        ipc = run(perf + ["latency", "bandwidth", "-m", "cuda:cuda", "--sizes", "8,4m,64m,512m"],
                  out=log)
        nccl_p2p = run(nccl_perf + ["--sizes", "8,4m,64m,512m"], env=nccl_env, out=log)
        staged = run(perf + ["bandwidth", "-m", "cuda:cuda", "--sizes", "64m,256m"],
                     env={"FERRY_CUDA_IPC": "0"}, out=log)
        to_pinned = run(perf + ["bandwidth", "-m", "cuda:pinned", "--sizes", "64m"], out=log)
        from_pinned = run(perf + ["bandwidth", "-m", "pinned:cuda", "--sizes", "64m"], out=log)
        from_pinned_staged = run(perf + ["bandwidth", "-m", "pinned:cuda", "--sizes", "64m"],
                                 env={"FERRY_CUDA_IPC": "0"}, out=log)
        to_pinned_staged = run(perf + ["bandwidth", "-m", "cuda:pinned", "--sizes", "64m"],
                               env={"FERRY_CUDA_IPC": "0"}, out=log)
        allreduce = run(perf + ["allreduce", "-m", "cuda", "--sizes", "8,8m,512m"], out=log)
        nccl_all = run(nccl_perf + ["--allreduce", "--sizes", "8,8m,512m"], env=nccl_env, out=log)
        rma = run(perf + ["put_bw", "get_bw", "-m", "cuda", "--sizes", "4m", "--window", "16"],
                  out=log)
        graphs = nccl_graphs = p2p_graphs = nccl_p2p_graphs = None
        if os.path.exists(os.path.join(BIN, "all_reduce_perf")):
            graphs = run(perf + ["allreduce", "--graph", "100", "-m", "cuda", "--sizes", "8,64k"],
                         out=log)
            nccl_graphs = run([os.path.join(BIN, "all_reduce_perf"), "-b", "8", "-e", "64K", "-f",
                               "8192", "-g", "2", "-G", "100"], env=nccl_env, out=log)
        if os.path.exists(os.path.join(BIN, "sendrecv_perf")):
            p2p_graphs = run(perf + ["sendrecv", "--graph", "100", "-m", "cuda", "--sizes",
                                     "8,256k"], out=log)
            nccl_p2p_graphs = run([os.path.join(BIN, "sendrecv_perf"), "-b", "8", "-e", "256K",
                                   "-f", "32768", "-g", "2", "-G", "100"], env=nccl_env, out=log)
        f_lat, f_bw = table(ipc, "latency"), table(ipc, "bandwidth")
        n_lat, n_bw = table(nccl_p2p, "latency"), table(nccl_p2p, "bandwidth")
        measured = {}
        try:
            measured["p2p ipc latency 8 B / NCCL"] = f_lat[8][1] / n_lat[8][1]
            for size, label in ((4 * MiB, "4 MiB"), (64 * MiB, "64 MiB"), (512 * MiB, "512 MiB")):
                measured["p2p ipc bandwidth %s / NCCL" % label] = f_bw[size][2] / n_bw[size][2]
            s_bw = table(staged, "bandwidth")
            for size, label in ((64 * MiB, "64 MiB"), (256 * MiB, "256 MiB")):
                measured["staged bandwidth %s / pinned copy" % label] = s_bw[size][2] / pinned
            measured["cuda:pinned by IPC 64 MiB / pinned copy"] = (
                table(to_pinned, "bandwidth")[64 * MiB][2] / pinned)
            measured["pinned:cuda by IPC 64 MiB / pinned copy"] = (
                table(from_pinned, "bandwidth")[64 * MiB][2] / pinned)
            measured["pinned:cuda staged 64 MiB / pinned copy"] = (
                table(from_pinned_staged, "bandwidth")[64 * MiB][2] / pinned)
            measured["cuda:pinned staged 64 MiB / pinned copy"] = (
                table(to_pinned_staged, "bandwidth")[64 * MiB][2] / pinned)
            f_all, n_all = table(allreduce, "allreduce"), table(nccl_all, "allreduce")
            measured["allreduce 8 B / NCCL (each call waited for)"] = f_all[8][1] / n_all[8][1]
            for size, label in ((8 * MiB, "8 MiB"), (512 * MiB, "512 MiB")):
                measured["allreduce %s busbw / NCCL (each call waited for)" % label] = (
                    f_all[size][2] / n_all[size][2])
            measured["one-sided put 4 MiB / peer copy"] = table(rma, "put_bw")[4 * MiB][2] / peer
            measured["one-sided get 4 MiB / peer copy"] = table(rma, "get_bw")[4 * MiB][2] / peer
            if graphs is not None:
                f_graph, n_graph = table(graphs, "allreduce"), nccl_tests_times(nccl_graphs)
                for size, label in ((8, "8 B"), (64 * 1024, "64 KiB")):
                    measured["stream allreduce %s from graphs / NCCL from graphs" % label] = (
                        f_graph[size][1] / n_graph[size])
            if p2p_graphs is not None:
                f_graph, n_graph = table(p2p_graphs, "sendrecv"), nccl_tests_times(nccl_p2p_graphs)
                for size, label in ((8, "8 B"), (256 * 1024, "256 KiB")):
                    measured["stream sendrecv %s from graphs / NCCL from graphs" % label] = (
                        f_graph[size][1] / n_graph[size])
        except (KeyError, TypeError, ZeroDivisionError, IndexError) as e:
            print("guard: a measurement is missing (%r); see %s" % (e, log))
            return 2
        for name, value in measured.items():
            ratios[name].append(value)
            print("  %-55s %.3f" % (name, value), flush=True)
    below = 0
    print("--- medians over %d rounds against the ratios recorded on %s (tolerance %d%% for "
          "bandwidths, %d%% for latencies)" % (args.rounds, model or "this GPU (none recorded)",
                                               TOLERANCE["bandwidth"] * 100,
                                               TOLERANCE["latency"] * 100))
    for name, better, by_model in RECORDED:
        if not ratios[name]:
            print("skip  %-55s (not measured: nccl-tests not packed)" % name)
            continue
        median = statistics.median(ratios[name])
        recorded = by_model.get(model) if model else None
        if recorded is None:
            print("new   %-55s %.3f (not recorded on this GPU model: record it)" % (name, median))
            continue
        tolerance = TOLERANCE["latency" if better == "lower" else "bandwidth"]
        worse = median < recorded * (1 - tolerance) if better == "higher" else (
            median > recorded * (1 + tolerance))
        below += worse
        print("%-5s %-55s %.3f (recorded %.2f, %s is better)" %
              ("BELOW" if worse else "ok", name, median, recorded, better))
    print("%d of %d figures below their recorded ratio" % (below, len(RECORDED)))
    return 1 if below else 0


if __name__ == "__main__":
    sys.exit(main())
