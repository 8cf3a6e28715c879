#!/usr/bin/env bash
# Scratch: 4-rank 16 MiB broadcast, variants against Open MPI, interleaved (bus bandwidth GB/s).
set -u
top=/work/main; build=$top/build
work=$(mktemp -d); mpicc -O2 -o "$work/mpi_coll" "$top/bench/mpi_coll.c"
f() { env "$@" "$build/tools/ferryrun" -n 4 "$build/tools/ferry-perf" broadcast --sizes 16777216 --iterations 50 --csv | awk -F, 'NR==2{print $5}'; }
for round in $(seq ${1:-5}); do
  d=$(f FERRY_X=1); b=$(f FERRY_COLL_BROADCAST=binomial); c8=$(f FERRY_COLL_CHUNK=8m)
  o=$(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none -np 4 --mca pml ob1 --mca btl vader,self "$work/mpi_coll" broadcast 16777216 50 2>/dev/null | tail -1 | awk '{print $2}')
  echo "round $round default $d binomial $b chunk8m $c8 ompi $o"
done
