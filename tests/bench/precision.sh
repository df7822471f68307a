#!/usr/bin/env bash
# The experts' dtypes on one core (issue 29): f32, bf16, fp8, mxfp4 and int8
# at three expert shapes (the serving benchmark's layer H=1024 F=2816,
# Qwen3-30B-A3B's H=2048 F=768, DeepSeek-V3's H=7168 F=2048). Per shape and
# dtype: resident bytes of a slot and of a rank, one slot's migration (copy
# out and install, and its bytes), decode GFLOP/s at 1, 4 and 16 rows with
# the weights read from DRAM against the stream bandwidth bound, prefill at
# 256 rows against the best dense GEMM (OpenBLAS fp32 sgemm; oneDNN's bf16
# and int8 matmuls where libdnnl-dev is installed, also compared at decode),
# and accuracy against fp32 (on the dtype's own values, bitwise with f32
# products; relative error and cosine against the unquantized weights); then
# top-2 agreement on a 4-layer toy MoE. Compact dtypes multiply with auto's
# products, int8 also with int8 products (int8/vnni). Prints figures,
# asserts nothing: each ratio's bound is measured in the same run, medians
# of several measurements (the machines are shared and noisy).
#   [QUICK=1] [CORE=N] tests/bench/precision.sh [BUILD_DIR] [bench_precision options]
# QUICK=1: 3 measurements of 0.05 s each and decode sets 2x the LLC (about a
# minute on the 2-core build machine; the default, 5 of 0.25 s and 4x, about
# five). CORE=N pins the run to core N (taskset); by default the kernel
# places it. Options go to bench_precision (--help: --shape, --dtype, --isa,
# --products, --reps, --seconds, --llc-mb, --memory-gb, --rank-slots).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$root/build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  build=$1
  shift
fi
bench=$build/tests/bench_precision
[ -x "$bench" ] || { echo "build first: $bench is missing (ci/build.sh)" >&2; exit 2; }
args=()
case ${QUICK:-0} in 0 | "") ;; 1) args+=(--quick) ;; *) echo "QUICK=$QUICK: expected 0 or 1" >&2; exit 2 ;; esac
pin=()
if [ -n "${CORE:-}" ]; then
  if ! [[ $CORE =~ ^[0-9]+$ ]] || [ "$CORE" -ge "$(nproc)" ]; then
    echo "CORE=$CORE: expected a core from 0 to $(($(nproc) - 1))" >&2
    exit 2
  fi
  command -v taskset >/dev/null || { echo "CORE=$CORE: taskset is missing (util-linux)" >&2; exit 2; }
  pin=(taskset -c "$CORE")
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1  # OpenBLAS and oneDNN (OpenMP) on the one core
exec "${pin[@]}" "$bench" "${args[@]}" "$@"
