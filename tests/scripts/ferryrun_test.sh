#!/usr/bin/env bash
# Tests of the ferryrun launcher with /bin/sh programs as ranks: environment, exit-status and
# signal propagation, timeouts, forwarding of SIGTERM, ABORT, argument errors and cleanup.
# Usage: ferryrun_test.sh PATH/TO/ferryrun [PATH/TO/thread_preload.so]
#   (prints "N passed, M failed"; exit 1 on a failure). With the library, the job's end, exit
#   codes and SIGTERM are checked again with it preloaded into ferryrun: a thread that blocks no
#   signal, as tools inject (compute-sanitizer's does).
set -u

FERRYRUN=${1:?usage: ferryrun_test.sh PATH/TO/ferryrun [PATH/TO/thread_preload.so]}
[[ -x $FERRYRUN ]] || { echo "ferryrun_test.sh: '$FERRYRUN' is not executable" >&2; exit 2; }
FERRYRUN=$(cd "$(dirname "$FERRYRUN")" && pwd)/$(basename "$FERRYRUN")
PRELOAD=${2:-}
[[ -z $PRELOAD || -f $PRELOAD ]] || { echo "ferryrun_test.sh: no '$PRELOAD'" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/ferryrun-test-XXXXXX")
trap 'rm -rf "$WORK"' EXIT
# ferryrun's socket directories land here, so leftovers are visible.
export TMPDIR=$WORK/tmp
mkdir -p "$TMPDIR"
unset FERRY_RANK FERRY_SIZE FERRY_LOCAL_RANK FERRY_LOCAL_SIZE FERRY_STORE FERRY_JOB_ID

passed=0
failed=0
pass() { echo "PASS: $1"; passed=$((passed + 1)); }
fail() {
  echo "FAIL: $1: $2"
  [[ -s $WORK/err ]] && sed 's/^/    stderr: /' "$WORK/err" | head -20
  failed=$((failed + 1))
}
now_ms() { echo $(($(date +%s%N) / 1000000)); }

# run ARGS...: runs ferryrun; sets RC and MS (elapsed), stdout in $WORK/out, stderr in $WORK/err.
run() {
  local start
  start=$(now_ms)
  "$FERRYRUN" "$@" >"$WORK/out" 2>"$WORK/err" </dev/null
  RC=$?
  MS=$(($(now_ms) - start))
}

# check NAME CONDITION-DESCRIPTION COMMAND...: passes when COMMAND succeeds.
check() {
  local name=$1 what=$2
  shift 2
  if "$@"; then pass "$name"; else fail "$name" "$what"; fi
}
err_has() { grep -qF -- "$1" "$WORK/err"; }
out_has() { grep -qF -- "$1" "$WORK/out"; }
out_line() { grep -qxF -- "$1" "$WORK/out"; }

# --- environment ---------------------------------------------------------------------------------
LOCAL_RANK=7 run -n 3 sh -c 'echo "$FERRY_RANK $FERRY_SIZE $FERRY_LOCAL_RANK $FERRY_LOCAL_SIZE $FERRY_STORE $FERRY_JOB_ID $LOCAL_RANK"'
ranks=$(awk '{print $1}' "$WORK/out" | sort | tr '\n' ' ')
check "env: exit 0" "rc=$RC" test "$RC" -eq 0
check "env: distinct ranks 0..2" "got '$ranks'" test "$ranks" = "0 1 2 "
check "env: FERRY_SIZE and FERRY_LOCAL_*" "$(cat "$WORK/out")" \
  test "$(awk '$2 == 3 && $3 == $1 && $4 == 3' "$WORK/out" | wc -l)" -eq 3
check "env: one unix: store and one job id" "$(cat "$WORK/out")" \
  test "$(awk '$5 ~ /^unix:\// && $6 != "" {print $5, $6}' "$WORK/out" | sort -u | wc -l)" -eq 1
check "env: LOCAL_RANK is the local rank (an inherited one replaced)" "$(cat "$WORK/out")" \
  test "$(awk '$7 == $3' "$WORK/out" | wc -l)" -eq 3

# --- exit status ---------------------------------------------------------------------------------
run -n 4 true
check "success: exit 0" "rc=$RC" test "$RC" -eq 0

run -n 2 sh -c '[ "$FERRY_RANK" = 0 ] || sleep 0.3'
check "a rank exiting 0 early is normal" "rc=$RC" test "$RC" -eq 0

run -n 3 sh -c 'exit $((FERRY_RANK == 1 ? 3 : 0))'
check "exit code propagates" "rc=$RC, expected 3" test "$RC" -eq 3
check "exit code message names rank 1" "stderr" err_has "rank 1 (pid"
check "exit code message gives the code" "stderr" err_has "exited with code 3"

run -n 3 sh -c 'if [ "$FERRY_RANK" = 2 ]; then kill -9 $$; else sleep 100; fi'
check "killed rank: exit 137" "rc=$RC" test "$RC" -eq 137
check "killed rank: message" "stderr" err_has "rank 2 (pid"
check "killed rank: signal named" "stderr" err_has "killed by signal 9"
check "killed rank: others stopped in a few seconds" "took ${MS} ms" test "$MS" -lt 5000

# A rank that ignores SIGTERM is killed after the grace period.
deaf=$WORK/deaf
run -n 2 sh -c "trap '' TERM
  if [ \$FERRY_RANK = 0 ]; then while [ ! -e $deaf ]; do sleep 0.01; done; exit 4; fi
  touch $deaf; while :; do sleep 0.1; done"
check "SIGTERM ignored: exit 4" "rc=$RC" test "$RC" -eq 4
check "SIGTERM ignored: SIGKILL after the grace" "took ${MS} ms" \
  test "$MS" -ge 1900 -a "$MS" -lt 6000

run -n 2 /nonexistent/program
check "exec failure: exit 127" "rc=$RC" test "$RC" -eq 127
check "exec failure: message" "stderr" err_has "cannot run '/nonexistent/program'"

run -n 2 -- sh -c 'exit 0'
check "'--' ends the options" "rc=$RC" test "$RC" -eq 0

# --- timeout -------------------------------------------------------------------------------------
run -n 2 --timeout 1 sleep 100
check "timeout: exit 124" "rc=$RC" test "$RC" -eq 124
check "timeout: message" "stderr" err_has "ferryrun: job timed out after 1 s"
check "timeout: fast" "took ${MS} ms" test "$MS" -lt 4000

# A rank killed first under --keep-going: the others go on, and the limit still ends them.
run -n 2 --keep-going --timeout 1 sh -c '[ "$FERRY_RANK" = 1 ] && kill -9 $$; sleep 20'
check "timeout after a death under --keep-going: exit 124" "rc=$RC" test "$RC" -eq 124
check "timeout after a death under --keep-going: message" "stderr" \
  err_has "ferryrun: job timed out after 1 s"
check "timeout after a death under --keep-going: fast" "took ${MS} ms" test "$MS" -lt 4000

run -n 1 --timeout=5 true
check "timeout not reached: exit 0" "rc=$RC" test "$RC" -eq 0

# --- signals to ferryrun -------------------------------------------------------------------------
marks=$WORK/marks
ready=$WORK/ready
mkdir -p "$marks" "$ready"
"$FERRYRUN" -n 3 sh -c "trap 'echo term > $marks/\$FERRY_RANK; exit 0' TERM
  touch $ready/\$FERRY_RANK; sleep 100 & wait" >"$WORK/out" 2>"$WORK/err" </dev/null &
pid=$!
# Signal only once every rank has its trap in place.
for _ in $(seq 100); do [[ $(ls "$ready" | wc -l) -eq 3 ]] && break; sleep 0.1; done
start=$(now_ms)
kill -TERM "$pid"
wait "$pid"
RC=$?
MS=$(($(now_ms) - start))
check "SIGTERM: exit 143" "rc=$RC" test "$RC" -eq 143
check "SIGTERM: forwarded to every rank" "marks: $(ls "$marks" | tr '\n' ' ')" \
  test "$(ls "$marks" | wc -l)" -eq 3
check "SIGTERM: message" "stderr" err_has "got SIGTERM"
check "SIGTERM: fast" "took ${MS} ms" test "$MS" -lt 4000

"$FERRYRUN" -n 2 sleep 100 >"$WORK/out" 2>"$WORK/err" </dev/null &
pid=$!
sleep 0.3
kill -INT "$pid"
wait "$pid"
RC=$?
check "SIGINT: exit 130" "rc=$RC" test "$RC" -eq 130

# --- a thread in ferryrun that blocks no signal (a tool's injected library) ----------------------
# The kernel gives it SIGCHLD and SIGTERM, which ferryrun's own thread blocks and reads from its
# signalfd. Before ferryrun caught them there too, the job's end went unseen until --timeout and
# SIGTERM ended ferryrun without reaching the ranks.
if [[ -n $PRELOAD ]]; then
  # Only ferryrun gets the library (the ranks' shells would lose their own SIGCHLDs to it), and
  # `timeout` bounds a ferryrun that misses the end.
  preloaded() {
    local start
    start=$(now_ms)
    LD_PRELOAD=$PRELOAD timeout 60 "$FERRYRUN" "$@" >"$WORK/out" 2>"$WORK/err" </dev/null
    RC=$?
    MS=$(($(now_ms) - start))
  }
  preloaded -n 3 --timeout 30 env -u LD_PRELOAD sh -c 'sleep 0.2'
  check "preloaded thread: the job's end is seen" "rc=$RC after ${MS} ms" \
    test "$RC" -eq 0 -a "$MS" -lt 10000
  preloaded -n 3 --timeout 30 env -u LD_PRELOAD sh -c 'exit $((FERRY_RANK == 2 ? 6 : 0))'
  check "preloaded thread: exit code propagates" "rc=$RC after ${MS} ms, expected 6" \
    test "$RC" -eq 6 -a "$MS" -lt 10000
  preloaded -n 2 --timeout 1 env -u LD_PRELOAD sleep 100
  check "preloaded thread: timeout ends the job" "rc=$RC after ${MS} ms, expected 124" \
    test "$RC" -eq 124 -a "$MS" -lt 10000
  marks=$WORK/preload_marks
  ready=$WORK/preload_ready
  mkdir -p "$marks" "$ready"
  LD_PRELOAD=$PRELOAD timeout 60 "$FERRYRUN" -n 2 --timeout 30 env -u LD_PRELOAD sh -c \
    "trap 'echo term > $marks/\$FERRY_RANK; exit 0' TERM; touch $ready/\$FERRY_RANK; sleep 100 & wait" \
    >"$WORK/out" 2>"$WORK/err" </dev/null &
  pid=$!
  for _ in $(seq 100); do [[ $(ls "$ready" | wc -l) -eq 2 ]] && break; sleep 0.1; done
  # The signal goes to ferryrun itself, not to `timeout`.
  kill -TERM "$(pgrep -P "$pid" -x ferryrun || echo "$pid")"
  wait "$pid"
  RC=$?
  check "preloaded thread: SIGTERM exits 143" "rc=$RC" test "$RC" -eq 143
  check "preloaded thread: SIGTERM forwarded to every rank" "marks: $(ls "$marks" | tr '\n' ' ')" \
    test "$(ls "$marks" | wc -l)" -eq 2
  check "preloaded thread: SIGTERM message" "stderr" err_has "got SIGTERM"
else
  echo "SKIP: a preloaded thread in ferryrun (no library given: a sanitized build)"
fi

# --- stdin ---------------------------------------------------------------------------------------
echo hello | "$FERRYRUN" -n 2 sh -c 'read -r line; echo "$FERRY_RANK:$line"' >"$WORK/out" 2>"$WORK/err"
check "stdin reaches rank 0" "$(cat "$WORK/out")" out_line "0:hello"
check "stdin does not reach rank 1" "$(cat "$WORK/out")" out_line "1:"

# --- cleanup -------------------------------------------------------------------------------------
# Each rank leaves a segment, waits until both exist (so neither is stopped before it made its
# own), then dies without removing it.
FERRY_LOG_LEVEL=info run -n 2 sh -c 'touch /dev/shm/ferry-$FERRY_JOB_ID-$FERRY_RANK
  [ $FERRY_RANK = 0 ] && echo "$FERRY_JOB_ID"
  while [ "$(ls /dev/shm | grep -c "^ferry-$FERRY_JOB_ID-")" -lt 2 ]; do sleep 0.01; done
  kill -9 $$'
job=$(head -1 "$WORK/out")
check "shm: job ran" "rc=$RC" test "$RC" -eq 137
check "shm: sweep reported at info level" "stderr" err_has "removed 2 shared-memory segment(s)"
check "shm: segments swept" "left: $(ls /dev/shm | grep -F "ferry-$job-" | tr '\n' ' ')" \
  test -z "$(ls /dev/shm | grep -F "ferry-$job-")"
check "socket directories removed" "left: $(ls "$TMPDIR")" test -z "$(ls "$TMPDIR")"
# A ferryrun killed by SIGKILL leaves its directory: the next one removes it once its pid is gone,
# and keeps those of a live ferryrun and any holding more than the socket.
# The rank ends once its ferryrun is gone.
"$FERRYRUN" -n 1 sh -c 'while kill -0 $PPID 2>/dev/null; do sleep 0.05; done' \
  >/dev/null 2>&1 </dev/null &
killed=$!
while [ -z "$(ls "$TMPDIR")" ]; do sleep 0.01; done
kill -9 "$killed"
wait "$killed" 2>/dev/null
dead_dir=$(ls "$TMPDIR")
mkdir "$TMPDIR/ferryrun-$$-abcdef" "$TMPDIR/ferryrun-$killed-zzzzzz"
touch "$TMPDIR/ferryrun-$killed-zzzzzz/other"
run -n 1 true
check "killed ferryrun's directory: named by its pid" "$dead_dir" test "${dead_dir%-*}" = "ferryrun-$killed"
check "killed ferryrun's directory: removed by the next" "left: $(ls "$TMPDIR")" \
  test ! -e "$TMPDIR/$dead_dir"
check "a live ferryrun's directory and a full one kept" "left: $(ls "$TMPDIR")" \
  test -d "$TMPDIR/ferryrun-$$-abcdef" -a -d "$TMPDIR/ferryrun-$killed-zzzzzz"
rm -rf "${TMPDIR:?}"/*

# --- abort through the store (needs python3 to speak the protocol) --------------------------------
if command -v python3 >/dev/null; then
  cat >"$WORK/abort.py" <<'EOF'
import os, socket, struct, sys, time
rank, size = int(os.environ["FERRY_RANK"]), int(os.environ["FERRY_SIZE"])
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ["FERRY_STORE"][len("unix:"):])
frame = lambda op, payload: struct.pack("=IB", len(payload) + 1, op) + payload
s.sendall(frame(1, struct.pack("=iii", rank, size, os.getpid())))
if s.recv(5)[4] != 16:
    sys.exit("no HELLO_OK")
if rank == 1:
    reason = b"out of cheese"
    s.sendall(frame(6, struct.pack("=iI", 5, len(reason)) + reason))
time.sleep(100)
EOF
  run -n 3 python3 "$WORK/abort.py"
  check "abort: exit with its code" "rc=$RC" test "$RC" -eq 5
  check "abort: message names rank 1" "stderr" err_has "rank 1 (pid"
  check "abort: reason printed" "stderr" err_has "aborted the job with code 5: out of cheese"
  check "abort: fast" "took ${MS} ms" test "$MS" -lt 5000
else
  echo "SKIP: abort tests (no python3)"
fi

# --- arguments -----------------------------------------------------------------------------------
run true
check "no -n: usage error" "rc=$RC" test "$RC" -eq 2
check "no -n: message" "stderr" err_has "-n N (the number of ranks) is required"
for bad in 0 -1 abc 3x; do
  run -n "$bad" true
  check "-n $bad: usage error" "rc=$RC" test "$RC" -eq 2
  check "-n $bad: message" "stderr" err_has "-n takes a number of ranks"
done
run -n 2
check "no program: usage error" "rc=$RC" test "$RC" -eq 2
check "no program: message" "stderr" err_has "no program to run"
run -n 2 --bogus true
check "unknown option: usage error" "rc=$RC" test "$RC" -eq 2
check "unknown option: message" "stderr" err_has "unknown option '--bogus'"
run -n 2 --timeout -3 true
check "bad timeout: usage error" "rc=$RC" test "$RC" -eq 2
check "bad timeout: message" "stderr" err_has "--timeout takes a positive number"
run -n
check "-n without value: usage error" "rc=$RC" test "$RC" -eq 2
run --help
check "--help: exit 0" "rc=$RC" test "$RC" -eq 0
check "--help: usage" "stdout" out_has "usage: ferryrun -n N"
run -n4 sh -c 'test "$FERRY_SIZE" = 4'
check "-nN form" "rc=$RC" test "$RC" -eq 0

echo "$passed passed, $failed failed"
[[ $failed -eq 0 ]]
