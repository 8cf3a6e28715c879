#!/usr/bin/env bash
# A rank SIGKILLed mid-job under `ferryrun --keep-going`: the survivors' operations with it fail
# with kPeerFailed (checked inside fault_test), they finish their own work and exit 0, ferryrun
# reports the death and exits 137, nothing is left in /dev/shm, and the job ends in seconds.
# With a third argument `ofi` the same kill runs over libfabric (tcp, net and shm providers, the
# death seen by pidfd; and tcp and net with every peer taken as remote, seen by keepalives).
#   fault_test.sh FERRYRUN FAULT_TEST [ofi]
set -u
ferryrun=$1 program=$2 with_ofi=${3:-}
passed=0 failed=0
# shellcheck source=shm_leftovers.sh
. "$(dirname "${BASH_SOURCE[0]}")/shm_leftovers.sh"
# libfabric's shm provider leaves its region (/dev/shm/PID:N:N) behind when its process is
# SIGKILLed, and a later process given the same pid cannot open an endpoint (fi_enable: EBUSY):
# ferryrun removes those of the ranks it reaps. Prints the killed ranks' regions still there.
provider_regions_left() {
  local pid
  for pid in $(echo "$1" | grep -o 'pid [0-9]*) was killed' | grep -o '[0-9][0-9]*'); do
    ls /dev/shm 2>/dev/null | grep "^$pid:"
  done
}
before=$(leftovers)
variants=("" "FERRY_SHM_CMA_THRESHOLD=0" "FERRY_SHM_CMA=0" "FERRY_WAIT_MODE=block")
if [ "$with_ofi" = ofi ]; then
  variants+=("FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp"
             "FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=shm"
             "FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp FERRY_WAIT_MODE=block"
             "FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp FERRY_TEST_OFI_REMOTE=1 FERRY_KEEPALIVE=0.2"
             "FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=net"
             "FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=net FERRY_TEST_OFI_REMOTE=1 FERRY_KEEPALIVE=0.2")
fi
for variant in "${variants[@]}"; do
  start=$(date +%s%N)
  out=$(env $variant timeout 60 "$ferryrun" --keep-going -n 3 "$program" 2>&1)
  rc=$?
  regions=$(provider_regions_left "$out")
  elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
  why=""
  [ "$rc" -eq 137 ] || why+="exit code $rc, expected 137; "
  echo "$out" | grep -q "rank 2 .*signal 9" || why+="ferryrun did not report rank 2; "
  [ "$(echo "$out" | grep -c "peer failure seen in .* 0 failures")" -eq 2 ] || why+="survivors failed; "
  echo "$out" | grep -q "^FAIL" && why+="a check failed; "
  [ "$elapsed" -lt 20000 ] || why+="took $elapsed ms; "
  [ "$before" = "$(leftovers)" ] || why+="left files in /dev/shm; "
  [ -z "$regions" ] || why+="left libfabric's regions of killed ranks: $regions; "
  if [ -z "$why" ]; then
    passed=$((passed + 1))
    echo "ok   ${variant:-default}: $(echo "$out" | grep -o 'seen in [0-9.]* ms' | tr '\n' ' ')(${elapsed} ms)"
  else
    failed=$((failed + 1)); echo "FAIL ${variant:-default}: $why"; echo "$out" | tail -15
  fi
done
# One scenario: `expect WHAT RC LINES PATTERN [VAR=VALUE...] -- FERRYRUN-ARGS...` runs ferryrun
# with those variables; it passes when ferryrun exits RC, LINES ranks print PATTERN, and nothing
# is left in /dev/shm.
expect() {
  local what=$1 want_rc=$2 want_lines=$3 pattern=$4 vars=()
  shift 4
  while [ "$1" != -- ]; do vars+=("$1"); shift; done
  shift
  local out rc
  out=$(env "${vars[@]}" timeout 60 "$ferryrun" "$@" 2>&1)
  rc=$?
  if [ "$rc" -eq "$want_rc" ] && [ "$(echo "$out" | grep -c "$pattern")" -eq "$want_lines" ] &&
     [ "$before" = "$(leftovers)" ] && [ -z "$(provider_regions_left "$out")" ]; then
    passed=$((passed + 1)); echo "ok   $what"
  else
    failed=$((failed + 1)); echo "FAIL $what: rc $rc"; echo "$out" | tail -6
  fi
}
expect "a sender killed mid-pipeline fails the receive" 137 2 "mid-pipeline kill, 0 failures" \
  FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 FERRY_SHM_CMA=0 \
  -- --keep-going -n 3 "$program" pipeline
