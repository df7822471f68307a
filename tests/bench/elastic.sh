#!/usr/bin/env bash
# What a lost rank costs the clients: elastic serving ([comm].elastic, the
# survivors go on) against the restart path (moed-mpirun --restart relaunches
# the job), at the demo's shape (configs/demo.toml: 4 ranks, 2 islands of 2)
# and the decode layer's (configs/bench-decode.toml), served to network
# clients through the front door.
#
# Each kill: SIGKILL of world rank 1 at time t0, with no replica of its
# experts ([placement].redundancy = 1: the survivors reload them from the
# checkpoint) and with a replica of each (redundancy = 2); at once a client with every
# rank as a home submits 4 requests, one at a time; t1 is when the last is
# answered. "kill -> answered" is t1 - t0: detecting the loss, agreeing,
# rebuilding (or relaunching and reloading), the client's failover, and 4
# requests served. The same client against an undisturbed job gives the
# base. A client that connects that late does not see all of the pause of
# the clients in flight, so the survivors' own figure is printed too:
# "paused", the longest over the survivors from the start of the step the
# loss cut short to serving again (their log). A third client sends
# requests one at a time throughout, from 1 s before the kill to 3 s after
# it: "latency around the loss" is the p99 and the max of its requests in
# flight or started from 1 s before to 3 s after the kill, against its p99
# before the kill (elastic serving only: the restart path's figure is the
# new client's kill -> answered). With a spare ([comm].spares
# = 1, a fifth rank launched with the job), the same kill is followed by
# the spare's admission and the migration of its share of the slots:
# "grown back" is from the kill to the log's commit of that migration
# (polled every 10 ms), and "join paused" the members' longest pause for
# the join itself. A process started after the job (`moed --join`, one
# join slot, [comm].join_slots = 1) is timed too, with no kill: "late join"
# is from its start to the commit of its share's migration, and "paused"
# the members' longest pause for its admission. Prints each shape's medians
# of 3 kills (and 3 joins) and the ratio restart / elastic; asserts nothing.
#   tests/bench/elastic.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=$(cd "${1:-$root/build}" && pwd)
moed=$build/apps/moed check=$build/tests/front_door_check
[ -x "$moed" ] && [ -x "$check" ] || { echo "build first: $moed or $check is missing (ci/build.sh)" >&2; exit 2; }
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/moed-elastic.XXXXXX)
head -c 32 /dev/urandom >"$work/key" && chmod 600 "$work/key"
pid=""
stop_job() {
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  pkill -9 -f -- "^$moed .*$work/" 2>/dev/null || true
  [ -z "$pid" ] || wait "$pid" 2>/dev/null || true
  pid=""
}
trap 'stop_job; rm -rf "$work"' EXIT
port=$((18500 + $$ % 5000)) join_port=$((24000 + $$ % 5000))

