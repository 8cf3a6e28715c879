#!/usr/bin/env bash
# Small host collectives, the community's own benchmark on both sides: OSU 7.4's osu_barrier,
# osu_bcast, osu_reduce, osu_allreduce, osu_allgather and osu_reduce_scatter (from a fetched copy,
# never committed) built once with ferry's mpicc and once with Debian's Open MPI, run interleaved
# (ferry, then Open MPI, for each benchmark and rank count in each round; the vCPUs of these VMs
# change placement every few seconds), 8 B to 64 KiB. OSU times every call on its own between
# barriers and reports the average over its iterations; the table gives per rank count, benchmark
# and size the medians of the rounds, the median of the per-round ratios (Open MPI / ferry: > 1,
# ferry faster), and the spread of each side, (slowest - fastest) / median, with each side's
# slowest round.
#   bench/osu_coll.sh OSU_SOURCE_DIR [ROUNDS] [RANKS...]     (default 5 rounds; 2 3 4 8 ranks)
# OSU_WORK keeps the builds for the next run; OSU_COLL="bcast allreduce" runs only those;
# Open MPI runs with --oversubscribe --bind-to none (as many ranks as vCPUs or more: neither binds).
# MPICH=1 adds Debian's MPICH (4.0, ch4:ucx; libmpich-dev installed where missing) as a third
# side, after Open MPI in each round, and the same tables against it (on rank counts up to the
# CPUs only: see below).
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
src=$1 rounds=${2:-5}
shift $(($# > 1 ? 2 : 1))
ranks_list=${*:-2 3 4 8}
if [ -n "${OSU_WORK:-}" ]; then
  work=$OSU_WORK
  mkdir -p "$work"
else
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
fi
# shellcheck source=bench/osu_build.sh
source "$top/bench/osu_build.sh"
osu_build "$work/ferry" "$src" "$build/tools/mpicc" "$build/tools/mpicxx"
osu_build "$work/openmpi" "$src" mpicc.openmpi mpicxx.openmpi
sides="ferry openmpi"
if [ "${MPICH:-0}" = 1 ]; then
  osu_build "$work/mpich" "$src" mpicc.mpich mpicxx.mpich
  sides+=" mpich"
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

results=$work/osu_coll.tsv
: >"$results"
run() {  # SIDE RANKS BENCHMARK -> "size latency" lines
  local dir=$work/$1/c/mpi/collective/blocking args=(-m 8:65536) out
  [ "$3" = barrier ] && args=()
  out=$(mpi_side "$1" "$2" "$dir/osu_$3" "${args[@]}") ||
    { echo "osu_coll: osu_$3 on $2 ranks ($1) failed:" >&2; echo "$out" | tail -5 >&2; exit 1; }
  if [ "$3" = barrier ]; then
    echo "$out" | awk '/^ *[0-9.]+ *$/ {print 0, $1}'
  else
    echo "$out" | awk '/^[0-9]+ +[0-9.]+/ {print $1, $2}'
  fi
}
for round in $(seq "$rounds"); do
  for n in $ranks_list; do
    echo "round $round/$rounds, $n ranks" >&2
    for b in ${OSU_COLL:-barrier bcast reduce allreduce allgather reduce_scatter}; do
      for side in $sides; do
        # MPICH's ranks poll without yielding: more ranks than CPUs crawl (on 2 vCPUs, 3 ranks
        # took 4,179 us per 8 B allreduce; 8 ranks did not finish osu_allreduce in 300 s).
        if [ "$side" = mpich ] && [ "$n" -gt "$(nproc)" ]; then continue; fi
        run "$side" "$n" "$b" | while read -r size us; do
          printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$n" "$b" "$size" "$side" "$us" >>"$results"
        done
      done
    done
  done
done

python3 - "$results" <<'PY'
import collections, statistics, sys
runs = collections.defaultdict(dict)  # (ranks, benchmark, size) -> side -> {round: us}
for line in open(sys.argv[1]):
    rnd, n, b, size, side, us = line.split()
    runs[(int(n), b, int(size))].setdefault(side, {})[rnd] = float(us)
def spread(xs):
    return (max(xs) - min(xs)) / statistics.median(xs)
def report(ref, name):
    print(f"## ferry against {name}")
    print()
    print(f"| ranks | benchmark | size | ferry median (us) | {name} median | ratio | ferry spread "
          f"| {name} spread | ferry slowest | {name} slowest |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    behind, wider, wider_us, slower_worst, cells = [], [], [], [], 0
    for (n, b, size), sides in sorted(runs.items()):
        f, o = sides.get("ferry", {}), sides.get(ref, {})
        both = sorted(set(f) & set(o))
        if not both:
            continue
        cells += 1
        fv, ov = [f[r] for r in both], [o[r] for r in both]
        ratio = statistics.median(o[r] / f[r] for r in both)
        label = f"{n} {b} {size if b != 'barrier' else '-'}"
        if statistics.median(fv) > statistics.median(ov):
            behind.append(label)
        if spread(fv) > spread(ov):
            wider.append(label)
        if max(fv) - min(fv) > max(ov) - min(ov):
            wider_us.append(label)
        if max(fv) > max(ov):
            slower_worst.append(label)
        print(f"| {n} | {b} | {size if b != 'barrier' else '-'} | {statistics.median(fv):.2f} | "
              f"{statistics.median(ov):.2f} | {ratio:.2f} | {spread(fv):.2f} | {spread(ov):.2f} | "
              f"{max(fv):.2f} | {max(ov):.2f} |")
    print()
    print(f"{cells} cells. ferry's median slower than {name}'s in {len(behind)}: "
          f"{', '.join(behind) or '-'}")
    print(f"ferry's spread wider in {len(wider)}: {', '.join(wider) or '-'}")
    # The same jitter (a round in the VM's far placement) is a wider spread relative to a
    # smaller median: the difference in microseconds too.
    print(f"ferry's slowest - fastest (us) wider in {len(wider_us)}: {', '.join(wider_us) or '-'}")
    print(f"ferry's slowest round slower than {name}'s slowest in {len(slower_worst)}: "
          f"{', '.join(slower_worst) or '-'}")
    print()
    print(f"| ranks | benchmark | sizes at or ahead of {name} | lowest ratio (size) | median ratio "
          "| spread no wider | slowest round no slower |")
    print("|---|---|---|---|---|---|---|")
    for n, b in sorted({(k[0], k[1]) for k in runs}):
        rows = []
        for (n2, b2, size), sides in sorted(runs.items()):
            f, o = sides.get("ferry", {}), sides.get(ref, {})
            both = sorted(set(f) & set(o))
            if (n2, b2) != (n, b) or not both:
                continue
            fv, ov = [f[r] for r in both], [o[r] for r in both]
            rows.append((size, statistics.median(o[r] / f[r] for r in both),
                         spread(fv) <= spread(ov), max(fv) <= max(ov)))
        if not rows:
            continue
        low = min(rows, key=lambda r: r[1])
        where = "-" if b == "barrier" else (f"{low[0]} B" if low[0] < 1024 else f"{low[0] // 1024} KiB")
        print(f"| {n} | {b} | {sum(r[1] >= 1 for r in rows)}/{len(rows)} | {low[1]:.2f} ({where}) | "
              f"{statistics.median(r[1] for r in rows):.2f} | {sum(r[2] for r in rows)}/{len(rows)} | "
              f"{sum(r[3] for r in rows)}/{len(rows)} |")
    print()
report("openmpi", "Open MPI")
if any("mpich" in sides for sides in runs.values()):
    report("mpich", "MPICH")
PY
echo "raw rounds (round, ranks, benchmark, size, side, us): $results"