# The receiver offers the second half and waits (FERRY_TEST_GET_DELAY) so that the sender claims
# it; the sender dies before writing it.
expect "a sender killed with half a message to write fails the receive" 137 2 \
  "mid-pipeline kill, 0 failures" FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 \
  FERRY_SHM_CMA_THRESHOLD=0 FERRY_TEST_GET_DELAY=0.3 -- --keep-going -n 3 "$program" pipeline
expect "a sender killed mid-staging (the device fallback ring) fails the receive" \
  137 2 "mid-pipeline kill, 0 failures" \
  FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 FERRY_TEST_HOST_STAGING=1 \
  FERRY_CUDA_STAGE_CHUNK=64k -- --keep-going -n 3 "$program" pipeline
expect "a receiver that cannot map the staging ring fails both sides" 0 3 \
  "staging refused, 0 failures" FERRY_TEST_HOST_STAGING=1 FERRY_TEST_STAGE_OPEN_FAIL=1 \
  FERRY_TIMEOUT=10 FERRY_CUDA_STAGE_CHUNK=64k -- -n 3 "$program" stagefail
if [ "$with_ofi" = ofi ]; then
  for detect in "FERRY_OFI_PROVIDER=tcp" "FERRY_OFI_PROVIDER=tcp FERRY_TEST_OFI_REMOTE=1 FERRY_KEEPALIVE=0.2" \
                "FERRY_OFI_PROVIDER=shm" "FERRY_OFI_PROVIDER=net"; do
    # The sender dies with its buffer exposed for the receiver's read, which starts late
    # (FERRY_TEST_GET_DELAY) and so meets a dead process; then the same with tagged transfers.
    # shellcheck disable=SC2086
    expect "a sender killed mid-rendezvous over ofi fails the receive ($detect)" 137 2 \
      "mid-pipeline kill, 0 failures" FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 \
      FERRY_TEST_GET_DELAY=0.3 FERRY_TRANSPORTS=self,ofi $detect -- --keep-going -n 3 "$program" \
      pipeline
    # shellcheck disable=SC2086
    expect "a sender killed mid-direct-transfer over ofi fails the receive ($detect)" 137 2 \
      "mid-pipeline kill, 0 failures" FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 \
      FERRY_OFI_RMA=off FERRY_TRANSPORTS=self,ofi $detect -- --keep-going -n 3 "$program" pipeline
  done
  # A provider that loses a message (tcp;ofi_rxm does while two ranks connect to each other at
  # once, tcp when a read names a closed key): sent again from the sender's copies, kept until
  # acknowledged; a loss that copies do not fill fails the link on both sides, saying so, instead
  # of holding everything behind it for ever.
  expect "a message lost while the link comes up is sent again" 0 2 \
    "lossy link, 300 round trips, 0 failures" FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp \
    FERRY_TEST_OFI_DROP=0 FERRY_KEEPALIVE=0.1 -- -n 2 "$program" lossy recover
  expect "a message lost after the link is up is sent again" 0 2 \
    "lossy link, 300 round trips, 0 failures" FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp \
    FERRY_TEST_OFI_DROP=150 FERRY_KEEPALIVE=0.1 -- -n 2 "$program" lossy recover
  expect "a message whose copies are lost too fails the link on both sides" 0 2 \
    "lossy link, .* 0 failures" FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp \
    FERRY_TEST_OFI_DROP=150 FERRY_TEST_OFI_DROP_COPIES=1 FERRY_KEEPALIVE=0.1 \
    -- -n 2 "$program" lossy fail
  # Two ranks that send to each other first at once over tcp;ofi_rxm (a withdrawn rendezvous
  # read late, in spin mode): one of the first messages was lost and the job hung, 16 of 16.
  expect "ranks that connect to each other at once lose no message" 0 3 \
    "withdrawn while read, 0 failures" FERRY_WAIT_MODE=spin FERRY_TRANSPORTS=self,ofi \
    FERRY_OFI_PROVIDER=tcp FERRY_TIMEOUT=0.5 FERRY_TEST_GET_DELAY=1 -- -n 3 "$program" withdraw
  expect "a sender killed after its first chunk over ofi fails the receive" 137 2 \
    "mid-pipeline kill, 0 failures" FERRY_TEST_CRASH_AT=mid-pipeline FERRY_TEST_CRASH_RANK=2 \
    FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp FERRY_TEST_OFI_CHUNKED=1 FERRY_OFI_CHUNK=1m \
    -- --keep-going -n 3 "$program" pipeline
