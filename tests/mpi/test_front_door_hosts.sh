#!/usr/bin/env bash
# The front door across hosts, on the emulated cluster (launch/emulated-cluster):
# 4 hosts on a 1 Gbit/s bridge; moed's 4 ranks on hosts 1 and 2 (the expert
# hosts), their network doors on every interface; hosts 3 and 4 are
# attention hosts whose clients reach the ranks only over the emulated
# network (UCX over TCP on veth0).
#   - Clients on both attention hosts at once, several per rank, get the bits
#     a same-host client gets through the Unix door.
#   - The built-in workload's tokens, sent layer by layer by clients on an
#     attention host and by a same-host client, come back with the bits
#     `moed --dump-output` writes when moed serves that workload itself.
#   - A client with another key gets nothing, and is counted.
#   - Handshake abuse from an attention host (12 handshakes left stalled at
#     once, beyond the 8 per peer; a login replayed on a new connection) is
#     refused and counted while the other host's clients are served.
#   - An attention host dropping off mid-request (its link set down, its
#     client killed) disturbs no one: the others are served with the same
#     bits, and every rank lets go of the dead client once it answers no
#     ping ([ingress].silence_timeout_ms), its host still off the network.
#   - Nothing is left behind: no endpoint, no client, no file descriptor.
#   - A rank killed on host 2 while 8 clients on host 3 send: the job is
#     restarted on the same hosts and ports (emulated-cluster --restart), the
#     clients connect again and submit what was in flight: no call fails, and
#     the outputs keep the reference's bits.
# Skipped (exit 77) only where network namespaces cannot be created.
source "$(dirname "$0")/lib.sh"
: "${FRONT_DOOR_CHECK:?}" "${MOECTL:?}" "${HANDSHAKE_ABUSE:?}"
emu="$MOED_SOURCE_DIR/launch/emulated-cluster"

need_emulated_cluster "$emu"

head -c 32 /dev/urandom >"$SCRATCH/key" && chmod 600 "$SCRATCH/key"
head -c 32 /dev/urandom >"$SCRATCH/other-key" && chmod 600 "$SCRATCH/other-key"
sock=$SCRATCH/sock admin=$SCRATCH/admin
launcher=""
cleanup() {
  [ -n "$launcher" ] && kill -TERM "$launcher" 2>/dev/null && wait "$launcher" 2>/dev/null
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# mpirun fills the hosts slot by slot: -np 4 puts ranks 0-1 on host 1, 2-3 on host 2.
# Fixed ports (each host's own, in its namespace), so that a restarted job
# listens where its clients knew it; the launcher restarts a failed job once.
"$emu" --hosts 4 --ranks-per-host 2 --rate 1gbit --restart 1 -- -np 4 "$MOED" --config "$SMALL" \
  --set workload.kind=ingress --set "ingress.dir=\"$sock\"" --set "admin.dir=\"$admin\"" \
  --set 'ingress.listen="*:17400"' --set "ingress.key_file=\"$SCRATCH/key\"" --set 'ingress.transports="tcp"' \
  --set ingress.ping_interval_ms=1000 --set ingress.silence_timeout_ms=3000 \
  >"$SCRATCH/cluster.txt" 2>&1 &
launcher=$!
all_up() {
  for r in 0 1 2 3; do [ -S "$sock/moed-ingress-$r.sock" ] && [ -s "$sock/moed-ingress-$r.ucx" ] || return 1; done
}
wait_until 120 all_up || { cat "$SCRATCH/cluster.txt" >&2; fail "the 4 ranks' front doors did not open within 120 s"; }
ns_of() { grep -oE "\bmoed4-[0-9]+-h$1\b" "$SCRATCH/cluster.txt" | head -1; }
addr_of() { sed -n "s/.*host $(ns_of "$1"): namespace .*, veth0 \([0-9.]*\)\/24.*/\1/p" "$SCRATCH/cluster.txt" | head -1; }
h1=$(addr_of 1) h2=$(addr_of 2) a3=$(ns_of 3) a4=$(ns_of 4)
[ -n "$h1" ] && [ -n "$h2" ] && [ -n "$a3" ] && [ -n "$a4" ] || { cat "$SCRATCH/cluster.txt" >&2; fail "cannot find the hosts"; }
for r in 0 1 2 3; do
  host=$([ $r -lt 2 ] && echo "$h1" || echo "$h2")
  head -1 "$sock/moed-ingress-$r.ucx" | grep -q "^ucx://$host:" ||
    fail "rank $r lists $(head -1 "$sock/moed-ingress-$r.ucx"), not an address of its host ($host)"
done
echo "ok: ranks 0-1 listen on host 1 ($h1), ranks 2-3 on host 2 ($h2)"

# on HOST_NS CMD...: runs CMD on an attention host, its UCX on the emulated network only.
on() {
  local ns=$1
  shift
  ip netns exec "$ns" env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "$@"
}
daemons=$(pgrep -f -- "^$MOED .*$sock" | tr '\n' ' ')
[ "$(echo $daemons | wc -w)" = 4 ] || fail "expected 4 moed processes, found: $daemons"
fds() { local n=0; for p in $daemons; do n=$((n + $(ls /proc/$p/fd | wc -l))); done; echo $n; }
status() { "$MOECTL" --dir "$admin" --json status; }
network() {  # network FIELD: rank 0's network door counter
  status | python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['front_door']['network']['$1'])"
}

