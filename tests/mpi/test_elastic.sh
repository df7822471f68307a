#!/usr/bin/env bash
# Elastic serving ([comm].elastic, docs/elastic.md): 4 ranks under mpirun
# --enable-recovery, 2 islands of 2, front-door clients on the network door
# with every rank as a home. Each loss happens while 8 clients are paused
# with submits in flight; after it, every client call has succeeded and the
# outputs are the bits of the undisturbed run (cmp).
#   1. [placement].redundancy = 2 (every expert on both islands):
#      - SIGKILL of world rank 1: the other three agree on epoch 1 and go on,
#        loading nothing; status shows the survivors and the loss as an
#        alert, and the metrics the epoch and the ranks lost;
#      - SIGSTOP of world rank 2 past [comm].timeout_ms: the other two agree
#        on epoch 2 (a second loss in a row) and go on; after SIGCONT the
#        stopped rank learns it was left out and exits without answering;
#      - the shutdown: the survivors drain and leave without MPI_Finalize.
#   2. No redundancy: SIGKILL of world rank 0, the coordinator: the others
#      load its experts from the checkpoint, world rank 1 coordinates (moectl
#      finds its socket, the lowest that answers, and its shutdown ends the job).
#   3. 5 ranks, no redundancy: world ranks 1 and 3 killed 4 ms apart, so
#      that the second loss often falls within the survivors' rebuild after
#      the first (they agree again): 3 of 5 go on with both ranks' experts.
#   4. Too few left (2 of 4 killed at once): no majority, so no agreement;
#      the job ends and moed-mpirun --restart starts it again, which serves
#      the clients with the same bits (the restart path as the fallback).
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
  "$mpirun_l" --hosts localhost --gpus-per-host "$ranks" --moed "$MOED" --bind none --elastic "${launcher[@]}" \
    -- "${elastic[@]}" "$@" >"$SCRATCH/job.log" 2>&1 &
  job=$!
  wait_until 120 doors_open || { cat "$SCRATCH/job.log" >&2; fail "the $ranks front doors did not open"; }
}
ranks=4  # of the job start() starts
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

# --- 1. every expert on both islands: two losses in a row ------------------------
start -- --set placement.redundancy=2 --set 'metrics.listen="127.0.0.1:0"'
clients reference >/dev/null || fail "the undisturbed clients"
paused_clients kill1
kill -KILL "$(pid_of 1)"
clients_done kill1 "8 clients across world rank 1 killed"
wait_until 30 logged_times 'lost world rank(s) 1 at step' 3 || fail_seeing "not every survivor logged the loss of rank 1"
[ "$(logged '0 expert(s) of the lost loaded')" = 3 ] || fail "with every expert on both islands, a survivor loaded experts"
[ "$(survivors_of 0)" = "1 0 2 3" ] || fail "rank 0's status shows survivors '$(survivors_of 0)', expected epoch 1 of 0 2 3"
status_of 3 | grep -q '"alerts":\["lost world rank(s) 1 at step' || fail "rank 3's status has no alert for the loss"
port=$(grep -om1 'metrics endpoint http://127.0.0.1:[0-9]*' "$SCRATCH/job.log" | sed 's/.*://')
metrics=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "rank 0's metrics endpoint"
for line in "moed_survivors_epoch 1" "moed_ranks_serving 3" "moed_ranks_lost 1"; do
  grep -qx "$line" <<<"$metrics" || fail "rank 0's metrics lack '$line'"
done
echo "ok: world rank 1 killed: epoch 1 on world ranks 0 2 3, nothing loaded, the loss in status, alerts and metrics"

