# Sourced by the test scripts. leftovers: ferry's files in /dev/shm that belong to no running
# job, sorted. A job's files are named ferry-<job id>-…, and ferryrun's job ids begin with its pid
# (<pid>x<random>): the files of a job whose ferryrun still runs (another test beside this one,
# under ctest -j) are not leftovers. Names that do not begin with a pid are always listed.
leftovers() {
  local name pid
  for name in $(ls /dev/shm 2>/dev/null | grep '^ferry-' | sort); do
    pid=${name#ferry-}
    pid=${pid%%x*}
    case $pid in
      '' | *[!0-9]*) ;;
      *) kill -0 "$pid" 2>/dev/null && continue ;;
    esac
    echo "$name"
  done
}
