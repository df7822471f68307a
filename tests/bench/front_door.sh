#!/usr/bin/env bash
# The front door's benchmark (configs/bench-front-door.toml: 2 layers x 8
# experts, H=4096 F=1024, top-2; 128 rows per layer per client). Prints
# figures, asserts nothing; every comparison is within this one run.
#   tests/bench/front_door.sh [BUILD_DIR] [SECONDS]
# (a) overhead: one client on one rank, one layer's 128 rows at a time, wall
#     time per layer at the client, against the engine serving the same rows
#     from the built-in synthetic workload (its step time per layer);
# (b) pooling: 1, 2 and 4 clients per rank on 2 ranks: tokens/s and the rows
#     each expert sees per step;
# (c) ping-pong: two micro-batches of 128 in flight, each with a fixed
#     "attention" time per layer (a sleep: attention runs elsewhere), against
#     one micro-batch of 256 (the same work, attention then MoE in turn), one
#     client on rank 0 of 2;
# (d) idle: CPU of idle ranks, and the delay before an idle rank serves.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
seconds=${2:-8}
bench=$build/tests/bench_front_door
config=$root/configs/bench-front-door.toml
[ -x "$bench" ] || { echo "build first: $bench is missing (ci/build.sh)" >&2; exit 2; }
flags=(--bind-to none --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench.XXXXXX")
daemon=""
# On any exit: no daemon left behind (SIGKILL if SIGTERM is not enough).
end_daemon() { kill "$1" 2>/dev/null || return 0; for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -9 "$1" 2>/dev/null || true; }
trap '[ -n "$daemon" ] && end_daemon $daemon; rm -rf "$work"' EXIT
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); $(date -u +%F) $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"

start() {  # start RANKS: daemons with the front door, in the background
  rm -rf "$work/sock" "$work/admin"
  mpirun "${flags[@]}" -np "$1" "$build/apps/moed" --config "$config" --set "ingress.dir=\"$work/sock\"" \
    --set "admin.dir=\"$work/admin\"" --report-json "$work/report.json" >"$work/out.txt" 2>"$work/err.txt" &
  daemon=$!
  for _ in $(seq 600); do
    [ "$(ls "$work/sock" 2>/dev/null | grep -c sock)" = "$1" ] && return
    kill -0 $daemon 2>/dev/null || { cat "$work/err.txt" >&2; exit 1; }
    sleep 0.1
  done
}
stop() {
  "$build/apps/moectl" --dir "$work/admin" shutdown >/dev/null
  wait $daemon
  daemon=""
}
drive() { "$bench" --config "$config" --set "ingress.dir=\"$work/sock\"" --dir "$work/sock" "$@"; }
json() { python3 -c "import json,sys; d=json.load(open('$work/report.json')); print($1)"; }

echo "(a) the front door's overhead, 1 rank, 1 client (medians of 3 alternating runs)"
base=() door=()
for _ in 1 2 3; do
  "$build/apps/moed" --config "$config" --set workload.kind=synthetic --report-json "$work/base.json" >/dev/null
  base+=("$(python3 -c "import json; d=json.load(open('$work/base.json')); print(d['step_latency_ms']['p50'] / d['layers'])")")
  start 1
  line=$(drive --ranks 1 --clients-per-rank 1 --seconds "$seconds")
  stop
  door+=("$(echo "$line" | sed -E 's/.*submit to outputs ([0-9.]+) ms.*/\1/')")
done
median() { printf '%s\n' "$@" | sort -g | sed -n 2p; }
base_ms=$(median "${base[@]}") door_ms=$(median "${door[@]}")
echo "  engine, synthetic workload:  $(printf %.2f "$base_ms") ms per layer (step p50 / layers; the engine alone; runs: ${base[*]})"
echo "  front door:                  $(printf %.2f "$door_ms") ms per layer (at the client, from writing the rows into the slot to reading the outputs; runs: ${door[*]})"
python3 -c "print(f'  ratio                        {$door_ms / $base_ms:.3f} (front door / engine)')"

echo "(b) pooling: clients per rank on 2 ranks"
for c in 1 2 4; do
  start 2
  line=$(drive --ranks 2 --clients-per-rank $c --seconds "$seconds")
  stop
  per_expert=$(json "f\"{d['rows_per_step'] * d['experts_per_token'] / (d['experts'] * d['layers']):.1f}\"")
  echo "  $c per rank: $(echo "$line" | sed -E 's/.*client: ([0-9.]+ ms per layer per client), ([0-9]+ tokens\/s).*/\2, \1/'), $per_expert rows per expert per layer per step"
done

echo "(c) ping-pong: 2 micro-batches of 128 in flight vs 1 of 256, one client (on rank 0 of 2)"
for att in 10000 30000 90000; do
  for mode in single pingpong; do
    start 2
    line=$(drive --ranks 1 --clients-per-rank 1 --seconds "$seconds" --mode $mode --attention-us $att)
    stop
    echo "  attention $((att / 1000)) ms per 128 rows, $mode: $(echo "$line" | sed -E 's/.* ([0-9]+ tokens\/s).*/\1/')"
  done
done

echo "(d) idle ranks"
start 2
sleep 1
pids=$(pgrep -f -- "^$build/apps/moed .*$work/sock" | tr '\n' ' ')
ticks() { local t=0; for p in $pids; do t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
t0=$(ticks); sleep 5; t1=$(ticks)
python3 -c "print(f'  CPU while idle: {100 * ($t1 - $t0) / $(getconf CLK_TCK) / 5 / 2:.1f}% of a core per rank')"
# One row to rank 0 after 40 ms without work (rank 1 asleep), against the
# engine serving one row per step from the workload.
line=$(drive --ranks 1 --clients-per-rank 1 --rows 1 --seconds 3 --mode single --attention-us 20000)
stop
"$build/apps/moed" --config "$config" --set workload.kind=synthetic --set workload.tokens_per_step=1 \
  --report-json "$work/one.json" >/dev/null
one_ms=$(python3 -c "import json; d=json.load(open('$work/one.json')); print(d['step_latency_ms']['p50'] / d['layers'])")
echo "  one row after 40 ms idle: $(echo "$line" | sed -E 's/.*submit to outputs ([0-9.]+) ms.*/\1/') ms per layer from submit to outputs; the engine alone: $(printf %.3f "$one_ms") ms"
