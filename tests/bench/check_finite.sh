#!/usr/bin/env bash
# The cost of [model].check_finite: one rank loads a generated checkpoint
# (default 1 layer of 8 experts at H=1024, F=2816, fp32: 277 MB) and serves
# one small step, with the check on and off, REPEATS times each, alternating
# (the file stays in the page cache after the first load). Prints the best
# wall time of each and their ratio; asserts nothing (shared, noisy machines).
#   tests/bench/check_finite.sh [BUILD_DIR]
# SHAPE overrides the model, e.g. SHAPE="--set model.hidden=2048 --set model.ffn=5632".
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
moed=$build/apps/moed
[ -x "$moed" ] || { echo "build first: $moed is missing (ci/build.sh)" >&2; exit 2; }
repeats=${REPEATS:-5}
read -r -a shape <<<"${SHAPE:---set model.layers=1 --set model.experts=8 --set model.hidden=1024 --set model.ffn=2816}"
export OPENBLAS_NUM_THREADS=1
out=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench.XXXXXX")
trap 'rm -rf "$out"' EXIT

echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
"$moed" "${shape[@]}" --generate-weights "$out/model.safetensors" >/dev/null
echo "checkpoint: $(du -m "$out/model.safetensors" | cut -f1) MB (${shape[*]})"
run=("$moed" "${shape[@]}" --weights "$out/model.safetensors" --set workload.tokens_per_step=8
     --set workload.steps=1 --set workload.warmup_steps=0 --set log.per_step=false --log-level warn)
"${run[@]}" >/dev/null  # into the page cache

seconds() {  # seconds CHECK: wall time of one load and step
  local t0 t1
  t0=$(date +%s.%N)
  "${run[@]}" --set "model.check_finite=$1" >/dev/null
  t1=$(date +%s.%N)
  echo "$t1 - $t0" | bc
}
best_on="" best_off=""
for ((i = 0; i < repeats; i++)); do
  on=$(seconds true) off=$(seconds false)
  [ -z "$best_on" ] || [ "$(echo "$on < $best_on" | bc)" = 1 ] && best_on=$on
  [ -z "$best_off" ] || [ "$(echo "$off < $best_off" | bc)" = 1 ] && best_off=$off
done
printf 'check_finite on:  %.3f s (best of %d)\n' "$best_on" "$repeats"
printf 'check_finite off: %.3f s (best of %d)\n' "$best_off" "$repeats"
printf 'ratio on/off:     %.3f\n' "$(echo "$best_on / $best_off" | bc -l)"
