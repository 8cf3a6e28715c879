#!/usr/bin/env bash
# Shared set-up for the quick start: installs what is missing (Debian 12), then configures and
# builds ferry in build/ (or $FERRY_BUILD_DIR). Idempotent: fast when nothing changed.
#   scripts/setup.sh [cmake target...]
set -euo pipefail
top=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FERRY_BUILD_DIR:-$top/build}

# Launchers the tests start ferry under: Open MPI (PMIx), MPICH (hydra, PMI-1) and Slurm; what
# the mpi4py test builds mpi4py with (python3-venv, python3-dev, python3-numpy).
packages=(cmake ninja-build g++ make pkg-config libgtest-dev python3 libfabric-dev iproute2
  libpmix-dev openmpi-bin mpich slurmctld slurmd slurm-client munge python3-venv python3-dev
  python3-numpy)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

cmake_args=(-G Ninja -DCMAKE_BUILD_TYPE=${FERRY_BUILD_TYPE:-RelWithDebInfo})
[ "${FERRY_WERROR:-OFF}" = ON ] && cmake_args+=(-DFERRY_WERROR=ON)
[ -n "${FERRY_SANITIZE:-}" ] && cmake_args+=(-DFERRY_SANITIZE="$FERRY_SANITIZE")
[ -n "${FERRY_KERNELS_FATBIN:-}" ] && cmake_args+=(-DFERRY_KERNELS_FATBIN="$FERRY_KERNELS_FATBIN")
[ -n "${FERRY_KERNELS_SASS:-}" ] && cmake_args+=(-DFERRY_KERNELS_SASS="$FERRY_KERNELS_SASS")
[ -n "${FERRY_BUILD_BENCH:-}" ] && cmake_args+=(-DFERRY_BUILD_BENCH="$FERRY_BUILD_BENCH")
command -v ccache >/dev/null && cmake_args+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
if [ ! -f "$build/build.ninja" ] || [ "${FERRY_WERROR:-OFF}" = ON ] || [ -n "${FERRY_SANITIZE:-}" ]; then
  cmake -S "$top" -B "$build" "${cmake_args[@]}" >/dev/null
fi
jobs=$(nproc)
if [ $# -gt 0 ]; then
  cmake --build "$build" -j "$jobs" --target "$@"
else
  cmake --build "$build" -j "$jobs"
fi
