#!/usr/bin/env bash
# Single-token traces on 4 ranks in 2 islands: a token followed with
# `moectl trace --follow` is traced through every layer, and its record
# agrees with what the run did (its step and home from its id, each chosen
# expert run on a rank holding it per `moectl placement`, islands per
# [cluster].ranks_per_island, times non-negative, phases summing to the
# home's total); ids sampled by [trace].sample are found by the same hash
# the daemon uses; an unknown id is not_found (exit 1); following a request
# already served is answered already_served at once (exit 1); rank 1 sends
# the operator to rank 0.
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}"
RANKS=4
TOKENS=100  # small.toml's tokens per step
run=$SCRATCH/run
mkdir -p "$run"
daemon_pid=""
cleanup() {
  [ -z "$daemon_pid" ] || end_daemon "$daemon_pid"
  rm -rf "$SCRATCH"
}
trap cleanup EXIT
ctl() { "$MOECTL" --dir "$run" "$@"; }

mpirun --bind-to none -np $RANKS "$MOED" --config "$SMALL" --set workload.steps=1000000 \
  --set "admin.dir=\"$run\"" --set cluster.ranks_per_island=2 --set trace.sample=0.005 --set trace.ring=8192 \
  >"$run/log" 2>&1 &
daemon_pid=$!
for _ in $(seq 600); do
  ctl status >/dev/null 2>&1 && ctl --rank $((RANKS - 1)) status >/dev/null 2>&1 && break
  kill -0 "$daemon_pid" 2>/dev/null || { cat "$run/log" >&2; fail "moed exited at start"; }
  sleep 0.1
done
step() { ctl --json status | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline()).get("step", 0))'; }

# A token of a step ahead: id = step x tokens + position. However fast the
# daemon runs, it may pass that step before the follow takes effect; it then
# answers already_served at once (it knows the step of every built-in
# request), and the next try follows a token twice as far ahead. No try
# depends on how fast this machine is.
ahead=50 id=""
for try in 1 2 3 4 5 6 7 8 9 10; do
  s1=$(step)
  id=$(( (s1 + ahead) * TOKENS + 42 ))
  echo "try $try: following request $id (step $((id / TOKENS)), $ahead steps ahead of $s1)"
  rc=0; ctl --json trace --follow "$id" --timeout 120 >"$run/trace.json" 2>"$run/err" || rc=$?
  [ "$rc" = 0 ] && break
  grep -q '"already_served"' "$run/trace.json" || { cat "$run/err" "$run/trace.json" "$run/log" >&2; fail "trace --follow $id: exit $rc"; }
  echo "  already served: $(python3 -c 'import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["error"]["message"])' "$run/trace.json")"
  ahead=$((ahead * 2))
done
[ "$rc" = 0 ] || fail "trace --follow: every try came too late"
ctl trace "$id" >"$run/text" 2>&1 || { cat "$run/text" >&2; fail "trace $id"; }
grep -q "request $id position 0: 3 of 3 layers traced" "$run/text" || { cat "$run/text" >&2; fail "followed token not traced through 3 layers"; }
echo "ok: moectl trace --follow $id: $(head -1 "$run/text")"
sed -n 2,6p "$run/text"

