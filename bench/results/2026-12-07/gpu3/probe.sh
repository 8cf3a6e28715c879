#!/usr/bin/env bash
# bash bench/results/2026-12-07/gpu3/probe.sh: probe.py (or PROBE) on two ranks (or RANKS), ferry's
# library preloaded, with the ranks' native stacks where they have not ended after 40 s (or WAIT).
set -u
py=/opt/torch/.venv/bin/python
lib=$PWD/.devbin/lib/ferry-nccl/libnccl.so.2
export LD_LIBRARY_PATH=$PWD/.devbin/lib:${LD_LIBRARY_PATH:-}
port=$((20000 + RANDOM % 20000))
for r in $(seq 0 $((${RANKS:-2} - 1))); do
  RANK=$r WORLD_SIZE=${RANKS:-2} LOCAL_RANK=$r MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    LD_PRELOAD=$lib FERRY_LOG_LEVEL=${LEVEL:-info} "$py" "$(dirname "$0")/${PROBE:-probe.py}" > "$OUT/probe_$r.txt" 2>&1 &
done
for _ in $(seq 1 "${WAIT:-40}"); do pgrep -f "${PROBE:-probe.py}" > /dev/null || break; sleep 1; done
for pid in $(pgrep -f "${PROBE:-probe.py}"); do
  echo "=== $pid"
  g=$(command -v gdb || command -v cuda-gdb)
  [ -n "$g" ] && timeout 40 $g -p $pid -batch -ex "thread apply all bt 16" 2>&1 | grep -E "^#|^Thread" | grep -vE "libc.so|pthread|futex|python3|libpython" | head -80
done > "$OUT/stacks.txt" 2>&1
pkill -9 -f "${PROBE:-probe.py}"
wait
tail -n 5 "$OUT"/probe_*.txt
