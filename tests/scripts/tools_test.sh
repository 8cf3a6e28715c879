#!/usr/bin/env bash
# ferry-perf and ferry-info as a user runs them: outputs parse, data checks pass, bad input fails.
#   tools_test.sh FERRYRUN FERRY_PERF FERRY_INFO
set -u
ferryrun=$1 perf=$2 info=$3
passed=0 failed=0
ok() { passed=$((passed + 1)); echo "ok   $1"; }
bad() { failed=$((failed + 1)); echo "FAIL $1"; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

if "$ferryrun" -n 2 "$perf" latency bandwidth bibw --sizes 8,64k,4m --iterations 10 --warmup 2 \
     --check --json >"$tmp/perf.json" 2>"$tmp/err" &&
   python3 - "$tmp/perf.json" <<'PY'
import json, sys
records = json.load(open(sys.argv[1]))
assert len(records) == 9, records
for r in records:
    assert r["size"] in (8, 65536, 4194304) and r["iterations"] == 10, r
    field = "latency_us" if r["test"] == "latency" else "bandwidth_GBps"
    assert r[field] > 0, r
PY
then ok "ferry-perf --check --json: 3 tests x 3 sizes, every byte verified"; else bad "ferry-perf --json"; cat "$tmp/err"; fi

if "$ferryrun" -n 2 "$perf" --sizes 1,100 --iterations 5 --csv >"$tmp/perf.csv" &&
   [ "$(head -1 "$tmp/perf.csv")" = "test,size,iterations,latency_us,bandwidth_GBps" ] &&
   [ "$(wc -l <"$tmp/perf.csv")" -eq 5 ]; then ok "ferry-perf --csv"; else bad "ferry-perf --csv"; fi

if "$ferryrun" -n 2 "$perf" latency --sizes 8 --iterations 5 >"$tmp/table" &&
   grep -q "latency_us" "$tmp/table" && grep -qE "^latency +8 +5 " "$tmp/table"; then
  ok "ferry-perf table"; else bad "ferry-perf table"; cat "$tmp/table"; fi

"$ferryrun" -n 2 "$perf" --sizes 8,zz >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -ne 0 ] && grep -q "bad size 'zz'" "$tmp/err"; then ok "ferry-perf rejects a bad size"
else bad "ferry-perf bad size (rc $rc)"; fi

"$perf" >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -eq 2 ] && grep -q "needs 2 ranks" "$tmp/err"; then ok "ferry-perf alone says it needs 2 ranks"
else bad "ferry-perf alone (rc $rc)"; fi

if "$ferryrun" -n 3 "$info" --peers >"$tmp/info" 2>&1 &&
   grep -q "FERRY_SHM_FIFO_SIZE = 1024 \[default\]" "$tmp/info" &&
   grep -q "shm: available (3 processes" "$tmp/info" &&
   grep -q "bootstrap: ferryrun store unix:.* (rank 0 of 3; ranks on this node: 0,1,2)" "$tmp/info" &&
   [ "$(grep -c "shm (CMA probe ok): eager up to 32760 B, rendezvous by zero-copy get from" "$tmp/info")" -eq 6 ] &&
   [ "$(grep -c ": self" "$tmp/info")" -eq 3 ]; then
  ok "ferry-info --peers shows transports, variables and every rank's paths"
else bad "ferry-info --peers"; cat "$tmp/info"; fi

if FERRY_SHM_CMA=0 "$ferryrun" -n 2 "$info" --peers 2>&1 | grep -q "no CMA: CMA disabled by FERRY_SHM_CMA=0.*rendezvous pipelined$"; then
  ok "ferry-info says why CMA is not used"; else bad "ferry-info CMA reason"; fi

# How long a wait spins: ranks bound to a CPU each (as mpirun and srun bind them) spin; ranks that
# share a CPU yield at once (the ranks publish their affinity, and each counts who shares its CPUs).
if command -v taskset >/dev/null && [ "$(nproc)" -ge 2 ]; then
  bound=$("$ferryrun" -n 2 sh -c 'exec taskset -c "$FERRY_LOCAL_RANK" "$0" "$@"' "$info" --peers 2>&1 |
          grep "waiting:")
  shared=$("$ferryrun" -n 2 sh -c 'exec taskset -c 0 "$0" "$@"' "$info" --peers 2>&1 |
           grep "waiting:")
  if echo "$bound" | grep -q "waiting: 2000 empty polls, then yield the CPU$" &&
     echo "$shared" | grep -q "waiting: 0 empty polls, then yield the CPU (2 ranks of this node share the 1 CPU(s)"; then
    ok "ranks bound to a CPU each spin; ranks bound to one CPU yield at once"
  else bad "waiting policy under binding: '$bound' / '$shared'"; fi
else
  ok "taskset or a second CPU missing: the binding checks do not apply"
fi

FERRY_SHM_FIFO_SIZE=1000 "$info" >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -ne 0 ] && grep -q "FERRY_SHM_FIFO_SIZE" "$tmp/err" && grep -q "power of two" "$tmp/err"; then
  ok "an invalid variable fails init naming it"; else bad "invalid variable (rc $rc)"; cat "$tmp/err"; fi

# GPU options on a machine without a usable CUDA driver (CI): every one fails clearly, nothing hangs.
if "$info" 2>&1 | grep -q "^  cuda: not used ("; then
  ok "ferry-info says why CUDA is not used ($("$info" 2>&1 | grep -o "cuda: not used (.*" | cut -c1-60)…)"
  "$ferryrun" -n 2 "$perf" latency -m cuda --sizes 8 >/dev/null 2>"$tmp/err"; rc=$?
  if [ $rc -eq 2 ] && grep -q "ferry-perf: --mem cuda: " "$tmp/err"; then
    ok "ferry-perf -m cuda without a GPU fails and says why"
  else bad "ferry-perf -m cuda without a GPU (rc $rc)"; cat "$tmp/err"; fi
  FERRY_CUDA=require "$info" >/dev/null 2>"$tmp/err"; rc=$?
  if [ $rc -ne 0 ] && grep -q "FERRY_CUDA=require, but CUDA cannot be used: " "$tmp/err"; then
    ok "FERRY_CUDA=require without a GPU fails init naming the reason"
  else bad "FERRY_CUDA=require (rc $rc)"; cat "$tmp/err"; fi
else
  ok "CUDA is usable here: the no-GPU checks do not apply"
fi
FERRY_CUDA=maybe "$info" >/dev/null 2>"$tmp/err"; rc=$?
if [ $rc -ne 0 ] && grep -q "FERRY_CUDA" "$tmp/err" && grep -q "auto|off|require" "$tmp/err"; then
  ok "an invalid FERRY_CUDA names the allowed values"; else bad "FERRY_CUDA=maybe (rc $rc)"; cat "$tmp/err"; fi

echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