fi
expect "a producer killed between claim and publish leaves no stuck FIFO" 137 2 \
  "dead producer, 0 failures" FERRY_TEST_CRASH_AT=mid-claim FERRY_TEST_CRASH_RANK=2 \
  -- --keep-going -n 3 "$program" hole
expect "bounce buffers sent to a receiver that died are taken back" 137 2 \
  "bounce buffers back from a dead receiver, 0 failures" FERRY_SHM_BOUNCE_COUNT=8 \
  -- --keep-going -n 3 "$program" bounce-to-dead
expect "a send withdrawn while its receiver reads it is not delivered" 0 3 \
  "withdrawn while read, 0 failures" FERRY_TIMEOUT=0.5 FERRY_SHM_CMA_THRESHOLD=0 \
  FERRY_TEST_GET_DELAY=1 -- -n 3 "$program" withdraw
expect "a receive from a rank no transport reaches fails at once" 0 2 "unreachable, 0 failures" \
  FERRY_TRANSPORTS=self -- -n 2 "$program" unreachable
expect "a rank that waits in its own poll loop sees a death within a second" 137 1 \
  "polled receive failed .* 0 failures" -- --keep-going -n 2 "$program" polled-death
expect "a receive from any source fails once every other rank has died" 137 1 \
  "any source without the others .* 0 failures" -- --keep-going -n 3 "$program" any-source
if [ "$with_ofi" = ofi ]; then
  expect "a receive from any source fails once every other rank has died, over ofi" 137 1 \
    "any source without the others .* 0 failures" FERRY_TRANSPORTS=self,ofi \
    FERRY_OFI_PROVIDER=tcp -- --keep-going -n 3 "$program" any-source
fi
expect "one-sided operations on a rank that dies fail, and the others go on" 137 2 \
  "one-sided without rank 2, 0 failures" -- --keep-going -n 3 "$program" rma-death
if [ "$with_ofi" = ofi ]; then
  expect "one-sided operations on a rank that dies fail over ofi" 137 2 \
    "one-sided without rank 2, 0 failures" FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp \
    -- --keep-going -n 3 "$program" rma-death
fi
# A message sent just before the end (whose finalize barrier fails at once: a rank is dead)
# still reaches its peer, also when the receiver sees the sender gone before it reads it (in
# block mode over ofi tcp its first poll only accepts the connection, and it looks at its peers
# after each sleep).
expect "a message sent just before finalize arrives" 137 2 "delivered before finalize, 0 failures" \
  -- --keep-going -n 3 "$program" exit-after-send
if [ "$with_ofi" = ofi ]; then
  for variant in "FERRY_OFI_PROVIDER=tcp" "FERRY_OFI_PROVIDER=shm" "FERRY_OFI_PROVIDER=net" \
                 "FERRY_OFI_PROVIDER=tcp FERRY_WAIT_MODE=block"; do
    # shellcheck disable=SC2086
    expect "a message sent just before finalize arrives over ofi ($variant)" 137 2 \
      "delivered before finalize, 0 failures" FERRY_TRANSPORTS=self,ofi $variant \
      -- --keep-going -n 3 "$program" exit-after-send
  done
fi
expect "FERRY_TIMEOUT bounds blocking send, recv and probe" 0 3 "timeouts, 0 failures" \
  FERRY_TIMEOUT=0.5 -- -n 3 "$program" timeout
expect "a member killed mid-collective fails the collectives of every survivor" 137 3 \
  "collectives without rank 3 .* 0 failures" FERRY_COLL_SMALL=0 -- --keep-going -n 4 "$program" coll-death
# Survivors read each other's messages late (FERRY_TEST_GET_DELAY), after the one next to the
# victim gave up and withdrew them: still kPeerFailed naming a dead rank, not kCanceled.
expect "a collective that fails by a withdrawn message still names the death" 137 3 \
  "collectives without rank 3 after .* peer failed: .* is gone: .* 0 failures" FERRY_COLL_SMALL=0 \
  FERRY_SHM_CMA_THRESHOLD=0 FERRY_TEST_GET_DELAY=0.3 -- --keep-going -n 4 "$program" coll-death
