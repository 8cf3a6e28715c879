#!/bin/bash
# ferry's MPI on the GPU machine: OSU 7.4 (built here with ferry's mpicc, --enable-cuda) with
# device buffers, then the same source built there against its CUDA-aware Open MPI.
top=$PWD
export LD_LIBRARY_PATH=$top/.devbin/lib:$top/.devbin/lib/ferry-mpi:${LD_LIBRARY_PATH:-}
R=$top/.devbin/bin/ferryrun
O=$top/.devbin/osu
mkdir -p $OUT/r
nvidia-smi -L > $OUT/r/gpus.txt 2>&1
{
for b in osu_latency osu_bw osu_bibw; do
  echo "== ferry $b -d cuda D D -c"
  timeout 100 $R -n 2 $O/$b -c -m 1:4194304 -d cuda D D 2>&1 | tail -26
done
for b in osu_allreduce osu_bcast; do
  echo "== ferry $b -d cuda -c"
  timeout 100 $R -n 2 $O/$b -d cuda -c -m 1:4194304 2>&1 | tail -26
done
} > $OUT/r/ferry.txt 2>&1
{
which mpicc mpirun nvcc; mpirun --version 2>&1 | head -2
ompi_info --parsable --all 2>/dev/null | grep -i cuda | head -5
cuda=$(dirname $(dirname $(which nvcc)))
mkdir -p /tmp/ob && tar xJf .devbin/osu-src.tar.xz -C /tmp/ob && cd /tmp/ob/osu.src &&
  { CC=mpicc CXX=mpicxx ./configure --enable-cuda --with-cuda=$cuda > conf.log 2>&1 || tail -5 conf.log; } &&
  for d in c/util c/mpi/pt2pt/standard c/mpi/collective/blocking; do
    make -j16 -C $d CFLAGS="-g -O2 -include /tmp/ob/osu_cuda13.h" > make.log 2>&1 || tail -5 make.log
  done
ob=/tmp/ob/osu.src/c/mpi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
for b in osu_latency osu_bw osu_bibw; do
  echo "== Open MPI $b -d cuda D D -c"
  timeout 100 mpirun -n 2 --bind-to none $ob/pt2pt/standard/$b -c -m 1:4194304 -d cuda D D 2>&1 | tail -26
done
for b in osu_allreduce osu_bcast; do
  echo "== Open MPI $b -d cuda -c"
  timeout 100 mpirun -n 2 --bind-to none $ob/collective/blocking/$b -d cuda -c -m 1:4194304 2>&1 | tail -26
done
} > $OUT/r/openmpi.txt 2>&1
cd $top
{
for round in 1 2 3; do
  echo "== round $round"
  timeout 60 $R -n 2 $O/osu_latency -m 8:8 -d cuda D D 2>&1 | tail -1 | sed 's/^/ferry latency /'
  timeout 60 mpirun -n 2 --bind-to none /tmp/ob/osu.src/c/mpi/pt2pt/standard/osu_latency -m 8:8 -d cuda D D 2>&1 | tail -1 | sed 's/^/ompi latency /'
  timeout 60 $R -n 2 $O/osu_bw -m 4194304:4194304 -d cuda D D 2>&1 | tail -1 | sed 's/^/ferry bw /'
  timeout 60 mpirun -n 2 --bind-to none /tmp/ob/osu.src/c/mpi/pt2pt/standard/osu_bw -m 4194304:4194304 -d cuda D D 2>&1 | tail -1 | sed 's/^/ompi bw /'
  timeout 60 $R -n 2 $O/osu_allreduce -d cuda -m 8:8 2>&1 | tail -1 | sed 's/^/ferry allreduce /'
  timeout 60 mpirun -n 2 --bind-to none /tmp/ob/osu.src/c/mpi/collective/blocking/osu_allreduce -d cuda -m 8:8 2>&1 | tail -1 | sed 's/^/ompi allreduce /'
done
} > $OUT/r/interleaved.txt 2>&1
