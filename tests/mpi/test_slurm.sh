#!/usr/bin/env bash
# The launchers against a real Slurm: brings up munged, slurmctld and slurmd on
# this machine (no systemd, everything under a temp dir, ports picked free),
# then runs the small job on 4 ranks three ways and compares the outputs bit
# for bit:
#   mpirun   launch/moed-mpirun --hosts localhost --gpus-per-host 4
#   srun     srun --mpi=pmix -n 4 launch/moed-rank --ranks 4 moed ...
#   sbatch   sbatch --wait launch/moed.sbatch (4 tasks, 4 GPUs of the node)
# and checks that a job smaller than the ranks wanted is refused (exit 2).
# The daemons are always torn down, on failure too. Exit 77 (skip) only where
# Slurm is not installed and cannot be (not root, or apt cannot install it),
# or, when not root, where the daemons cannot start.
source "$(dirname "$0")/lib.sh"
LAUNCH="$MOED_SOURCE_DIR/launch"
RANKS=4

skip() {
  echo "SKIP: $*"
  exit 77
}

# --- Slurm's programs ----------------------------------------------------------

SLURM_TOOLS=(munged slurmctld slurmd srun sbatch sinfo squeue scancel scontrol)

# The daemons live in /usr/sbin, which a non-root PATH may lack.
export PATH="$PATH:/usr/sbin:/sbin"

missing_tools() {
  local t
  for t in "${SLURM_TOOLS[@]}"; do command -v "$t" >/dev/null || echo "$t"; done
}

ensure_slurm_installed() {
  local missing
  missing=$(missing_tools | tr '\n' ' ')
  [ -n "$missing" ] || return 0
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    skip "Slurm is not installed (no ${missing% }) and cannot be installed here (not root or no apt-get):" \
      "install the Debian packages slurm-wlm and munge (ci/install-deps.sh does)"
  fi
  echo "installing slurm-wlm munge (missing: ${missing% })"
  local apt=(env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 install -y -q slurm-wlm munge)
  timeout 180 "${apt[@]}" >"$SCRATCH/apt.log" 2>&1 ||
    { timeout 120 apt-get update -q >>"$SCRATCH/apt.log" 2>&1 && timeout 180 "${apt[@]}" >>"$SCRATCH/apt.log" 2>&1; } ||
    skip "Slurm is not installed and apt-get could not install slurm-wlm munge: $(tail -1 "$SCRATCH/apt.log")"
  missing=$(missing_tools | tr '\n' ' ')
  [ -z "$missing" ] || fail "slurm-wlm and munge installed, yet ${missing% } missing"
}

# --- the cluster: munged, slurmctld, slurmd --------------------------------------

CLUSTER="$SCRATCH/slurm"
MUNGE_DIR=""
MUNGED_PID="" CTLD_PID="" SLURMD_PID=""
CLUSTER_USER=$(id -un)
NODE=$(hostname -s)

