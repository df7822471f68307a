# Sourced by the benchmarks: ucx_perftest between a server and a client on
# localhost, with the UCX_* environment the caller has (the same transports
# moed's UCX backend would pick). Needs $out (a scratch directory).
#   perftest_gbps TEST SIZE ITERS  -> the best GB/s of 3 runs, or "-"
# ucx_perftest prints MB/s as 2^20 bytes per second; GB here are 1e9 bytes.
perftest=$(command -v ucx_perftest || true)
[ -n "$perftest" ] || { echo "ucx_perftest is missing (Debian package ucx-utils)" >&2; exit 2; }

perftest_gbps() {
  local test=$1 size=$2 iters=$3 best=0 run port server gbps
  for run in 1 2 3; do
    port=$((20000 + RANDOM % 20000))
    "$perftest" -p "$port" >"$out/server.txt" 2>&1 &
    server=$!
    sleep 0.3
    timeout 120 "$perftest" 127.0.0.1 -p "$port" -t "$test" -s "$size" -n "$iters" \
      -w $((iters / 10 + 1)) -f >"$out/client.txt" 2>&1 || true
    wait "$server" || true
    gbps=$(tail -1 "$out/client.txt" | awk '{ printf "%.3f", ($6 + 0) * 1048576 / 1e9 }')
    best=$(awk -v a="$best" -v b="$gbps" 'BEGIN { print (b > a ? b : a) }')
  done
  awk -v b="$best" 'BEGIN { if (b > 0) printf "%.3f", b; else print "-" }'
}
