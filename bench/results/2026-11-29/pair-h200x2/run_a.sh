#!/bin/bash
# Two H200s (nvidia-h200-x2), run from the repository root with .devbin packed by
# `bench/gpu_run.sh pack build` (NCCL_TESTS set) plus OSU 7.4 built with ferry's mpicc and
# --enable-cuda (.devbin/osu), libmpi (.devbin/lib/ferry-mpi) and mpi4py for Python 3.12
# (.devbin/py312). Parts: OSU with device buffers on ferry's MPI, and the machine's Open MPI
# where it is CUDA-aware; mpi4py with CuPy arrays; stream send/recv through the bulk ring in
# several shapes against nccl-tests' sendrecv, interleaved; a DDP step on ferry's libnccl against
# NCCL's; the stream suite.
top=$PWD
export LD_LIBRARY_PATH=$top/.devbin/lib:$top/.devbin/lib/ferry-mpi:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
B=$top/.devbin/bin
R=$B/ferryrun
O=$top/.devbin/osu
o=${OUT:-/tmp/out}/r
mkdir -p "$o"
{ nvidia-smi -L; nvidia-smi topo -m; } > "$o/gpus.txt" 2>&1
parts=${PARTS:-osu mpi4py ring ddp suite}

if [[ $parts == *osu* ]]; then
  {
    for b in osu_latency osu_bw osu_bibw; do
      echo "== ferry $b -c -m 1:4194304 -d cuda D D"
      timeout 120 "$R" -n 2 "$O/$b" -c -m 1:4194304 -d cuda D D 2>&1 | tail -26
      echo "exit ${PIPESTATUS[0]}"
    done
    for b in osu_allreduce osu_bcast; do
      echo "== ferry $b -d cuda -c -m 1:4194304"
      timeout 120 "$R" -n 2 "$O/$b" -d cuda -c -m 1:4194304 2>&1 | tail -26
      echo "exit ${PIPESTATUS[0]}"
    done
    for round in 1 2 3 4 5; do
      echo "== round $round"
      timeout 60 "$R" -n 2 "$O/osu_latency" -m 8:8 -d cuda D D 2>&1 | tail -1 | sed 's/^/latency 8 /'
      timeout 60 "$R" -n 2 "$O/osu_bw" -m 4194304:4194304 -d cuda D D 2>&1 | tail -1 | sed 's/^/bw 4M /'
      timeout 60 "$R" -n 2 "$O/osu_allreduce" -d cuda -m 8:8 2>&1 | tail -1 | sed 's/^/allreduce 8 /'
      timeout 60 "$R" -n 2 "$O/osu_allreduce" -d cuda -m 1048576:1048576 2>&1 | tail -1 |
        sed 's/^/allreduce 1M /'
    done
  } > "$o/osu_ferry.txt" 2>&1
  {
    which mpicc mpirun
    mpirun --version 2>&1 | head -1
    ompi_info --parsable --all 2>/dev/null | grep -i "cuda_support\|built_with_cuda" | head -5
  } > "$o/openmpi.txt" 2>&1
fi

if [[ $parts == *mpi4py* ]]; then
  for n in 2 4; do
    echo "== $n ranks, cupy"
    PYTHONPATH=$top/.devbin/py312 timeout 120 "$R" -n $n /opt/torch/.venv/bin/python \
      tests/mpi/mpi4py_test.py cupy 2>&1 | tail -8
  done > "$o/mpi4py_cupy.txt" 2>&1
fi

if [[ $parts == *ring* ]]; then
  # Shapes: places chunk blocks.
  shapes=${SHAPES:-"64 64k 64|128 64k 64|128 64k 128|64 128k 64|256 32k 64|128 128k 128"}
  for round in 1 2; do
    IFS='|' read -ra list <<< "$shapes"
    for shape in "${list[@]}"; do
      read -r places chunk blocks <<< "$shape"
      echo "== round $round places $places chunk $chunk blocks $blocks"
      FERRY_STREAM_RING_PLACES=$places FERRY_STREAM_RING_CHUNK=$chunk \
        FERRY_STREAM_RING_BLOCKS=$blocks timeout 120 "$R" -n 2 "$B/ferry-perf" sendrecv send \
        --stream -m cuda --check --sizes 1m,4m,16m,64m,256m 2>&1 | grep -v "^#" | tail -14
      FERRY_STREAM_RING_PLACES=$places FERRY_STREAM_RING_CHUNK=$chunk \
        FERRY_STREAM_RING_BLOCKS=$blocks timeout 120 "$R" -n 2 "$B/ferry-perf" sendrecv \
        --graph 100 -m cuda --check --sizes 1m,16m,256m 2>&1 | grep -v "^#" | tail -5
    done
    echo "== round $round nccl sendrecv"
    timeout 120 "$B/sendrecv_perf" -b 1M -e 256M -f 4 -g 2 -G 0 -c 1 2>&1 | grep -E "^ +[0-9]"
    timeout 120 "$B/sendrecv_perf" -b 1M -e 256M -f 4 -g 2 -G 100 -c 1 2>&1 | grep -E "^ +[0-9]"
  done > "$o/ring.txt" 2>&1
fi

if [[ $parts == *ddp* ]]; then
  # PyTorch DDP on ferry's libnccl against torch's own NCCL, interleaved (issue 35's step time).
  GPU_RUN_TORCH_PARTS=ddp GPU_RUN_TORCH_ROUNDS=3 GPU_RUN_CUPY=0 OUT=$o \
    bash bench/gpu_run.sh run nccl_python > "$o/ddp.txt" 2>&1
fi

if [[ $parts == *suite* ]]; then
  OUT=$o bash bench/gpu_run.sh run stream > "$o/stream.txt" 2>&1
fi
ls -la "$o"
