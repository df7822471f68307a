#!/usr/bin/env bash
# Shared by the elastic-serving tests on one machine (test_elastic.sh,
# test_elastic_migration.sh): a job of $ranks ranks under moed-mpirun
# --elastic, 2 islands of 2, front-door clients on the network door with
# every rank as a home, and what the tests ask of its ranks.
source "$(dirname "$0")/lib.sh"
: "${FRONT_DOOR_CHECK:?}" "${MOECTL:?}"
mpirun_l="$MOED_SOURCE_DIR/launch/moed-mpirun"

head -c 32 /dev/urandom >"$SCRATCH/key" && chmod 600 "$SCRATCH/key"
sock=$SCRATCH/sock admin=$SCRATCH/admin
job=""
cleanup() {
  if [ -n "$job" ]; then
    kill -TERM "$job" 2>/dev/null || true
    pkill -KILL -f -- "^$MOED .*$sock" 2>/dev/null || true
    wait "$job" 2>/dev/null || true
  fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

elastic=(--config "$SMALL" --set workload.kind=ingress --set "ingress.dir=\"$sock\"" --set "admin.dir=\"$admin\""
  --set 'ingress.listen="127.0.0.1:0"' --set "ingress.key_file=\"$SCRATCH/key\"" --set 'ingress.transports="tcp"'
  --set 'comm.backend="ucx"' --set 'comm.control="transport"' --set comm.timeout_ms=5000
  --set cluster.ranks_per_island=2 --set 'log.level="info"')

# start [LAUNCHER ARGS] -- [MOED ARGS]: the job in the background (moed-mpirun
# --elastic), once every front door is open; its log in job.log.
start() {
  local launcher=()
  while [ "$1" != -- ]; do launcher+=("$1"); shift; done
  shift
  rm -rf "$sock" "$admin"
  "$mpirun_l" --hosts localhost --gpus-per-host "$((ranks + spares))" --moed "$MOED" --bind none --elastic "${launcher[@]}" \
    -- "${elastic[@]}" "$@" >"$SCRATCH/job.log" 2>&1 &
  job=$!
  wait_until 120 doors_open || { cat "$SCRATCH/job.log" >&2; fail "the $ranks front doors did not open"; }
}
ranks=4 spares=0  # of the job start() starts: serving ranks, and spares launched after them
doors_open() {
  kill -0 "$job" 2>/dev/null || { cat "$SCRATCH/job.log" >&2; fail "the job ended at start"; }
  for ((r = 0; r < ranks; r++)); do [ -s "$sock/moed-ingress-$r.ucx" ] || return 1; done
}
# pid_of WORLD_RANK: the daemon process of that rank.
pid_of() {
  local p
  for p in $(pgrep -f -- "^$MOED .*$sock"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
clients() {  # clients OUT [front_door_check args]: 8 clients, every rank a home
  local out=$1
  shift
  "$FRONT_DOOR_CHECK" --dir "$sock" --ranks "$ranks" --mode concurrent --key-file "$SCRATCH/key" --all-homes \
    --out "$SCRATCH/$out.bin" "$@"
}
# paused_clients NAME: clients in the background, paused with submits in flight.
paused_clients() {
  rm -f "$SCRATCH/resume-$1"
  clients "$1" --pause-after 16 --resume-file "$SCRATCH/resume-$1" >"$SCRATCH/$1.txt" 2>&1 &
  client_pid=$!
  wait_until 60 grep -q paused "$SCRATCH/$1.txt" || { cat "$SCRATCH/$1.txt" >&2; fail "$1: the clients did not pause"; }
}
clients_done() {  # clients_done NAME WHAT [REFERENCE]: against the undisturbed run's outputs (reference.bin)
  touch "$SCRATCH/resume-$1"
  wait "$client_pid" || { cat "$SCRATCH/$1.txt" >&2; tail -30 "$SCRATCH/job.log" >&2; fail "$2: a client call failed"; }
  same_bits "$SCRATCH/${3:-reference}.bin" "$SCRATCH/$1.bin" "$2"
}
status_of() { "$MOECTL" --dir "$admin" --rank "$1" --json status; }
survivors_of() {  # survivors_of RANK: "epoch members..." from that rank's status
  status_of "$1" | python3 -c "import json, sys; s = json.loads(sys.stdin.readline())['survivors']; \
print(s['epoch'], *s['members'])"
}
logged() { grep -c -- "$1" "$SCRATCH/job.log"; }
# fail_seeing WHAT: fails, showing what the ranks said of losses and errors first.
fail_seeing() {
  grep -E "lost|epoch|fenced|went on|error|critical|relaunch" "$SCRATCH/job.log" | tail -40 >&2 || true
  fail "$1"
}
logged_times() { [ "$(logged "$1")" = "$2" ]; }  # logged_times TEXT N: N lines of the log hold TEXT