ctl --json placement >"$run/placement.json"
python3 - "$run/trace.json" "$run/placement.json" "$id" "$TOKENS" "$RANKS" <<'PY'
import json, sys
trace = json.loads(open(sys.argv[1]).read().splitlines()[-1]); placement = json.load(open(sys.argv[2]))
rid, T, R = int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
assert trace["ok"] and len(trace["tokens"]) == 1, trace
tok = trace["tokens"][0]
assert tok["complete"] and [l["layer"] for l in tok["layers"]] == [0, 1, 2], tok
step, position = divmod(rid, T)
home = next(r for r in range(R) if T * r // R <= position < T * (r + 1) // R)
for l in tok["layers"]:
    where = f"layer {l['layer']}"
    assert l["step"] == step, (where, l["step"], step)
    assert l["home"] == {"rank": home, "island": home // 2}, (where, l["home"])
    assert l["epoch"] == placement["epoch"], where
    experts = l["experts"]
    assert len(experts) == 2 and len({e["expert"] for e in experts}) == 2, (where, experts)
    assert abs(sum(e["weight"] for e in experts) - 1) < 1e-5, (where, experts)
    for e in experts:
        holders = placement["slots"][l["layer"]][e["expert"]]
        assert e["rank"] in holders, (where, e, holders)
        assert e["island"] == e["rank"] // 2, (where, e)
        assert e["queue_us"] >= 0 and e["expert_us"] >= 0, (where, e)
        assert e["rank"] in l["ranks"] and e["island"] in l["islands"], (where, e)
    assert home in l["ranks"], where
    remote = [e for e in experts if e["rank"] != home]
    assert (l["bytes"]["rows"] > 0) == bool(remote), (where, l["bytes"], experts)
    # Answers as they came: none from the home itself; from elsewhere one expert's
    # fp32 output (small.toml: H = 64), or a sum of several narrowed below its full
    # width (8 + 8 H bytes).
    H = 64
    for g in l["legs"]:
        if g["rank"] == home:
            assert g["answer_bytes"] == 0, (where, g)
        elif g["pairs"] == 1:
            assert g["answer_bytes"] == 4 * H, (where, g)
        else:
            assert 8 < g["answer_bytes"] < 8 + 8 * H, (where, g)
    assert l["bytes"]["answers"] == sum(g["answer_bytes"] for g in l["legs"]), (where, l["bytes"], l["legs"])
    p = l["phases_us"]
    parts = [p[k] for k in ("route", "plan", "dispatch", "wait", "combine")]
    assert all(v >= 0 for v in parts), (where, p)
    assert abs(sum(parts) - p["total"]) <= 0.01 * p["total"] + 1, (where, p)
    assert p["total"] < 10e6, (where, p)  # under 10 s: microseconds, not some other unit
    for s in l["spans"]:
        assert s["end_us"] >= s["start_us"] and 0 <= s["rank"] < R, (where, s)
print(f"ok: trace of request {rid} agrees with the run: step {step}, home rank {home}, "
      f"experts {[[e['expert'] for e in l['experts']] for l in tok['layers']]}")
PY

# The ids of [first, end) that [trace].sample = 0.005 traces: the daemon's
# hash (splitmix64's finalizer of id ^ "trace").
sampled_ids() {  # sampled_ids FIRST END
  python3 - "$1" "$2" <<'PY'
import sys
M = (1 << 64) - 1
def mix64(x):
    x = (x + 0x9E3779B97F4A7C15) & M
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M
    return x ^ (x >> 31)
print(" ".join(str(i) for i in range(int(sys.argv[1]), int(sys.argv[2]))
               if mix64(i ^ 0x7472616365) < int(0.005 * 2**64)))
PY
}

# Sampled ids over the last steps' tokens; the newest few must be in the ring.
s=$(step)
sampled=$(sampled_ids $(( (s - 30) * TOKENS )) $(( (s - 2) * TOKENS )) | tr ' ' '\n' | tail -3 | tr '\n' ' ')
[ -n "${sampled// /}" ] || fail "no sampled id in 28 steps at [trace].sample = 0.005"
for sid in $sampled; do
  ctl trace "$sid" >"$run/sampled" 2>&1 || { cat "$run/sampled" >&2; fail "sampled request $sid not traced"; }
  grep -q "request $sid position 0: 3 of 3 layers traced" "$run/sampled" || { cat "$run/sampled" >&2; fail "sampled $sid"; }
done
echo "ok: sampled requests $sampled are traced (the same hash in the daemon and here)"

rc=0; ctl trace $((id - 1)) >"$run/none" 2>&1 || rc=$?
# id - 1: served in the same step as the followed token, neither followed
# nor (unless the hash says so) sampled.
[ -z "$(sampled_ids $((id - 1)) "$id")" ] || rc=skip
if [ "$rc" != skip ]; then
  [ "$rc" = 1 ] && grep -q "moectl: not_found: no trace of request $((id - 1))" "$run/none" \
    || { cat "$run/none" >&2; fail "unknown id: exit $rc"; }
  echo "ok: unknown id -> exit 1: $(head -1 "$run/none" | cut -c1-120)"
fi
# A request whose step the daemon has served (status says so), and which
# the hash did not sample (a sampled one has its trace, and --follow gives
# it at once): --follow answers already_served at once, naming the steps,
# and exits 1.
for _ in $(seq 600); do [ "$(step)" -ge 2 ] && break; sleep 0.1; done
old=$(( ($(step) - 1) * TOKENS + 5 ))
while [ -n "$(sampled_ids "$old" $((old + 1)))" ]; do old=$((old + 1)); done
rc=0; ctl trace --follow "$old" --timeout 120 >"$run/old" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "moectl: already_served: request $old was served by step $((old / TOKENS))" "$run/old" \
  || { cat "$run/old" >&2; fail "follow of an already served request: exit $rc"; }
echo "ok: follow of an already served request -> exit 1: $(head -1 "$run/old" | cut -c1-140)"
rc=0; ctl --rank 1 trace "$id" >"$run/rank1" 2>&1 || rc=$?
[ "$rc" = 1 ] && grep -q "not_coordinator: traces are assembled on rank 0" "$run/rank1" \
  || { cat "$run/rank1" >&2; fail "trace on rank 1: exit $rc"; }
echo "ok: rank 1 -> exit 1: $(head -1 "$run/rank1")"

ctl shutdown >/dev/null
for _ in $(seq 600); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
rc=0; wait "$daemon_pid" || rc=$?
daemon_pid=""
[ "$rc" = 0 ] || { cat "$run/log" >&2; fail "moed exited with $rc after moectl shutdown"; }
echo "ok: shut down"
