#!/usr/bin/env bash
# The serving-core benchmark: prints figures, asserts nothing (the machines are
# shared and noisy; the figures are ratios measured within one run).
#   [ONLY=prefill|families|decode] tests/bench/serving.sh [BUILD_DIR]
# (a) one MoE layer, H=1024 F=2816, 16 experts, top-2, 2048 tokens per rank,
#     at 2 and 4 ranks: tokens/s against the OpenBLAS compute bound;
# (b) the same layer at 128 tokens per rank on 4 ranks (decode-like): where
#     the step time goes, and its overhead (step wall time minus the GEMM
#     calls moed issued, replayed alone).
# (c) two families' layers on 2 ranks, against the bound measured in the same
#     run: DeepSeek-V3-shaped (H=7168 F=2048, top-8 from 8 groups with 4
#     kept, one shared expert; 32 experts, not 256, to fit the machine, 128
#     tokens per rank) and Qwen3-30B-A3B-shaped (H=2048 F=768, 128 experts,
#     top-8, 512 tokens per rank): tokens/s, the router's share of the step
#     and what the shared expert costs.
# The prefill cases run twice, A/B: the experts on OpenBLAS sgemm (canonical
# chunks, not batch-invariant) and on the fixed-order GEMM (the default).
# The decode case runs three ways, A/B/C, alternating over ROUNDS rounds
# (default 3): every phase waiting for the whole previous one
# ([engine].overlap = false), with overlap (the default), and with overlap
# and two micro-batches; the medians over rounds close the output. Compare ratios and overheads within a
# run: each case measures its own bound.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
bench=$build/tests/bench_serving
[ -x "$bench" ] || { echo "build first: $bench is missing (ci/build.sh)" >&2; exit 2; }
# Each rank bound to a core, as a deployment binds its ranks; where ranks
# outnumber cores (4 on a 2-core machine), two share each core, always the
# same two. Unbound, the kernel moves ranks between cores from step to step,
# and the 4-rank figures swung twice as much from run to run.
flags=(--bind-to core:overload-allowed --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
# ONLY=prefill|families|decode runs one part (default: all three).
only=${ONLY:-all}
case $only in all | prefill | families | decode) ;; *) echo "ONLY=$only: expected prefill, families or decode" >&2; exit 2 ;; esac
run() { [ "$only" = all ] || [ "$only" = "$1" ]; }
run prefill && for ranks in 2 4; do
  for gemm in openblas fixed-order; do
    mpirun "${flags[@]}" -np $ranks "$bench" --config "$root/configs/bench-prefill.toml" \
      --set workload.tokens_per_step=$((2048 * ranks)) --set experts.gemm=$gemm \
      --label "prefill, 2048 tokens/rank, experts on $gemm"
  done
done
run families && for model in deepseek-v3 qwen3-30b; do
  mpirun "${flags[@]}" -np 2 "$bench" --config "$root/configs/bench-$model.toml" \
    --label "$model-shaped layer, $(grep -m1 '^tokens_per_step' "$root/configs/bench-$model.toml" | tr -dc 0-9) tokens/step"
done
# Decode: the three engines alternate over ROUNDS rounds (default 3), so that
# drift in the machine's speed hits each alike; the medians close the output.
run decode || exit 0
rounds=${ROUNDS:-3}
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for round in $(seq "$rounds"); do
  for engine in "overlap=false" "overlap=true" "microbatches=2"; do
    mpirun "${flags[@]}" -np 4 "$bench" --config "$root/configs/bench-decode.toml" --set "engine.$engine" \
      --label "decode, 128 tokens/rank, [engine].$engine, round $round" | tee -a "$out"
  done
done
echo "decode, medians over $rounds rounds (overhead = step wall time minus its served GEMMs):"
for engine in "overlap=false" "overlap=true" "microbatches=2"; do
  awk -v e="[engine].$engine," -v name="$engine" '
    BEGIN { n = 0 }
    index($0, e) { on = 1; next }
    on && /^  moed / { step[n] = $6 }
    on && /^  served GEMMs/ { served[n] = $7 }
    on && /^  overhead/ { over[n++] = $2; on = 0 }
    function median(a, k,   i, j, t) { for (i = 0; i < k; i++) for (j = i + 1; j < k; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
                                       return k % 2 ? a[int(k / 2)] : (a[k / 2 - 1] + a[k / 2]) / 2 }
    END { printf "  %-15s overhead %6.2f ms   step p50 %7.2f ms   served GEMMs %7.2f ms\n", name, median(over, n), median(step, n), median(served, n) }' "$out"
done
