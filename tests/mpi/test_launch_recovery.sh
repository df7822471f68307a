#!/usr/bin/env bash
# What the installed Open MPI does when a rank dies (docs/elastic.md), with
# recovery_probe on 3 ranks, the last killed:
# - plain mpirun aborts the job: the survivors are killed, mpirun fails;
# - mpirun --enable-recovery keeps the survivors alive, point-to-point
#   between survivors works, a barrier on MPI_COMM_WORLD gets no answer
#   (no ULFM: nothing reports the loss to the survivors), and mpirun ends
#   with 0 once they leave.
# If a later Open MPI changes any of this, the elastic launch must be
# looked at again.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
: "${RECOVERY_PROBE:?set RECOVERY_PROBE to the recovery_probe binary}"
out=$SCRATCH/out
flags=(--bind-to none --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)

rc=0
timeout 60 mpirun "${flags[@]}" -np 3 "$RECOVERY_PROBE" >"$out" 2>&1 || rc=$?
[ "$rc" != 0 ] && [ "$rc" != 124 ] || { cat "$out" >&2; fail "plain mpirun: exit $rc after a rank died, expected a failure"; }
grep -q 'alive after' "$out" && { cat "$out" >&2; fail "plain mpirun: a survivor went on after the loss"; }
echo "ok: plain mpirun aborts the job when a rank dies (exit $rc)"

rc=0
timeout 60 mpirun "${flags[@]}" --enable-recovery -np 3 "$RECOVERY_PROBE" --barrier-seconds 3 >"$out" 2>&1 || rc=$?
[ "$rc" = 0 ] || { cat "$out" >&2; fail "mpirun --enable-recovery: exit $rc, expected 0 once the survivors leave"; }
for r in 0 1; do
  grep -q "rank $r: alive after rank 2 was lost" "$out" || { cat "$out" >&2; fail "rank $r did not survive"; }
  grep -q "rank $r: point to point with rank $((1 - r)): works" "$out" ||
    { cat "$out" >&2; fail "rank $r: point to point between survivors"; }
  grep -q "rank $r: barrier after the loss: no answer" "$out" ||
    { cat "$out" >&2; fail "rank $r: a barrier over the lost rank did not hang (ULFM? see docs/elastic.md)"; }
done
echo "ok: mpirun --enable-recovery keeps the survivors; point to point works, a collective over the lost rank gets no answer"
