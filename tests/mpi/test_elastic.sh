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
#      finds its socket, the lowest that answers, and its shutdown ends the
#      job) and serves the metrics endpoint that went with world rank 0.
#   3. 5 ranks, no redundancy: world ranks 1 and 3 killed 4 ms apart, so
#      that the second loss often falls within the survivors' rebuild after
#      the first (they agree again): 3 of 5 go on with both ranks' experts.
#   4. Too few left (2 of 4 killed at once): no majority, so no agreement;
#      the job ends and moed-mpirun --restart starts it again, which serves
#      the clients with the same bits (the restart path as the fallback).
#   5. The fencing lease ([comm].lease_ms = 1 s): world rank 2 pauses 2.5 s
#      in a step (MOED_FAULT=pause), short of the 5 s deadline. Its step
#      outlives the lease, so it holds its answers back and serves those
#      rows again at the next turn: nobody is lost, every call succeeds with
#      the same bits, and its status counts the step.
source "$(dirname "$0")/elastic_lib.sh"

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
start -- --set 'metrics.listen="127.0.0.1:0"'
paused_clients kill0
kill -KILL "$(pid_of 0)"
clients_done kill0 "8 clients across world rank 0 (the coordinator) killed"
wait_until 30 logged_times 'lost world rank(s) 0 at step' 3 || fail_seeing "not every survivor logged the loss of rank 0"
loaded=$(sed -n 's/.*lost world rank(s) 0 at step .*; \([0-9]*\) expert(s) of the lost loaded.*/\1/p' "$SCRATCH/job.log" |
  awk '{ s += $1 } END { print s }')
# Rank 0 held experts 0-1 of each of the 3 layers: 6 orphans, each loaded once.
[ "$loaded" = 6 ] || fail "the survivors loaded $loaded experts of the lost rank, expected 6"
[ "$(survivors_of 1)" = "1 1 2 3" ] || fail "rank 1's status shows survivors '$(survivors_of 1)'"
# World rank 1 took over the metrics endpoint that went with world rank 0.
port=$(grep -o '\[rank 1\].*metrics endpoint http://127.0.0.1:[0-9]*' "$SCRATCH/job.log" | sed 's/.*://')
[ -n "$port" ] || fail_seeing "world rank 1 did not open the metrics endpoint after the coordinator was lost"
metrics=$(curl -sf "http://127.0.0.1:$port/metrics") || fail "world rank 1's metrics endpoint"
for line in "moed_survivors_epoch 1" "moed_ranks_serving 3" "moed_ranks_lost 1"; do
  grep -qx "$line" <<<"$metrics" || fail "world rank 1's metrics lack '$line'"
done
# moectl finds the coordinator by itself: rank 0's socket is gone, and world rank 1's is the lowest that answers.
"$MOECTL" --dir "$admin" shutdown >/dev/null 2>"$SCRATCH/moectl.err" || { cat "$SCRATCH/moectl.err" >&2; fail "moectl shutdown: world rank 1 coordinates now"; }
grep -q "using rank 1's, the lowest that does" "$SCRATCH/moectl.err" || fail "moectl did not say it used rank 1's socket"
wait "$job" || true
job=""
echo "ok: world rank 0 killed: its 6 experts loaded from the checkpoint, world rank 1 coordinates (moectl found it) and serves the metrics"

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

# --- 5. the fencing lease: a slow step's answers wait for the next turn ----------------
MOED_FAULT=pause:rank=2,step=4,ms=2500 start -x MOED_FAULT -- --set comm.lease_ms=1000
clients lease >/dev/null || { tail -30 "$SCRATCH/job.log" >&2; fail "clients across a step past the lease"; }
same_bits "$SCRATCH/reference.bin" "$SCRATCH/lease.bin" "8 clients across world rank 2 pausing 2.5 s in a step"
grep -q "\[rank 2\].*past the fencing lease (\[comm\].lease_ms, 1000 ms): its answers wait for the next turn" \
  "$SCRATCH/job.log" || fail_seeing "world rank 2 answered a step that outlived the lease"
[ "$(logged 'lost world rank' || true)" = 0 ] || fail_seeing "a rank was taken as lost for a pause short of the deadline"
expired=$(status_of 2 | python3 -c "import json, sys; print(json.loads(sys.stdin.readline()).get('lease_expired', 0))")
[ "$expired" -ge 1 ] || fail "world rank 2's status counts $expired steps past the lease"
"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown (the lease)"
wait "$job" || true
job=""
echo "ok: world rank 2 paused 2.5 s in a step: its answers waited for the next turn (the lease), nobody lost, same bits"
