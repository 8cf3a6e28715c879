#!/bin/sh
# ferry's mpicc compiles an MPI program and its mpiexec runs it: `mpicc -show` names mpi.h's
# folder and libmpi, the program builds with no other flag and passes on 2 ranks, and it links
# ferry's libmpi even when the caller's -L names a folder with another MPI's libmpi.so first (as
# Python's extension builds do with /usr/lib/x86_64-linux-gnu, where Open MPI's may be).
#   mpi_wrappers.sh TOOLS_DIR PROGRAM.c
set -u
tools=$1 source=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
show=$("$tools/mpicc" -show -o x x.c)
case $show in
  *-I*/libmpi.so*) ;;
  *) echo "FAIL: mpicc -show printed: $show"; exit 1 ;;
esac
"$tools/mpicc" -O2 -L/usr/lib/x86_64-linux-gnu -o "$work/mpi_test" "$source" ||
  { echo "FAIL: mpicc could not build $source"; exit 1; }
linked=$(ldd "$work/mpi_test" | grep "libmpi\.so")
case $linked in
  *"/lib/ferry-mpi/libmpi.so"*) ;;
  *) echo "FAIL: the program is linked with another libmpi: $linked"; exit 1 ;;
esac
out=$("$tools/mpiexec" -n 2 "$work/mpi_test" 2>&1)
rc=$?
echo "$out"
passed=$(echo "$out" | grep -c "checks, 0 failures")
if [ "$rc" -ne 0 ] || [ "$passed" -ne 2 ]; then
  echo "FAIL: mpiexec -n 2: exit $rc, $passed of 2 ranks passed"
  exit 1
fi
echo "ok: mpicc and mpiexec"
