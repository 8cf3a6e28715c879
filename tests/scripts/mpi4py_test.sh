#!/usr/bin/env bash
# mpi4py on ferry's MPI: builds mpi4py from PyPI's source distribution against ferry's mpicc in a
# virtual environment of its own (with numpy; mpi4py's build checks which MPI functions exist),
# then runs tests/mpi/mpi4py_test.py under ferryrun on 2, 3 and 4 ranks.
#   mpi4py_test.sh BUILD_DIR [VENV_DIR]      (VENV_DIR kept between runs: default /tmp/ferry-mpi4py)
set -euo pipefail
build=$1 venv=${2:-/tmp/ferry-mpi4py}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=4.1.2
if ! "$venv/bin/python" -c "import mpi4py, numpy" 2>/dev/null; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q numpy
  MPICC="$build/tools/mpicc" CFLAGS="-O1 -g0" "$venv/bin/pip" install -q --no-cache-dir \
    --no-binary mpi4py "mpi4py==$version"
fi
failed=0
for n in 2 3 4; do
  out=$(timeout 300 "$build/tools/ferryrun" -n "$n" "$venv/bin/python" \
        "$here/tests/mpi/mpi4py_test.py" 2>&1) || true
  passed=$(echo "$out" | grep -o ": 0 failures" | wc -l)
  echo "$n ranks: $passed of $n ranks passed"
  if [ "$passed" -ne "$n" ]; then failed=1; echo "$out" | tail -20; fi
done
exit $failed
