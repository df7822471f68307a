#!/usr/bin/env bash
# The fixed-order GEMM against OpenBLAS sgemm alone, one core, at the serving
# benchmark's expert shapes (H=1024, F=2816) from prefill to decode row
# counts: GFLOP/s of each (medians of 3 alternating measurements) and the
# ratio. Prints figures, asserts nothing.
#   tests/bench/gemm.sh [BUILD_DIR] [--isa avx512|avx2|portable]
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
shift || true
bench=$build/tests/bench_gemm
[ -x "$bench" ] || { echo "build first: $bench is missing (ci/build.sh)" >&2; exit 2; }
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
OPENBLAS_NUM_THREADS=1 "$bench" --repeat 3 "$@"
