#!/usr/bin/env python3
"""Draw docs/PERFORMANCE.md's main comparisons from the raw files under bench/results/.

Each plot puts ferry beside its reference, by message size on a log scale:
  p2p_device_vs_nccl.png        point-to-point on device buffers, ferry-perf against nccl_perf
  allreduce_device_vs_nccl.png  allreduce on device buffers, ferry-perf against nccl_perf
  coll_host_vs_openmpi.png      host collectives of 128 KiB-1 MiB, ferry against Open MPI
  ofi_vs_fi_pingpong.png        ping-pong over libfabric tcp, ferry against fabtests' fi_pingpong

With no arguments the files PERFORMANCE.md cites are read; any of them can be replaced on the
command line (see --help). Where a file holds several rounds, the plot shows the median of the
rounds and shades the range between the fastest and the slowest. Needs matplotlib.
"""

import argparse
import os
import re
import statistics
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
DEFAULTS = {
    "p2p_ferry": "2026-11-23b/compare_ferry_kernel_copy.txt",
    "p2p_nccl": "2026-11-23b/compare_nccl.txt",
    "ar_ferry": "2026-11-26/h200x2/run5_head/coll_compare_ferry.txt",
    "ar_nccl": "2026-11-26/h200x2/run5_head/coll_compare_nccl.txt",
    "coll_host": "2026-11-25e/coll_compare_mid_head.txt",
    "ofi": "2026-11-25c/ofi_compare_tcp_read_from.txt",
}
UNITS = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "B": 1}


def size_label(n):
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def table_rows(path):
    """Rows of a whitespace table (ferry-perf and nccl_perf output): (test, size, [values])."""
    rows = []
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) < 4 or line.startswith("#") or not parts[1].isdigit():
                continue
            values = [None if v == "-" else float(v) for v in parts[2:]]
            rows.append((parts[0], int(parts[1]), values))
    return rows


def by_size(rows, test, column):
    """{size: [value per round]} of one column (index into the values after the size)."""
    out = defaultdict(list)
    for name, size, values in rows:
        if name == test and column < len(values) and values[column] is not None:
            out[size].append(values[column])
    return out


def draw(ax, series, label, style="-"):
    sizes = sorted(series)
    if not sizes:
        return
    med = [statistics.median(series[s]) for s in sizes]
    line, = ax.plot(sizes, med, style, marker="o", markersize=3, label=label)
    lo = [min(series[s]) for s in sizes]
    hi = [max(series[s]) for s in sizes]
    ax.fill_between(sizes, lo, hi, color=line.get_color(), alpha=0.2, linewidth=0)


def size_axis(ax, sizes):
    ax.set_xscale("log", base=2)
    ticks = sorted(sizes)
    if len(ticks) > 12:
        ticks = ticks[:: (len(ticks) + 11) // 12]
    ax.set_xticks(ticks)
    ax.set_xticklabels([size_label(s) for s in ticks], rotation=45, fontsize=7)
    ax.set_xlabel("message size")
    ax.grid(True, which="both", alpha=0.3)


def save(fig, out, name, sources):
    path = os.path.relpath(os.path.join(out, name))
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"drew {path} from {', '.join(os.path.relpath(s) for s in sources)}")


def plot_p2p_device(ferry_path, nccl_path, out):
    ferry, nccl = table_rows(ferry_path), table_rows(nccl_path)
    fig, (lat, bw) = plt.subplots(1, 2, figsize=(10, 4))
    # columns after size: iterations, latency_us, bandwidth_GBps
    draw(lat, by_size(ferry, "latency", 1), "ferry")
    draw(lat, by_size(nccl, "latency", 1), "NCCL send/recv", "--")
    draw(bw, by_size(ferry, "bandwidth", 2), "ferry")
    draw(bw, by_size(nccl, "bandwidth", 2), "NCCL send/recv", "--")
    lat.set_yscale("log")
    lat.set_ylabel("half round trip (µs)")
    lat.set_title("device ping-pong")
    bw.set_ylabel("GB/s")
    bw.set_title("device bandwidth, window of 64")
    for ax in (lat, bw):
        size_axis(ax, {size for _, size, _ in ferry})
        ax.legend(fontsize=8)
    save(fig, out, "p2p_device_vs_nccl.png", [ferry_path, nccl_path])


