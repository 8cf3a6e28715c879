#!/usr/bin/env bash
# Start-up cost: wall time from launch to the end of a job whose ranks only initialize a Context
# (one allgather of addresses, shm segments mapped, one barrier) and finalize it, for 2, 8, 32 and
# 64 ranks on this 2-vCPU VM (oversubscribed). Under ferryrun, mpirun.openmpi (PMIx) and
# mpirun.mpich (hydra, PMI-1),
# interleaved with the references measured in the same rounds: `mpirun.openmpi true` (the
# launcher alone) and an Open MPI program that only calls MPI_Init and MPI_Finalize.
#   [RANKS="2 8 32 64"] bench/init_time.sh [ROUNDS]   (default 5; medians, in seconds)
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}
rounds=${1:-5}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
printf '#include <mpi.h>\nint main(int c, char** v) { MPI_Init(&c, &v); MPI_Finalize(); return 0; }\n' \
  >"$work/mpi_init.c"
mpicc -O2 -o "$work/mpi_init" "$work/mpi_init.c"
ferry_job=("$build/tests/ferry_mp_tests" --gtest_filter=-*)  # init, no tests, finalize
ompi=(mpirun.openmpi --oversubscribe --allow-run-as-root --mca plm_rsh_agent false
      --mca btl vader,self --mca pml ob1)
seconds() {  # COMMAND... -> wall seconds; "fail" for a job that failed or ran past 60 s (seen:
  # `mpirun.openmpi -np 32 true` once never returned)
  local start end
  start=$(date +%s%N)
  if ! timeout 60 "$@" >/dev/null 2>&1; then echo fail; return; fi
  end=$(date +%s%N)
  echo "scale=3; ($end - $start) / 1000000000" | bc
}
# Median of the runs that finished, and how many did not ("1.104" or "0.273 (2 failed)").
median() {
  local runs failed
  runs=$(cat)
  failed=$(echo "$runs" | grep -c fail || true)
  echo "$runs" | grep -v fail | sort -n |
    awk -v f="$failed" '{ v[NR] = $1 } END { if (NR == 0) { print "all failed"; exit }
      printf "%.3f%s\n", v[int((NR + 1) / 2)], (f > 0 ? " (" f " failed)" : "") }'
}
printf '%6s %10s %14s %14s %18s %18s\n' ranks ferryrun mpirun+ferry hydra+ferry \
  "mpirun true" mpirun+MPI_Init
for n in ${RANKS:-2 8 32 64}; do
  : >"$work/a"; : >"$work/b"; : >"$work/c"; : >"$work/d"; : >"$work/e"
  for ((i = 0; i < rounds; i++)); do
    seconds "$build/tools/ferryrun" -n "$n" "${ferry_job[@]}" >>"$work/a"
    seconds "${ompi[@]}" -np "$n" "${ferry_job[@]}" >>"$work/b"
    seconds mpirun.mpich -np "$n" "${ferry_job[@]}" >>"$work/e"
    seconds "${ompi[@]}" -np "$n" true >>"$work/c"
    seconds "${ompi[@]}" -np "$n" "$work/mpi_init" >>"$work/d"
  done
  printf '%6d %10s %14s %14s %18s %18s\n' "$n" "$(median <"$work/a")" "$(median <"$work/b")" \
    "$(median <"$work/e")" "$(median <"$work/c")" "$(median <"$work/d")"
done
