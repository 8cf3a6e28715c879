#!/bin/sh
# ferry's mpicc compiles an MPI program and its mpiexec runs it: `mpicc -show` names mpi.h's
# folder and libmpi, the program builds with no other flag and passes on 2 ranks.
#   mpi_wrappers.sh TOOLS_DIR PROGRAM.c
set -u
tools=$1 source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
show=$("$tools/mpicc" -show -o x x.c)
case $show in
  *-I*-lmpi*) ;;
  *) echo "FAIL: mpicc -show printed: $show"; exit 1 ;;
esac
"$tools/mpicc" -O2 -o "$work/mpi_test" "$source" || { echo "FAIL: mpicc could not build $source"; exit 1; }
out=$("$tools/mpiexec" -n 2 "$work/mpi_test" 2>&1)
rc=$?
echo "$out"
passed=$(echo "$out" | grep -c "checks, 0 failures")
if [ "$rc" -ne 0 ] || [ "$passed" -ne 2 ]; then
  echo "FAIL: mpiexec -n 2: exit $rc, $passed of 2 ranks passed"
  exit 1
fi
echo "ok: mpicc and mpiexec"
