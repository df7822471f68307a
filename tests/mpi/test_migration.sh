#!/usr/bin/env bash
# Live migration and online re-optimisation end to end: 4 ranks serve while
# moectl drives them through the admin socket. PART is one of
#   live     migrate one expert, a reoptimize refused while a migration runs,
#            reoptimize --apply: outputs bit-exact against a run without any
#            migration, and the committed placement written; metrics, stats
#            dumps, drain; a migration over the MPI backend's windows
#   faults   a transfer that fails midway, a checksum mismatch, a shutdown
#            while moectl follows, a destination without memory: each aborts,
#            and serving goes on on the old epoch
#   restart  a rank killed during a migration ends the job with a clear
#            message; relaunched, the cluster resumes the committed placement
#            and its statistics
#   shards   shards of split experts move to other ranks of their island, and
#            reoptimize --apply keeps the splits while it moves the rest, then
#            with [placement].shard_over_mean cuts hot whole experts into
#            shards, and with shard_per_island into a copy of shards on each
#            island;
#            outputs bit-exact against an unsplit run with the same chunks
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}"
part=${1:?usage: test_migration.sh live|faults|restart|shards}
RANKS=4

daemon_pid=""
reference_args=()  # settings the reference run shares with the daemon's
cleanup() {
  [ -z "$daemon_pid" ] || kill "$daemon_pid" 2>/dev/null || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# start_daemon NAME [moed flags...]: 4 ranks serving "for ever" in the
# background (moectl shutdown ends them), admin sockets in $SCRATCH/NAME.
# Returns once rank 0 and the last rank answer.
start_daemon() {
  local name=$1
  shift
  run=$SCRATCH/$name
  mkdir -p "$run"
  mpirun --bind-to none -np $RANKS "$MOED" --config "$SMALL" --set workload.steps=1000000 \
    --set "admin.dir=\"$run\"" --dump-output "$run/out.bin" --report-json "$run/report.json" "$@" \
    >"$run/log" 2>&1 &
  daemon_pid=$!
  for _ in $(seq 600); do
    if ctl status >/dev/null 2>&1 && ctl --rank $((RANKS - 1)) status >/dev/null 2>&1; then return 0; fi
    kill -0 "$daemon_pid" 2>/dev/null || { cat "$run/log" >&2; fail "$name: moed exited at start"; }
    sleep 0.1
  done
  fail "$name: no admin socket answered within 60 s"
}

ctl() { "$MOECTL" --dir "$run" "$@"; }

# wait_daemon: the background job ends within 60 s; its exit code in $daemon_rc.
wait_daemon() {
  for _ in $(seq 600); do
    kill -0 "$daemon_pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$daemon_pid" 2>/dev/null && { cat "$run/log" >&2; fail "moed still runs 60 s after it should have ended"; }
  daemon_rc=0
  wait "$daemon_pid" || daemon_rc=$?
  daemon_pid=""
}

stop_daemon() {
  ctl shutdown >/dev/null
  wait_daemon
  [ "$daemon_rc" = 0 ] || { cat "$run/log" >&2; fail "moed exited with $daemon_rc after moectl shutdown"; }
}

# expect_ctl CODE PATTERN WHAT -- MOECTL ARGS: moectl exits with CODE and says PATTERN.
expect_ctl() {
  local code=$1 pattern=$2 what=$3 rc=0
  shift 4
  ctl "$@" >"$run/ctl.out" 2>&1 || rc=$?
  [ "$rc" = "$code" ] || { cat "$run/ctl.out" "$run/log" >&2; fail "$what: moectl exit $rc, expected $code"; }
  grep -Eq -- "$pattern" "$run/ctl.out" || { cat "$run/ctl.out" >&2; fail "$what: moectl output lacks /$pattern/"; }
  echo "ok: $what: $(grep -Em1 -- "$pattern" "$run/ctl.out" | cut -c1-140)"
}

epoch() { ctl --json placement | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["epoch"])'; }

# same_as_reference: the stopped run's outputs equal those of a single
# process serving the same number of steps with no migration at all.
same_as_reference() {
  local steps
  steps=$(od -An -tu8 -j24 -N8 "$run/out.bin" | tr -d ' ')
  [ "${steps:-0}" -gt 0 ] || fail "the output dump of $run holds no steps"
  moed_on 0 --config "$SMALL" "${reference_args[@]}" --set workload.steps="$steps" \
    --dump-output "$run/reference.bin" >/dev/null
  same_bits "$run/reference.bin" "$run/out.bin" "$1 ($steps steps)"
}

case $part in
live)
  start_daemon live --set "placement.committed=\"$SCRATCH/committed.toml\""
  [ "$(stat -c %a "$run/moed-0.sock")" = 600 ] || fail "the admin socket is not mode 0600"
  echo "ok: admin sockets are mode 0600"
  expect_ctl 0 'committed' "migrate layer 1 expert 3 to rank 0" -- migrate 1 3 0
  [ "$(epoch)" = 1 ] || fail "epoch $(epoch) after one migration, expected 1"
  grep -q '^epoch = 1' "$SCRATCH/committed.toml" || fail "the committed placement file is not epoch 1"
  grep -q 'slots = \[\[0\], \[0\], \[1\], \[0\],' "$SCRATCH/committed.toml" ||
    fail "layer 1 expert 3 is not on rank 0 in the committed placement"

  # A reoptimize right behind a migrate, in one write on one socket: it lands
  # at the migrate's boundary or the next, while migration 2 is in one of its
  # five stages (prepare, transfer, verify, commit, release), so it is busy
  # whatever the step time.
  python3 - "$run/moed-0.sock" >"$run/busy.out" <<'PY' || { cat "$run/busy.out" >&2; fail "migrate + reoptimize in one write"; }
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(60)
s.connect(sys.argv[1])
s.sendall(b'{"id":1,"cmd":"migrate","layer":0,"expert":0,"to":3}\n{"id":2,"cmd":"reoptimize","dry_run":false}\n')
f = s.makefile()
answers = {a["id"]: a for a in (json.loads(f.readline()) for _ in range(2))}
print(json.dumps(answers))
started, refused = answers[1], answers[2]
assert started["ok"] and started["migration"]["id"] == 2, "migration 2 did not start"
assert not refused["ok"] and refused["error"]["code"] == "busy", "the reoptimize was not refused as busy"
print(f"ok: reoptimize while migration 2 runs: busy: {refused['error']['message'][:100]}")
PY
  tail -1 "$run/busy.out"
  state=""
  settled() {
    state=$(ctl --json migration | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["migration"]["state"])')
    [ "$state" = committed ] || [ "$state" = aborted ]
  }
  { wait_until 120 settled && [ "$state" = committed ]; } ||
    { cat "$run/log" >&2; fail "migration 2 did not commit within 120 s (state $state)"; }

  expect_ctl 0 'committed' "reoptimize --apply --max-moves 4 from the live statistics" -- reoptimize --apply --max-moves 4
  grep -Eq 'move layer' "$run/ctl.out" || fail "reoptimize listed no moves"
  # (what it says depends on how many tokens were sampled by then)
  grep -Eq "pooled share [01]\.[0-9]+|greedy-load's placement, " "$run/ctl.out" ||
    fail "reoptimize (metis) did not say how it chose its pooled share"
  [ "$(epoch)" = 3 ] || fail "epoch $(epoch) after three commits, expected 3"
  grep -q '^epoch = 3' "$SCRATCH/committed.toml" || fail "the committed placement file is not epoch 3"
  expect_ctl 0 '^moed_placement_epoch 3' "metrics in Prometheus text show epoch 3" -- metrics
  expect_ctl 0 "statistics written to $run/live.stats" "stats dumped to a file" -- stats --dump "$run/live.stats"
  [ -s "$run/live.stats" ] || fail "the stats dump is empty"
  (cd "$run" && ctl stats --dump relative.stats >/dev/null) || fail "stats --dump to a relative path failed"
  [ -s "$run/relative.stats" ] || fail "moectl did not resolve a relative dump path against its own directory"
  # drain: the work in flight ends, then the daemons stop by themselves.
  expect_ctl 0 'draining' "drain" -- drain
  wait_daemon
  [ "$daemon_rc" = 0 ] || { cat "$run/log" >&2; fail "moed exited with $daemon_rc after a drain"; }
  same_as_reference "outputs across three live migrations vs no migration"

  # The same weights path over MPI one-sided windows instead of UCX RMA.
  start_daemon mpi --set comm.backend='"mpi"' --set migration.chunk_mb=0.01 \
    --set 'placement.reoptimize_policy="greedy-load"'
  expect_ctl 0 'committed' "migrate over the MPI backend's windows" -- migrate 2 5 1
  # The policy reoptimize plans with when it names none comes from the config.
  expect_ctl 0 'dry run' "reoptimize with [placement].reoptimize_policy = greedy-load" -- reoptimize
  grep -Eq "pooled share|within the load cap" "$run/ctl.out" && fail "greedy-load was asked for, but metis planned"
  stop_daemon
  same_as_reference "outputs across a migration over MPI windows vs no migration"
  ;;

