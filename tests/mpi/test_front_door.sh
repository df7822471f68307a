#!/usr/bin/env bash
# The front door through real daemons under mpirun.
#   batching: the same 64 requests served one at a time, all at once from 2
#     clients per rank, and in shuffled order, at 1, 2 and 4 ranks, and with a
#     per-step budget that makes requests wait: every run's outputs are
#     cmp-equal. The Python client's outputs match, one row at a time too;
#     its forward() splits more rows than a submit holds, a wait that times
#     out keeps its handle (front_door_python.py).
#   faults: a client killed while holding a request, a client of another
#     uid, bad inputs from Python (each refused with its reason: request
#     ids, positions and layers named with their row; a bad row
#     leaving its neighbours' bits alone); the daemons serve on, leak no file
#     descriptor, and idle at a few percent of a core.
#   policies: router policies through the front door, on requests decoded
#     position by position (front_door_check --mode decode): smoothing uses
#     the rows' request ids and positions, so its outputs differ from no
#     smoothing and its flip rate is lower; they are cmp-equal at 1 rank with
#     one client and at 2 ranks in 2 islands with 4 clients; demotion serves.
#   network: the network door ([ingress].listen) on loopback: bit-identical
#     to the Unix door; a wrong key, a key file others may read, a listen
#     address without a port or a key are refused, and status counts them.
# Usage: test_front_door.sh batching|faults|policies|network
source "$(dirname "$0")/lib.sh"
: "${FRONT_DOOR_CHECK:?}" "${MOECTL:?}"
mode=${1:?mode}
PYTHON=/usr/bin/python3
daemon=""
trap '[ -n "$daemon" ] && end_daemon $daemon; rm -rf "$SCRATCH"' EXIT

# start NAME RANKS [FLAGS...]: moed with the front door in the background;
# returns once every rank's socket is there.
start() {
  local name=$1 n=$2
  shift 2
  run=$SCRATCH/$name
  mkdir -p "$run"
  # Not through moed_on: $! must be mpirun's (or moed's) own pid, not a subshell's.
  local launch=("$MOED")
  [ "$n" != 0 ] && launch=(mpirun --bind-to none -np "$n" "$MOED")
  "${launch[@]}" --config "$SMALL" --set workload.kind=ingress --set "ingress.dir=\"$run/sock\"" \
    --set "admin.dir=\"$run/admin\"" "$@" >"$run/out.txt" 2>"$run/err.txt" &
  daemon=$!
  local ranks=$((n == 0 ? 1 : n))
  for _ in $(seq 1200); do
    local up=0
    for r in $(seq 0 $((ranks - 1))); do [ -S "$run/sock/moed-ingress-$r.sock" ] && up=$((up + 1)); done
    [ "$up" = "$ranks" ] && return 0
    kill -0 $daemon 2>/dev/null || { cat "$run/err.txt" >&2; fail "$name: moed stopped before its sockets appeared"; }
    sleep 0.1
  done
  fail "$name: the front-door sockets did not appear within 120 s"
}
stop() {
  "$MOECTL" --dir "$run/admin" shutdown >/dev/null
  wait $daemon || { cat "$run/err.txt" >&2; fail "moed exited with code $?"; }
  daemon=""
}
check() {  # check RANKS MODE OUT [FLAGS...]
  local ranks=$1 how=$2 out=$3
  shift 3
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks "$ranks" --mode "$how" --out "$out" "$@"
}

