#!/usr/bin/env bash
# Elastic serving: a rank lost during a live migration (docs/elastic.md, "A
# loss during a live migration"). 4 ranks, 2 islands of 2, no redundancy;
# expert 2 of layer 0 (on world rank 1) migrates to world rank 3 while 8
# clients submit. The fault (MOED_FAULT) kills a
# rank at one stage of it. After each loss every client call has succeeded
# with the undisturbed run's bits (cmp), and every survivor ended the
# migration alike:
#   1. its source killed when it first sends: rolled back on every survivor
#      (moectl follows it to "aborted", naming the loss), the source's 6
#      experts loaded from the checkpoint;
#   2. a rank that is neither source nor destination killed at the commit:
#      committed on every survivor, the expert on world rank 3;
#   3. the coordinator killed at the commit, once it has sent the others
#      the commit: committed on every survivor, and world rank 1, the new
#      coordinator, shows the migration as committed. Sent is not read: on a
#      loaded machine none may have read it when the coordinator's sockets
#      close, and every survivor then rolls back alike (also checked).
source "$(dirname "$0")/elastic_lib.sh"

# placement_of RANK: slots[0][2], the ranks now holding expert 2 of layer 0.
expert_2_on() {
  "$MOECTL" --dir "$admin" --rank "$1" --json placement |
    python3 -c "import json, sys; print(*json.loads(sys.stdin.readline())['slots'][0][2])"
}
migration_of() {  # migration_of RANK: "id state" of the migration that rank's status shows
  status_of "$1" | python3 -c "import json, sys; m = json.loads(sys.stdin.readline())['migration']; \
print(m['id'], m['state'])"
}
# lose_during_migration NAME FAULT: a fresh job with MOED_FAULT set, clients
# paused with submits in flight and then let go, and the migration, so that
# the loss falls while they submit; moectl's output in NAME.ctl.
lose_during_migration() {
  MOED_FAULT=$2 start -x MOED_FAULT --
  paused_clients "$1"
  touch "$SCRATCH/resume-$1"
  "$MOECTL" --dir "$admin" migrate 0 2 3 >"$SCRATCH/$1.ctl" 2>&1 || true
}
rolled_forward=0  # survivors that switched after the loss, from what they kept: the commit had not reached them
stop() {
  "$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
  wait "$job" || true
  job=""
  rolled_forward=$((rolled_forward + $(logged 'committed here after the loss' || true)))
}

start --
clients reference >/dev/null || fail "the undisturbed clients"
stop

# --- 1. the source lost mid-transfer: rolled back -----------------------------------
lose_during_migration source migrate-kill:rank=1
clients_done source "8 clients across the migration's source killed mid-transfer"
wait_until 30 logged_times 'migration 1 rolled back' 3 || fail_seeing "not every survivor rolled migration 1 back"
grep -q "aborted.*world rank(s) 1 lost during it: rolled back" "$SCRATCH/source.ctl" ||
  { cat "$SCRATCH/source.ctl" >&2; fail "moectl migrate did not follow the migration to its roll-back"; }
[ "$(migration_of 0)" = "1 aborted" ] || fail "rank 0 shows migration '$(migration_of 0)', expected 1 aborted"
loaded=$(sed -n 's/.*lost world rank(s) 1 at step .*; \([0-9]*\) expert(s) of the lost loaded.*/\1/p' "$SCRATCH/job.log" |
  awk '{ s += $1 } END { print s }')
[ "$loaded" = 6 ] || fail "the survivors loaded $loaded experts of the lost source, expected 6"
stop
echo "ok: the source killed mid-transfer: rolled back on the 3 survivors, its 6 experts loaded, same bits"

# lost_at_commit NAME WORLD_RANK WHAT: WORLD_RANK killed at the commit; the
# migration is committed on the 3 survivors, and the lowest survivor (the
# coordinator) shows it, with the expert on world rank 3.
lost_at_commit() {
  local name=$1 lost=$2 what=$3 coordinator=$(($2 == 0 ? 1 : 0))
  lose_during_migration "$name" "migrate-commit-kill:rank=$lost"
  clients_done "$name" "8 clients across $what killed at the migration's commit"
  # The coordinator dies once its commit is sent, which is not once it has
  # landed: on a loaded machine its peers may not yet have read it when its
  # sockets close. None has it then, and every survivor rolls back alike.
  wait_until 30 logged_times "lost world rank(s) $lost at step .*migration 1 \(committed\|rolled back\)" 3 ||
    fail_seeing "not every survivor finished migration 1 after losing world rank $lost"
  if [ "$lost" = 0 ] && logged_times "lost world rank(s) 0 at step .*migration 1 rolled back" 3; then
    [ "$(migration_of 1)" = "1 aborted" ] || fail "world rank 1 shows migration '$(migration_of 1)', expected 1 aborted"
    [ "$(expert_2_on 1)" = 0 ] ||
      fail "expert 2 of layer 0 is on ranks '$(expert_2_on 1)' of epoch 1, expected 0 (world rank 1)"
    stop
    echo "ok: $what killed at the commit before any survivor read it: rolled back alike on the 3, same bits"
    return
  fi
  logged_times "lost world rank(s) $lost at step .*migration 1 committed" 3 ||
    fail_seeing "the survivors did not all commit migration 1 after losing world rank $lost"
  [ "$(migration_of $coordinator)" = "1 committed" ] ||
    fail "world rank $coordinator shows migration '$(migration_of $coordinator)', expected 1 committed"
  # World rank 3 is rank 2 of epoch 1 whichever of the others was lost.
  [ "$(expert_2_on $coordinator)" = 2 ] ||
    fail "expert 2 of layer 0 is on ranks '$(expert_2_on $coordinator)' of epoch 1, expected 2 (world rank 3)"
  stop
  echo "ok: $what killed at the commit: committed on the 3 survivors, world rank $coordinator shows it, the expert on world rank 3, same bits"
}

# --- 2. a bystander lost at the commit: committed ------------------------------------
lost_at_commit bystander 2 "a bystander (world rank 2)"

# --- 3. the coordinator lost at the commit: committed, shown by its successor -------
lost_at_commit coordinator 0 "the coordinator (world rank 0)"
echo "ok: $rolled_forward survivor(s) in all switched after the loss, the commit having not reached them"