faults)
  # A source that fails after its first chunk (rank 1 holds experts 2 and 3).
  MOED_FAULT=migrate-fail:rank=1 start_daemon fail --set migration.chunk_mb=0.01
  expect_ctl 1 'aborted.*transfer failed' "a transfer that fails midway" -- migrate 1 3 0
  [ "$(epoch)" = 0 ] || fail "epoch $(epoch) after an aborted migration, expected 0"
  grep -q 'migration 1 aborted' "$run/log" || fail "the abort is not in the log"
  expect_ctl 0 'committed' "a migration after the aborted one (another source)" -- migrate 0 0 2
  stop_daemon
  same_as_reference "outputs across an aborted and a committed migration vs no migration"

  MOED_FAULT=migrate-corrupt:rank=0 start_daemon corrupt
  expect_ctl 1 'aborted.*checksum mismatch' "weights corrupted in flight" -- migrate 1 3 0
  [ "$(epoch)" = 0 ] || fail "epoch $(epoch) after a checksum mismatch, expected 0"
  expect_ctl 0 'serving' "serving on after the mismatch" -- status
  stop_daemon
  same_as_reference "outputs across a migration aborted on its checksum vs no migration"

  # A shutdown while moectl follows a migration: the migration aborts before
  # its commit, and moectl says so (exit 1), not "cannot connect" (exit 3).
  # Its source (rank 1) holds it in transfer until then (migrate-hold).
  MOED_FAULT=migrate-hold:rank=1 start_daemon shutdown
  rc=0
  ctl migrate 1 3 0 >"$run/follow.out" 2>&1 &
  follower=$!
  wait_until 60 grep -q 'transfer' "$run/follow.out" ||
    { cat "$run/follow.out" >&2; fail "the held migration did not show its transfer within 60 s"; }
  ctl shutdown >/dev/null
  wait "$follower" || rc=$?
  wait_daemon
  [ "$rc" = 1 ] || { cat "$run/follow.out" >&2; fail "moectl migrate during a shutdown: exit $rc, expected 1"; }
  grep -Eq 'aborted.*(shutting down|when the daemon stopped)' "$run/follow.out" ||
    { cat "$run/follow.out" >&2; fail "moectl migrate during a shutdown does not say the migration aborted"; }
  grep -q 'cannot connect' "$run/follow.out" && { cat "$run/follow.out" >&2; fail "moectl says cannot connect"; }
  echo "ok: a shutdown during a followed migration: $(grep -m1 aborted "$run/follow.out" | cut -c1-140)"
  [ "$daemon_rc" = 0 ] || fail "moed exited with $daemon_rc after a shutdown during a migration"

  # 6 slots of 73.7 kB each are 0.44 MB: a seventh does not fit in 0.45 MB.
  start_daemon memory --set migration.memory_mb=0.45
  expect_ctl 1 'refused.*budget of 0.45 MB' "a destination without memory for the slot" -- migrate 1 3 0
  [ "$(epoch)" = 0 ] || fail "epoch $(epoch) after a refused migration, expected 0"
  stop_daemon
  ;;