case "$mode" in
batching)
  start one 0
  check 1 serial "$SCRATCH/ref.bin"
  check 1 concurrent "$SCRATCH/one-concurrent.bin"
  MOED_SOCKET="$run/sock/moed-ingress-0.sock" $PYTHON "$MOED_SOURCE_DIR/tests/mpi/front_door_python.py" batching ||
    fail "Python client"
  stop
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/one-concurrent.bin" "1 rank: all at once vs one at a time"
  start two 2
  check 2 concurrent "$SCRATCH/two.bin"
  stop
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/two.bin" "2 ranks, 2 clients each, all at once vs 1 rank one at a time"
  start four 4 --set cluster.ranks_per_island=2
  check 4 shuffled "$SCRATCH/four-shuffled.bin"
  check 4 serial "$SCRATCH/four-serial.bin"
  check 4 concurrent "$SCRATCH/four-many.bin" --clients-per-rank 3
  stop
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/four-shuffled.bin" "4 ranks in 2 islands, shuffled arrival"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/four-serial.bin" "4 ranks, one at a time"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/four-many.bin" "4 ranks, 3 clients each"
  start budget 2 --set ingress.max_tokens_per_step=64
  check 2 concurrent "$SCRATCH/budget.bin" --clients-per-rank 3
  stop
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/budget.bin" "2 ranks, 64 rows per layer per step (requests wait for later steps)"
  grep -q "steps of front-door rows" "$run/out.txt" || fail "no report at exit"
  ;;
faults)
  expect_failure 2 'needs \[ingress\]\.dir' "the front door without a socket dir" -- \
    "$MOED" --config "$SMALL" --set workload.kind=ingress
  expect_failure 2 'dump-output: with \[workload\]\.kind = "ingress" the outputs go back to the clients' \
    "--dump-output with the front door" -- "$MOED" --config "$SMALL" --set workload.kind=ingress \
    --set "ingress.dir=\"$SCRATCH/unused\"" --dump-output "$SCRATCH/x.bin"
  touch "$SCRATCH/a-file"
  expect_failure 2 '\[ingress\]\.dir: cannot create the front-door socket dir' "a socket dir under a file, 2 ranks" -- \
    mpirun --bind-to none -np 2 "$MOED" --config "$SMALL" --set workload.kind=ingress \
    --set "ingress.dir=\"$SCRATCH/a-file/sock\""
  start faults 2
  daemons=$(pgrep -f -- "^$MOED .*$run/sock" | tr '\n' ' ')
  [ -n "$daemons" ] || fail "cannot find the daemons' processes"
  fds() { local n=0; for p in $daemons; do n=$((n + $(ls /proc/$p/fd | wc -l))); done; echo $n; }
  check 2 concurrent "$SCRATCH/before.bin"
  fds_before=$(fds)

  # A client killed while its request is queued or being served.
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --mode hold >"$SCRATCH/hold.txt" &
  holder=$!
  wait_until 60 grep -q holding "$SCRATCH/hold.txt" || fail "the holding client did not submit within 60 s"
  kill -9 $holder
  wait $holder 2>/dev/null || true
  check 2 concurrent "$SCRATCH/after.bin"
  same_bits "$SCRATCH/before.bin" "$SCRATCH/after.bin" "served on after a client was killed holding a request"

  # A client of another uid cannot even reach the socket (its dir is 0700).
  if [ "$(id -u)" = 0 ] && command -v setpriv >/dev/null; then
    rc=0
    setpriv --reuid=65534 --regid=65534 --clear-groups "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 1 \
      --mode serial --out /dev/null >"$SCRATCH/other-uid.txt" 2>&1 || rc=$?
    [ $rc = 1 ] || fail "a client of uid 65534: exit $rc"
    grep -q "Permission denied (the socket is private to the daemon's user)" "$SCRATCH/other-uid.txt" ||
      { cat "$SCRATCH/other-uid.txt" >&2; fail "a client of uid 65534: no clear refusal"; }
    echo "ok: a client of another uid is refused: $(head -1 "$SCRATCH/other-uid.txt" | cut -c1-140)"
  fi

  MOED_SOCKET="$run/sock/moed-ingress-1.sock" $PYTHON "$MOED_SOURCE_DIR/tests/mpi/front_door_python.py" faults ||
    fail "Python client's bad inputs"

  # Nothing leaked: the daemons hold as many file descriptors as before.
  no_more_fds() { [ "$(fds)" -le "$fds_before" ]; }
  wait_until 60 no_more_fds || fail "file descriptors leaked: $fds_before before, $(fds) after (60 s later)"
  echo "ok: no file descriptor leaked ($fds_before before, $(fds) after)"

  # Idle: no client work, so the ranks sleep between checks. Each idle turn
  # waits 50 us, doubling up to idle_wait_us (2 ms), so over a window of T s
  # the step loop takes at most T / 2 ms + 16 turns however loaded the
  # machine (a load only slows it); ranks that spun would take hundreds of
  # times more. The CPU share is printed, not checked: the ranks' waits in the
  # turn's collective cost more when another process takes the core.
  idle_turns() { "$MOECTL" --dir "$run/admin" --json status | $PYTHON -c 'import json, sys; print(json.loads(sys.stdin.readline())["idle_turns"])'; }
  ticks() { local t=0; for p in $daemons; do t=$((t + $(awk '{print $14 + $15}' /proc/$p/stat))); done; echo $t; }
  # The window holds both reads of the count: the turns between them took at least its length.
  s0=$(date +%s.%N) t0=$(ticks)
  turns0=$(idle_turns) || fail "status has no idle_turns"
  sleep 3
  turns1=$(idle_turns) || fail "status has no idle_turns"
  t1=$(ticks) s1=$(date +%s.%N)
  $PYTHON -c "
