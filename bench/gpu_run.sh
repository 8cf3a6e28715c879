#!/usr/bin/env bash
# Runs the GPU tests and benchmarks on a GPU machine from binaries built elsewhere: pack them with
# `bench/gpu_run.sh pack BUILD_DIR` (into .devbin/), run `bench/gpu_run.sh run [STEP...]` there.
# Steps: info probe guard tests coll coll_kill coll_sanitizer stream stream_sanitizer stream_perf
# stream_ll pinned perf perf_staged compare coll_compare twoshot resident check sanitizer ofi
# ofi_perf kill campaign mesh_tests mesh_perf mesh_stream mesh_probe mesh_allreduce_probe nccl_api
# nccl_python (every GPU of the machine; default: info tests perf). guard measures every GPU
# figure docs/PERFORMANCE.md promises against its reference in the same run and prints those
# below their recorded ratio (bench/gpu_guard.py): every change to GPU code runs it. The ofi
# step needs libfabric there: carry .devlibs (a copy of Debian's libfabric1 and its
# dependencies, with an env.sh that puts them on LD_LIBRARY_PATH) and source .devlibs/env.sh
# first.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
if [ "${1:-}" = pack ]; then
  build=${2:?build dir}
  rm -rf "$here/.devbin" && mkdir -p "$here/.devbin/bin" "$here/.devbin/lib"
  cp "$build"/tools/ferryrun "$build"/tools/ferry-perf "$build"/tools/ferry-info \
     "$build"/tests/ferry_gpu_tests "$build"/tests/ferry_gpu_coll_tests \
     "$build"/tests/ferry_gpu_stream_tests "$build"/tests/ferry_fault_test \
     "$build"/tests/ferry_campaign_test "$here/.devbin/bin/"
  # nccl-tests, where NCCL_TESTS names a folder it was built in (a fetched copy of
  # NVIDIA/nccl-tests: make -C src NCCL_HOME=$CUDA_HOME
  # NVCC_GENCODE=-gencode=arch=compute_90,code=sm_90), with the CUDA runtime it links.
  if [ -n "${NCCL_TESTS:-}" ]; then
    for t in all_reduce sendrecv broadcast all_gather reduce_scatter reduce alltoall scatter \
             gather hypercube; do
      cp "$NCCL_TESTS/build/${t}_perf" "$here/.devbin/bin/" 2>/dev/null
    done
    cp -L "$(ldd "$NCCL_TESTS"/build/all_reduce_perf | awk '/libcudart/ {print $3}')" \
      "$here/.devbin/lib/"
  fi
  # NCCL's API on ferry, and nccl-tests built with MPI=1 (one process per GPU) where
  # NCCL_TESTS_MPI names their build folder (make -C src MPI=1 MPI_HOME=... BUILDDIR=...).
  if [ -e "$build/lib/ferry-nccl/libnccl.so.2" ]; then
    mkdir -p "$here/.devbin/lib/ferry-nccl"
    cp -P "$build"/lib/ferry-nccl/libnccl.so* "$here/.devbin/lib/ferry-nccl/"
  fi
  if [ -n "${NCCL_TESTS_MPI:-}" ]; then
    mkdir -p "$here/.devbin/bin/nccl-mpi"
    for t in all_reduce all_gather broadcast reduce reduce_scatter alltoall sendrecv scatter \
             gather hypercube; do
      cp "$NCCL_TESTS_MPI/${t}_perf_mpi" "$here/.devbin/bin/nccl-mpi/${t}_perf" 2>/dev/null ||
        cp "$NCCL_TESTS_MPI/${t}_perf" "$here/.devbin/bin/nccl-mpi/"
    done
    [ -e "$here/.devbin/lib/libcudart.so.13" ] || cp -L "$(ldd "$NCCL_TESTS_MPI"/all_reduce_perf* |
      awk '/libcudart/ {print $3}' | head -1)" "$here/.devbin/lib/"
  fi
  [ -x "$build/bench/nccl_perf" ] && cp "$build/bench/nccl_perf" "$here/.devbin/bin/"
  [ -x "$build/bench/cuda_probe" ] && cp "$build/bench/cuda_probe" "$here/.devbin/bin/"
  [ -x "$build/bench/pinned_rate" ] && cp "$build/bench/pinned_rate" "$here/.devbin/bin/"
  [ -f "$build/kernels.fatbin" ] && cp "$build/kernels.fatbin" "$here/.devbin/"
  # The link probe (bench/mesh_probe.cu: CUDA runtime, not the library's build).
  nvcc=${CUDA_HOME:-/usr/local/cuda}/bin/nvcc
  [ -x "$nvcc" ] && "$nvcc" -O3 -std=c++20 -gencode arch=compute_90,code=sm_90 \
    "$here/bench/mesh_probe.cu" -o "$here/.devbin/bin/mesh_probe"
  # The two-shot allreduce's ways of moving data (bench/mesh_allreduce_probe.cu, likewise).
  [ -x "$nvcc" ] && "$nvcc" -O3 -std=c++20 -gencode arch=compute_90,code=sm_90 \
    "$here/bench/mesh_allreduce_probe.cu" -o "$here/.devbin/bin/mesh_allreduce_probe"
  cp -P "$build"/libferry.so* "$here/.devbin/lib/"
  strip --strip-debug "$here"/.devbin/bin/* "$here"/.devbin/lib/libferry.so.*.* 2>/dev/null
  du -sh "$here/.devbin"
  exit 0
fi
if [ "${1:-}" != run ]; then
  # A step named without `run` had run the default steps instead (minutes of a GPU machine).
  echo "usage: bench/gpu_run.sh pack BUILD_DIR | run [STEP...] (got: ${*:-nothing})" >&2
  exit 2
fi
shift
steps=${*:-info tests perf}
export LD_LIBRARY_PATH=$here/.devbin/lib:${LD_LIBRARY_PATH:-}
export NCCL_NVLS_ENABLE=0
bin=$here/.devbin/bin
out=${OUT:-/tmp/ferry-gpu-out}
mkdir -p "$out"
run=("$bin/ferryrun" --timeout 500 -n 2)
for step in $steps; do
  echo "=== $step"
  case $step in
    info)
      nvidia-smi -L
      "${run[@]}" "$bin/ferry-info" --peers 2>&1 | grep -v "^  FERRY_" | head -20 ;;
    tests)
      for mode in ${GPU_RUN_MODES:-ipc ipc_refused staged kernel_copy events}; do
        env=()
        [ $mode = events ] && env=(FERRY_TEST_CUDA_EVENTS=1)
        [ $mode = ipc_refused ] && env=(FERRY_TEST_CUDA_IPC_FAIL=1)
        [ $mode = staged ] && env=(FERRY_CUDA_IPC=0)
        # Every IPC copy of a message that follows another one by the copy kernel.
        [ $mode = kernel_copy ] && env=(FERRY_CUDA_IPC_KERNEL_COPY=1 FERRY_CUDA_IPC_KERNEL_COPY_MAX=1024g)
        echo "--- gpu.$mode ${env[*]:-}"
        env "${env[@]}" "${run[@]}" "$bin/ferry_gpu_tests" 2>&1 | tee "$out/gpu_$mode.log" \
          | grep -E "^\[  |rank .*(grew|->)|Failure|error|SKIP" | head -40
        echo "exit ${PIPESTATUS[0]}"
      done
      # Page-locked sends alone with IPC failing: the receiver offers its buffer, the sender's
      # mapping fails (its first), so it refuses IPC with that peer and stages the message.
      echo "--- gpu.pinned_put_refused FERRY_TEST_CUDA_IPC_FAIL=1"
      FERRY_TEST_CUDA_IPC_FAIL=1 "${run[@]}" "$bin/ferry_gpu_tests" \
        --gtest_filter='Gpu.PinnedHost*' 2>&1 | tee "$out/gpu_pinned_put_refused.log" \
        | grep -E "^\[  |CUDA IPC with rank|Failure|error" | head -20
      echo "exit ${PIPESTATUS[0]}"
      # Staged page-locked memory with half of each slot copied by the CPU (the split's edges).
      echo "--- gpu.pinned_cpu_part FERRY_CUDA_IPC=0 FERRY_CUDA_STAGE_CPU_PART=50"
      FERRY_CUDA_IPC=0 FERRY_CUDA_STAGE_CPU_PART=50 "${run[@]}" "$bin/ferry_gpu_tests" \
        --gtest_filter='Gpu.PinnedHost*' 2>&1 | tee "$out/gpu_pinned_cpu_part.log" \
        | grep -E "^\[  |Failure|error" | head -20
      echo "exit ${PIPESTATUS[0]}" ;;
    coll)
      # Collectives on device buffers against host buffers: 2 ranks, 3 ranks (two share a GPU
      # where there are two, so no one-shot kernel unless FERRY_COLL_DEVICE_SHARED_GPU=1), the
      # bandwidth algorithms forced, and IPC refused (so no one-shot).
      # Then every device allreduce from 1 KiB by the two-shot kernel (recursive doubling's order
      # below FERRY_COLL_SMALL, the ring's from there), and from 64 KiB in rounds of 1 MiB past
      # 2 MiB.
      for case in "2" "3" "3 FERRY_COLL_DEVICE_SHARED_GPU=1" "2 FERRY_COLL_SMALL=0 FERRY_COLL_CHUNK=64k" \
          "2 FERRY_TEST_CUDA_IPC_FAIL=1" "2 FERRY_COLL_DEVICE_TWOSHOT=1k" \
          "2 FERRY_COLL_DEVICE_TWOSHOT=64k FERRY_COLL_DEVICE_ONESHOT=1m"; do
        set -- $case
        n=$1; shift
        echo "--- gpu.coll -n $n $*"
        env "$@" "$bin/ferryrun" --timeout 500 -n "$n" "$bin/ferry_gpu_coll_tests" 2>&1 \
          | tee -a "$out/gpu_coll.log" | grep -E "^\[  |rank .*grew|Failure|error|SKIP" | head -30
        echo "exit ${PIPESTATUS[0]}"
      done ;;
    stream)
      # Stream-ordered operations and graph replays (allreduces and send/recv as kernels on the
      # stream with IPC, the same with send/recv inline only to 4 KiB, and with another shape of
      # the bulk ring, then every call by ferry's thread, then staged), then the last rank killed
      # while the others' streams or graph replays wait for it: they must be released with the
      # error; then an allreduce nobody else makes, released by FERRY_TIMEOUT.
      for mode in ipc p2p_4k ring_small proxy staged; do
        env=()
        [ $mode = p2p_4k ] && env=(FERRY_STREAM_P2P=4k)
        # The bulk ring in another shape: two places a block, 16 KiB each (many rounds a message).
        [ $mode = ring_small ] && env=(FERRY_STREAM_RING_PLACES=128 FERRY_STREAM_RING_CHUNK=16k
          FERRY_STREAM_RING_BLOCKS=64)
        [ $mode = staged ] && env=(FERRY_CUDA_IPC=0)
        [ $mode = proxy ] && env=(FERRY_STREAM_KERNEL=0 FERRY_STREAM_P2P=0)
        echo "--- gpu.stream.$mode ${env[*]:-}"
        env "${env[@]}" "${run[@]}" "$bin/ferry_gpu_stream_tests" 2>&1 \
          | tee "$out/gpu_stream_$mode.log" | grep -E "^\[  |Failure|error|SKIP|Which is|Expected" \
          | awk 'NR <= 40'
        echo "exit ${PIPESTATUS[0]}"
      done
      # Send/recv through the kernels' bulk ring with ferry's thread kept idle: their launches
      # must release the streams themselves (a receive into host memory must wait).
      echo "--- thread-idle FERRY_TEST_STREAM_THREAD_IDLE=1 FERRY_COLL_DEVICE_SHARED_GPU=1"
      FERRY_TEST_STREAM_THREAD_IDLE=1 FERRY_COLL_DEVICE_SHARED_GPU=1 "$bin/ferryrun" --timeout 120 \
        -n 2 "$bin/ferry_gpu_stream_tests" thread-idle 2>&1 | tee "$out/gpu_thread_idle.log" \
        | grep -E "^rank|error|warn" | awk 'NR <= 20'
      echo "exit ${PIPESTATUS[0]}"
      # A rank killed, a call nobody else makes (FERRY_TIMEOUT=1), a rank that ends its Context
      # while the others' calls wait for it (no FERRY_TIMEOUT): every stream must be released.
      for mode in stream-death graph-death p2p-graph-death broadcast-graph-death never-arrives \
          p2p-never-arrives leaves p2p-leaves; do
        for kernel in 16m 0; do
          echo "--- $mode -n 2 FERRY_STREAM_KERNEL=$kernel FERRY_STREAM_P2P=${kernel/16m/256k}"
          FERRY_STREAM_KERNEL=$kernel FERRY_STREAM_P2P=${kernel/16m/256k} FERRY_TIMEOUT=$([[ $mode = *never-arrives ]] && echo 1 || echo 0) \
            "$bin/ferryrun" --timeout 60 --keep-going -n 2 "$bin/ferry_gpu_stream_tests" $mode \
            2>&1 | tee "$out/gpu_$mode.$kernel.log" | grep -E "^rank|error|warn" | awk 'NR <= 20'
          echo "exit ${PIPESTATUS[0]}"
        done
      done ;;
    stream_perf)
      # Interleaved rounds: ferry's allreduce and sendrecv host-synchronous (allreduce only),
      # stream-ordered back to back, and replayed from graphs of 100 calls; then nccl-tests (one
      # process, a GPU per rank) back to back and replayed from graphs (-G: 20 calls a graph).
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-8,512,32k,2m,16m,128m}
      ngpu=$(nvidia-smi -L | wc -l)
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-2}"); do
        echo "--- round $round"
        # One test per run: a run that stops loses only its own rows (they print at the end).
        for mode in "" "--stream" "--graph 100"; do
          for t in allreduce sendrecv; do
            [ -z "$mode" ] && [ $t = sendrecv ] && continue
            "$bin/ferryrun" --timeout 120 -n "$ngpu" "$bin/ferry-perf" $t $mode -m cuda \
              --check --sizes "$sizes" 2>&1 | tee -a "$out/stream_perf_ferry.txt"
          done
        done
        for t in all_reduce_perf sendrecv_perf; do
          [ -x "$bin/$t" ] || continue
          for graph in 0 100; do
            LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/$t" -b 8 -e 128M -f 8 -g "$ngpu" \
              -G "$graph" 2>&1 | grep -v "^#  Rank\|^# Using devices" \
              | sed "s/^/$t -G $graph: /" | tee -a "$out/stream_perf_nccl.txt" | grep -v "#"
          done
        done
      done ;;
    coll_compare)
      # Interleaved rounds: ferry-perf allreduce -m cuda, then NCCL's allreduce, same sizes.
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-8,64k,1m,8m,64m,512m}
      ngpu=$(nvidia-smi -L | wc -l)
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-3}"); do
        echo "--- round $round"
        "$bin/ferryrun" --timeout 500 -n "$ngpu" "$bin/ferry-perf" allreduce -m cuda --check \
          --sizes "$sizes" 2>&1 | tee -a "$out/coll_compare_ferry.txt"
        LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/ferryrun" --timeout 500 -n "$ngpu" \
          "$bin/nccl_perf" --allreduce --sizes "$sizes" 2>&1 | grep -v "^NCCL INFO" \
          | tee -a "$out/coll_compare_nccl.txt"
      done ;;
    twoshot)
      # Interleaved rounds at the sizes around the two-shot kernel: the default, the two-shot
      # kernel off (FERRY_COLL_DEVICE_TWOSHOT=0: one-shot up to 16 MiB, then the ring), the
      # two-shot kernel from GPU_RUN_TWOSHOT_FROM (4m), then NCCL.
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-4m,8m,16m,24m,32m,64m,512m}
      ngpu=$(nvidia-smi -L | wc -l)
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-3}"); do
        for twoshot in default 0 "${GPU_RUN_TWOSHOT_FROM:-4m}"; do
          echo "--- round $round: FERRY_COLL_DEVICE_TWOSHOT=$twoshot" | tee -a "$out/twoshot_ferry.txt"
          setting=(FERRY_COLL_DEVICE_TWOSHOT=$twoshot)
          [ "$twoshot" = default ] && setting=()
          env "${setting[@]}" "$bin/ferryrun" --timeout 120 -n "$ngpu" \
            "$bin/ferry-perf" allreduce -m cuda --check --sizes "$sizes" 2>&1 \
            | sed "s/^/twoshot=$twoshot /" | tee -a "$out/twoshot_ferry.txt"
        done
        LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/ferryrun" --timeout 120 -n "$ngpu" \
          "$bin/nccl_perf" --allreduce --sizes "$sizes" 2>&1 | grep -v "^NCCL INFO" \
          | tee -a "$out/twoshot_nccl.txt"
      done ;;
    resident)
      # Small device allreduces, interleaved: the resident kernel (default), every call launched
      # (FERRY_COLL_DEVICE_RESIDENT=0), then NCCL where there is a GPU per rank. With one GPU,
      # GPU_RUN_MPS=1 starts MPS so the ranks' kernels run side by side, and keeps the resident
      # kernel there (FERRY_COLL_DEVICE_SHARED_GPU=1).
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-8,1k,8k,64k}
      ngpu=$(nvidia-smi -L | wc -l)
      n=$ngpu; [ "$n" -lt 2 ] && n=2
      if [ -n "${GPU_RUN_MPS:-}" ]; then
        export CUDA_MPS_PIPE_DIRECTORY=/tmp/ferry-mps CUDA_MPS_LOG_DIRECTORY=/tmp/ferry-mps-log
        mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
        nvidia-cuda-mps-control -d && echo "MPS started"
        export FERRY_COLL_DEVICE_SHARED_GPU=1
      fi
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-3}"); do
        echo "--- round $round: resident"
        "$bin/ferryrun" --timeout 120 -n "$n" "$bin/ferry-perf" allreduce -m cuda --check \
          --sizes "$sizes" 2>&1 | tee -a "$out/resident_ferry.txt"
        echo "--- round $round: launched (FERRY_COLL_DEVICE_RESIDENT=0)"
        FERRY_COLL_DEVICE_RESIDENT=0 "$bin/ferryrun" --timeout 120 -n "$n" "$bin/ferry-perf" \
          allreduce -m cuda --check --sizes "$sizes" 2>&1 | tee -a "$out/resident_launched.txt"
        if [ "$ngpu" -ge 2 ]; then
          LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/ferryrun" --timeout 120 -n "$n" \
            "$bin/nccl_perf" --allreduce --sizes "$sizes" 2>&1 | grep -v "^NCCL INFO" \
            | tee -a "$out/resident_nccl.txt"
        fi
      done
      if [ -n "${GPU_RUN_MPS:-}" ]; then
        echo quit | nvidia-cuda-mps-control
        unset FERRY_COLL_DEVICE_SHARED_GPU
      fi ;;
    perf)
      for mem in cuda:cuda host:cuda cuda:host; do
        "${run[@]}" "$bin/ferry-perf" latency bandwidth -m $mem \
          --sizes 8,4k,64k,1m,4m,64m,256m 2>&1 | tee "$out/perf_${mem/:/_}.txt"
      done ;;
    perf_staged)
      FERRY_CUDA_IPC=0 "${run[@]}" "$bin/ferry-perf" latency bandwidth -m cuda:cuda \
        --sizes 8,64k,4m,64m,256m 2>&1 | tee "$out/perf_staged.txt" ;;
    pinned)
      # Interleaved rounds: the copy engine's pinned rates (bench/pinned_rate), then page-locked
      # host to and from device memory with CUDA IPC (written or read by one GPU's copy engine)
      # and with FERRY_CUDA_IPC=0 (through the staging ring).
      sizes=${GPU_RUN_SIZES:-4m,64m,256m}
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-3}"); do
        echo "--- round $round"
        "$bin/pinned_rate" 0 64 2>&1 | tee -a "$out/pinned_rate.txt"
        for ipc in 1 0; do
          for mem in pinned:cuda cuda:pinned; do
            echo "# FERRY_CUDA_IPC=$ipc $mem" | tee -a "$out/pinned_perf.txt"
            FERRY_CUDA_IPC=$ipc "${run[@]}" "$bin/ferry-perf" bandwidth -m $mem \
              --sizes "$sizes" 2>&1 | tee -a "$out/pinned_perf.txt"
          done
        done
      done ;;
    stream_ll)
      # Interleaved rounds: stream-ordered allreduces back to back and replayed from graphs of
      # 100 calls with LL lines up to each of GPU_RUN_LL (FERRY_STREAM_LL), then nccl-tests back
      # to back and from graphs, same sizes.
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-8,4k,16k,64k,128k,256k,1m}
      ngpu=$(nvidia-smi -L | wc -l)
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-2}"); do
        echo "--- round $round"
        for ll in ${GPU_RUN_LL:-0 256k}; do
          for mode in "--stream" "--graph 100"; do
            echo "# FERRY_STREAM_LL=$ll $mode" | tee -a "$out/stream_ll_ferry.txt"
            FERRY_STREAM_LL=$ll "$bin/ferryrun" --timeout 120 -n "$ngpu" "$bin/ferry-perf" \
              allreduce $mode -m cuda --check --sizes "$sizes" 2>&1 \
              | tee -a "$out/stream_ll_ferry.txt"
          done
        done
        if [ -x "$bin/all_reduce_perf" ]; then
          for graph in 0 100; do
            LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/all_reduce_perf" -b 8 -e 1M -f 2 \
              -g "$ngpu" -G "$graph" 2>&1 | grep -v "^#  Rank\|^# Using devices" \
              | sed "s/^/all_reduce_perf -G $graph: /" | tee -a "$out/stream_ll_nccl.txt" \
              | grep -v "#"
          done
        fi
      done ;;
    compare)
      # Interleaved rounds: ferry-perf -m cuda:cuda, then NCCL's send/recv, same sizes and tests.
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-8,64k,1m,4m,8m,64m,512m}
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-3}"); do
        echo "--- round $round"
        "${run[@]}" "$bin/ferry-perf" latency bandwidth -m cuda:cuda --sizes "$sizes" 2>&1 \
          | tee -a "$out/compare_ferry.txt"
        if [ -n "${GPU_RUN_NOSPLIT:-}" ]; then
          echo "# FERRY_CUDA_IPC_SPLIT=0" | tee -a "$out/compare_ferry_nosplit.txt"
          FERRY_CUDA_IPC_SPLIT=0 "${run[@]}" "$bin/ferry-perf" latency bandwidth -m cuda:cuda \
            --sizes "$sizes" 2>&1 | tee -a "$out/compare_ferry_nosplit.txt"
        fi
        LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "${run[@]}" "$bin/nccl_perf" --sizes "$sizes" \
          2>&1 | grep -v "^NCCL INFO" | tee -a "$out/compare_nccl.txt"
      done ;;
    mesh_tests)
      # Every GPU a rank (4 or 8 on a full mesh): the collective and stream suites (the
      # point-to-point suite is a pair's: the tests step); the collectives again with the two-shot
      # kernel from 1 KiB and from 21 KiB (up to 1.3 MiB with four members), and with the ring
      # forced; then a rank killed mid-allreduce (small calls, then 256 MiB ones by the ring).
      ngpu=$(nvidia-smi -L | wc -l)
      for case in "gpu_coll" "gpu_coll FERRY_COLL_DEVICE_TWOSHOT=1k" \
          "gpu_coll FERRY_COLL_DEVICE_TWOSHOT=64k FERRY_COLL_DEVICE_ONESHOT=1m" \
          "gpu_coll FERRY_COLL_ALLREDUCE=ring FERRY_COLL_SMALL=0" "gpu_stream"; do
        set -- $case
        suite=$1; shift
        echo "--- $suite -n $ngpu $*"
        env "$@" "$bin/ferryrun" --timeout 240 -n "$ngpu" "$bin/ferry_${suite}_tests" 2>&1 \
          | tee -a "$out/mesh_tests.log" | grep -E "^\[  |Failure|error|SKIP|Which is|Expected" | awk 'NR <= 30'
        echo "exit ${PIPESTATUS[0]}"
      done
      for size in "" 256; do
        echo "--- coll_kill -n $ngpu ${size:+(${size} MiB)}"
        "$bin/ferryrun" --timeout 60 --keep-going -n "$ngpu" "$bin/ferry_fault_test" \
          coll-death-device $size 2>&1 | tee -a "$out/mesh_tests.log" | grep -E "rank|FAIL|SKIP"
        echo "exit ${PIPESTATUS[0]}"
      done
      # The last rank killed while the others' streams or graph replays (an allreduce, a 4 MiB
      # broadcast by the mesh kernel) wait for it; an allreduce nobody else makes (FERRY_TIMEOUT).
      for mode in stream-death graph-death broadcast-graph-death never-arrives; do
        echo "--- $mode -n $ngpu"
        FERRY_TIMEOUT=$([ $mode = never-arrives ] && echo 1 || echo 0) "$bin/ferryrun" --timeout 60 \
          --keep-going -n "$ngpu" "$bin/ferry_gpu_stream_tests" $mode 2>&1 \
          | tee -a "$out/mesh_tests.log" | grep -E "^rank|error|warn" | awk 'NR <= 20'
        echo "exit ${PIPESTATUS[0]}"
      done ;;
    mesh_probe)
      # What the links carry by copy engine and by SMs, to one peer and to all, all GPUs at once.
      nvidia-smi topo -m 2>&1 | head -12
      "$bin/mesh_probe" ${MESH_PROBE_SIZES:-2m 16m 128m} 2>&1 | tee "$out/mesh_probe.txt" ;;
    mesh_allreduce_probe)
      "$bin/mesh_allreduce_probe" ${MESH_PROBE_SIZES:-8m 16m 64m 256m} 2>&1 \
        | tee "$out/mesh_allreduce_probe.txt" ;;
    mesh_perf)
      # Interleaved rounds on every GPU of the machine: ferry-perf's collectives of device
      # buffers, blocking and 20 in flight, the allreduce again with the two-shot kernel off and from GPU_RUN_TWOSHOT_FROM,
      # and stream-ordered and graph-replayed; then nccl-tests (one process, a GPU per rank) for
      # the same collectives, allreduce also replayed from graphs (sizes: GPU_RUN_SIZES and
      # GPU_RUN_NCCL_RANGE, nccl-tests' -b -e -f).
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-8,64k,1m,8m,64m,512m}
      ngpu=$(nvidia-smi -L | wc -l)
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-2}"); do
        echo "--- round $round" | tee -a "$out/mesh_perf_ferry.txt"
        "$bin/ferryrun" --timeout 300 -n "$ngpu" "$bin/ferry-perf" allreduce broadcast allgather \
          reduce_scatter reduce -m cuda --check --sizes "$sizes" 2>&1 | tee -a "$out/mesh_perf_ferry.txt"
        # Non-blocking, 20 calls posted before they are waited for, as nccl-tests times its 20
        # iterations between synchronizations (a result buffer per call in flight).
        echo "--- --in-flight 20" | tee -a "$out/mesh_perf_ferry.txt"
        "$bin/ferryrun" --timeout 300 -n "$ngpu" "$bin/ferry-perf" allreduce broadcast allgather \
          reduce_scatter reduce -m cuda --check --in-flight 20 \
          --sizes "${GPU_RUN_IN_FLIGHT_SIZES:-8,64k,1m,8m,16m,64m}" 2>&1 | tee -a "$out/mesh_perf_ferry.txt"
        for twoshot in 0 "${GPU_RUN_TWOSHOT_FROM:-3m}"; do
          echo "--- FERRY_COLL_DEVICE_TWOSHOT=$twoshot" | tee -a "$out/mesh_perf_ferry.txt"
          FERRY_COLL_DEVICE_TWOSHOT=$twoshot "$bin/ferryrun" --timeout 120 -n "$ngpu" \
            "$bin/ferry-perf" allreduce -m cuda --check --sizes "${GPU_RUN_TWOSHOT_SIZES:-1m,2m,4m,8m,64m}" \
            2>&1 | tee -a "$out/mesh_perf_ferry.txt"
        done
        for mode in "--stream" "--graph 100"; do
          "$bin/ferryrun" --timeout 120 -n "$ngpu" "$bin/ferry-perf" allreduce $mode -m cuda \
            --check --sizes 8,1k,32k,1m 2>&1 | tee -a "$out/mesh_perf_ferry.txt"
        done
        for t in all_reduce broadcast all_gather reduce_scatter reduce; do
          [ -x "$bin/${t}_perf" ] || continue
          for graph in 0 $([ $t = all_reduce ] && echo 100); do
            LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/${t}_perf" ${GPU_RUN_NCCL_RANGE:--b 8 -e 512M -f 8} \
              -g "$ngpu" -G "$graph" 2>&1 | grep -v "^#  Rank\|^# Using devices" \
              | sed "s/^/$t -G $graph: /" | tee -a "$out/mesh_perf_nccl.txt" | grep -v "#"
          done
        done
      done ;;
    mesh_stream)
      # Interleaved rounds on every GPU of the machine, every collective by its stream-ordered
      # form (--stream: back to back on one stream; --graph 100: replayed from graphs of 100
      # calls) and blocking, then nccl-tests (one process, a GPU per rank) back to back (-G 0) and
      # from graphs (-G 100). Sizes: GPU_RUN_SIZES and GPU_RUN_NCCL_RANGE (nccl-tests' -b -e -f).
      nccl_lib=$(ls -d /opt/torch/.venv/lib/python3*/site-packages/nvidia/nccl/lib 2>/dev/null | head -1)
      sizes=${GPU_RUN_SIZES:-8,64k,1m,8m,16m,64m}
      ngpu=$(nvidia-smi -L | wc -l)
      for round in $(seq 1 "${GPU_RUN_ROUNDS:-2}"); do
        for mode in "--stream" "--graph 100" ""; do
          echo "--- round $round ${mode:-blocking}" | tee -a "$out/mesh_stream_ferry.txt"
          "$bin/ferryrun" --timeout 300 -n "$ngpu" "$bin/ferry-perf" allreduce broadcast allgather \
            reduce_scatter reduce $mode -m cuda --check --sizes "$sizes" 2>&1 \
            | tee -a "$out/mesh_stream_ferry.txt"
        done
        for t in all_reduce broadcast all_gather reduce_scatter reduce; do
          [ -x "$bin/${t}_perf" ] || continue
          for graph in 0 100; do
            LD_LIBRARY_PATH=$nccl_lib:$LD_LIBRARY_PATH "$bin/${t}_perf" ${GPU_RUN_NCCL_RANGE:--b 8 -e 64M -f 8} \
              -g "$ngpu" -G "$graph" 2>&1 | grep -v "^#  Rank\|^# Using devices" \
              | sed "s/^/$t -G $graph: /" | tee -a "$out/mesh_stream_nccl.txt" | grep -v "#"
          done
        done
      done ;;
    guard)
      python3 "$here/bench/gpu_guard.py" --rounds "${GPU_RUN_ROUNDS:-2}" --out "$out" ;;
    probe)
      b=0; [ "$(nvidia-smi -L | wc -l)" -gt 1 ] && b=1
      "$bin/cuda_probe" 0 $b "$here/.devbin/kernels.fatbin" 2>&1 | tee "$out/probe.txt" ;;
    check)
      for ipc in 1 0; do
        for mem in cuda:cuda host:cuda cuda:host; do
          echo "--- FERRY_CUDA_IPC=$ipc -m $mem --check"
          FERRY_CUDA_IPC=$ipc "${run[@]}" "$bin/ferry-perf" latency bandwidth -m $mem --check \
            --sizes 1,8,100,64k,1m,5m --iterations 20 2>&1 | grep -v "^test " | cut -c1-70
        done
      done ;;
    sanitizer)
      # memcheck over both ranks (ferryrun's children): IPC, split copies, and staging.
      for ipc in 1 0; do
        FERRY_CUDA_IPC=$ipc compute-sanitizer --tool memcheck --target-processes all \
          --print-limit 20 "${run[@]}" "$bin/ferry-perf" latency bandwidth -m cuda:cuda --check \
          --sizes 8,64k,5m --iterations 5 --window 2 2>&1 | tee "$out/memcheck_ipc$ipc.txt" \
          | grep -E "ERROR SUMMARY|error|^latency|^bandwidth"
      done ;;
    ofi_perf)
      # Device data over ofi (copied through host memory) against host data, interleaved rounds.
      for round in 1 2 3; do
        for mem in host:host cuda:cuda; do
          FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp "${run[@]}" "$bin/ferry-perf" latency \
            bandwidth -m $mem --sizes 1m,64m --iterations 10 2>&1 | tee -a "$out/perf_ofi_rounds.txt" \
            | grep -E "^#|^(latency|bandwidth)" | cut -c1-100
        done
      done ;;
    kill)
      # A sender of 256 MiB of device memory killed mid-transfer: staged (shm ring) and over ofi.
      for env in "FERRY_CUDA_IPC=0" "FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp"; do
        echo "--- $env"
        env $env FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 "$bin/ferryrun" \
          --timeout 60 --keep-going -n 3 "$bin/ferry_fault_test" device 2>&1 \
          | tee -a "$out/gpu_kill.log" | grep -E "rank|FAIL|SKIP"
        echo "exit ${PIPESTATUS[0]}; /dev/shm: $(ls /dev/shm | grep -c '^ferry-') ferry files left"
      done ;;
    campaign)
      # The kill campaign (tests/scripts/campaign.sh) with device allreduces among its steps, a
      # rank per GPU: GPU_RUN_KILLS jobs (default 40), one rank SIGKILLed in each.
      gpus=$(nvidia-smi -L | wc -l)
      CAMPAIGN_DEVICE=1 bash "$here/tests/scripts/campaign.sh" "$bin/ferryrun" \
        "$bin/ferry_campaign_test" "${GPU_RUN_KILLS:-40}" "$gpus" one-node \
        "$out/campaign_times.txt" > "$out/campaign.log" 2>&1
      echo "exit $?"
      grep -v "^ok " "$out/campaign.log" | tail -20 ;;
    coll_sanitizer)
      # memcheck, racecheck and synccheck over both ranks of the whole collective suite (the
      # reduction kernel, copies, the one-shot, two-shot and resident kernels).
      for tool in memcheck racecheck synccheck; do
        echo "--- $tool"
        compute-sanitizer --tool $tool --target-processes all --print-limit 20 \
          "$bin/ferryrun" --timeout 300 -n 2 "$bin/ferry_gpu_coll_tests" 2>&1 \
          | tee "$out/${tool}_coll.txt" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  |Failure"
        echo "exit ${PIPESTATUS[0]}"
      done ;;
    stream_sanitizer)
      # memcheck, racecheck and synccheck over both ranks of the stream suite's graph replays,
      # host buffers and mixed calls (the on-stream kernels: LL, one-shot, send/recv; the proxy's
      # paths).
      filter=${GPU_RUN_STREAM_FILTER:-Stream.Graph*:Stream.AllreduceOfHostBuffers:Stream.MixesWithHostCalls:Stream.SendRecvHost*}
      for tool in memcheck racecheck synccheck; do
        echo "--- $tool"
        compute-sanitizer --tool $tool --target-processes all --print-limit 20 \
          "$bin/ferryrun" --timeout 300 -n 2 "$bin/ferry_gpu_stream_tests" --gtest_filter="$filter" \
          2>&1 | tee "$out/${tool}_stream.txt" | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|^\[  |Failure"
        echo "exit ${PIPESTATUS[0]}"
      done ;;
    coll_kill)
      # A member SIGKILLed while the others run small device allreduces (3 ranks): by the ring
      # where two share a GPU, then by the one-shot kernels all the same; then with 2 ranks
      # allreduces of 256 MiB (the two-shot kernel in rounds where there are two GPUs). Then a
      # device Communicator that outlives its Context.
      for case in "3 0" "3 1" "2 0 256"; do
        set -- $case
        echo "--- coll_kill -n $1 FERRY_COLL_DEVICE_SHARED_GPU=$2 ${3:+(${3} MiB)}"
        FERRY_COLL_DEVICE_SHARED_GPU=$2 "$bin/ferryrun" --timeout 60 --keep-going -n "$1" \
          "$bin/ferry_fault_test" coll-death-device ${3:-} 2>&1 | tee -a "$out/gpu_coll_kill.log" \
          | grep -E "rank|FAIL|SKIP"
        echo "exit ${PIPESTATUS[0]}"
      done
      # A device Communicator kept after its Context is destroyed (one-shot and resident kernels
      # where the GPU is shared, the ring otherwise).
      for shared in 0 1; do
        echo "--- comm_outlives FERRY_COLL_DEVICE_SHARED_GPU=$shared"
        FERRY_COLL_DEVICE_SHARED_GPU=$shared "$bin/ferryrun" --timeout 60 -n 2 \
          "$bin/ferry_fault_test" device-comm-outlives 2>&1 | tee -a "$out/gpu_comm_outlives.log" \
          | grep -E "rank|FAIL|SKIP"
        echo "exit ${PIPESTATUS[0]}"
      done ;;
    ofi)
      # Two processes as if on two nodes: libfabric over tcp, device data through host memory;
      # then FI_HMEM assumed (the provider's real refusal of GPU memory) and a refusal injected.
      # GPU_OFI_PROVIDER picks another provider (net), logs then named after it.
      provider=${GPU_OFI_PROVIDER:-tcp} tail=""
      [ "$provider" = tcp ] || tail="_$provider"
      export FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=$provider
      for hmem in none assume fail; do
        echo "--- gpu.ofi FERRY_OFI_PROVIDER=$provider FERRY_TEST_OFI_HMEM=$hmem"
        FERRY_TEST_OFI_HMEM=$hmem "${run[@]}" "$bin/ferry_gpu_tests" 2>&1 \
          | tee "$out/gpu_ofi_$hmem$tail.log" \
          | grep -E "^\[  |rank .*(grew|->)|Failure|error|SKIP|NIC" | head -40
        echo "exit ${PIPESTATUS[0]}"
      done
      for mem in cuda:cuda host:host; do
        "${run[@]}" "$bin/ferry-perf" latency bandwidth -m $mem --check \
          --sizes 16,256,4k,1m,64m --iterations 20 2>&1 | tee -a "$out/perf_ofi$tail.txt" | cut -c1-90
      done
      unset FERRY_TRANSPORTS FERRY_OFI_PROVIDER ;;
    nccl_api)
      # nccl-tests on ferry's libnccl.so.2, each with its own check (-c 1): built with MPI=1 (one
      # process per GPU, under mpirun -np GPU_RUN_NCCL_API_NP, default 2), or with
      # GPU_RUN_NCCL_API_NP=0 the plain build, its ranks threads of one process
      # (GPU_RUN_NCCL_API_ARGS names them: -g 2, or -t 2 -g 1). GPU_RUN_NCCL_API_REAL=1 runs the
      # same on NCCL's (the torch venv's) after each. GPU_RUN_NCCL_API_TESTS, _ARGS (default
      # -b 8 -e 32M -f 4), _GRAPH (e.g. "-G 100") and _TIMEOUT (seconds a run, default 60).
      np=${GPU_RUN_NCCL_API_NP:-2}
      tests=$bin/nccl-mpi launch=()
      if [ "$np" = 0 ]; then
        tests=$bin
      else
        mpirun=$(command -v mpirun || ls /usr/local/bin/mpirun /opt/*/bin/mpirun 2>/dev/null | head -1)
        echo "mpirun: $mpirun"
        launch=("$mpirun" --allow-run-as-root --oversubscribe -np "$np" -x NCCL_NVLS_ENABLE=0
                -x NCCL_DEBUG -x LD_LIBRARY_PATH)
      fi
      real=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib
      ldd "$tests/all_reduce_perf" | grep -E "mpi|nccl|cudart"
      libs="ferry"
      [ "${GPU_RUN_NCCL_API_REAL:-0}" = 1 ] && libs="ferry nccl"
      for t in ${GPU_RUN_NCCL_API_TESTS:-all_reduce all_gather broadcast reduce reduce_scatter alltoall sendrecv scatter gather hypercube}; do
        for lib in $libs; do
          dir=$here/.devbin/lib/ferry-nccl
          [ "$lib" = nccl ] && dir=$real
          file=$out/nccl_api_${lib}_${t}.txt
          [ -x "$tests/${t}_perf" ] || continue
          # shellcheck disable=SC2086
          LD_LIBRARY_PATH="$dir:$LD_LIBRARY_PATH" timeout "${GPU_RUN_NCCL_API_TIMEOUT:-60}" "${launch[@]}" \
            "$tests/${t}_perf" ${GPU_RUN_NCCL_API_ARGS:--b 8 -e 32M -f 4} -c 1 \
            ${GPU_RUN_NCCL_API_GRAPH:-} > "$file" 2>&1
          echo "$lib $t: rc=$? $(grep -E 'Out of bounds|Avg bus' "$file" | tr '\n' ' ')"
        done
      done
      ;;
    nccl_python)
      # PyTorch's NCCL backend and CuPy's cupy.cuda.nccl on ferry's libnccl.so.2 (LD_PRELOAD; the
      # torch venv's Python): tests/nccl/torch_check.py (GPU_RUN_TORCH_PARTS, default check ddp
      # kill; ddp against torch's own NCCL, GPU_RUN_TORCH_ROUNDS rounds) and tests/nccl/cupy_check.py.
      py=${GPU_RUN_PYTHON:-/opt/torch/.venv/bin/python}
      lib=$here/.devbin/lib/ferry-nccl/libnccl.so.2
      # shellcheck disable=SC2086
      timeout 900 "$py" "$here/tests/nccl/torch_check.py" --ferry "$lib" \
        --rounds "${GPU_RUN_TORCH_ROUNDS:-3}" ${GPU_RUN_TORCH_PARTS:-check ddp kill} 2>&1 |
        tee "$out/torch_check.txt" | grep -E "^(check|ddp|kill|rank . (FAIL|libnccl|exc))|HANG|warning: stream" | head -60
      echo "torch_check: rc=${PIPESTATUS[0]}"
      if [ "${GPU_RUN_CUPY:-1}" = 1 ]; then
        LD_PRELOAD=$lib timeout 400 "$py" "$here/tests/nccl/cupy_check.py" > "$out/cupy_check.txt" 2>&1
        echo "cupy_check: rc=$? $(grep -E 'cupy|initAll|libnccl' "$out/cupy_check.txt" | tr '\n' ' ' | head -c 2000)"
      fi
      ;;
    *) echo "unknown step $step" ;;
  esac
done