# A rank that exits before Context::init: the others' init fails at once, naming it (not after
# FERRY_BOOTSTRAP_TIMEOUT, 300 s).
expect "a rank that exits before init fails the others' init at once, naming it" 3 2 \
  "init failed after [0-9]* ms: .*rank 1 (pid [0-9]*) exited with code 0 before it joined" \
  -- --keep-going -n 3 "$program" exit-before-init
expect "a bootstrap timeout names the rank that never came" 3 2 \
  "init failed after .*timed out after 1 s .*rank 1 never connected to the store" \
  FERRY_BOOTSTRAP_TIMEOUT=1 -- --keep-going -n 3 "$program" late-before-init
# A rank that joined and exits 0 without finalizing: the job fails, and ferryrun says why.
expect "a rank that exits 0 without finalizing fails the job" 1 1 \
  "rank 1 (pid [0-9]*) exited with code 0 without finalizing ferry" \
  -- -n 3 "$program" exit-unfinalized
expect "a rank that exits 0 without finalizing fails the job (--keep-going)" 1 2 \
  "saw rank 1 leave: peer failed" -- --keep-going -n 3 "$program" exit-unfinalized
# Messages nobody receives do not hold finalize for FERRY_FINALIZE_TIMEOUT (30 s): the job ends
# well inside ferryrun's --timeout, and the announced send ends with kCanceled.
expect "a send nobody receives does not hold finalize" 0 1 "unreceived send ended" \
  -- --timeout 15 -n 2 "$program" unreceived
# A receive of a message its sender never sent, the sender finalizing: the receive ends (both
# would wait for ever, the receiver in its receive and the sender in finalize's barrier).
expect "a receive whose sender finalized without sending it ends" 0 1 \
  "received; a receive of what it never sent ended" -- --timeout 15 -n 2 "$program" never-sent
# The same for collectives: a barrier and a small allreduce through the node's area, a large one by
# messages, on the ranks that stay, once the last rank ended its Context instead of joining; with 3
# ranks a survivor that gave up first finalizes too, and the other still names the first to go.
for n in 2 3; do
  expect "collectives a rank never joins end when it finalizes ($n ranks)" 0 $((n - 1)) \
    "collectives rank $((n - 1)) never joined ended" -- --timeout 15 -n $n "$program" never-joins
done
expect "a rank that left the store is named as the cause when its peers exit first" 137 1 \
  "rank 1 (pid [0-9]*) was killed by signal 9" -- -n 3 "$program" late-death
if [ "$with_ofi" = ofi ]; then
  # A rank that crashes with libfabric loaded dies by its signal, and leaves no backtrace files.
  scratch=$(mktemp -d)
  out=$(cd "$scratch" && FERRY_TRANSPORTS=self,ofi FERRY_OFI_PROVIDER=tcp timeout 60 "$ferryrun" \
        -n 2 "$program" segfault 2>&1)
  rc=$?
  # (Under a sanitizer its own SEGV handler reports the crash and exits 1: also fine.)
  if { { [ "$rc" -eq 139 ] && echo "$out" | grep -q "rank 1 .*killed by signal 11"; } ||
       echo "$out" | grep -q "Sanitizer: SEGV"; } && [ -z "$(ls "$scratch")" ]; then
    passed=$((passed + 1)); echo "ok   a crash with libfabric loaded is reported as the signal"
  else
    failed=$((failed + 1)); echo "FAIL a crash with libfabric loaded: rc $rc, files: $(ls "$scratch")"
    echo "$out" | tail -4
  fi
  rm -rf "$scratch"
fi
start=$(date +%s%N)
out=$(timeout 60 "$ferryrun" -n 3 "$program" abort 2>&1)
rc=$?
elapsed=$(( ($(date +%s%N) - start) / 1000000 ))
if [ "$rc" -eq 7 ] && echo "$out" | grep -q "rank 1 .*aborted the job with code 7: fault_test asked for it" &&
   [ "$elapsed" -lt 10000 ] && [ "$before" = "$(leftovers)" ]; then
  passed=$((passed + 1)); echo "ok   Context::abort ends every rank (${elapsed} ms)"
else
  failed=$((failed + 1)); echo "FAIL Context::abort: rc $rc, ${elapsed} ms"; echo "$out" | tail -5
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