# Stops whatever this script started, whatever state it is in; never fails.
teardown() {
  local rc=$?
  set +e
  if [ -n "$CTLD_PID" ] && kill -0 "$CTLD_PID" 2>/dev/null; then
    # Jobs first, so that no slurmstepd (which slurmd does not wait for) outlives the test.
    timeout 5 scancel --quiet --user="$CLUSTER_USER" >/dev/null 2>&1
    wait_for 10 queue_empty
    timeout 5 scontrol shutdown >/dev/null 2>&1
  fi
  stop_pid "$BG_PID" "the job's client"
  stop_pid "$SLURMD_PID" slurmd
  stop_pid "$CTLD_PID" slurmctld
  stop_pid "$MUNGED_PID" munged
  if [ "$rc" != 0 ] && [ "$rc" != 77 ] && [ -d "$CLUSTER/log" ]; then
    echo "--- the cluster's logs (last lines) ---" >&2
    tail -n 15 "$CLUSTER"/log/*.log ${MUNGE_DIR:+"$MUNGE_DIR/munged.log"} >&2
  fi
  rm -rf "$SCRATCH" ${MUNGE_DIR:+"$MUNGE_DIR"}
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# stop_pid PID NAME: TERM, up to 5 s to go, then KILL.
stop_pid() {
  local pid=$1 _
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null
  for _ in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  echo "teardown: $2 (pid $pid) ignored TERM; killing it" >&2
  kill -KILL "$pid" 2>/dev/null
}

# bounded SECONDS COMMAND...: runs COMMAND for at most SECONDS. In the
# background, because bash runs a trap only once the foreground command is
# done: a TERM would otherwise wait for the whole job before the teardown.
BG_PID=""
bounded() {
  local secs=$1 rc=0
  shift
  timeout "$secs" "$@" &
  BG_PID=$!
  wait "$BG_PID" || rc=$?
  BG_PID=""
  return "$rc"
}

# wait_for SECONDS COMMAND...: polls COMMAND every 0.1 s until it succeeds.
wait_for() {
  local tenths=$(($1 * 10)) _
  shift
  for _ in $(seq "$tenths"); do
    "$@" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  return 1
}

queue_empty() { [ -z "$(timeout 5 squeue -h -o %i 2>/dev/null)" ]; }

# A TCP port nobody listens on (ports picked at random, so that two runs of this
# test on one machine do not meet).
free_port() {
  local port _
  for _ in $(seq 50); do
    port=$((20000 + RANDOM % 30000))
    if ! ss -Hltn "sport = :$port" 2>/dev/null | grep -q .; then
      echo "$port"
      return
    fi
  done
  fail "no free TCP port found"
}

# Fails the test when root (a broken install), skips it otherwise (an ordinary
# user may not be able to run Slurm's daemons at all).
cannot_start() {
  if [ "$(id -u)" = 0 ]; then fail "$*"; else skip "$* (not root)"; fi
}

# munged runs as user munge when we are root, else as ourselves; its key and
# socket are private to this run. The directory sits outside $SCRATCH, which
# only its owner can enter.
start_munge() {
  local owner=$CLUSTER_USER
  local -a as_owner=()
  if [ "$(id -u)" = 0 ]; then
    id munge >/dev/null 2>&1 || fail "user munge missing (the munge package creates it)"
    owner=munge
    as_owner=(setpriv --reuid=munge --regid=munge --clear-groups --)
  fi
  MUNGE_DIR=$(mktemp -d "${TMPDIR:-/tmp}/moed-munge.XXXXXX")
  head -c 1024 /dev/urandom >"$MUNGE_DIR/munge.key"
  chmod 600 "$MUNGE_DIR/munge.key"
  chmod 755 "$MUNGE_DIR"
  chown "$owner:" "$MUNGE_DIR" "$MUNGE_DIR/munge.key"
  MUNGE_SOCKET="$MUNGE_DIR/munge.socket"
  "${as_owner[@]}" munged --foreground --socket="$MUNGE_SOCKET" --key-file="$MUNGE_DIR/munge.key" \
    --pid-file="$MUNGE_DIR/munged.pid" --log-file="$MUNGE_DIR/munged.log" \
    --seed-file="$MUNGE_DIR/munged.seed" >"$MUNGE_DIR/munged.out" 2>&1 &
  MUNGED_PID=$!
  wait_for 10 test -S "$MUNGE_SOCKET" ||
    cannot_start "munged did not start: $(tail -n 3 "$MUNGE_DIR/munged.out" "$MUNGE_DIR/munged.log" 2>&1)"
}

write_slurm_conf() {
  mkdir -p "$CLUSTER"/{etc,state,spool,run,log,tmp}
  # One node with 8 CPUs and 4 "GPUs" (a count-only gres: no device files),
  # whatever this machine has: slurmd trusts the config (config_overrides).
  # A first job id picked at random keeps the PMIx directories of two runs
  # apart; task/none leaves the binding to moed-rank.
  cat >"$CLUSTER/etc/slurm.conf" <<EOF
ClusterName=moedtest
SlurmctldHost=$NODE(127.0.0.1)
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
SlurmUser=$CLUSTER_USER
SlurmdUser=$CLUSTER_USER
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
StateSaveLocation=$CLUSTER/state
SlurmdSpoolDir=$CLUSTER/spool
SlurmctldPidFile=$CLUSTER/run/slurmctld.pid
SlurmdPidFile=$CLUSTER/run/slurmd.pid
SlurmctldLogFile=$CLUSTER/log/slurmctld.log
SlurmdLogFile=$CLUSTER/log/slurmd.log
TmpFS=$CLUSTER/tmp
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=pmix
ReturnToService=2
FirstJobId=$((1000 + RANDOM * 16))
KillWait=2
GresTypes=gpu
NodeName=$NODE NodeAddr=127.0.0.1 CPUs=8 Gres=gpu:4 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  # Files stand in for /dev/nvidia0-3, so that Slurm hands out GPUs as on a
  # real node and sets CUDA_VISIBLE_DEVICES.
  mkdir -p "$CLUSTER/dev"
  touch "$CLUSTER"/dev/nvidia{0..3}
  cat >"$CLUSTER/etc/gres.conf" <<EOF
AutoDetect=off
NodeName=$NODE Name=gpu File=$CLUSTER/dev/nvidia[0-3]
EOF
  export SLURM_CONF="$CLUSTER/etc/slurm.conf"
}

node_idle() { [ "$(sinfo -h -N -n "$NODE" -o %t 2>/dev/null)" = idle ]; }

start_slurm() {
  slurmctld -D -f "$SLURM_CONF" >"$CLUSTER/log/slurmctld.out" 2>&1 &
  CTLD_PID=$!
  slurmd -D -f "$SLURM_CONF" -N "$NODE" >"$CLUSTER/log/slurmd.out" 2>&1 &
  SLURMD_PID=$!
  wait_for 30 node_idle ||
    cannot_start "slurmctld and slurmd did not bring node $NODE to idle in 30 s (sinfo: $(sinfo -h -N -o '%N %t %E' 2>&1))"
}

# --- the jobs ------------------------------------------------------------------------

job=(--config "$SMALL" --log-level info)

run_mpirun() {
  bounded 60 "$LAUNCH/moed-mpirun" --hosts localhost --gpus-per-host "$RANKS" --moed "$MOED" -- \
    "${job[@]}" --dump-output "$SCRATCH/mpirun.bin" >"$SCRATCH/mpirun.log" 2>&1 ||
    { cat "$SCRATCH/mpirun.log" >&2; fail "moed-mpirun on localhost x $RANKS failed"; }
  echo "ok: moed-mpirun --hosts localhost --gpus-per-host $RANKS"
}

# Every rank said where it runs, with the local rank Slurm gave it, and, where
# the daemon describes its binding, its cores and GPU.
check_ranks_logged() { # LOG LAUNCHER WHAT
  local r line binding="; cores? [0-9][0-9,-]*.*, (no GPU|GPU [0-9]+ of [0-9]+)"
  for r in $(seq 0 $((RANKS - 1))); do
    line=$(grep -m1 "local rank $r of $RANKS, launched by $2" "$1") ||
      { cat "$1" >&2; fail "$3: no rank logged 'local rank $r of $RANKS, launched by $2'"; }
    if [[ $line == *"launched by $2;"* && ! $line =~ launched\ by\ $2$binding ]]; then
      fail "$3: rank $r's binding is not 'cores LIST ..., GPU' in: $line"
    fi
  done
}

run_srun() {
  bounded 60 srun --mpi=pmix -n "$RANKS" "$LAUNCH/moed-rank" --ranks "$RANKS" -- "$MOED" \
    "${job[@]}" --dump-output "$SCRATCH/srun.bin" >"$SCRATCH/srun.log" 2>&1 ||
    { cat "$SCRATCH/srun.log" >&2; fail "srun --mpi=pmix -n $RANKS moed-rank moed failed"; }
  check_ranks_logged "$SCRATCH/srun.log" slurm "srun"
  same_bits "$SCRATCH/mpirun.bin" "$SCRATCH/srun.bin" "srun --mpi=pmix -n $RANKS (moed-rank) vs moed-mpirun"
}

# sbatch --wait: the template, with the test's size on the command line (it
# overrides the template's #SBATCH lines) and MOED_RANKS in the environment.
run_sbatch() {
  bounded 60 env MOED="$MOED" MOED_RANKS=$RANKS sbatch --wait --quiet --chdir="$SCRATCH" \
    --nodes=1 --ntasks-per-node=$RANKS --gpus-per-node=$RANKS --time=5 \
    --output="$SCRATCH/sbatch.log" "$LAUNCH/moed.sbatch" "${job[@]}" --dump-output "$SCRATCH/sbatch.bin" ||
    { cat "$SCRATCH/sbatch.log" >&2; fail "sbatch --wait launch/moed.sbatch failed"; }
  check_ranks_logged "$SCRATCH/sbatch.log" slurm "sbatch"
  same_bits "$SCRATCH/mpirun.bin" "$SCRATCH/sbatch.bin" "sbatch --wait launch/moed.sbatch vs moed-mpirun"
}

# A job smaller than the ranks wanted never starts moed.
run_too_small() {
  expect_failure 2 "the job has $RANKS ranks \(srun\), fewer than the 8 wanted" \
    "srun -n $RANKS with --ranks 8" -- \
    srun --mpi=pmix -n "$RANKS" "$LAUNCH/moed-rank" --ranks 8 -- "$MOED" "${job[@]}"
  local rc=0
  bounded 60 env MOED="$MOED" MOED_RANKS=8 sbatch --wait --quiet --chdir="$SCRATCH" \
    --nodes=1 --ntasks-per-node=$RANKS --gpus-per-node=$RANKS --time=5 \
    --output="$SCRATCH/small.log" "$LAUNCH/moed.sbatch" "${job[@]}" || rc=$?
  [ "$rc" = 2 ] || { cat "$SCRATCH/small.log" >&2; fail "sbatch of $RANKS tasks with MOED_RANKS=8: exit $rc, expected 2"; }
  grep -q "fewer than the 8 wanted" "$SCRATCH/small.log" ||
    { cat "$SCRATCH/small.log" >&2; fail "sbatch of $RANKS tasks with MOED_RANKS=8: no refusal message"; }
  if grep -q "launched by" "$SCRATCH/small.log"; then fail "sbatch of $RANKS tasks with MOED_RANKS=8: moed started"; fi
  echo "ok: sbatch of $RANKS tasks with MOED_RANKS=8 -> exit 2: $(grep -m1 "fewer than" "$SCRATCH/small.log" | cut -c1-120)"
}

# serving ADMIN: rank 0 of the job whose admin sockets are in ADMIN serves.
serving() { "$MOECTL" --dir "$1" status 2>/dev/null | grep -q 'state *serving'; }
job_running() { [ "$(squeue -h -j "$1" -o %T 2>/dev/null)" = RUNNING ]; }
job_gone() { ! squeue -h -j "$1" 2>/dev/null | grep -q .; }

# job_serving JOBID ADMIN LOG: the batch job runs (squeue says RUNNING), then
# its rank 0 serves, each within 120 s: a loaded machine starts jobs slowly.
job_serving() {
  wait_until 120 job_running "$1" ||
    { cat "$3" >&2; fail "job $1 is not running 120 s after sbatch (state $(squeue -h -j "$1" -o %T 2>/dev/null))"; }
  wait_until 120 serving "$2" || { cat "$3" >&2; fail "job $1 runs but does not serve within 120 s"; }
}

# scancel sends SIGTERM to every task: the job drains (the step in flight
# ends, the report and statistics are written, the sockets go) and every
# rank exits 0, with a line saying so.
run_scancel() {
  local admin=$SCRATCH/scancel-admin jobid
  jobid=$(env MOED="$MOED" MOED_RANKS=$RANKS sbatch --parsable --chdir="$SCRATCH" \
    --nodes=1 --ntasks-per-node=$RANKS --gpus-per-node=$RANKS --time=5 \
    --output="$SCRATCH/scancel.log" "$LAUNCH/moed.sbatch" "${job[@]}" --set workload.steps=1000000 \
    --set "admin.dir=\"$admin\"" --set "stats.file=\"$SCRATCH/scancel-stats.bin\"" --set stats.every_steps=1000000 \
    --report-json "$SCRATCH/scancel.json") || fail "sbatch of the job to cancel failed"
  job_serving "$jobid" "$admin" "$SCRATCH/scancel.log"
  sleep 0.5
  scancel "$jobid"
  wait_until 120 job_gone "$jobid" || fail "job $jobid still queued 120 s after scancel"
  grep -q "moed: stopped by SIGTERM after" "$SCRATCH/scancel.log" ||
    { cat "$SCRATCH/scancel.log" >&2; fail "scancel: no line saying the job drained"; }
  [ -s "$SCRATCH/scancel.json" ] || fail "scancel: no report written"
  [ -s "$SCRATCH/scancel-stats.bin" ] || fail "scancel: no statistics written"
  [ -z "$(ls -A "$admin" 2>/dev/null)" ] || fail "scancel: admin sockets left: $(ls "$admin")"
  echo "ok: scancel drains: $(grep -m1 'stopped by SIGTERM' "$SCRATCH/scancel.log" | cut -c1-120)"
}

# MOED_RESTARTS=1: a rank killed (SIGKILL) ends the step; the batch script
# relaunches it in the allocation, which then serves again (and drains on scancel).
run_restart() {
  local admin=$SCRATCH/restart-admin jobid victim
  jobid=$(env MOED="$MOED" MOED_RANKS=$RANKS MOED_RESTARTS=1 sbatch --parsable --chdir="$SCRATCH" \
    --nodes=1 --ntasks-per-node=$RANKS --gpus-per-node=$RANKS --time=5 \
    --output="$SCRATCH/restart.log" "$LAUNCH/moed.sbatch" "${job[@]}" --set workload.steps=1000000 \
    --set "admin.dir=\"$admin\"") || fail "sbatch of the job to restart failed"
  job_serving "$jobid" "$admin" "$SCRATCH/restart.log"
  victim=$(pgrep -f -- "moed .*$admin" | sed -n 3p)
  [ -n "$victim" ] || { cat "$SCRATCH/restart.log" >&2; fail "no rank to kill"; }
  kill -9 "$victim"
  # The relaunch's line comes once the lost step has ended: what serves after it is the new step.
  wait_until 120 grep -q "relaunching (restart 1 of 1)" "$SCRATCH/restart.log" ||
    { cat "$SCRATCH/restart.log" >&2; fail "MOED_RESTARTS=1: no relaunch within 120 s of a lost rank"; }
  wait_until 120 serving "$admin" ||
    { cat "$SCRATCH/restart.log" >&2; fail "MOED_RESTARTS=1: not serving again within 120 s of the relaunch"; }
  scancel "$jobid"
  wait_until 120 job_gone "$jobid" || fail "job $jobid still queued 120 s after scancel"
  echo "ok: sbatch with MOED_RESTARTS=1 serves again after a lost rank: $(grep -m1 relaunching "$SCRATCH/restart.log" | cut -c1-110)"
}

timed() { # WHAT COMMAND...: runs it and says how long it took
  local start=$SECONDS
  "${@:2}"
  echo "   ($1: $((SECONDS - start)) s)"
}

ensure_slurm_installed
timed "munged" start_munge
write_slurm_conf
timed "slurmctld + slurmd up, node idle" start_slurm
timed "mpirun" run_mpirun
timed "srun" run_srun
timed "sbatch --wait" run_sbatch
timed "refusals" run_too_small
timed "scancel" run_scancel
timed "restart" run_restart
