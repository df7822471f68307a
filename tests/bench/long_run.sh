#!/usr/bin/env bash
# A daemon runs for months: rank 0's memory and its cost per step over
# 100,000 steps. The demo's layout (the embedded default config: 4 ranks as 2
# islands of 2, 4 layers x 8 experts, top-2, admin socket and routing
# statistics on), with hidden and FFN sizes cut to 16 and 64 tokens per step
# so that 100,000 steps take about a minute instead of hours. Prints, at every
# 10,000 steps, rank 0's resident memory and its recent tokens/s as its admin
# socket reports them, then the growth from 10,000 steps to the end. Prints
# figures, asserts nothing (tests/mpi/test_long_run.sh is the test).
#   tests/bench/long_run.sh [BUILD_DIR] [STEPS]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
steps=${2:-100000}
moed=$build/apps/moed moectl=$build/apps/moectl
[ -x "$moed" ] && [ -x "$moectl" ] || { echo "build first: $moed or $moectl is missing (ci/build.sh)" >&2; exit 2; }
work=$(mktemp -d) pid=""
trap 'kill "$pid" 2>/dev/null || true; rm -rf "$work"' EXIT
flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1
mpirun "${flags[@]}" -np 4 "$moed" --set model.hidden=16 --set model.ffn=16 --set workload.tokens_per_step=64 \
  --set workload.steps="$steps" --set log.level='"warn"' --set log.per_step=false \
  --set "admin.dir=\"$work/admin\"" --set "stats.file=\"$work/stats.json\"" >"$work/log" 2>&1 &
pid=$!
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $steps steps"
# One status line of rank 0 every second while it serves: step, RSS, tokens/s.
while kill -0 "$pid" 2>/dev/null; do
  "$moectl" --dir "$work/admin" --json --timeout 5 status 2>/dev/null >>"$work/status" || true
  sleep 1
done
wait "$pid" || { echo "moed failed:" >&2; tail -20 "$work/log" >&2; exit 1; }
python3 - "$work/status" "$steps" <<'PY'
import json, sys
samples = []
for line in open(sys.argv[1]):
    try:
        s = json.loads(line)
    except ValueError:
        continue
    if s.get("ok") and s.get("memory"):
        samples.append((s["step"], s["memory"]["rss_bytes"] / 2**20, s["recent_tokens_per_s"]))
steps = int(sys.argv[2])
mark = max(steps // 10, 1)
rows, next_mark = [], mark
for step, rss, rate in samples:
    if step >= next_mark:
        rows.append((step, rss, rate))
        next_mark = (step // mark + 1) * mark
if len(rows) < 2:
    sys.exit(f"too few status samples ({len(samples)}) to compare")
print(f"{'step':>8} {'rank 0 RSS MB':>14} {'recent tokens/s':>16}")
for step, rss, rate in rows:
    print(f"{step:>8} {rss:>14.1f} {rate:>16.0f}")
first, last = rows[0], rows[-1]
print(f"from step {first[0]} to {last[0]}: RSS {last[1] - first[1]:+.1f} MB, "
      f"tokens/s {last[2] / first[2]:.2f}x of the first mark's")
PY