restart)
  committed=$SCRATCH/committed.toml stats=$SCRATCH/stats.bin
  keep=(--set "placement.committed=\"$committed\"" --set "stats.file=\"$stats\"" --set stats.every_steps=8)
  MOED_FAULT=migrate-kill:rank=1 start_daemon killed "${keep[@]}"
  expect_ctl 0 'committed' "a migration before the failure" -- migrate 0 0 2
  rc=0
  ctl migrate 1 3 0 >"$run/ctl.out" 2>&1 || rc=$?
  [ "$rc" != 0 ] || fail "moectl migrate reported success although its source rank died"
  wait_daemon
  rc=$daemon_rc
  [ "$rc" != 0 ] || fail "the job ended with exit 0 after a rank was killed"
  grep -q 'rank 1 dies during migration 2' "$run/log" || { cat "$run/log" >&2; fail "no log of the killed rank"; }
  grep -Eiq 'signal 9|killed' "$run/log" || { cat "$run/log" >&2; fail "mpirun did not say a rank was killed"; }
  echo "ok: a rank killed during migration 2 ends the job (exit $rc): $(grep -Eim1 'signal 9|killed' "$run/log" | cut -c1-120)"
  grep -q '^epoch = 1' "$committed" || fail "the committed placement is not epoch 1 after the failure"

  run=$SCRATCH/relaunch
  mkdir -p "$run"
  moed_on $RANKS --config "$SMALL" "${keep[@]}" --log-level info \
    --dump-output "$run/out.bin" --report-json "$run/report.json" >"$run/log" 2>&1 ||
    { cat "$run/log" >&2; fail "the relaunch failed"; }
  grep -q "epoch 1" "$run/report.json" || { cat "$run/report.json" >&2; fail "the relaunch did not resume epoch 1"; }
  grep -q "resuming the statistics of $stats" "$run/log" || fail "the relaunch did not resume the statistics"
  echo "ok: the relaunch resumes the committed placement (epoch 1) and the statistics"
  same_as_reference "outputs of the relaunched cluster vs a single process"
  ;;
