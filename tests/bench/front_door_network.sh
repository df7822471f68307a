#!/usr/bin/env bash
# The network front door's benchmark (issue 33), on the emulated cluster
# (launch/emulated-cluster: hosts as network namespaces on a bridge, each
# host's link limited to RATE each way), at 1 Gbit/s, 10 Gbit/s and
# unlimited links. The decode shape: configs/bench-front-door.toml (H=4096,
# 8 experts, top-2, 2 MoE layers) with [model].ffn = 16, so that the experts'
# arithmetic does not hide the network; 128 rows per micro-batch per client.
# Every daemon listens on its network door (UCX over TCP on veth0, the key
# checked) and its Unix socket. Prints figures, asserts nothing: every
# comparison is within this one run.
#
#   tests/bench/front_door_network.sh [BUILD_DIR] [SECONDS] [RATES]
#
# SECONDS: how long each case drives (default 4); RATES: the link rates, as
# emulated-cluster's --rate, comma-separated (default 1gbit,10gbit,none).
# BENCH_UCX_ENV="VAR=VALUE ...": UCX settings for the daemons and the
# clients alike (e.g. UCX_RNDV_THRESH=inf: every message eager).
# Per rate:
# (a) per-layer latency, one client, one rank (1 expert host, 1 attention
#     host): the same rank served through its network door from the
#     attention host, and through its Unix socket from a client on its own
#     host; against the bytes-on-the-wire bound: the rows out plus the
#     outputs back (and 12 bytes of id and position per row) over the link
#     rate, one direction after the other; and against that bound plus the
#     same-host door's time (the door adds nothing but the crossing);
# (b) ping-pong across hosts: two micro-batches of 128 in flight, each with
#     an "attention" time A per layer (a sleep), against one micro-batch of
#     256 (attention, then the MoE), in tokens/s (tokens through all layers);
# (c) M-to-N: 2 expert hosts x 2 ranks, 2 attention hosts x 4 clients, each
#     client ping-ponging as in (b): one home rank per client (client i on
#     rank i % 4) against each client spread over all 4 homes (round robin
#     per submit), in tokens/s over both attention hosts (in the order
#     one, spread, spread, one: the mean of each pair);
# and once, on the first rate's (c) cluster:
# (d) CPU per rank when idle: the 4 ranks with no client, then with 64
#     network clients connected (32 per attention host, 16 per rank), each
#     having served one layer and then silent; and how much of it is in
#     threads other than the ranks' main (step loop) thread, the network
#     door's among them.
# Needs root (network namespaces); exits 77 where they cannot be made.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
seconds=${2:-4}
IFS=, read -r -a rates <<<"${3:-1gbit,10gbit,none}"
emu=$root/launch/emulated-cluster
bench=$build/tests/bench_front_door_network
moed=$build/apps/moed
moectl=$build/apps/moectl
config=$root/configs/bench-front-door.toml
ffn=16 rows=128 attention_us=2000 layers=2
for b in "$bench" "$moed" "$moectl"; do
  [ -x "$b" ] || { echo "build first: $b is missing (cmake --build build --target moed moectl bench_front_door_network)" >&2; exit 2; }
done
if ! check=$("$emu" --check 2>&1); then
  echo "SKIP: the emulated cluster cannot run here: $check"
  exit 77
fi
[ "$(id -u)" != 0 ] || export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OPENBLAS_NUM_THREADS=1

work=$(mktemp -d "${TMPDIR:-/tmp}/moed-bench-network.XXXXXX")
sock=$work/sock admin=$work/admin
head -c 32 /dev/urandom >"$work/key" && chmod 600 "$work/key"
sets=(--set "model.ffn=$ffn" --set "ingress.dir=\"$sock\"" --set "admin.dir=\"$admin\""
  --set 'ingress.listen="*:0"' --set "ingress.key_file=\"$work/key\"" --set 'ingress.transports="tcp"')

