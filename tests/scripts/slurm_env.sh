# shellcheck shell=bash
# Private single-node Slurm for tests. Source this file, then:
#   slurm_start || { echo "SKIP: $SLURM_ENV_ERROR"; exit 0; }
#   trap slurm_stop EXIT
#   srun -n 4 ./prog; srun --mpi=pmix -n 4 ./prog; srun --mpi=pmi2 -n 4 ./prog
#   slurm_stop        # idempotent, fine from an EXIT trap; leaves no process or file behind
# Needs (Debian 12, root): slurmctld slurmd slurm-client munge, plus libpmix-dev for --mpi=pmix
# (the plugin dlopens the unversioned .../pmix2/lib/libpmix.so). Installs nothing and writes only
# inside one mktemp -d directory; safe under set -euo pipefail. Knobs: SLURM_ENV_CPUS (CPUs the
# node claims, default max(nproc,8), so `srun -n 4` fits 2 cores), SLURM_ENV_TIMEOUT (s, default 30).

# shellcheck disable=SC2034  # SLURM_ENV_ERROR is read by the caller
SLURM_ENV_DIR=${SLURM_ENV_DIR:-} SLURM_ENV_PIDS=${SLURM_ENV_PIDS:-} SLURM_ENV_ERROR=${SLURM_ENV_ERROR:-}

# Prints a free TCP port pair "ctld slurmd", starting from a pid/random-seeded even port.
_slurm_env_ports() {
  local p tries
  p=$((20000 + (($$ * 7 + RANDOM) % 15000) * 2))
  for tries in 1 2 3 4 5 6 7 8 9 10; do
    if [ -z "$(ss -Hltn "( sport = :$p or sport = :$((p + 1)) )" 2>/dev/null || true)" ]; then
      echo "$p $((p + 1))"
      return 0
    fi
    p=$((p + 2 * tries))
  done
  return 1
}

# Fails slurm_start: sets the one-line reason, shows the daemon log tails on stderr, cleans up.
_slurm_env_fail() {
  local f
  SLURM_ENV_ERROR="slurm: $1"
  echo "slurm_env: $1" >&2
  for f in "$SLURM_ENV_DIR"/log/*; do
    if [ -s "$f" ]; then echo "--- ${f##*/}:" >&2; tail -n 5 "$f" >&2 || true; fi
  done
  slurm_stop
  return 1
}