# The same-host door: a client in the root namespace, through the ranks' sockets.
"$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --mode concurrent --out "$SCRATCH/unix.bin" >/dev/null ||
  fail "the same-host client"
fds_before=$(fds)

# Both attention hosts at once, 2 clients per rank each, one in shuffled order.
on "$a3" "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --mode concurrent --clients-per-rank 2 \
  --key-file "$SCRATCH/key" --out "$SCRATCH/a3.bin" >"$SCRATCH/a3.txt" 2>&1 &
c3=$!
on "$a4" "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --mode shuffled --clients-per-rank 2 \
  --key-file "$SCRATCH/key" --out "$SCRATCH/a4.bin" >"$SCRATCH/a4.txt" 2>&1 &
c4=$!
wait $c3 || { cat "$SCRATCH/a3.txt" >&2; fail "the clients on attention host 3"; }
wait $c4 || { cat "$SCRATCH/a4.txt" >&2; fail "the clients on attention host 4"; }
same_bits "$SCRATCH/unix.bin" "$SCRATCH/a3.bin" "8 clients on attention host 3 over the network vs the same-host door"
same_bits "$SCRATCH/unix.bin" "$SCRATCH/a4.bin" "8 clients on attention host 4, shuffled, at the same time"

# The built-in workload served by moed itself, against its tokens through either door.
moed_on 4 --config "$SMALL" --dump-output "$SCRATCH/builtin.bin" >/dev/null || fail "moed serving its own workload"
"$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --clients-per-rank 1 --mode workload --config "$SMALL" \
  --out "$SCRATCH/workload-unix.bin" >/dev/null || fail "the workload through the same-host door"
on "$a3" "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --clients-per-rank 1 --mode workload --config "$SMALL" \
  --key-file "$SCRATCH/key" --out "$SCRATCH/workload-network.bin" >/dev/null || fail "the workload from attention host 3"
same_bits "$SCRATCH/builtin.bin" "$SCRATCH/workload-unix.bin" "the built-in workload vs its tokens through the same-host door"
same_bits "$SCRATCH/builtin.bin" "$SCRATCH/workload-network.bin" "the built-in workload vs its tokens from attention host 3"

# A wrong key gets nothing.
expect_failure 1 "does not hold the cluster's key" "a client on host 4 with another key" -- \
  ip netns exec "$a4" env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 1 --mode serial --out /dev/null --key-file "$SCRATCH/other-key"
[ "$(network auth_failures)" = 1 ] || fail "rank 0 counts $(network auth_failures) auth failures, expected 1"
echo "ok: rank 0 counted the refused key"

# Handshake abuse from host 4 while host 3 is served: 12 handshakes left
# stalled at once (beyond [ingress].max_handshakes_per_peer = 8, the rest are
# refused at once), then dropped after handshake_timeout_ms; then a login
# recorded on one connection replayed on another.
rank0=$(head -1 "$sock/moed-ingress-0.ucx")
on "$a4" "$HANDSHAKE_ABUSE" --address "$rank0" --stall 12 >"$SCRATCH/stall.txt" 2>&1 &
abuser=$!
wait_until 60 grep -q "^stalled" "$SCRATCH/stall.txt" || { cat "$SCRATCH/stall.txt" >&2; fail "the stalling peer on host 4 got no answers"; }
on "$a3" "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --mode concurrent --key-file "$SCRATCH/key" \
  --out "$SCRATCH/during-abuse.bin" >/dev/null || fail "host 3 while host 4 stalls handshakes"
same_bits "$SCRATCH/unix.bin" "$SCRATCH/during-abuse.bin" "host 3 served while host 4 stalls 12 handshakes"
wait $abuser || { cat "$SCRATCH/stall.txt" >&2; fail "the stalled handshakes"; }
read -r stalled refused < <(sed -n 's/^stalled \([0-9]*\) handshakes; \([0-9]*\) refused at once$/\1 \2/p' "$SCRATCH/stall.txt") || true
[ -n "$refused" ] && [ "$refused" -ge 1 ] && [ "$stalled" -le 8 ] || fail "12 handshakes from one host: $(cat "$SCRATCH/stall.txt")"
[ "$(network handshake_timeouts)" = "$stalled" ] || fail "rank 0 timed out $(network handshake_timeouts) handshakes, the peer stalled $stalled"
[ "$(network handshakes_refused)" = "$refused" ] || fail "rank 0 refused $(network handshakes_refused) handshakes, the peer saw $refused refused"
echo "ok: $stalled stalled handshakes timed out and $refused more were refused as a flood, counted by rank 0"
on "$a4" "$HANDSHAKE_ABUSE" --address "$rank0" --replay --key-file "$SCRATCH/key" >"$SCRATCH/replay.txt" 2>&1 ||
  { cat "$SCRATCH/replay.txt" >&2; fail "a replayed login from host 4"; }