shards)
  # Layer 1 expert 1 in 2 shards on ranks 0 and 1, expert 6 in 2 on 3 and 2.
  reference_args=(--set experts.ffn_chunks=4)
  {
    printf 'format = "moed-placement-v1"\nepoch = 0\nranks = 4\nlayers = 3\nexperts = 8\n'
    for _ in 1 2 3; do
      printf '[[layer]]\nslots = [[0], {shards = [0, 1]}, [1], [1], [2], [2], {shards = [3, 2]}, [3]]\n'
    done
  } >"$SCRATCH/split.toml"
  # moe-place check applies the run's shard rules to split experts.
  "$MOE_PLACE" check "$SCRATCH/split.toml" --ffn-chunks 4 --ranks-per-island 2 |
    grep -q '6 split experts within the shard rules (4 F-chunks)' || fail "moe-place check of split experts"
  expect_failure 2 'does not divide \[experts\]\.ffn_chunks = 3' "check: 2 shards of 3 F-chunks" -- \
    "$MOE_PLACE" check "$SCRATCH/split.toml" --ffn-chunks 3 --ranks-per-island 2
  expect_failure 2 'the shards of an expert must share an island' "check: shards on two islands" -- \
    "$MOE_PLACE" check "$SCRATCH/split.toml" --ffn-chunks 4 --ranks-per-island 1
  expect_failure 2 'splits experts: give --config' "check: split experts without the run's F-chunks" -- \
    "$MOE_PLACE" check "$SCRATCH/split.toml"
  start_daemon shards "${reference_args[@]}" --placement "$SCRATCH/split.toml" \
    --set "placement.committed=\"$SCRATCH/committed.toml\""
  # moectl placement --json lists shard ranks apart from replicas.
  ctl --json placement | python3 -c '
