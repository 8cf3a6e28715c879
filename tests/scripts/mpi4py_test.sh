#!/usr/bin/env bash
# mpi4py on ferry's MPI: builds mpi4py from PyPI's source distribution against ferry's mpicc in a
# virtual environment of its own (with Debian's numpy, python3-numpy; mpi4py's build checks which
# MPI functions exist), then runs tests/mpi/mpi4py_test.py under ferryrun on 2, 3 and 4 ranks.
# The README's set-up (scripts/setup.sh) installs python3-venv, python3-dev and python3-numpy.
#   mpi4py_test.sh BUILD_DIR [VENV_DIR]      (VENV_DIR kept between runs: default /tmp/ferry-mpi4py)
set -euo pipefail
build=$(cd "$1" && pwd) venv=${2:-/tmp/ferry-mpi4py}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
version=4.1.2
if ! "$venv/bin/python" -c "import mpi4py, numpy" 2>/dev/null; then
  rm -rf "$venv"
  # Debian's Python, whose numpy and headers the set-up installed (not another python3 on PATH).
  /usr/bin/python3 -m venv --system-site-packages "$venv"
  # -O0: the test checks what mpi4py calls, not its speed, and MPI.c builds in a third of the time.
  MPICC="$build/tools/mpicc" CFLAGS="-O0 -g0" "$venv/bin/pip" install -q --no-cache-dir \
    --no-binary mpi4py "mpi4py==$version"
fi
# Built against ferry's libmpi, not another MPI on the machine. The module is found, not imported
# (an import initializes MPI), and ldd's output read whole: `ldd | grep -q` under pipefail failed
# now and then, when grep's early exit cut ldd off (SIGPIPE: 2 of 12 runs side by side).
module=$("$venv/bin/python" -c \
  'import importlib.util as u; print(u.find_spec("mpi4py.MPI").origin)')
libraries=$(ldd "$module")
if ! grep -q "$build/lib/ferry-mpi/libmpi.so" <<<"$libraries"; then
  echo "mpi4py in $venv is not linked with $build/lib/ferry-mpi/libmpi.so"
  exit 1
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
