#!/usr/bin/env bash
# A process started after the job joins it (docs/elastic.md, "Joining a
# running job"): 4 ranks launched under moed-mpirun --elastic keep one join
# slot ([comm].join_slots = 1, world rank 4) and hear joiners at
# [comm].join_listen. 8 network clients use the ranks as homes.
#   1. Joiners refused, the job untouched: one with another key, one with
#      another config; each exits 2 naming why.
#   2. `moed-mpirun --join` (moed --join with the job's arguments), outside
#      mpirun: every member reaches it at a step boundary, rank 0 admits it
#      (epoch 2: world ranks 0 1 2 3 4), and a migration moves its share (4
#      of 24 slots) to it; its front door opens. Clients started after, with its door a home too, get the
#      undisturbed run's bits.
#   3. World rank 1 is killed with submits in flight: the survivors, the
#      joiner among them, go on (epoch 3) with the same bits.
#   4. A second joiner is refused (the one slot is taken); a shutdown ends
#      the joiner too, with exit code 0.
source "$(dirname "$0")/elastic_lib.sh"

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
join=(--set comm.join_slots=1 --set "comm.join_listen=\"127.0.0.1:$port\"")
slots_on() {  # slots_on RANK: the slots that rank of the current epoch holds, as rank 0 shows them
  "$MOECTL" --dir "$admin" --json placement |
    python3 -c "import json, sys; p = json.loads(sys.stdin.readline()); \
print(sum(r == $1 for layer in p['slots'] for ranks in layer for r in ranks))"
}
# joiner NAME [MOED ARGS]: `moed-mpirun --join` (moed --join with the job's
# arguments) in the foreground; its log in NAME.log, its exit code echoed.
joiner() {
  local name=$1 rc=0
  shift
  "$mpirun_l" --join "127.0.0.1:$port" --moed "$MOED" -- "${elastic[@]}" "${join[@]}" "$@" >"$SCRATCH/$name.log" 2>&1 ||
    rc=$?
  echo "$rc"
}

start -- "${join[@]}"
# The listener opens after the front doors (start-up's order): wait for it.
wait_until 30 grep -q "join listener 127.0.0.1:$port (1 join slot(s) left of 1)" "$SCRATCH/job.log" ||
  fail_seeing "rank 0 did not open its join listener"
clients reference >/dev/null || fail "the undisturbed clients"

# --- 1. joiners refused ------------------------------------------------------------
head -c 32 /dev/urandom >"$SCRATCH/other-key" && chmod 600 "$SCRATCH/other-key"
[ "$(joiner wrong-key --set "ingress.key_file=\"$SCRATCH/other-key\"")" = 2 ] || fail "a joiner with another key did not exit 2"
grep -q "refused: its proof of the cluster's key is wrong" "$SCRATCH/wrong-key.log" || { cat "$SCRATCH/wrong-key.log" >&2; fail "the wrong key's refusal"; }
[ "$(joiner other-config --set model.seed=99)" = 2 ] || fail "a joiner with another config did not exit 2"
grep -q "start it with the job's config and flags" "$SCRATCH/other-config.log" || { cat "$SCRATCH/other-config.log" >&2; fail "the other config's refusal"; }
clients untouched >/dev/null || fail "clients after the refusals"
same_bits "$SCRATCH/reference.bin" "$SCRATCH/untouched.bin" "clients after two joiners were refused"
echo "ok: a joiner with another key and one with another config were refused (exit 2), the job served on"

# --- 2. a joiner admitted --------------------------------------------------------------
"$mpirun_l" --join "127.0.0.1:$port" --moed "$MOED" -- "${elastic[@]}" "${join[@]}" >"$SCRATCH/joined.log" 2>&1 &
joined=$!
wait_until 60 logged_times 'world rank(s) 4 joined (moed --join) at step' 4 || { cat "$SCRATCH/joined.log" >&2; fail_seeing "not every member logged the join"; }
wait_until 30 grep -q 'world rank(s) 4 joined (moed --join) at step' "$SCRATCH/joined.log" || { cat "$SCRATCH/joined.log" >&2; fail "the joiner did not log its join"; }
shows() { [ "$(survivors_of "$1" 2>/dev/null)" = "$2" ]; }  # shows RANK "EPOCH MEMBERS...": that rank's status, once it is published
wait_until 30 shows 4 "2 0 1 2 3 4" || fail "the joiner's status shows '$(survivors_of 4)', expected epoch 2 of 0 1 2 3 4"
wait_until 30 migration_committed "$admin" || fail_seeing "the migration to the joiner did not commit"
[ "$(slots_on 4)" = 4 ] || fail "the joiner holds $(slots_on 4) slots, expected 4 of 24"
wait_until 30 test -s "$sock/moed-ingress-4.ucx" || fail "the joiner's front door did not open"
ranks=5
clients after >/dev/null || fail "clients after the join"
same_bits "$SCRATCH/reference.bin" "$SCRATCH/after.bin" "clients served with the joiner's experts and door"
echo "ok: moed --join took world rank 4 (epoch 2 of 5 ranks), 4 of 24 slots migrated to it, its door opened, same bits"

# --- 3. a loss after the join ----------------------------------------------------------
paused_clients loss
kill -KILL "$(pid_of 1)"
clients_done loss "8 clients across world rank 1 killed, the joiner serving"
wait_until 30 grep -q 'lost world rank(s) 1 at step' "$SCRATCH/joined.log" ||
  { tail -30 "$SCRATCH/joined.log" >&2; fail_seeing "the joiner did not go on without world rank 1"; }
wait_until 30 shows 4 "3 0 2 3 4" || fail "the joiner's status shows '$(survivors_of 4)', expected epoch 3 of 0 2 3 4"
echo "ok: world rank 1 lost after the join: epoch 3 of 0 2 3 4, the joiner among the survivors, same bits"

# --- 4. no slot left; the joiner ends with the job ---------------------------------------
[ "$(joiner second)" = 2 ] || fail "a second joiner did not exit 2"
grep -q "every join slot is taken" "$SCRATCH/second.log" || { cat "$SCRATCH/second.log" >&2; fail "the second joiner's refusal"; }
"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
rc=0
wait "$joined" || rc=$?
[ "$rc" = 0 ] || { tail -20 "$SCRATCH/joined.log" >&2; fail "the joiner exited $rc at the job's end"; }
wait "$job" || true
job=""
echo "ok: a second joiner was refused (no slot left); the joiner left with the job, exit code 0"