import json, sys
p = json.loads(sys.stdin.readline())
assert p["shards"][1] == {"1": [[0, 1]], "6": [[3, 2]]}, p["shards"][1]
assert p["replicas"][1][1] == [] and p["replicas"][1][0] == [0], p["replicas"][1]
' || fail "moectl placement --json: shards apart from replicas"
  expect_ctl 1 'already holds' "a shard onto a rank holding the other shard" -- migrate 1 1 0 --from 1
  expect_ctl 0 'committed' "shard 1 of layer 1 expert 1 from rank 1 to rank 3" -- migrate 1 1 3 --from 1
  grep -q 'slots = \[\[0\], {shards = \[0, 3\]}' "$SCRATCH/committed.toml" ||
    { cat "$SCRATCH/committed.toml" >&2; fail "the committed placement does not hold shard 1 on rank 3"; }
  expect_ctl 0 'committed' "shard 0 of layer 2 expert 6 from rank 3 to rank 1" -- migrate 2 6 1 --from 3
  expect_ctl 0 'committed|no move|: 0 moves' "reoptimize --apply keeps the splits and places the rest" -- \
    reoptimize --apply --max-moves 4
  grep -q 'slots = \[\[0\], {shards = \[0, 3\]}' "$SCRATCH/committed.toml" ||
    { cat "$SCRATCH/committed.toml" >&2; fail "the re-optimisation moved a shard"; }
  stop_daemon
  same_as_reference "outputs across two shard migrations vs an unsplit single process"
  # split_live NAME PATTERN WHAT [moed flags...]: from whole experts, once
  # statistics of 20 steps are in, reoptimize --apply splits the hot ones
  # (the workload's hottest is 2.75x the mean), each shard cut from a whole
  # copy by the migration; the committed placement must match PATTERN, and
  # the outputs those of an unsplit single process.
  split_live() {
    local name=$1 pattern=$2 what=$3
    shift 3
    rm -f "$SCRATCH/committed.toml"
    start_daemon "$name" "${reference_args[@]}" --set "placement.committed=\"$SCRATCH/committed.toml\"" \
      --set placement.shard_over_mean=1.5 "$@"
    for _ in $(seq 600); do
      step=$(ctl --json status | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline()).get("step", 0))')
      [ "$step" -ge 20 ] && break
      sleep 0.1
    done
    [ "$step" -ge 20 ] || fail "$name: the daemon did not reach step 20 within 60 s"
    expect_ctl 0 'committed' "reoptimize --apply $what" -- reoptimize --apply
    grep -q "$pattern" "$SCRATCH/committed.toml" ||
      { cat "$run/ctl.out" "$SCRATCH/committed.toml" >&2; fail "$name: the committed placement lacks $pattern"; }
    stop_daemon
    same_as_reference "outputs across a live split ($name) vs an unsplit single process"
  }
  split_live split 'shards = ' "with shard_over_mean 1.5 cuts the hot experts into shards"
  # With [placement].shard_per_island on 2 islands of 2 ranks, a hot expert
  # the re-optimisation replicates on both islands is cut into a copy of
  # shards on each.
  # Its control collectives run over UCX after start-up ([comm].control).
  split_live copies 'shards = \[\[' "with shard_per_island cuts hot experts into a copy per island" \
    --set placement.shard_per_island=true --set cluster.ranks_per_island=2 --set comm.control=transport
  grep -q 'transport          ucx (the control collectives too, after start-up)' "$run/log" ||
    { cat "$run/log" >&2; fail "copies: the control collectives did not move to UCX"; }
  ;;
*) fail "unknown part $part" ;;
esac
