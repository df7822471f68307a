#!/usr/bin/env bash
# Live-migration benchmark (issue 5, item 7): one expert of the benchmark
# layer (H=1024, F=2816, fp32: 34.6 MB) migrates while 4 ranks serve. Prints
# figures, asserts nothing (shared, noisy machines: compare the ratios).
#   tests/bench/migration.sh [BUILD_DIR]
# - migration bandwidth: the slot's bytes over the time the source spent in
#   its puts and their flush (moed's UCX RMA path), against ucx_perftest
#   ucp_put_bw of the same size measured in the same run;
# - step latency: p99 wall time of the steps while the migration runs (from
#   boundary to boundary, so the transfer's time counts) against the p99 of
#   the steps just before it.
# REPEATS migrations (default 4) move the expert back and forth between
# ranks 1 and 2 through the kept window ([migration].keep_window). A source's
# first puts into a window pay for mapping the peer's memory (migrations 1
# and 2); later ones do not. Printed: the bandwidth of the first migration
# and the median of the ones after the first two, and the worst latency
# ratio of all.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
moed=$build/apps/moed moectl=$build/apps/moectl
[ -x "$moed" ] && [ -x "$moectl" ] || { echo "build first: $moed or $moectl is missing (ci/build.sh)" >&2; exit 2; }
repeats=${REPEATS:-4}
flags=(--bind-to none --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1
out=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench.XXXXXX")
pid=""
trap '[ -z "$pid" ] || kill $pid 2>/dev/null; rm -rf "$out"' EXIT
source "$here/perftest.sh"

echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "UCX $(ucx_info -v | sed -n 's/^# Version //p'); UCX_TLS=${UCX_TLS:-<default: all>}"

# The decode-shaped benchmark layer (128 tokens per rank), serving until told
# to stop; the whole slot may go in one boundary (chunk_mb 64).
mpirun "${flags[@]}" -np 4 "$moed" --config "$root/configs/bench-decode.toml" \
  --set workload.steps=1000000 --set comm.backend='"ucx"' --set "admin.dir=\"$out\"" >"$out/log" 2>&1 &
pid=$!
for _ in $(seq 600); do "$moectl" --dir "$out" status >/dev/null 2>&1 && break; sleep 0.1; done
ctl() { "$moectl" --dir "$out" "$@"; }
ctl status >/dev/null || { cat "$out/log" >&2; echo "moed did not start" >&2; exit 1; }
step_now() { ctl --json status | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline()).get("step", 0))'; }
wait_steps() {  # N more steps
  local until=$(($(step_now) + $1))
  while [ "$(step_now)" -lt "$until" ]; do sleep 0.2; done
}
wait_steps 30  # warm-up, and steady steps for the "before" window

: >"$out/migrations.jsonl"
for i in $(seq "$repeats"); do
  # Expert 5 of layer 0 lives on rank 1 (16 experts, contiguous): to rank 2 and back.
  if [ $((i % 2)) = 1 ]; then to=2 from=1; else to=1 from=2; fi
  ctl --json migrate 0 5 $to --from $from >/dev/null
  ctl --json migration | python3 -c 'import json,sys; print(json.dumps(json.loads(sys.stdin.readline())["migration"]))' \
    >>"$out/migrations.jsonl"
  wait_steps 20  # steady again before the next one
done
iters=$((20000000000 / 34603008))
put=$(perftest_gbps ucp_put_bw 34603008 "$iters")
ctl shutdown >/dev/null
wait $pid || true
pid=""

python3 - "$out/migrations.jsonl" "$put" <<'PY'
import json, sys
runs = [json.loads(line) for line in open(sys.argv[1])]
put = float(sys.argv[2]) if sys.argv[2] != "-" else 0.0
print(f"{'migration':>9} | {'state':>9} | {'MB':>6} | {'transfer ms':>11} | {'GB/s':>6} | "
      f"{'steps':>5} | {'p99 before ms':>13} | {'p99 during ms':>13} | {'ratio':>5}")
for r in runs:
    ratio = r.get("step_ms_p99_during", 0) / r["step_ms_p99_before"] if r.get("step_ms_p99_before") else 0
    print(f"{r['id']:>9} | {r['state']:>9} | {r['bytes'] / 1e6:6.1f} | {r['transfer_s'] * 1e3:11.2f} | "
          f"{r.get('transfer_gbps', 0):6.2f} | {r['steps_during']:>5} | {r.get('step_ms_p99_before', 0):13.1f} | "
          f"{r.get('step_ms_p99_during', 0):13.1f} | {ratio:5.2f}")
first = runs[0].get("transfer_gbps", 0)
later = sorted(r.get("transfer_gbps", 0) for r in runs[2:])
warm = later[(len(later) - 1) // 2] if later else 0  # the lower median
worst = max(r.get("step_ms_p99_during", 0) / r["step_ms_p99_before"] for r in runs if r.get("step_ms_p99_before"))
print()
print(f"ucx_perftest ucp_put_bw, 34.6 MB: {put:.2f} GB/s")
if put:
    print(f"migration bandwidth / put bandwidth: first {first / put:.2f}, "
          f"after each source's first puts (median) {warm / put:.2f}   (aim: at least 0.5)")
else:
    print("ucx_perftest gave no figure")
print(f"p99 step latency during / before migration (worst): {worst:.2f}   (aim: at most 1.25)")
PY
