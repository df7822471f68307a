#!/usr/bin/env bash
# Losses across emulated hosts (launch/emulated-cluster), one after another
# in one job: 6 ranks of moed on hosts 1-3 (2 each, one island per host, no
# redundancy), host 4 an attention host whose 6 clients have every rank as
# a home. Each loss falls while the clients have submits in flight; after
# each, every call has succeeded with the undisturbed run's bits (cmp):
#   1. a loss during a live migration: expert 2 of layer 0 migrates to world
#      rank 3, and world rank 5 (host 3) is killed at its commit
#      (MOED_FAULT=migrate-commit-kill:rank=5): the 5 survivors commit it
#      alike (epoch 1);
#   2. SIGKILL of world rank 1 (host 1): the 4 survivors go on (epoch 2),
#      loading its experts from the checkpoint;
#   3. SIGSTOP of world rank 3 (host 2) past [comm].timeout_ms: the other 3
#      go on (epoch 3); after SIGCONT it learns it was left out and exits.
# Then the survivors drain and leave. Skipped (exit 77) only where network
# namespaces cannot be created.
source "$(dirname "$0")/elastic_hosts_lib.sh"

export MOED_FAULT=migrate-commit-kill:rank=5
mpirun_extra=(-x MOED_FAULT)
start_hosts 6

clients reference >/dev/null || fail "the undisturbed clients on host 4"

# --- 1. a loss at a live migration's commit ----------------------------------------
paused_clients migration
touch "$SCRATCH/resume-migration"
"$MOECTL" --dir "$admin" migrate 0 2 3 >"$SCRATCH/migration.ctl" 2>&1 || true
clients_done migration "6 clients on host 4 across world rank 5 (host 3) killed at a migration's commit"
wait_until 30 logged_times "lost world rank(s) 5 at step .*migration 1 committed" 5 ||
  fail_seeing "not every survivor finished migration 1 after losing world rank 5"
echo "ok: world rank 5 killed at the migration's commit: committed on the 5 survivors (epoch 1)"

# --- 2. SIGKILL ----------------------------------------------------------------------
paused_clients kill
kill -KILL "$(pid_of 1)"
clients_done kill "6 clients on host 4 across world rank 1 (host 1) killed"
wait_until 30 logged_times "lost world rank(s) 1 at step .*epoch 2 serves on world ranks 0 2 3 4;" 4 ||
  fail_seeing "the 4 survivors did not go on without world rank 1"
echo "ok: world rank 1 killed: epoch 2 on world ranks 0 2 3 4"

# --- 3. SIGSTOP past the deadline, then SIGCONT ---------------------------------------
paused_clients stop
stopped=$(pid_of 3)
kill -STOP "$stopped"
wait_until 60 logged_times "epoch 3 serves on world ranks 0 2 4;" 3 || fail_seeing "the others did not go on without world rank 3"
kill -CONT "$stopped"
wait_until 60 bash -c "! kill -0 $stopped 2>/dev/null" || fail_seeing "world rank 3, left out, is still running"
clients_done stop "6 clients on host 4 across world rank 3 (host 2) stopped past the deadline, then left out"
echo "ok: world rank 3 stopped: epoch 3 on world ranks 0 2 4; resumed, it left"

"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
wait_until 60 logged_times "leaving without MPI_Finalize" 3 || fail_seeing "the 3 survivors did not leave"
echo "ok: the survivors drained and left"
