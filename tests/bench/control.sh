#!/usr/bin/env bash
# What moving the control collectives off MPI costs ([comm].control =
# "transport": each step's command, figures and outputs over the UCX
# transport's exchanges after start-up, docs/elastic.md): the same job on 4
# ranks with the control over MPI (A) and over the transport (B),
# alternating over ROUNDS rounds (default 5), at the demo's shape and the
# decode layer's (configs/bench-decode.toml). Prints each case's median step
# p50 and p99 and tokens/s, and B over A; asserts nothing (the machine is
# shared and noisy: compare within one run).
#   [ROUNDS=N] tests/bench/control.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
moed=$build/apps/moed
[ -x "$moed" ] || { echo "build first: $moed is missing (ci/build.sh)" >&2; exit 2; }
rounds=${ROUNDS:-5}
[[ $rounds =~ ^[1-9][0-9]*$ ]] || { echo "control.sh: ROUNDS takes a positive integer" >&2; exit 2; }
flags=(--bind-to core:overload-allowed --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench-control.XXXXXX")
trap 'rm -rf "$work"' EXIT
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for shape in "demo:$root/configs/demo.toml:300" "decode layer:$root/configs/bench-decode.toml:60"; do
  IFS=: read -r name config steps <<<"$shape"
  for round in $(seq "$rounds"); do
    for control in mpi transport; do
      mpirun "${flags[@]}" -np 4 "$moed" --config "$config" --set comm.control=$control \
        --set workload.steps="$steps" --set log.level=\"warn\" \
        --report-json "$work/$control-$round.json" >"$work/log" 2>&1 ||
        { cat "$work/log" >&2; echo "control.sh: $name with control=$control failed" >&2; exit 1; }
    done
  done
  python3 - "$work" "$rounds" "$name" <<'PY'
import json, statistics, sys
work, rounds, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def figures(control):
    runs = [json.load(open(f"{work}/{control}-{r}.json")) for r in range(1, rounds + 1)]
    return {"p50": statistics.median(r["step_latency_ms"]["p50"] for r in runs),
            "p99": statistics.median(r["step_latency_ms"]["p99"] for r in runs),
            "tok": statistics.median(r["tokens_per_s"] for r in runs),
            "steps": runs[0]["measured_steps"]}
a, b = figures("mpi"), figures("transport")
print(f"\n{name}: 4 ranks, {a['steps']} measured steps per run, medians of {rounds} runs each")
print(f"  {'control over':<14} {'step p50':>10} {'step p99':>10} {'tokens/s':>10}")
for label, f in (("MPI (A)", a), ("transport (B)", b)):
    print(f"  {label:<14} {f['p50']:>8.2f}ms {f['p99']:>8.2f}ms {f['tok']:>10.0f}")
print(f"  B / A          {b['p50'] / a['p50']:>9.2f}x {b['p99'] / a['p99']:>9.2f}x {b['tok'] / a['tok']:>9.2f}x")
PY
done
