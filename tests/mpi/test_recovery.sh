#!/usr/bin/env bash
# Supervised recovery after a lost rank: `moed-mpirun --restart N` relaunches
# a job whose rank was killed (Open MPI cannot survive it), the relaunch
# resumes the committed placement and the statistics, and front-door clients
# reconnect and resubmit what they had in flight.
#   builtin  a migration commits epoch 1; a rank is killed (SIGKILL); the job
#            serves again on epoch 1 with its statistics; the time from the
#            kill to serving again is printed
#   clients  4 ranks serving the front door to 2 clients per rank, a rank
#            killed midway (while the clients pause with submits in flight):
#            every call completes (no failed call), and the outputs are the
#            bits of a run without the failure
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}"
mode=${1:?usage: test_recovery.sh builtin|clients}
LAUNCH=$MOED_SOURCE_DIR/launch
run=$SCRATCH/run
mkdir -p "$run"
pid=""
cleanup() {
  [ -z "$pid" ] || end_daemon "$pid"
  pkill -9 -f -- "$run/" 2>/dev/null || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
ctl() { "$MOECTL" --dir "$run/admin" "$@"; }
status_of() { ctl --json status 2>/dev/null | python3 -c "import json,sys; d=json.loads(sys.stdin.readline()); print(d.get('state'), d.get('step'), d.get('epoch'))" 2>/dev/null || true; }

# start [moed flags...]: moed-mpirun --restart 2 on 4 ranks, in the background.
start() {
  "$LAUNCH/moed-mpirun" --restart 2 --hosts localhost --gpus-per-host 4 --moed "$MOED" -- --config "$SMALL" \
    --set "admin.dir=\"$run/admin\"" --set "placement.committed=\"$run/committed.toml\"" \
    --set "stats.file=\"$run/stats.bin\"" --set stats.every_steps=50 "$@" >"$run/log" 2>&1 &
  pid=$!
  for _ in $(seq 600); do
    [ "$(status_of | cut -d' ' -f1)" = serving ] && return 0
    # The front door's ranks publish a status after their first work: its sockets say it is up.
    [ "$(ls "$run/sock"/moed-ingress-*.sock 2>/dev/null | wc -l)" = 4 ] && return 0
    kill -0 "$pid" 2>/dev/null || { cat "$run/log" >&2; fail "moed-mpirun exited at start"; }
    sleep 0.1
  done
  fail "not serving within 60 s"
}

serving() { [ "$(status_of | cut -d' ' -f1)" = serving ]; }

# kill_a_rank [COMMAND...]: SIGKILL to rank 2's process, then COMMAND; waits
# until moed-mpirun has relaunched the job (the old job is gone once it says
# so) and the relaunch serves; prints and sets $recovery_s.
kill_a_rank() {
  local victim t0
  victim=$(pgrep -f -- "apps/moed .*$run/admin|moed --config .*$run/admin" | sed -n 3p)
  [ -n "$victim" ] || fail "no rank process to kill"
  t0=$(date +%s.%N)
  kill -9 "$victim"
  "$@"
  wait_until 120 grep -q "relaunching (restart 1 of 2)" "$run/log" ||
    { cat "$run/log" >&2; fail "moed-mpirun did not relaunch within 120 s"; }
  wait_until 120 serving || { cat "$run/log" >&2; fail "the relaunched job did not serve within 120 s"; }
  recovery_s=$(python3 -c "import time; print(f'{time.time() - $t0:.1f}')")
  echo "ok: a rank killed (SIGKILL): serving again after $recovery_s s ($(grep -m1 'relaunching' "$run/log" | cut -c1-100))"
}

stop() {
  ctl shutdown >/dev/null
  for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  local rc=0
  wait "$pid" || rc=$?
  pid=""
  [ "$rc" = 0 ] || { tail -30 "$run/log" >&2; fail "moed-mpirun exited $rc after the shutdown"; }
}

case $mode in
builtin)
  start --set workload.steps=100000000 --log-level info --set log.per_step=false
  ctl migrate 1 3 0 >/dev/null || fail "the migration before the failure did not commit"
  grep -q '^epoch = 1' "$run/committed.toml" || fail "no committed epoch 1"
  wait_until 120 test -s "$run/stats.bin" || fail "no statistics written within 120 s"
  kill_a_rank
  epoch=$(status_of | cut -d' ' -f3)
  [ "$epoch" = 1 ] || fail "the relaunched job serves epoch $epoch, expected the committed 1"
  grep -q "resuming the statistics of $run/stats.bin" "$run/log" ||
    { grep -i statist "$run/log" >&2; fail "the relaunched job did not resume the statistics"; }
  stop
  ;;
clients)
  : "${FRONT_DOOR_CHECK:?}"
  start --set workload.kind=ingress --set "ingress.dir=\"$run/sock\""
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 4 --mode concurrent --requests 64 --out "$SCRATCH/ref.bin" ||
    fail "the reference run of the clients"
  # The clients pause after 500 of 2,000 requests with submits in flight; the
  # rank is killed there, and they go on while the job is relaunched.
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 4 --mode concurrent --requests 2000 --clients-per-rank 2 \
    --pause-after 500 --resume-file "$run/resume" --out "$SCRATCH/long.bin" >"$run/clients.log" 2>&1 &
  clients=$!
  wait_until 120 grep -q paused "$run/clients.log" ||
    { cat "$run/clients.log" >&2; fail "the clients did not pause within 120 s"; }
  kill_a_rank touch "$run/resume"
  crc=0
  wait "$clients" || crc=$?
  [ "$crc" = 0 ] || { cat "$run/clients.log" >&2; fail "a client call failed across the recovery (exit $crc)"; }
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 4 --mode concurrent --requests 2000 --clients-per-rank 2 \
    --out "$SCRATCH/again.bin" || fail "the run without a failure"
  same_bits "$SCRATCH/again.bin" "$SCRATCH/long.bin" "2000 requests across a lost rank vs without"
  stop
  ;;
esac