import sys
seconds, turns = $s1 - $s0, $turns1 - $turns0
share = ($t1 - $t0) / $(getconf CLK_TCK) / seconds / 2
bound = seconds / 0.002 + 16
print(f'idle: {turns} turns in {seconds:.2f} s (at most {bound:.0f}), {100 * share:.1f}% of a core per rank')
sys.exit(0 if 0 < turns <= bound else 1)" || fail "idle ranks spin (or never turn)"
  stop
  ;;
policies)
  # flip_rate OUT: the flip rate (%) the report printed at exit.
  flip_rate() { sed -n 's/.*; \([0-9.]*\)% flip from their request.s previous position.*/\1/p' "$1"; }
  decode=(--requests 32 --positions 12 --drift 0.3)
  start none 0 --set router.measure_jitter=true
  check 1 decode "$SCRATCH/none.bin" "${decode[@]}" --clients-per-rank 1
  stop
  none_flips=$(flip_rate "$run/out.txt")
  start smooth 0 --set router.measure_jitter=true --set router.smoothing_beta=1
  check 1 decode "$SCRATCH/smooth.bin" "${decode[@]}" --clients-per-rank 1
  stop
  smooth_flips=$(flip_rate "$run/out.txt")
  start smooth2 2 --set cluster.ranks_per_island=1 --set router.measure_jitter=true --set router.smoothing_beta=1
  check 2 decode "$SCRATCH/smooth-2.bin" "${decode[@]}" --clients-per-rank 2
  stop
  same_bits "$SCRATCH/smooth.bin" "$SCRATCH/smooth-2.bin" "smoothing: 2 ranks in 2 islands, 4 clients vs 1 rank, 1 client"
  cmp -s "$SCRATCH/none.bin" "$SCRATCH/smooth.bin" && fail "smoothing changed no output through the front door"
  [ -n "$none_flips" ] && [ -n "$smooth_flips" ] || fail "no flip rate in the report (none: '$none_flips', smoothing: '$smooth_flips')"
  python3 -c "import sys; sys.exit(0 if $smooth_flips < $none_flips else 1)" ||
    fail "smoothing did not lower the flip rate through the front door: $none_flips% -> $smooth_flips%"
  echo "ok: through the front door, smoothing (beta 1) cut the flip rate from $none_flips% to $smooth_flips%"
  start demote 2 --set router.load_policy=demote --set router.capacity_factor=1.0
  check 2 decode "$SCRATCH/demote.bin" "${decode[@]}" --clients-per-rank 2
  stop
  grep -q "router policies .*demote" "$run/out.txt" || { cat "$run/out.txt" >&2; fail "demotion's figures missing from the report"; }
  echo "ok: demotion serves through the front door: $(grep -m1 'router policies' "$run/out.txt" | sed 's/^ *//')"
  ;;
