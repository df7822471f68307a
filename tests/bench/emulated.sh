#!/usr/bin/env bash
# Benchmark 6(b): moed on an emulated 2-host cluster (launch/emulated-cluster:
# 2 network namespaces x 2 ranks, the link between the hosts limited to RATE
# each way per host) serving a co-activation-heavy synthetic workload, in
# these cases: contiguous or optimised placement, flat or hierarchical
# dispatch, each phase waiting for the whole previous one ("serial",
# [engine].overlap = false) or overlapped (the default); the last case sends
# its answers at full width ([comm].narrow_answers = false), to show what
# narrowing them saves. The
# optimised placement is moe-place's METIS placement, fitted on the routing
# statistics of a first run of the same workload. Prints figures, asserts
# nothing (the machines are shared and noisy).
#
#   tests/bench/emulated.sh [--rate RATE] [--repeats N] [--keep DIR] [--placement FILE] [BUILD_DIR]
#
# --rate: tc rate of the inter-host link (default 1gbit; `none` for no limit,
# which shows what the step costs without the network). --repeats: runs per
# case; the table shows the median of their p50s. --keep DIR: keep the config,
# stats, placement, reports and logs there. --placement FILE: the optimised
# cases serve FILE instead of the placement fitted here (to tell the step
# loop's figures from the optimiser's). Needs root (network namespaces).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
emu=$root/launch/emulated-cluster

rate=1gbit repeats=1 keep="" given="" build=$root/build
while [ $# -gt 0 ]; do
  case "$1" in
  --rate) rate=${2:?--rate needs a value}; shift 2 ;;
  --repeats) repeats=${2:?--repeats needs a value}; shift 2 ;;
  --keep) keep=${2:?--keep needs a directory}; shift 2 ;;
  --placement) given=${2:?--placement needs a file}; shift 2 ;;
  -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  -*) echo "emulated.sh: unknown option $1" >&2; exit 2 ;;
  *) build=$1; shift ;;
  esac
done
[[ $repeats =~ ^[1-9][0-9]*$ ]] || { echo "emulated.sh: --repeats must be a positive integer" >&2; exit 2; }
moed=$build/apps/moed
place=$build/apps/moe-place
for b in "$moed" "$place"; do
  [ -x "$b" ] || { echo "build first: $b is missing (ci/build.sh)" >&2; exit 2; }
done
"$emu" --check >/dev/null || { echo "emulated.sh: the emulated cluster cannot run here (see above)" >&2; exit 2; }

if [ -n "$keep" ]; then
  mkdir -p "$keep"
  work=$(cd "$keep" && pwd)
else
  work=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench-emulated.XXXXXX")
  trap 'rm -rf "$work"' EXIT
fi
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

# The workload: 4 topics of 8 co-routed experts out of 32, top-4, 2% of choices
# leave the topic. Each of the 4 ranks holds 8 experts. H=2048 makes a token
# row 8 KB; F=32 keeps the expert GEMMs small, so bytes, not FLOPs, dominate.
# With top-4, a token's co-located experts share one crossing (hierarchical
# dispatch) and one int64 partial sum on the way back: co-location saves bytes
# both ways. (With top-2 it would save on the dispatch only: the returning
# partial sums cost 4 bytes per element per expert either way.)
cfg=$work/bench.toml
cat >"$cfg" <<'EOF'
[model]
layers = 2
experts = 32
top_k = 4
hidden = 2048
ffn = 32

[workload]
tokens_per_step = 1024
steps = 8
warmup_steps = 1
topic_size = 8
cross_topic = 0.02

[comm]
timeout_ms = 120000

[log]
level = "warn"
per_step = false
EOF

have_hier=0
# (Not `moed | grep -q`: under pipefail, grep's early exit fails the pipe.)
"$moed" --print-config >"$work/print-config.toml"
grep -q '^hierarchical' "$work/print-config.toml" && have_hier=1

echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "emulated cluster: 2 hosts x 2 ranks, inter-host link $rate each way per host"
echo "workload: $(grep -E '^(layers|experts|top_k|hidden|ffn|tokens_per_step|steps|topic_size|cross_topic) ' "$cfg" | tr -s ' ' | paste -sd, | sed 's/,/, /g')"

# 1. The routing statistics of the same workload, from one process (routing
#    does not depend on the rank count), and the placement fitted on them.
"$moed" --config "$cfg" --set workload.steps=4 --set "stats.file=$work/fit.stats" >"$work/stats.log" 2>&1 ||
  { cat "$work/stats.log" >&2; echo "emulated.sh: the statistics run failed" >&2; exit 1; }
if [ -n "$given" ]; then  # served as "optimised" in its stead (not priced: the cost model needs a trace)
  "$place" check "$given" >/dev/null
  cp "$given" "$work/optimised.toml"
  echo "the optimised cases serve the given placement $given" >"$work/optimised.txt"
else
  "$place" optimize --config "$cfg" --stats "$work/fit.stats" --ranks 4 --ranks-per-island 2 \
    --out "$work/optimised.toml" >"$work/optimised.txt"
