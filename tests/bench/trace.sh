#!/usr/bin/env bash
# The cost of single-token tracing: moed on 4 ranks serving the decode-like
# layer of configs/bench-decode.toml (4 layers here, 512 tokens per step),
# A/B by config in the same run, interleaved: [trace].sample = 0 (off) and
# the default 0.001; then 1 (every row a rank may announce, 4 per pass: the
# most tracing can cost). Prints per run the step latency p50 and the engine
# time per step (the report's JSON), then the ratios against off. Asserts
# nothing: the machine is shared and noisy; read the ratios, and rerun.
#   tests/bench/trace.sh [BUILD_DIR] [ROUNDS]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
rounds=${2:-3}
moed=$build/apps/moed
[ -x "$moed" ] || { echo "build first: $moed is missing (ci/build.sh)" >&2; exit 2; }
flags=(--bind-to none --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1
out=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench-trace.XXXXXX")
trap 'rm -rf "$out"' EXIT
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"

serve() {  # serve LABEL SAMPLE
  mpirun "${flags[@]}" -np 4 "$moed" --config "$root/configs/bench-decode.toml" --set model.layers=4 \
    --set workload.steps=200 --set workload.warmup_steps=10 --set "trace.sample=$2" \
    --report-json "$out/$1.json" >/dev/null
}
for round in $(seq "$rounds"); do
  serve "off-$round" 0
  serve "default-$round" 0.001
done
serve "all-1" 1

python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def figures(name):
    r = json.load(open(f"{out}/{name}.json"))
    return r["step_latency_ms"]["p50"], r["phase_ms"]["engine"]
runs = {kind: [figures(f"{kind}-{i}") for i in range(1, (rounds if kind != "all" else 1) + 1)]
        for kind in ("off", "default", "all")}
for kind, label in (("off", "[trace].sample = 0    "), ("default", "[trace].sample = 0.001"), ("all", "[trace].sample = 1    ")):
    for p50, engine in runs[kind]:
        print(f"{label}  step p50 {p50:7.2f} ms   engine {engine:7.2f} ms per step")
med = {k: (statistics.median(p for p, _ in v), statistics.median(e for _, e in v)) for k, v in runs.items()}
for kind in ("default", "all"):
    print(f"{kind:>7} / off (medians): step p50 x{med[kind][0] / med['off'][0]:.3f}   engine x{med[kind][1] / med['off'][1]:.3f}")
PY