paused_clients stop2
stopped=$(pid_of 2)
kill -STOP "$stopped"
wait_until 60 logged_times 'epoch 2 serves on world ranks 0 3' 2 || fail_seeing "the others did not go on without rank 2"
kill -CONT "$stopped"
wait_until 60 grep -q "went on without this one at epoch 2" "$SCRATCH/job.log" || fail_seeing "the stopped rank did not learn it was left out"
wait_until 30 bash -c "! kill -0 $stopped 2>/dev/null" || fail "the rank left out is still running"
clients_done stop2 "8 clients across world rank 2 stopped past the deadline, then left out"
echo "ok: world rank 2 stopped: epoch 2 on world ranks 0 3; resumed, it left without answering"

"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
rc=0
wait "$job" || rc=$?
job=""
[ "$(logged 'leaving without MPI_Finalize')" = 2 ] || fail "the 2 survivors did not leave on their own"
echo "ok: the survivors drained and left (mpirun: $rc)"

# --- 2. no redundancy: the coordinator killed, its experts loaded ----------------
start --
paused_clients kill0
kill -KILL "$(pid_of 0)"
clients_done kill0 "8 clients across world rank 0 (the coordinator) killed"
wait_until 30 logged_times 'lost world rank(s) 0 at step' 3 || fail_seeing "not every survivor logged the loss of rank 0"
loaded=$(sed -n 's/.*lost world rank(s) 0 at step .*; \([0-9]*\) expert(s) of the lost loaded.*/\1/p' "$SCRATCH/job.log" |
  awk '{ s += $1 } END { print s }')
# Rank 0 held experts 0-1 of each of the 3 layers: 6 orphans, each loaded once.
[ "$loaded" = 6 ] || fail "the survivors loaded $loaded experts of the lost rank, expected 6"
[ "$(survivors_of 1)" = "1 1 2 3" ] || fail "rank 1's status shows survivors '$(survivors_of 1)'"
# moectl finds the coordinator by itself: rank 0's socket is gone, and world rank 1's is the lowest that answers.
"$MOECTL" --dir "$admin" shutdown >/dev/null 2>"$SCRATCH/moectl.err" || { cat "$SCRATCH/moectl.err" >&2; fail "moectl shutdown: world rank 1 coordinates now"; }
grep -q "using rank 1's, the lowest that does" "$SCRATCH/moectl.err" || fail "moectl did not say it used rank 1's socket"
wait "$job" || true
job=""
echo "ok: world rank 0 killed: its 6 experts loaded from the checkpoint, world rank 1 coordinates (moectl found it)"

# --- 3. two losses close together ---------------------------------------------------
ranks=5
start --
clients reference5 >/dev/null || fail "the undisturbed clients on 5 ranks"
paused_clients close
first=$(pid_of 1) second=$(pid_of 3)
kill -KILL "$first"
sleep 0.004
kill -KILL "$second"
clients_done close "10 clients across world ranks 1 and 3 killed 4 ms apart" reference5
wait_until 30 logged_times 'epoch [12] serves on world ranks 0 2 4;' 3 || fail_seeing "the 3 survivors did not go on together"
"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown (5 ranks)"
wait "$job" || true
job=""
ranks=4
echo "ok: world ranks 1 and 3 killed 4 ms apart: world ranks 0 2 4 went on with both ranks' experts$(
  grep -q 'going on without a lost rank' "$SCRATCH/job.log" && echo ', agreeing again during the rebuild')"

# --- 4. too few left: the restart path ----------------------------------------------
# Fixed ports (the base + the rank), so that the restarted job listens where its clients knew it.
port=$((17500 + $$ % 5000))
start --restart 1 -- --set "ingress.listen=\"127.0.0.1:$port\""
paused_clients two
kill -KILL "$(pid_of 2)" "$(pid_of 3)"
wait_until 120 grep -q "relaunching (restart 1 of 1)" "$SCRATCH/job.log" || { tail -30 "$SCRATCH/job.log" >&2; fail "no restart after 2 of 4 lost"; }
clients_done two "8 clients across 2 of 4 ranks killed and the job's restart"
"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown after the restart"
wait "$job" || fail "the restarted job did not end cleanly"
job=""
echo "ok: 2 of 4 lost: no majority, the job restarted and served the clients with the same bits"