[ "$(network auth_failures)" = 2 ] || fail "rank 0 counts $(network auth_failures) auth failures after the replay, expected 2"
echo "ok: a replayed login from host 4 was refused and counted"

# Host 4 drops off mid-request: its client pauses with submits in flight, its
# link goes down, the client dies; host 3 is served meanwhile with the same bits.
on "$a4" "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --mode concurrent --clients-per-rank 1 \
  --key-file "$SCRATCH/key" --out /dev/null --pause-after 8 --resume-file "$SCRATCH/never" >"$SCRATCH/drop.txt" 2>&1 &
dropper=$!
wait_until 60 grep -q paused "$SCRATCH/drop.txt" || { cat "$SCRATCH/drop.txt" >&2; fail "the client on host 4 did not pause"; }
ip -n "$a4" link set veth0 down
kill -9 $dropper
wait $dropper 2>/dev/null || true
on "$a3" "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --mode concurrent --key-file "$SCRATCH/key" \
  --out "$SCRATCH/after-drop.bin" >/dev/null || fail "host 3 after host 4 dropped off"
same_bits "$SCRATCH/unix.bin" "$SCRATCH/after-drop.bin" "host 3 served while host 4 is off the network mid-request"
# The dead client answers no ping: every rank lets it go, the link still down.
no_endpoints() { [ "$(network endpoints)" = 0 ]; }
wait_until 120 no_endpoints || fail "rank 0 still holds $(network endpoints) endpoints 120 s after every client went"
[ "$(network silences)" = 1 ] || fail "rank 0 let the dead client go $(network silences) times for its silence, expected 1"
echo "ok: the client whose host went away was let go for answering no ping (rank 0: 0 endpoints)"
ip -n "$a4" link set veth0 up

# Nothing left behind.
no_clients() { [ "$(status | python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['front_door']['clients'])")" = 0 ]; }
wait_until 60 no_clients || fail "rank 0 still counts clients"
no_more_fds() { [ "$(fds)" -le "$fds_before" ]; }
wait_until 120 no_more_fds || fail "file descriptors leaked: $fds_before before the network clients, $(fds) after"
echo "ok: no client, endpoint or file descriptor left behind ($fds_before fds before, $(fds) after)"

# A rank killed while the clients of another host send: mpirun ends the job,
# the launcher starts it again on the same hosts and ports, and the clients
# connect again within reconnect_ms and submit again what was in flight: no
# call fails, and the outputs are the reference's bits.
on "$a3" "$FRONT_DOOR_CHECK" --dir "$sock" --ranks 4 --mode concurrent --clients-per-rank 2 \
  --key-file "$SCRATCH/key" --out "$SCRATCH/killed.bin" --pause-after 16 --resume-file "$SCRATCH/resume" \
  >"$SCRATCH/killed.txt" 2>&1 &
survivor=$!
wait_until 60 grep -q paused "$SCRATCH/killed.txt" || { cat "$SCRATCH/killed.txt" >&2; fail "the clients on host 3 did not pause"; }
victim=""
for p in $(ip netns pids "$(ns_of 2)"); do
  case " $daemons " in *" $p "*) victim=$p; break ;; esac
done
[ -n "$victim" ] || fail "no moed rank found on host 2"
kill -9 "$victim"
touch "$SCRATCH/resume"
restarted() {
  local now
  now=$(pgrep -f -- "^$MOED .*$sock" | tr '\n' ' ')
  [ "$(echo $now | wc -w)" = 4 ] && ! echo " $now " | grep -q " $victim " && all_up
}
wait_until 120 restarted || { cat "$SCRATCH/cluster.txt" >&2; fail "the job did not come back within 120 s"; }
wait $survivor || { cat "$SCRATCH/killed.txt" >&2; tail -20 "$SCRATCH/cluster.txt" >&2; fail "a client on host 3 failed across the rank's death"; }
same_bits "$SCRATCH/unix.bin" "$SCRATCH/killed.bin" "8 clients on host 3 across a rank killed on host 2 and the job's restart"
grep -q "restarting mpirun (1 of 1)" "$SCRATCH/cluster.txt" || fail "the launcher did not say it restarted the job"

"$MOECTL" --dir "$admin" shutdown >/dev/null
rc=0
wait $launcher || rc=$?
launcher=""
[ "$rc" = 0 ] || { cat "$SCRATCH/cluster.txt" >&2; fail "moed on the emulated cluster exited with $rc"; }
echo "ok: the daemons stopped cleanly"
