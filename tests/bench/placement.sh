#!/usr/bin/env bash
# The placement benchmark: every policy side by side on the real Mixtral trace
# and on synthetic OLMoE- and DeepSeek-V3-shaped routing, fitted on one part of
# the routing and evaluated on another; then metis against greedy-load at
# equal slot budgets; then the same on held-out routing (another prompt,
# another text domain); group-limited routing; hot experts split into shards,
# held once or per island. Prints figures, asserts nothing.
#   tests/bench/placement.sh [BUILD_DIR] [--budgets-only|--held-out-only|--splits-only]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../../build}
bench=$build/tests/bench_placement
[ -x "$bench" ] || { echo "build first: $bench is missing (ci/build.sh)" >&2; exit 2; }
exec taskset -c 0 "$bench" "$here/../data" "${@:2}"  # one core, as the aim says
