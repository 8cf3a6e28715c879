#!/usr/bin/env bash
# /dev/shm too small (a private 1 MiB or 3 MiB tmpfs in a mount namespace): init fails with an
# error that names /dev/shm and the size it needed, ferryrun ends the job, and nothing is left.
#   shm_full_test.sh FERRYRUN FERRY_INFO
set -u
ferryrun=$1 info=$2
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
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