slurm_start() {
  local d host cpus ports ctld_port d_port bin pid state="" timeout=${SLURM_ENV_TIMEOUT:-30}
  if [ -n "$SLURM_ENV_DIR" ]; then SLURM_ENV_ERROR="slurm: already started"; return 1; fi
  SLURM_ENV_ERROR=""
  for bin in munged slurmctld slurmd srun sinfo squeue scancel; do
    command -v "$bin" >/dev/null || { SLURM_ENV_ERROR="slurm: $bin not installed"; return 1; }
  done
  [ "$(id -u)" -eq 0 ] || { SLURM_ENV_ERROR="slurm: needs root (SlurmUser=root)"; return 1; }
  ports=$(_slurm_env_ports) || { SLURM_ENV_ERROR="slurm: no free port pair"; return 1; }
  read -r ctld_port d_port <<<"$ports"
  d=$(mktemp -d "${TMPDIR:-/tmp}/ferry-slurm.XXXXXX") || { SLURM_ENV_ERROR="slurm: mktemp failed"; return 1; }
  SLURM_ENV_DIR=$d
  host=$(hostname -s)
  cpus=$(nproc)
  [ "$cpus" -ge 8 ] || cpus=8
  cpus=${SLURM_ENV_CPUS:-$cpus}
  if ! { mkdir -p "$d"/munge "$d"/state "$d"/spool "$d"/log "$d"/run && chmod 700 "$d"/munge &&
    dd if=/dev/urandom of="$d/munge/key" bs=1024 count=1 status=none && chmod 400 "$d/munge/key"; }; then
    _slurm_env_fail "cannot populate $d"; return 1
  fi

  # munged with its own key and socket; -F keeps it in the foreground so $! is its pid.
  munged -F --force --socket="$d/munge/sock" --key-file="$d/munge/key" --pid-file="$d/run/munged.pid" \
    --seed-file="$d/munge/seed" --log-file="$d/log/munged.log" </dev/null >>"$d/log/munged.out" 2>&1 &
  SLURM_ENV_PIDS=$!
  for _ in $(seq 50); do [ -S "$d/munge/sock" ] && break; sleep 0.1; done
  [ -S "$d/munge/sock" ] || { _slurm_env_fail "munged did not start"; return 1; }

  # Minimal cgroup-free config, every path inside $d. AuthInfo points auth and cred at our munged;
  # config_overrides lets the node claim $cpus CPUs whatever the hardware has.
  cat >"$d/slurm.conf" <<EOF
ClusterName=ferrytest
SlurmctldHost=$host(127.0.0.1)
SlurmUser=root
SlurmctldPort=$ctld_port
SlurmdPort=$d_port
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$d/munge/sock
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool
SlurmctldPidFile=$d/run/slurmctld.pid
SlurmdPidFile=$d/run/slurmd.pid
SlurmctldLogFile=$d/log/slurmctld.log
SlurmdLogFile=$d/log/slurmd.log
PlugStackConfig=$d/plugstack.conf
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
MailProg=/bin/true
KillWait=2
MinJobAge=2
NodeName=$host NodeAddr=127.0.0.1 CPUs=$cpus State=UNKNOWN
PartitionName=test Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF
  : >"$d/plugstack.conf"
  export SLURM_CONF="$d/slurm.conf"  # daemons, srun/sinfo and every task inherit it

  slurmctld -D -i -f "$SLURM_CONF" </dev/null >>"$d/log/slurmctld.out" 2>&1 &
  SLURM_ENV_PIDS="$! $SLURM_ENV_PIDS"  # newest first
  slurmd -D -f "$SLURM_CONF" -N "$host" </dev/null >>"$d/log/slurmd.out" 2>&1 &
  SLURM_ENV_PIDS="$! $SLURM_ENV_PIDS"  # newest first

  # Bounded wait for the node to be idle; give up early if a daemon died.
  for _ in $(seq $((timeout * 4))); do
    state=$(sinfo -h -N -n "$host" -o %t 2>/dev/null || true)
    [ "$state" != idle ] || return 0
    for pid in $SLURM_ENV_PIDS; do
      kill -0 "$pid" 2>/dev/null || { _slurm_env_fail "daemon pid $pid exited during start"; return 1; }
    done
    sleep 0.25
  done
  _slurm_env_fail "node not idle after ${timeout}s (state '${state:-none}')"
}

slurm_stop() {
  local d=$SLURM_ENV_DIR pid strays
  [ -n "$d" ] || return 0
  # Cancel leftover jobs first, so slurmstepd kills its tasks while slurmd is still up.
  if [ -n "$(squeue -h -o %i 2>/dev/null || true)" ]; then
    scancel --quiet --user=root 2>/dev/null || true
    for _ in $(seq 40); do
      [ -n "$(squeue -h -o %i 2>/dev/null || true)" ] || break
      sleep 0.25
    done
  fi
  # Daemons in reverse start order (slurmd, slurmctld, munged): TERM, then KILL after 10 s.
  for pid in $SLURM_ENV_PIDS; do
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 40); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  # Backstop: any process still carrying our SLURM_CONF in its environment (stray slurmstepd,
  # tasks, background sruns) was started through this instance: kill exactly those.
  strays=$(grep -lzxF "SLURM_CONF=$d/slurm.conf" /proc/[0-9]*/environ 2>/dev/null | cut -d/ -f3 |
    grep -vxE "$$|$BASHPID" || true)
  if [ -n "$strays" ]; then
    # shellcheck disable=SC2086
    kill -9 $strays 2>/dev/null || true
  fi
  rm -rf -- "$d"
  if [ "${SLURM_CONF:-}" = "$d/slurm.conf" ]; then unset SLURM_CONF; fi
  SLURM_ENV_DIR="" SLURM_ENV_PIDS=""
  return 0
}
