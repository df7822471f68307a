#!/usr/bin/env bash
# The survivors of a lost rank go on, across real processes on this host
# (tests/mpi/survivors_check.cc under mpirun --enable-recovery, UCX with
# [comm].detect_lost_peers, 4 ranks):
# - SIGKILL of rank 3 at the start of step 1: its watch endpoints report
#   the loss (no deadline passes), the other three agree on epoch 1 without
#   it, go on over the same transport and serve every step, each block
#   checked byte for byte; mpirun ends with 0;
# - SIGKILL of rank 2 just after it announced its next step's blocks;
# - SIGSTOP of rank 1 (a middle rank: the survivors renumber) past the
#   exchange deadline: the others go on without it; once they have, SIGCONT
#   wakes it, it learns that it was fenced and leaves.
source "$(dirname "$0")/lib.sh"
: "${SURVIVORS_CHECK:?set SURVIVORS_CHECK to the survivors_check binary}"
out=$SCRATCH/out
flags=(--bind-to none --oversubscribe --enable-recovery)

expect_survivors() {  # MEMBERS VICTIM
  local members=$1 victim=$2
  for r in $members; do
    grep -q "^world rank $r: epoch 1: members \[$members\]" "$out" ||
      { cat "$out" >&2; fail "rank $r did not go on as a member of epoch 1 [$members]"; }
    grep -q "^world rank $r: served 6 steps, the last on epoch 1" "$out" ||
      { cat "$out" >&2; fail "rank $r did not serve every step on epoch 1"; }
  done
  ! grep -q "^FAIL" "$out" || { cat "$out" >&2; fail "a check failed"; }
  ! grep -q "^world rank $victim: served" "$out" || { cat "$out" >&2; fail "the lost rank $victim served on"; }
}

rc=0
timeout 120 mpirun "${flags[@]}" -np 4 "$SURVIVORS_CHECK" --victim 3 --how kill --timeout-ms 60000 >"$out" 2>&1 || rc=$?
[ "$rc" = 0 ] || { cat "$out" >&2; fail "SIGKILL: mpirun exit $rc"; }
expect_survivors "0 1 2" 3
# The endpoints report it: a survivor's watch endpoint, before any
# deadline. A survivor learns of it inside step 1's exchange, or between
# steps from the agreement (a slow survivor may not have begun step 1).
grep -q "UCX transport on rank [012]: the endpoint to rank 3 failed" "$out" ||
  { cat "$out" >&2; fail "SIGKILL: the loss was not reported by the endpoints"; }
! grep -q "deadline of [0-9]* ms expired" "$out" || { cat "$out" >&2; fail "SIGKILL: a deadline passed"; }
[ "$(grep -c '^world rank [012]: went on in [0-9.]* ms' "$out")" = 3 ] ||
  { cat "$out" >&2; fail "SIGKILL: a survivor did not report its pause"; }
echo "ok: SIGKILL of a rank: its watch endpoints report it, the other three agree on epoch 1 and serve every step"
echo "    $(grep -m1 '^world rank 0: went on in' "$out")"

# Killed with its next step's blocks announced: the survivors that took
# them would read its memory (UCX's cma ends the reader then, so elastic
# serving leaves cma out), and their waits must not outlast the loss.
rc=0
timeout 120 mpirun "${flags[@]}" -np 4 "$SURVIVORS_CHECK" --victim 2 --how kill-sending --timeout-ms 60000 >"$out" 2>&1 || rc=$?
[ "$rc" = 0 ] || { cat "$out" >&2; fail "SIGKILL while sending: mpirun exit $rc"; }
expect_survivors "0 1 3" 2
! grep -q "cma_ep" "$out" || { cat "$out" >&2; fail "SIGKILL while sending: a survivor read the dead rank's memory"; }
echo "ok: SIGKILL of a rank with its blocks announced: the other three go on"

timeout 180 mpirun "${flags[@]}" -np 4 "$SURVIVORS_CHECK" --victim 1 --how stop --timeout-ms 2000 \
  --linger-until "$SCRATCH/fenced" >"$out" 2>&1 &
job=$!
victim_pid() { sed -n 's/^world rank 1: pid \([0-9]*\)$/\1/p' "$out"; }
went_on() { [ "$(grep -c '^world rank [023]: epoch 1: members \[0 2 3\]' "$out")" = 3 ]; }
wait_until 120 went_on || { cat "$out" >&2; end_daemon "$job"; fail "SIGSTOP: the others did not go on"; }
pid=$(victim_pid)
[ -n "$pid" ] || { cat "$out" >&2; fail "SIGSTOP: no pid of rank 1"; }
kill -CONT "$pid"
fenced() { grep -q "^world rank 1: fenced at epoch 1, leaving" "$out"; }
wait_until 120 fenced || { cat "$out" >&2; end_daemon "$job"; fail "SIGSTOP: the stopped rank did not learn that it was fenced"; }
touch "$SCRATCH/fenced"
rc=0
wait "$job" || rc=$?
[ "$rc" = 0 ] || { cat "$out" >&2; fail "SIGSTOP: mpirun exit $rc"; }
expect_survivors "0 2 3" 1
grep -q "^world rank 1: fenced at epoch 1, leaving" "$out" ||
  { cat "$out" >&2; fail "SIGSTOP: the stopped rank did not learn that it was fenced"; }
grep -q "deadline of 2000 ms expired" "$out" || { cat "$out" >&2; fail "SIGSTOP: not found at the deadline"; }
echo "ok: SIGSTOP past the deadline: the others renumber and serve every step; after SIGCONT the stopped rank is fenced and leaves"
