#!/usr/bin/env bash
# SIGTERM and SIGINT drain a serving job (runtime/daemon/stop_signal.h): the step in
# flight finishes, a migration before its switch aborts, the report, the
# statistics and the output dump are written whole, the admin sockets go, and
# every rank exits 0 with a line saying so. Under
#   a single process (SIGTERM, SIGINT),
#   mpirun (which cannot forward SIGTERM: it signals the ranks and exits 1 itself),
#   moed-mpirun (which passes the signal on as SIGUSR2: exit 0),
#   moed-mpirun with a migration running (it aborts; nothing is committed).
# scancel under Slurm is in test_slurm.sh.
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}"
LAUNCH=$MOED_SOURCE_DIR/launch

pid=""
cleanup() {
  [ -z "$pid" ] || end_daemon "$pid"
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# start NAME HOW [moed flags...]: serving "for ever" in the background, HOW
# one of single, mpirun, moed-mpirun; returns once rank 0 serves.
start() {
  local name=$1 how=$2
  shift 2
  run=$SCRATCH/$name
  mkdir -p "$run"
  local args=(--config "$SMALL" --set workload.steps=1000000 --set "admin.dir=\"$run/admin\""
    --set "stats.file=\"$run/stats.bin\"" --set stats.every_steps=1000000
    --dump-output "$run/out.bin" --report-json "$run/report.json" "$@")
  case $how in
    single) "$MOED" "${args[@]}" >"$run/log" 2>&1 & ;;
    # On SIGTERM, Open MPI's mpirun sends the ranks SIGCONT, waits
    # odls_base_sigkill_timeout seconds (default 1), sends SIGTERM, waits as
    # long again, then SIGKILL: 10 s is the time the ranks have to drain,
    # whatever the load (and mpirun ends 20 s after the signal).
    mpirun) mpirun --bind-to none --mca odls_base_sigkill_timeout 10 -np 4 "$MOED" "${args[@]}" >"$run/log" 2>&1 & ;;
    moed-mpirun) "$LAUNCH/moed-mpirun" --hosts localhost --gpus-per-host 4 --moed "$MOED" -- "${args[@]}" \
      >"$run/log" 2>&1 & ;;
  esac
  pid=$!
  for _ in $(seq 600); do
    "$MOECTL" --dir "$run/admin" status 2>/dev/null | grep -q 'state *serving' && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$run/log" >&2; fail "$name: moed exited at start"; }
    sleep 0.1
  done
  fail "$name: not serving within 60 s"
}

# served_some: rank 0 has served a few steps.
served_some() {
  local step
  step=$("$MOECTL" --dir "$run/admin" --json status 2>/dev/null |
    python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["step"])' 2>/dev/null) || return 1
  [ "${step:-0}" -ge 3 ]
}

# signal_and_wait SIGNAL: once a few steps are served, sends it to the job's
# launcher (or the process); the job must end within 60 s. Its exit code in $rc.
signal_and_wait() {
  wait_until 60 served_some || { cat "$run/log" >&2; fail "not 3 steps served within 60 s"; }
  kill -s "$1" "$pid"
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -0 "$pid" 2>/dev/null && { cat "$run/log" >&2; fail "still running 60 s after $1"; }
  rc=0
  wait "$pid" || rc=$?
  pid=""
}

# drained WHAT SIGNAL-NAME: the line, the files whole, the sockets gone, and
# the dumped outputs bit-identical to a run of as many steps without a signal.
drained() {
  local what=$1 name=$2 steps
  grep -q "moed: stopped by $name.* after [0-9]* steps: drained" "$run/log" ||
    { cat "$run/log" >&2; fail "$what: no line saying it drained"; }
  python3 -c 'import json,sys; json.load(open(sys.argv[1]))' "$run/report.json" ||
    fail "$what: the report is not whole JSON"
  [ -s "$run/stats.bin" ] || fail "$what: no statistics written"
  [ -z "$(ls -A "$run/admin" 2>/dev/null)" ] || fail "$what: sockets left: $(ls "$run/admin")"
  steps=$(od -An -tu8 -j24 -N8 "$run/out.bin" | tr -d ' ')
  [ "${steps:-0}" -gt 0 ] || fail "$what: the output dump holds no steps"
  moed_on 0 --config "$SMALL" --set workload.steps="$steps" --dump-output "$run/reference.bin" >/dev/null
  same_bits "$run/reference.bin" "$run/out.bin" "$what: the outputs of the $steps steps served"
  echo "ok: $what: $(grep -m1 'stopped by' "$run/log" | cut -c1-140)"
}

start single-term single
signal_and_wait TERM
[ "$rc" = 0 ] || { cat "$run/log" >&2; fail "one process, SIGTERM: exit $rc, expected 0"; }
drained "one process, SIGTERM" SIGTERM

start single-int single
signal_and_wait INT
[ "$rc" = 0 ] || { cat "$run/log" >&2; fail "one process, SIGINT: exit $rc, expected 0"; }
drained "one process, SIGINT" SIGINT

# mpirun ends the job itself on SIGTERM (it cannot forward it) and exits 1;
# its ranks still drain and write everything.
start mpirun mpirun
signal_and_wait TERM
drained "mpirun -np 4, SIGTERM to mpirun (mpirun's own exit $rc)" SIGTERM
[ "$(grep -c 'stopped by SIGTERM' "$run/log")" = 1 ] || fail "mpirun: rank 0 should say it once"

start launcher moed-mpirun
signal_and_wait TERM
[ "$rc" = 0 ] || { cat "$run/log" >&2; fail "moed-mpirun, SIGTERM: exit $rc, expected 0"; }
drained "moed-mpirun, SIGTERM" "SIGUSR2"

# A migration running when the signal comes aborts before its switch: its
# source (rank 1) holds it in transfer until then (migrate-hold).
MOED_FAULT=migrate-hold:rank=1 start migrating moed-mpirun --set "placement.committed=\"$SCRATCH/committed.toml\""
"$MOECTL" --dir "$run/admin" migrate 1 3 0 >"$run/ctl.out" 2>&1 &
follower=$!
wait_until 60 grep -q transfer "$run/ctl.out" ||
  { cat "$run/ctl.out" >&2; fail "the held migration did not show its transfer within 60 s"; }
signal_and_wait TERM
ctl_rc=0
wait "$follower" || ctl_rc=$?
[ "$rc" = 0 ] || { cat "$run/log" >&2; fail "moed-mpirun with a migration, SIGTERM: exit $rc, expected 0"; }
[ "$ctl_rc" = 1 ] || { cat "$run/ctl.out" >&2; fail "moectl migrate during the drain: exit $ctl_rc, expected 1"; }
grep -q aborted "$run/ctl.out" || { cat "$run/ctl.out" >&2; fail "moectl does not say the migration aborted"; }
[ ! -e "$SCRATCH/committed.toml" ] || fail "a placement was committed although the migration aborted"
drained "moed-mpirun, SIGTERM during a migration" "SIGUSR2"
