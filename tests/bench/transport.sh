#!/usr/bin/env bash
# Transport benchmark (issue 4, item 6a): dispatch+combine bandwidth of large
# batches over moed's UCX and MPI backends at 2 ranks, against ucx_perftest's
# tag bandwidth measured in the same run with the same UCX transports (the
# UCX_* environment both inherit). Every figure is the best of 3 runs. Prints
# figures, asserts nothing (shared, noisy machines: compare the ratios, which
# are measured seconds apart).
#   tests/bench/transport.sh [BUILD_DIR]
# Columns, per message size B (bytes per peer pair per exchange):
#   bidir   GB/s per rank: both ranks send B to each other, then the same back
#   oneway  GB/s: rank 0 sends B to rank 1 (tag_bw's shape)
#   perftest GB/s: ucx_perftest -t tag_bw -s B (one sender, one receiver)
#   ucx-detect / ucx bidir: the same exchanges with [comm].detect_lost_peers
#            (endpoints that report a lost peer, for elastic serving)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
bench=$build/tests/bench_transport
[ -x "$bench" ] || { echo "build first: $bench is missing (ci/build.sh)" >&2; exit 2; }
flags=(--bind-to none --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
sizes=(262144 1048576 8388608 33554432)  # 8388608 = 2048 rows x 4096 bytes
out=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench.XXXXXX")
trap 'rm -rf "$out"' EXIT

echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
echo "UCX $(ucx_info -v | sed -n 's/^# Version //p'); UCX_TLS=${UCX_TLS:-<default: all>}"

source "$here/perftest.sh"

# The perftest runs interleave with moed's, size by size, so that both see the
# same machine load.
: >"$out/moed.txt"
declare -A perf
for size in "${sizes[@]}"; do
  mpirun "${flags[@]}" -np 2 "$bench" --sizes "$size" >>"$out/moed.txt"
  iters=$((1000000000 / size))  # about 0.5 s at 2 GB/s, like bench_transport
  [ "$iters" -ge 20 ] || iters=20
  perf[$size]=$(perftest_gbps tag_bw "$size" "$iters")
done
grep '^#' "$out/moed.txt" || true

fig() { awk -v b="$1" -v m="$2" -v s="$3" '$1 == "RESULT" && $2 == b && $3 == m && $4 == s { print $5 }' "$out/moed.txt"; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.2f", a / b; else print "-" }'; }

echo
printf "%10s | %9s %9s | %9s %9s | %9s | %12s %12s | %10s | %11s\n" "bytes/pair" "ucx bidir" "ucx 1way" \
  "mpi bidir" "mpi 1way" "perftest" "ucx 1way /" "ucx bidir /" "ucx bidir /" "ucx-detect"
printf "%10s | %9s %9s | %9s %9s | %9s | %12s %12s | %10s | %11s\n" "" "GB/s/rank" "GB/s" "GB/s/rank" \
  "GB/s" "tag_bw GB/s" "perftest" "perftest" "mpi bidir" "/ ucx bidir"
for size in "${sizes[@]}"; do
  ub=$(fig ucx bidir "$size") uo=$(fig ucx oneway "$size")
  mb=$(fig mpi bidir "$size") mo=$(fig mpi oneway "$size")
  db=$(fig ucx-detect bidir "$size")
  p=${perf[$size]}
  printf "%10s | %9s %9s | %9s %9s | %9s | %12s %12s | %10s | %11s\n" "$size" "${ub:--}" "${uo:--}" \
    "${mb:--}" "${mo:--}" "$p" "$(ratio "$uo" "$p")" "$(ratio "$ub" "$p")" "$(ratio "$ub" "$mb")" \
    "$(ratio "$db" "$ub")"
done
echo
echo "aim (issue 4): moed-UCX at least 0.8 of ucx_perftest tag bandwidth for large batches"