network)
  # The network door on loopback: the same bits as the Unix door, whatever
  # door or rank serves a row; a wrong key gets nothing, and is counted.
  head -c 32 /dev/urandom >"$SCRATCH/key" && chmod 600 "$SCRATCH/key"
  head -c 32 /dev/urandom >"$SCRATCH/other-key" && chmod 600 "$SCRATCH/other-key"
  listen=(--set 'ingress.listen="127.0.0.1:0"' --set "ingress.key_file=\"$SCRATCH/key\"")
  expect_failure 2 'listen needs \[ingress\]\.key_file' "a network door without a key" -- \
    "$MOED" --config "$SMALL" --set workload.kind=ingress --set "ingress.dir=\"$SCRATCH/unused\"" \
    --set 'ingress.listen="127.0.0.1:0"'
  chmod 644 "$SCRATCH/key"
  expect_failure 2 'key_file: key file .*mode 0644 lets others read or write the key' "a key others may read" -- \
    "$MOED" --config "$SMALL" --set workload.kind=ingress --set "ingress.dir=\"$SCRATCH/unused\"" "${listen[@]}"
  chmod 600 "$SCRATCH/key"
  expect_failure 2 'is not HOST:PORT' "a listen address without a port" -- \
    "$MOED" --config "$SMALL" --set workload.kind=ingress --set "ingress.dir=\"$SCRATCH/unused\"" \
    --set 'ingress.listen="127.0.0.1"' --set "ingress.key_file=\"$SCRATCH/key\""
  start net 2 "${listen[@]}"
  for r in 0 1; do
    wait_until 60 test -s "$run/sock/moed-ingress-$r.ucx" || fail "rank $r listed no network address"
    grep -q '^ucx://127\.0\.0\.1:[0-9]*$' "$run/sock/moed-ingress-$r.ucx" || fail "rank $r: $(cat "$run/sock/moed-ingress-$r.ucx")"
  done
  check 2 concurrent "$SCRATCH/unix.bin"
  check 2 concurrent "$SCRATCH/network.bin" --key-file "$SCRATCH/key"
  check 1 serial "$SCRATCH/network-serial.bin" --key-file "$SCRATCH/key"
  same_bits "$SCRATCH/unix.bin" "$SCRATCH/network.bin" "2 ranks, 2 clients each: the network door vs the Unix door"
  same_bits "$SCRATCH/unix.bin" "$SCRATCH/network-serial.bin" "one network client on rank 0, one request at a time"
  MOED_SOCKET="$run/sock/moed-ingress-0.sock" MOED_KEY="$SCRATCH/key" MOED_OTHER_KEY="$SCRATCH/other-key" \
    MOED_NETWORK="$(head -1 "$run/sock/moed-ingress-0.ucx"),$(head -1 "$run/sock/moed-ingress-1.ucx")" \
    $PYTHON "$MOED_SOURCE_DIR/tests/mpi/front_door_python.py" network || fail "Python client through the network door"
  expect_failure 1 "does not hold the cluster's key" "a client with another key" -- \
    "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 1 --mode serial --out /dev/null --key-file "$SCRATCH/other-key"
  "$MOECTL" --dir "$run/admin" --json status >"$SCRATCH/status.json"
  $PYTHON - "$SCRATCH/status.json" <<'PY' || fail "status does not count the refused key"
import json, sys
door = json.loads(open(sys.argv[1]).readline())["front_door"]
print("front door (rank 0):", door)
sys.exit(0 if door["network"]["auth_failures"] == 2 and door["network"]["logged_in"] >= 3 else 1)
PY
  stop
  ;;
*) fail "unknown mode $mode" ;;
esac
