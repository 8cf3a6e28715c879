#!/usr/bin/env bash
# /dev/shm too small (a private 1 MiB or 3 MiB tmpfs in a mount namespace): init fails with an
# error that names /dev/shm and the size it needed, ferryrun ends the job, and nothing is left.
# Then 10 MiB, room for the ranks but not for a communicator's whole shared area (about 10 MiB for
# two members): the collectives take a smaller area, say so, and compute right, also where the
# first call (the one that sets the area up) is larger than the smaller area's slots.
#   shm_full_test.sh FERRYRUN FERRY_INFO [FERRY_PERF FERRY_COLL_TESTS]
set -u
ferryrun=$1 info=$2 perf=${3:-} coll=${4:-}
if ! unshare -m true 2>/dev/null; then
  echo "skipped: cannot create a mount namespace here (unshare -m needs root)"
  echo "0 passed, 0 failed, 1 skipped"
  exit 0
fi
passed=0 failed=0
for size in 1m 3m; do
  out=$(unshare -m bash -c "mount -t tmpfs -o size=$size tmpfs /dev/shm || exit 99
    timeout 60 '$ferryrun' -n 2 '$info' >/dev/null; echo \"rc=\$?\"; echo \"left=\$(ls /dev/shm | wc -l)\"" 2>&1)
  if ! echo "$out" | grep -q "^rc="; then
    echo "skipped: could not mount a tmpfs over /dev/shm in a mount namespace here"
    echo "0 passed, 0 failed, 1 skipped"
    exit 0
  fi
  why=""
  echo "$out" | grep -q "^rc=0" && why+="init succeeded; "
  echo "$out" | grep -q "^rc=124" && why+="it hung; "
  echo "$out" | grep -q "^left=0$" || why+="files left in /dev/shm; "
  echo "$out" | grep -q "reserving [0-9]* bytes failed (is /dev/shm full or too small" ||
    why+="no error naming the size; "
  if [ -z "$why" ]; then passed=$((passed + 1)); echo "ok   /dev/shm of $size: $(echo "$out" | grep -o 'reserving [0-9]* bytes' | head -1)"
  else failed=$((failed + 1)); echo "FAIL /dev/shm of $size: $why"; echo "$out" | tail -5; fi
done
if [ -n "$perf" ]; then
  out=$(unshare -m bash -c "mount -t tmpfs -o size=10m tmpfs /dev/shm || exit 99
    FERRY_LOG_LEVEL=info timeout 60 '$ferryrun' -n 2 '$perf' allreduce broadcast allgather --sizes 8,64k,256k --iterations 50 --check &&
    timeout 60 '$ferryrun' -n 2 '$coll' --gtest_filter='*FirstCallOfACommunicator*' | grep -q 'PASSED.*1 test' &&
    echo first-call-passed; echo \"rc=\$?\"; echo \"left=\$(ls /dev/shm | wc -l)\"" 2>&1)
  why=""
  echo "$out" | grep -q "^rc=0" || why+="the job failed; "
  echo "$out" | grep -q "^left=0$" || why+="files left in /dev/shm; "
  echo "$out" | grep -q "a smaller area instead, taking calls of up to 65536 bytes" ||
    why+="no word of the smaller area; "
  echo "$out" | grep -q "shared area ready (2 members, up to 65536 bytes each)" ||
    why+="no area of 64 KiB slots; "
  echo "$out" | grep -q "messages instead" && why+="the area was given up; "
  echo "$out" | grep -q "^first-call-passed" || why+="a first call larger than the slots failed; "
  if [ -z "$why" ]; then passed=$((passed + 1)); echo "ok   /dev/shm of 10m: a smaller collective area, data checked"
  else failed=$((failed + 1)); echo "FAIL /dev/shm of 10m: $why"; echo "$out" | tail -8; fi
fi
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