# start MODE CONFIG: the job in the background (MODE: restart, elastic,
# replicas: elastic with every expert on both islands, spare: elastic with a
# fifth rank as a spare, or join: elastic with a join slot), once every
# serving rank's door is open.
start() {
  local mode=$1 config=$2 launcher=(--restart 5) ranks=4 extra=()
  [ "$mode" != restart ] && launcher+=(--elastic)
  # (the migration's commit is logged at info)
  [ "$mode" = spare ] && ranks=5 extra=(--set comm.spares=1 --set 'log.level="info"')
  [ "$mode" = replicas ] && extra=(--set placement.redundancy=2)
  [ "$mode" = join ] && extra=("${join_args[@]}")
  rm -rf "$work/sock"
  job_args=(--config "$config" "${extra[@]}" --set workload.kind=ingress --set "ingress.dir=\"$work/sock\""
    --set "ingress.listen=\"127.0.0.1:$port\"" --set "ingress.key_file=\"$work/key\""
    --set 'ingress.transports="tcp"' --set 'comm.backend="ucx"' --set 'comm.control="transport"'
    --set log.per_step=false)
  "$root/launch/moed-mpirun" "${launcher[@]}" --hosts localhost --gpus-per-host "$ranks" --moed "$moed" --bind none -- \
    "${job_args[@]}" >"$work/log" 2>&1 &
  pid=$!
  for _ in $(seq 1200); do
    up=1
    for r in 0 1 2 3; do [ -s "$work/sock/moed-ingress-$r.ucx" ] || up=0; done
    [ "$up" = 1 ] && return
    kill -0 "$pid" 2>/dev/null || { cat "$work/log" >&2; exit 1; }
    sleep 0.05
  done
  echo "the job did not open its doors" >&2
  exit 1
}
world_rank_pid() {
  local p
  for p in $(pgrep -f -- "^$moed .*$work/sock"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
# requests: seconds for 4 requests, one at a time, by a client with every rank as a home.
# A relaunched job's doors are listed again only once it is up: until then
# the client cannot even find its homes, and tries again.
requests() {
  local t0=$1
  for _ in $(seq 3000); do
    "$check" --dir "$work/sock" --ranks 4 --mode serial --requests 4 --key-file "$work/key" --all-homes \
      --out /dev/null >/dev/null 2>"$work/client.err" && {
      python3 -c "import time; print(f'{time.time() - $t0:.3f}')"
      return
    }
    grep -q "lists no network address" "$work/client.err" || break
    sleep 0.02
  done
  cat "$work/client.err" >&2
  tail -20 "$work/log" >&2
  exit 1
}
median() { printf '%s\n' "$@" | sort -n | sed -n 2p; }
# grown_back T0: seconds from T0 until the log shows the join's migration committed.
grown_back() {
  for _ in $(seq 6000); do
    if grep -q "placement epoch 1 committed" "$work/log"; then
      python3 -c "import time; print(f'{time.time() - $1:.3f}')"
      return
    fi
    sleep 0.01
  done
  tail -20 "$work/log" >&2
  exit 1
}

# latency_client: in the background, requests one at a time with every rank
# as a home, each one's start and latency appended to $work/latencies.
latency_client() {
  "$check" --dir "$work/sock" --ranks 4 --mode serial --requests 200 --rounds 100000 --key-file "$work/key" --all-homes \
    --out /dev/null --latencies "$work/latencies" >/dev/null 2>"$work/latency.err" &
  latency_pid=$!
  sleep 1
}
# latency_window T0: once 3 s have passed since T0, stops the latency client
# and prints "p99 max p99_before" (ms) of its requests around T0 and before it.
latency_window() {
  python3 -c "import time; time.sleep(max(0.0, $1 + 3 - time.time()))"
  kill -0 "$latency_pid" 2>/dev/null ||
    { cat "$work/latency.err" >&2; echo "the latency client ended before 3 s after the kill (it failed)" >&2; exit 1; }
  kill "$latency_pid" 2>/dev/null || true
  wait "$latency_pid" 2>/dev/null || true
  python3 - "$work/latencies" "$1" <<'PY'
import sys
t0 = float(sys.argv[2])
rows = [tuple(map(float, line.split())) for line in open(sys.argv[1]) if len(line.split()) == 2]
def p99(v):
    v = sorted(v)
    return v[min(len(v) - 1, int(0.99 * len(v)))] if v else float("nan")
around = [ms for s, ms in rows if t0 - 1 <= s <= t0 + 3 or (s < t0 and s + ms / 1000 >= t0)]
before = [ms for s, ms in rows if s + ms / 1000 < t0 - 0.1]
if not around:
    sys.exit("no request of the latency client around the kill")
print(f"{p99(around):.0f} {max(around):.0f} {p99(before):.0f}")
PY
}
# medians OF "a b c" TRIPLES: the median of each column ("p99 max p99_before").
medians() {
  python3 -c "import statistics, sys; cols = list(zip(*[map(float, t.split()) for t in sys.argv[1:]])); \
print(' '.join(f'{statistics.median(c):.0f}' for c in cols))" "$@"
}

join_args=(--set comm.elastic=true --set comm.join_slots=1 --set "comm.join_listen=\"127.0.0.1:$join_port\""
  --set 'log.level="info"')

echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for shape in "demo:$root/configs/demo.toml" "decode layer:$root/configs/bench-decode.toml"; do
  name=${shape%%:*} config=${shape#*:}
  base=() restart=()
  declare -A answered=() paused=() latency=()
  for mode in elastic replicas; do
    for _ in 1 2 3; do  # a fresh job for each kill
      start "$mode" "$config"
      [ "$mode" = elastic ] && base+=("$(requests "$(date +%s.%N)")")
      latency_client
      victim=$(world_rank_pid 1)
      t0=$(date +%s.%N)
      kill -9 "$victim"
      answered[$mode]+="$(requests "$t0") "
      paused[$mode]+="$(sed -n 's/.*serving paused \([0-9]*\) ms on this rank/\1/p' "$work/log" | sort -n | tail -1) "
      latency[$mode]+="$(latency_window "$t0"),"
      stop_job
    done
  done
  grown=() joined=()
  for _ in 1 2 3; do  # a spare: admitted after the kill, then given its share of the slots
    start spare "$config"
    victim=$(world_rank_pid 1)
    t0=$(date +%s.%N)
    kill -9 "$victim"
    requests "$t0" >/dev/null
    grown+=("$(grown_back "$t0")")
    joined+=("$(sed -n 's/.*joined (spares) at step .* serving paused \([0-9]*\) ms on this rank/\1/p' "$work/log" |
      sort -n | tail -1)")
    stop_job
  done
  late=() late_paused=()
  for _ in 1 2 3; do  # moed --join: a process started after the job, admitted, given its share of the slots
    start join "$config"
    t0=$(date +%s.%N)
    "$moed" "${job_args[@]}" --join "127.0.0.1:$join_port" >"$work/joiner.log" 2>&1 &
    disown  # stop_job ends it with the job
    late+=("$(grown_back "$t0")")
    late_paused+=("$(sed -n 's/.*joined (moed --join) at step .* serving paused \([0-9]*\) ms on this rank/\1/p' \
      "$work/log" | sort -n | tail -1)")
    late_slots=$(sed -n 's/.*rank 0: \([0-9]*\) slot(s) migrate to the rank(s) that joined.*/\1/p' "$work/log" | head -1)
    stop_job
  done
  start restart "$config"
  for _ in 1 2 3; do  # the restart path: the job relaunches after each kill
    victim=$(world_rank_pid 1)
    t0=$(date +%s.%N)
    kill -9 "$victim"
    restart+=("$(requests "$t0")")
  done
  stop_job
  r=$(median "${restart[@]}") b=$(median "${base[@]}")
  echo "$name (undisturbed: 4 requests answered in $b s; restart path: kill -> answered $r s (${restart[*]}))"
  for mode in elastic replicas; do
    IFS=' ' read -r -a a <<<"${answered[$mode]}"
    IFS=' ' read -r -a p <<<"${paused[$mode]}"
    IFS=',' read -r -a l <<<"${latency[$mode]%,}"
    e=$(median "${a[@]}")
    # The loss's cost to the new client: its kill -> answered less the same
    # requests undisturbed (the 4 requests' own time dilutes the plain ratio).
    printf '  %-8s kill -> answered %s s (%s), survivors paused %s ms (%s), restart / elastic %.1fx (%.1fx less the undisturbed %s s),\n' \
      "$mode" "$e" "${a[*]}" "$(median "${p[@]}")" "${p[*]}" "$(python3 -c "print($r / $e)")" \
      "$(python3 -c "print(($r - $b) / max($e - $b, 0.001))")" "$b"
    printf '           latency around the loss p99 / max / p99 before (ms): %s\n' "$(medians "${l[@]}")"
  done
  printf '  spare: grown back %s s (%s), join paused %s ms (%s)\n' "$(median "${grown[@]}")" "${grown[*]}" \
    "$(median "${joined[@]}")" "${joined[*]}"
  printf '  moed --join: started -> share committed %s s (%s; %s slots), members paused %s ms (%s)\n' \
    "$(median "${late[@]}")" "${late[*]}" "$late_slots" "$(median "${late_paused[@]}")" "${late_paused[*]}"
done
