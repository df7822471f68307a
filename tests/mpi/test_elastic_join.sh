#!/usr/bin/env bash
# Elastic serving grows back (docs/elastic.md, "Spares: growing back"): 4
# serving ranks in 2 islands and one spare ([comm].spares = 1, world rank
# 4), launched with the job, holding no expert. 8 network clients use the 4
# serving ranks as homes.
#   1. World rank 1 is killed while the clients are paused with submits in
#      flight: the survivors go on (epoch 2), rank 0 admits the spare (epoch
#      3: world ranks 0 2 3 4), and a migration moves its share of the slots
#      to it (6 of 24). Every client call succeeds with the undisturbed run's
#      bits; so do the calls of clients started after the join, which the
#      joined rank serves experts for; its front door opens once it serves.
#   2. Scaling up without a loss: moectl admit; epoch 2 serves on all 5
#      ranks, 4 of the 24 slots migrate to the spare, the same bits; a
#      second admit is refused (no spare waits).
#   3. A spare never admitted leaves when the serving ranks have all left
#      (a plain shutdown ends the whole job).
source "$(dirname "$0")/elastic_lib.sh"

spares=1
slots_on() {  # slots_on RANK: the slots that rank of the current epoch holds, as rank 0 shows them
  "$MOECTL" --dir "$admin" --json placement |
    python3 -c "import json, sys; p = json.loads(sys.stdin.readline()); \
print(sum(r == $1 for layer in p['slots'] for ranks in layer for r in ranks))"
}

# --- 1. a loss, then the spare joins and takes its share ----------------------------
start -- --set comm.spares=1
clients reference >/dev/null || fail "the undisturbed clients"
[ ! -e "$sock/moed-ingress-4.ucx" ] || fail "the spare opened its front door before it joined"
paused_clients join
kill -KILL "$(pid_of 1)"
clients_done join "8 clients across world rank 1 killed and the spare joining"
wait_until 30 logged_times 'world rank(s) 4 joined (spares) at step' 4 ||
  fail_seeing "not every member logged the spare's join"
[ "$(survivors_of 4)" = "3 0 2 3 4" ] || fail "the joined rank's status shows '$(survivors_of 4)', expected epoch 3 of 0 2 3 4"
wait_until 30 migration_committed "$admin" || fail_seeing "the migration to the joined rank did not commit"
[ "$(slots_on 3)" = 6 ] || fail "the joined rank (rank 3 of epoch 3) holds $(slots_on 3) slots, expected 6 of 24"
wait_until 30 test -s "$sock/moed-ingress-4.ucx" || fail "the joined rank's front door did not open"
clients after >/dev/null || fail "clients after the join"
same_bits "$SCRATCH/reference.bin" "$SCRATCH/after.bin" "clients served with the joined rank's experts"
echo "ok: world rank 1 lost, spare world rank 4 admitted (epoch 3), 6 of 24 slots migrated to it, same bits before and after"

"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
wait "$job" || true
job=""
[ "$(logged 'leaving without MPI_Finalize')" = 4 ] || fail "the 4 members did not leave on their own"

# --- 2. scaling up: moectl admit --------------------------------------------------------
start -- --set comm.spares=1
"$MOECTL" --dir "$admin" admit >"$SCRATCH/admit.out" 2>&1 || { cat "$SCRATCH/admit.out" >&2; fail "moectl admit"; }
grep -q "admitting.*4" "$SCRATCH/admit.out" || { cat "$SCRATCH/admit.out" >&2; fail "moectl admit did not name spare 4"; }
wait_until 30 logged_times 'world rank(s) 4 joined (spares) at step' 5 || fail_seeing "the spare did not join on moectl admit"
wait_until 30 migration_committed "$admin" || fail_seeing "the migration to the admitted rank did not commit"
[ "$(slots_on 4)" = 4 ] || fail "the admitted rank holds $(slots_on 4) slots, expected 4 of 24"
clients grown >/dev/null || fail "clients after scaling up"
same_bits "$SCRATCH/reference.bin" "$SCRATCH/grown.bin" "clients served by 5 ranks after moectl admit"
rc=0
"$MOECTL" --dir "$admin" admit >"$SCRATCH/admit.out" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "no spare waits" "$SCRATCH/admit.out" || { cat "$SCRATCH/admit.out" >&2; fail "a second admit was not refused"; }
"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown (5 ranks)"
wait "$job" || true
job=""
echo "ok: moectl admit: spare world rank 4 joined without a loss (epoch 2 of 5 ranks), 4 of 24 slots migrated, same bits; a second admit refused"

# --- 3. a spare never admitted leaves with the job ------------------------------------
start -- --set comm.spares=1
"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown (the spare idle)"
wait_until 60 bash -c "! kill -0 $job 2>/dev/null" || fail_seeing "the job did not end with its spare idle"
wait "$job" || true
job=""
grep -q "a spare: the job's serving ranks have all left" "$SCRATCH/job.log" || fail_seeing "the idle spare did not say why it left"
echo "ok: an idle spare left when the 4 serving ranks had"
