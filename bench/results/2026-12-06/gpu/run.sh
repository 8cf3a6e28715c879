#!/bin/bash
# On the GPU machine, from the repository root with .devbin packed (bench/gpu_run.sh pack build,
# then OSU 7.4 built with ferry's mpicc and --enable-cuda in .devbin/osu, libmpi in
# .devbin/lib/ferry-mpi): the GPU suites, then OSU's device-buffer benchmarks with validation.
#   bash bench/results/2026-12-06/gpu/run.sh tests|stream
top=$PWD
export LD_LIBRARY_PATH=$top/.devbin/lib:$top/.devbin/lib/ferry-mpi:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
mkdir -p "$OUT"
nvidia-smi -L | tee "$OUT/gpus.txt"
case ${1:-tests} in
  tests)
    GPU_RUN_MODES="ipc ipc_refused staged" timeout 330 bash bench/gpu_run.sh run tests 2>&1 |
      tee "$OUT/tests.txt" | tail -40
    R=$top/.devbin/bin/ferryrun O=$top/.devbin/osu
    {
      for b in osu_latency osu_bw osu_bibw; do
        echo "== ferry $b -d cuda D D -c"
        timeout 60 "$R" -n 2 "$O/$b" -c -m 1:1048576 -d cuda D D 2>&1 | tail -23
      done
      for b in osu_allreduce osu_bcast; do
        echo "== ferry $b -d cuda -c"
        timeout 60 "$R" -n 2 "$O/$b" -d cuda -c -m 1:1048576 2>&1 | tail -23
      done
    } > "$OUT/osu_cuda.txt" 2>&1
    grep -cE " Pass$" "$OUT/osu_cuda.txt"; grep -E " Fail$|rror" "$OUT/osu_cuda.txt" | head ;;
  stream)
    timeout 560 bash bench/gpu_run.sh run stream coll 2>&1 | tee "$OUT/stream.txt" | tail -60 ;;
esac