fi
"$place" optimize --config "$cfg" --stats "$work/fit.stats" --ranks 4 --ranks-per-island 2 \
  --policy contiguous --out "$work/contiguous.toml" >"$work/contiguous.txt"
copies() { grep 'cross-island copies per token' "$1" | awk '{ print $NF }' | grep . || echo "n/a (given)"; }
echo "moe-place cost model: cross-island copies per token per layer: contiguous $(copies "$work/contiguous.txt"), optimised $(copies "$work/optimised.txt")"

# 2. The cases.
cases=("contiguous flat serial" "contiguous flat overlap" "optimised flat overlap"
  "optimised hierarchical serial" "optimised hierarchical overlap")
grep -q '^narrow_answers' "$work/print-config.toml" && cases+=("optimised hierarchical overlap full-width")
[ "$have_hier" = 1 ] || {
  echo "note: this moed has no [comm].hierarchical key yet: only the flat cases run"
  cases=("contiguous flat serial" "optimised flat serial")
}
run_case() { # PLACEMENT DISPATCH ENGINE ANSWERS REPEAT
  local name="$1-$2-$3${4:+-$4}-$5" args=(--config "$cfg")
  [ "$4" != full-width ] || args+=(--set comm.narrow_answers=false)
  [ "$1" = contiguous ] || args+=(--placement "$work/optimised.toml")
  [ "$have_hier" = 0 ] || args+=(--set "comm.hierarchical=$([ "$2" = hierarchical ] && echo true || echo false)")
  [ "$have_hier" = 0 ] || args+=(--set "engine.overlap=$([ "$3" = overlap ] && echo true || echo false)")
  if ! "$emu" --hosts 2 --ranks-per-host 2 --rate "$rate" -- "$moed" "${args[@]}" \
    --report-json "$work/$name.json" >"$work/$name.log" 2>&1; then
    echo "  $1 + $2 + $3${4:+ + $4}: failed; the end of its log:" >&2
    tail -5 "$work/$name.log" >&2
    rm -f "$work/$name.json"
  fi
}
for ((r = 1; r <= repeats; r++)); do
  for c in "${cases[@]}"; do
    read -r p d e a <<<"$c"
    start=$SECONDS
    run_case "$p" "$d" "$e" "${a:-}" "$r"
    echo "  ran ${c// / + } ($r of $repeats) in $((SECONDS - start)) s" >&2
  done
done

# 3. The table.
python3 - "$work" "$repeats" "${cases[@]}" <<'EOF'
import json, os, statistics, sys
work, repeats, cases = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
rows = {}
for c in cases:
    reports = []
    for r in range(1, repeats + 1):
        f = os.path.join(work, f"{c.replace(' ', '-')}-{r}.json")
        if os.path.exists(f):
            reports.append(json.load(open(f)))
    if not reports:
        continue
    def med(get):
        return statistics.median(get(r) for r in reports)
    steps = lambda r: max(r["measured_steps"], 1)
    rows[c] = {
        "p50": med(lambda r: r["step_latency_ms"]["p50"]),
        "p99": med(lambda r: r["step_latency_ms"]["p99"]),
        "rows_wait": med(lambda r: r["phase_ms"]["rows_wait"]),
        "answers_wait": med(lambda r: r["phase_ms"]["answers_wait"]),
        "cross": med(lambda r: r["bytes_sent"]["cross_island"] / steps(r) / 1e6),
        "island": med(lambda r: r["bytes_sent"]["same_island"] / steps(r) / 1e6),
        "islands": reports[0]["islands"],
    }
print()
print(f"{'case':<49} {'step p50':>9} {'step p99':>9} {'idle for':>9} {'idle for':>9} {'cross-island':>13} {'same-island':>12}  speedup")
print(f"{'':<49} {'ms':>9} {'ms':>9} {'rows ms':>9} {'answers':>9} {'MB/step':>13} {'MB/step':>12}")
base = rows.get("contiguous flat serial")
for c in cases:
    if c not in rows:
        print(f"{c.replace(' ', ' + '):<49} (failed)")
        continue
    x = rows[c]
    sp = f"{base['p50'] / x['p50']:.2f}x" if base else "-"
    print(f"{c.replace(' ', ' + '):<49} {x['p50']:9.1f} {x['p99']:9.1f} {x['rows_wait']:9.1f} {x['answers_wait']:9.1f} "
          f"{x['cross']:13.1f} {x['island']:12.1f}  {sp}")
bad = [c for c in rows if rows[c]["islands"] != 2]
if bad:
    print(f"warning: not 2 islands in {', '.join(bad)} (islands come from the host names)")
best = "optimised hierarchical overlap" if "optimised hierarchical overlap" in rows else "optimised flat serial"
if base and best in rows:
    s = base["p50"] / rows[best]["p50"]
    cut = 1 - rows[best]["cross"] / base["cross"] if base["cross"] else 0
    print(f"\n{best.replace(' ', ' + ')} over contiguous + flat + serial: {s:.2f}x per step (p50), "
          f"{cut:.0%} fewer cross-island bytes (aim: at least 1.3x)")
EOF
[ -z "$keep" ] || echo "files: $work"
