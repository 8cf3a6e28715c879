# shellcheck shell=bash
# Sourced by the bench/osu_*.sh scripts. osu_build DIR SOURCE CC CXX: the OSU micro-benchmarks
# from SOURCE (a fetched copy, never committed) configured with CC/CXX and built in DIR, unmodified;
# a DIR that already holds a build is reused.
osu_build() {
  local dir=$1 source=$2 cc=$3 cxx=$4
  [ -x "$dir/c/mpi/pt2pt/standard/osu_latency" ] && return 0
  # Open MPI's wrapper links -lmpi, which only its -dev package provides (the README's set-up
  # installs openmpi-bin, the launcher the tests use).
  # Likewise MPICH's (libmpich-dev beside the mpich package).
  local dev=
  case $cc in mpicc.openmpi) dev=libopenmpi-dev ;; mpicc.mpich) dev=libmpich-dev ;; esac
  if [ -n "$dev" ] &&
    ! dpkg-query -W -f='${Status}' "$dev" 2>/dev/null | grep -q "install ok installed"; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$dev" >/dev/null
  fi
  rm -rf "$dir"
  cp -r "$source" "$dir"
  (cd "$dir" && CC=$cc CXX=$cxx ./configure >configure.log 2>&1 && make -j"$(nproc)" >make.log 2>&1) ||
    { echo "osu: building with $cc failed (see $dir/*.log)" >&2; return 1; }
}

# mpi_side SIDE N PROGRAM ARGS...: PROGRAM on N ranks by ferry's mpiexec (SIDE ferry; $build is
# ferry's build folder), by Debian's Open MPI (SIDE openmpi: --oversubscribe --bind-to none, as
# these VMs have fewer CPUs than ranks) or by Debian's MPICH (SIDE mpich: hydra, which binds
# nothing unless asked), stdout and stderr together, at most 300 s.
mpi_side() {
  local side=$1 n=$2
  shift 2
  if [ "$side" = ferry ]; then
    timeout 300 "${build:?mpi_side needs build, the ferry build folder}/tools/mpiexec" -n "$n" "$@" 2>&1
  elif [ "$side" = mpich ]; then
    timeout 300 mpiexec.mpich -n "$n" "$@" 2>&1
  else
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
      timeout 300 mpirun.openmpi --oversubscribe --bind-to none -n "$n" "$@" 2>&1
  fi
}