def plot_allreduce_device(ferry_path, nccl_path, out):
    ferry, nccl = table_rows(ferry_path), table_rows(nccl_path)
    fig, (t, bw) = plt.subplots(1, 2, figsize=(10, 4))
    # ferry: iterations, latency_us, bandwidth_GBps; nccl: iterations, sync_us, busbw, pipelined_us, busbw
    draw(t, by_size(ferry, "allreduce", 1), "ferry (blocking)")
    draw(t, by_size(nccl, "allreduce", 1), "NCCL, each call waited for", "--")
    draw(t, by_size(nccl, "allreduce", 3), "NCCL, back to back", ":")
    draw(bw, by_size(ferry, "allreduce", 2), "ferry (blocking)")
    draw(bw, by_size(nccl, "allreduce", 2), "NCCL, each call waited for", "--")
    draw(bw, by_size(nccl, "allreduce", 4), "NCCL, back to back", ":")
    t.set_yscale("log")
    t.set_ylabel("time per call (µs)")
    t.set_title("allreduce, float32 sum, 2 GPUs")
    bw.set_ylabel("bus bandwidth (GB/s)")
    bw.set_title("allreduce bus bandwidth")
    for ax in (t, bw):
        size_axis(ax, by_size(ferry, "allreduce", 1))
        ax.legend(fontsize=8)
    save(fig, out, "allreduce_device_vs_nccl.png", [ferry_path, nccl_path])


def plot_coll_host(path, out):
    """coll_compare.sh's markdown summary: one table per rank count, rows
    '| <collective> <n> <unit> latency (us) | ferry | Open MPI | ratio | ...'."""
    data = defaultdict(lambda: defaultdict(dict))  # collective -> ranks -> size -> (ferry, ompi)
    ranks = None
    row = re.compile(r"^\|\s*(\w+) (\d+) (B|KiB|MiB|GiB) latency \(us\)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|")
    with open(path) as f:
        for line in f:
            m = re.match(r"^(\d+) ranks\.", line)
            if m:
                ranks = int(m.group(1))
                continue
            m = row.match(line)
            if m and ranks:
                size = int(m.group(2)) * UNITS[m.group(3)]
                data[m.group(1)][ranks][size] = (float(m.group(4)), float(m.group(5)))
    if not data:
        print(f"no collective table found in {path}", file=sys.stderr)
        return
    names = list(data)
    fig, axes = plt.subplots(1, len(names), figsize=(3.2 * len(names), 3.6), squeeze=False)
    for ax, name in zip(axes[0], names):
        for n, sizes in sorted(data[name].items()):
            xs = sorted(sizes)
            line, = ax.plot(xs, [sizes[s][0] for s in xs], "-", marker="o", markersize=3,
                            label=f"ferry, {n} ranks")
            ax.plot(xs, [sizes[s][1] for s in xs], "--", marker="x", markersize=3,
                    color=line.get_color(), label=f"Open MPI, {n} ranks")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        size_axis(ax, xs)
        if ax is axes[0][0]:
            ax.set_ylabel("time per call (µs)")
    axes[0][0].legend(fontsize=6)
    save(fig, out, "coll_host_vs_openmpi.png", [path])


def plot_ofi(path, out):
    """ofi_compare.sh's rows: 'round size ferry_us fi_pingpong_us ferry_rma_off_us'."""
    ferry, fi, off = defaultdict(list), defaultdict(list), defaultdict(list)
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 5 and not line.startswith("#") and parts[0].isdigit():
                size = int(parts[1])
                ferry[size].append(float(parts[2]))
                fi[size].append(float(parts[3]))
                off[size].append(float(parts[4]))
    if not ferry:
        print(f"no rounds found in {path}", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(5.5, 4))
    draw(ax, ferry, "ferry (default)")
    draw(ax, off, "ferry, FERRY_OFI_RMA=off", "-.")
    draw(ax, fi, "fi_pingpong -e rdm", "--")
    ax.set_yscale("log")
    ax.set_ylabel("half round trip (µs)")
    ax.set_title("ping-pong over libfabric tcp")
    size_axis(ax, ferry)
    ax.legend(fontsize=8)
    save(fig, out, "ofi_vs_fi_pingpong.png", [path])


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(here, "..", "docs", "plots"),
                        help="directory for the PNG files (default: docs/plots)")
    parser.add_argument("--p2p-device", nargs=2, metavar=("FERRY", "NCCL"),
                        help="ferry-perf latency/bandwidth -m cuda:cuda and nccl_perf output")
    parser.add_argument("--allreduce-device", nargs=2, metavar=("FERRY", "NCCL"),
                        help="ferry-perf allreduce -m cuda and nccl_perf --allreduce output")
    parser.add_argument("--coll-host", metavar="FILE", help="bench/coll_compare.sh output")
    parser.add_argument("--ofi", metavar="FILE", help="bench/ofi_compare.sh output")
    args = parser.parse_args()

    def default(key):
        return os.path.join(RESULTS, DEFAULTS[key])

    os.makedirs(args.out, exist_ok=True)
    p2p = args.p2p_device or (default("p2p_ferry"), default("p2p_nccl"))
    ar = args.allreduce_device or (default("ar_ferry"), default("ar_nccl"))
    plot_p2p_device(p2p[0], p2p[1], args.out)
    plot_allreduce_device(ar[0], ar[1], args.out)
    plot_coll_host(args.coll_host or default("coll_host"), args.out)
    plot_ofi(args.ofi or default("ofi"), args.out)


if __name__ == "__main__":
    main()