read -r -a ucx_env <<<"${BENCH_UCX_ENV:-}"
mpi_env=()
for v in "${ucx_env[@]}"; do mpi_env+=(-x "$v"); done
launcher="" clients=()
# On any exit: the daemons stopped, the clients ended, the namespaces torn
# down (emulated-cluster does it on TERM), the files removed.
stop_cluster() {
  [ -n "$launcher" ] || return 0
  timeout 20 "$moectl" --dir "$admin" shutdown >/dev/null 2>&1 || true
  for _ in $(seq 100); do kill -0 "$launcher" 2>/dev/null || break; sleep 0.1; done
  kill -TERM "$launcher" 2>/dev/null || true
  wait "$launcher" 2>/dev/null || true
  launcher=""
}
cleanup() {
  local p
  for p in "${clients[@]}"; do kill "$p" 2>/dev/null || true; done
  stop_cluster
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load $(cut -d' ' -f1-3 /proc/loadavg);" \
  "$(date -u +%F) $(git -C "$root" rev-parse --short HEAD 2>/dev/null)"
[ ${#ucx_env[@]} = 0 ] || echo "UCX settings (BENCH_UCX_ENV) of the daemons and the clients: ${ucx_env[*]}"
echo "shape: H=4096, 8 experts, top-2, F=$ffn, 2 MoE layers; $rows rows per micro-batch per client; UCX over TCP on the emulated links"

# start_cluster HOSTS RANKS_PER_HOST NP RATE: moed in the background on the
# emulated cluster; returns once every rank's doors are open.
start_cluster() {
  local r
  rm -rf "$sock" "$admin"
  "$emu" --hosts "$1" --ranks-per-host "$2" --rate "$4" -- -np "$3" "${mpi_env[@]}" "$moed" --config "$config" "${sets[@]}" \
    >"$work/cluster.txt" 2>&1 &
  launcher=$!
  for _ in $(seq 1200); do
    local up=1
    for ((r = 0; r < $3; r++)); do [ -S "$sock/moed-ingress-$r.sock" ] && [ -s "$sock/moed-ingress-$r.ucx" ] || up=0; done
    [ "$up" = 0 ] || break
    kill -0 "$launcher" 2>/dev/null || { cat "$work/cluster.txt" >&2; echo "front_door_network.sh: the cluster failed" >&2; exit 1; }
    sleep 0.1
  done
  [ "$up" = 1 ] || { cat "$work/cluster.txt" >&2; echo "front_door_network.sh: the doors did not open in 120 s" >&2; exit 1; }
  nhosts=$1
}
ns_of() { grep -oE "\bmoed$nhosts-[0-9]+-h$1\b" "$work/cluster.txt" | head -1; }
addr_of() { sed -n "s/.*host $(ns_of "$1"): namespace .*, veth0 \([0-9.]*\)\/24.*/\1/p" "$work/cluster.txt" | head -1; }
# on HOST CMD...: CMD on host HOST (1-based), its UCX on the emulated network
# only. It execs: call it (and drive) in a subshell, $(...) or &, so that $!
# is the client's own pid.
on() {
  local ns
  ns=$(ns_of "$1")
  shift
  exec ip netns exec "$ns" env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "${ucx_env[@]}" "$@"
}
drive() { # drive HOST ARGS...: the bench client on HOST; prints its figures' line
  local host=$1
  shift
  on "$host" "$bench" --config "$config" "${sets[@]}" --dir "$sock" --rows $rows --seconds "$seconds" "$@"
}
get() { # get KEY LINE...: the value of KEY=...
  local key=$1
  shift
  echo "$*" | tr ' ' '\n' | sed -n "s/^$key=//p" | head -1
}
check_homes() { # each rank lists an address of its own host first
  local r host want
  for ((r = 0; r < $1; r++)); do
    host=$((r / $2 + 1))
    want=$(addr_of $host)
    head -1 "$sock/moed-ingress-$r.ucx" | grep -q "^ucx://$want:" ||
      { echo "front_door_network.sh: rank $r lists $(head -1 "$sock/moed-ingress-$r.ucx"), not host $host's $want" >&2; exit 1; }
  done
}
calc() { python3 -c "print($1)"; }
bits() { # bits RATE: the link's bits per second (none: 0)
  case "$1" in
  none) echo 0 ;;
  *) python3 -c "
import re; m = re.fullmatch(r'([0-9.]+)([kmgt]?)(bit|bps)', '$1')
print(float(m.group(1)) * {'': 1, 'k': 1e3, 'm': 1e6, 'g': 1e9, 't': 1e12}[m.group(2)] * (8 if m.group(3) == 'bps' else 1))" ;;
  esac
}
# Bytes per row: out (the row, its id and position), back (the output).
out_bytes=$((4096 * 4 + 12)) back_bytes=$((4096 * 4))

idle_done=0
declare -A summary
for rate in "${rates[@]}"; do
  bps=$(bits "$rate")
  echo
  echo "== links: $rate each way per host =="

  # (a) and (b): rank 0 alone on host 1; host 2 is the attention host.
  start_cluster 2 1 1 "$rate"
  check_homes 1 1
  unix=$(drive 1 --ranks 1)
  net=$(drive 2 --ranks 1 --key-file "$work/key")
  unix_ms=$(get layer_ms_p50 "$unix") net_ms=$(get layer_ms_p50 "$net")
  same="same bits"
  [ "$(get hash "$unix")" = "$(get hash "$net")" ] || same="OUTPUTS DIFFER between the doors"
  if [ "$bps" = 0 ]; then
    echo "(a) network door, $rate: per-layer $net_ms ms (p50; p90 $(get layer_ms_p90 "$net")) = $(calc "f'{$net_ms / $unix_ms:.2f}'") x the same-host door ($unix_ms ms); no wire bound on an unlimited link; $same"
    summary[$rate]="per-layer $net_ms ms, $(calc "f'{$net_ms / $unix_ms:.2f}'") x same-host"
  else
    wire_ms=$(calc "f'{$rows * ($out_bytes + $back_bytes) * 8 / $bps * 1e3:.2f}'")
    echo "(a) network door, $rate: per-layer $net_ms ms (p50; p90 $(get layer_ms_p90 "$net")) = $(calc "f'{$net_ms / $wire_ms:.2f}'") x the wire bound ($wire_ms ms)," \
      "$(calc "f'{$net_ms / ($wire_ms + $unix_ms):.2f}'") x the wire bound + the same-host door," \
      "$(calc "f'{$net_ms / $unix_ms:.2f}'") x the same-host door ($unix_ms ms); $same"
    summary[$rate]="per-layer $net_ms ms, $(calc "f'{$net_ms / $wire_ms:.2f}'") x wire bound $wire_ms ms, $(calc "f'{$net_ms / ($wire_ms + $unix_ms):.2f}'") x (wire + same-host), $(calc "f'{$net_ms / $unix_ms:.2f}'") x same-host"
  fi

  single=$(drive 2 --ranks 1 --key-file "$work/key" --mode single --attention-us $attention_us)
  pingpong=$(drive 2 --ranks 1 --key-file "$work/key" --mode pingpong --attention-us $attention_us)
  s_tps=$(get tokens_per_s "$single") p_tps=$(get tokens_per_s "$pingpong")
  line="(b) ping-pong across hosts, $rate, attention $((attention_us / 1000)) ms per 128 rows per layer: 2 x 128 in flight $p_tps tokens/s, 1 x 256 $s_tps tokens/s: $(calc "f'{$p_tps / $s_tps:.2f}'") x"
  if [ "$bps" != 0 ]; then
    # Both directions busy at once: the link carries a row out and an output back per row per layer.
    bound=$(calc "f'{$bps / 8 / $out_bytes / $layers:.0f}'")
    line+="; the link's bound (both directions at once) $bound tokens/s: ping-pong at $(calc "f'{$p_tps / $bound:.2f}'") of it"
  fi
  echo "$line"
  summary[$rate]+="; ping-pong $(calc "f'{$p_tps / $s_tps:.2f}'") x"
  if [ "$rate" = "${rates[0]}" ]; then
    # The same on one host (through the Unix socket): the gain without a link.
    single=$(drive 1 --ranks 1 --mode single --attention-us $attention_us)
    pingpong=$(drive 1 --ranks 1 --mode pingpong --attention-us $attention_us)
    echo "    the same on the expert host (Unix socket): $(get tokens_per_s "$pingpong") against $(get tokens_per_s "$single") tokens/s: $(calc "f'{$(get tokens_per_s "$pingpong") / $(get tokens_per_s "$single"):.2f}'") x"
  fi
  stop_cluster

  # (c): ranks 0-1 on host 1, 2-3 on host 2 (mpirun fills the hosts slot by
  # slot); hosts 3 and 4 are the attention hosts.
  start_cluster 4 2 4 "$rate"
  check_homes 4 2
  declare -A tps=([one]=0 [spread]=0)
  for homes in one spread spread one; do
    at=$(($(date +%s%3N) + 4000))
    drive 3 --ranks 4 --key-file "$work/key" --clients 4 --first-client 0 --homes $homes --mode pingpong \
      --attention-us $attention_us --start-at-ms $at >"$work/h3.txt" 2>&1 &
    clients=($!)
    drive 4 --ranks 4 --key-file "$work/key" --clients 4 --first-client 4 --homes $homes --mode pingpong \
      --attention-us $attention_us --start-at-ms $at >"$work/h4.txt" 2>&1 &
    clients+=($!)
    for p in "${clients[@]}"; do
      wait "$p" || { cat "$work/h3.txt" "$work/h4.txt" >&2; echo "front_door_network.sh: M-to-N clients failed" >&2; exit 1; }
    done
    clients=()
    grep -h "after --start-at-ms" "$work/h3.txt" "$work/h4.txt" >&2 || true
    tps[$homes]=$(calc "f'{${tps[$homes]} + ($(get tokens_per_s "$(grep '^clients=' "$work/h3.txt")") + $(get tokens_per_s "$(grep '^clients=' "$work/h4.txt")")) / 2:.1f}'")
  done
  line="(c) M-to-N, $rate: 2 attention hosts x 4 clients (2 x 128 in flight each), 4 ranks on 2 hosts: one home per client ${tps[one]} tokens/s, spread over 4 homes ${tps[spread]} tokens/s: spread/one $(calc "f'{${tps[spread]} / ${tps[one]}:.2f}'") x"
  [ "$bps" = 0 ] || line+="; (a loose bound: the attention hosts' links, $(calc "f'{2 * $bps / 8 / $out_bytes / $layers:.0f}'") tokens/s; the expert hosts' links carry the ranks' own exchanges too)"
  echo "$line"
  summary[$rate]+="; M-to-N spread/one $(calc "f'{${tps[spread]} / ${tps[one]}:.2f}'") x (${tps[spread]} / ${tps[one]} tokens/s)"

  if [ "$idle_done" = 0 ]; then
    idle_done=1
    pids=$(pgrep -f -- "^$moed .*$sock" | tr '\n' ' ')
    [ "$(echo "$pids" | wc -w)" = 4 ] || { echo "front_door_network.sh: expected 4 moed ranks, found: $pids" >&2; exit 1; }
    ticks() { local t=0 p; for p in $pids; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/stat"))); done; echo $t; }
    window=5
    sleep 1
    t0=$(ticks); sleep $window; t1=$(ticks)
    none_pct=$(calc "f'{100 * ($t1 - $t0) / $(getconf CLK_TCK) / $window / 4:.1f}'")
    for h in 3 4; do
      drive "$h" --ranks 4 --key-file "$work/key" --clients 32 --first-client $(((h - 3) * 32)) --idle-seconds 120 \
        >"$work/idle$h.txt" 2>&1 &
      clients+=($!)
    done
    connected() { grep -q "^connected 32" "$work/idle3.txt" && grep -q "^connected 32" "$work/idle4.txt"; }
    for _ in $(seq 1200); do
      connected && break
      for p in "${clients[@]}"; do kill -0 "$p" 2>/dev/null || { cat "$work/idle3.txt" "$work/idle4.txt" >&2; exit 1; }; done
      sleep 0.1
    done
    connected || { cat "$work/idle3.txt" "$work/idle4.txt" >&2; echo "front_door_network.sh: the 64 clients did not connect" >&2; exit 1; }
    sleep 1
    per_rank=()
    for p in $pids; do per_rank+=("$(awk '{print $14 + $15}' "/proc/$p/stat")"); done
    main_ticks() { local t=0 p; for p in $pids; do t=$((t + $(awk '{print $14 + $15}' "/proc/$p/task/$p/stat"))); done; echo $t; }
    t0=$(ticks) m0=$(main_ticks); sleep $window; t1=$(ticks) m1=$(main_ticks)
    i=0 each=""
    for p in $pids; do
      each+="${each:+, }$(calc "f'{100 * ($(awk '{print $14 + $15}' "/proc/$p/stat") - ${per_rank[i]}) / $(getconf CLK_TCK) / $window:.1f}'")%"
      i=$((i + 1))
    done
    with_pct=$(calc "f'{100 * ($t1 - $t0) / $(getconf CLK_TCK) / $window / 4:.1f}'")
    others_pct=$(calc "f'{max(0, 100 * (($t1 - $t0) - ($m1 - $m0)) / $(getconf CLK_TCK) / $window / 4):.1f}'")
    echo "(d) idle CPU per rank, 4 ranks, over $window s: $with_pct% of a core with 64 network clients connected (ranks: $each; aim: under 5%)," \
      "of which $others_pct% in threads other than the step loop's (the network door's among them); $none_pct% with no client"
    for p in "${clients[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    clients=()
  fi
  stop_cluster
done

echo
echo "summary:"
for rate in "${rates[@]}"; do echo "  $rate: ${summary[$rate]}"; done
