#!/usr/bin/env bash
# Scratch: 4-rank 64 KiB allreduce, this build against the previous library and Open MPI, interleaved.
set -u
top=/work/main; build=$top/build
work=$(mktemp -d); mpicc -O2 -o "$work/mpi_coll" "$top/bench/mpi_coll.c"
for round in $(seq ${1:-7}); do
  for n in 4 2; do
    new=$("$build/tools/ferryrun" -n $n "$build/tools/ferry-perf" allreduce --sizes 65536 --iterations 2000 --csv | awk -F, 'NR==2{print $4}')
    old=$(LD_LIBRARY_PATH=/tmp/ferry_prev "$build/tools/ferryrun" -n $n "$build/tools/ferry-perf" allreduce --sizes 65536 --iterations 2000 --csv | awk -F, 'NR==2{print $4}')
    ompi=$(mpirun.openmpi --allow-run-as-root --oversubscribe --bind-to none -np $n --mca pml ob1 --mca btl vader,self "$work/mpi_coll" allreduce 65536 2000 2>/dev/null | tail -1 | awk '{print $1}')
    echo "$n $round new $new old $old ompi $ompi"
  done
done
