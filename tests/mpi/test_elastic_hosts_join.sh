#!/usr/bin/env bash
# A new host joins a running job across emulated hosts (launch/emulated-
# cluster): 4 ranks of moed on hosts 1 and 2 (one island each), one join
# slot ([comm].join_slots = 1) and rank 0's join listener on host 1; host 4
# an attention host whose clients have every rank as a home. On host 3,
# which held no rank, `moed --join` is started outside mpirun: it reaches
# rank 0 over the emulated network, every member reaches it, and rank 0
# admits it (epoch 2: world ranks 0-4);
# its share of the slots migrates to it over the network, and its front
# door opens. Clients started after, its door among their homes, get the
# undisturbed run's bits (cmp). A shutdown then ends the joiner too, with
# exit code 0. Skipped (exit 77) only where network namespaces cannot be
# created.
source "$(dirname "$0")/lib.sh"
: "${FRONT_DOOR_CHECK:?}" "${MOECTL:?}"
emu="$MOED_SOURCE_DIR/launch/emulated-cluster"

need_emulated_cluster "$emu"

head -c 32 /dev/urandom >"$SCRATCH/key" && chmod 600 "$SCRATCH/key"
sock=$SCRATCH/sock admin=$SCRATCH/admin
launcher="" joiner=""
cleanup() {
  [ -z "$joiner" ] || kill -KILL "$joiner" 2>/dev/null || true
  if [ -n "$launcher" ]; then
    kill -TERM "$launcher" 2>/dev/null || true
    wait "$launcher" 2>/dev/null || true
  fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

args=(--config "$SMALL" --set workload.kind=ingress --set "ingress.dir=\"$sock\"" --set "admin.dir=\"$admin\""
  --set 'ingress.listen="*:17400"' --set "ingress.key_file=\"$SCRATCH/key\"" --set 'ingress.transports="tcp"'
  --set 'comm.backend="ucx"' --set 'comm.control="transport"' --set comm.timeout_ms=5000 --set comm.elastic=true
  --set comm.join_slots=1 --set 'comm.join_listen="0.0.0.0:17500"' --set 'log.level="info"')
"$emu" --hosts 4 --ranks-per-host 2 -- --enable-recovery -np 4 "$MOED" "${args[@]}" >"$SCRATCH/cluster.txt" 2>&1 &
launcher=$!
all_up() { for r in 0 1 2 3; do [ -s "$sock/moed-ingress-$r.ucx" ] || return 1; done; }
wait_until 120 all_up || { cat "$SCRATCH/cluster.txt" >&2; fail "the 4 ranks' front doors did not open within 120 s"; }
ns_of() { grep -oE "\bmoed4-[0-9]+-h$1\b" "$SCRATCH/cluster.txt" | head -1; }
h1=$(ns_of 1) h3=$(ns_of 3) a4=$(ns_of 4)
[ -n "$h1" ] && [ -n "$h3" ] && [ -n "$a4" ] || { cat "$SCRATCH/cluster.txt" >&2; fail "cannot find the hosts"; }
h1_address=$(ip -n "$h1" -4 -o addr show veth0 | awk '{print $4}' | cut -d/ -f1)
[ -n "$h1_address" ] || fail "host 1 has no address"
logged_times() { [ "$(grep -c -- "$1" "$SCRATCH/cluster.txt")" = "$2" ]; }
clients() {  # clients OUT RANKS: on host 4, every rank a home
  ip netns exec "$a4" env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "$FRONT_DOOR_CHECK" --dir "$sock" --ranks "$2" \
    --mode concurrent --clients-per-rank 1 --key-file "$SCRATCH/key" --all-homes --out "$SCRATCH/$1.bin"
}
clients reference 4 >/dev/null || fail "the undisturbed clients on host 4"

# Host 3, in a UTS namespace of its own as the launcher's hosts are (its hostname names its island).
ip netns exec "$h3" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$h3" \
  env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "$MOED" "${args[@]}" --join "$h1_address:17500" >"$SCRATCH/joiner.txt" 2>&1 &
joiner=$!
wait_until 60 logged_times "world rank(s) 4 joined (moed --join) at step .*epoch 2 serves on world ranks 0 1 2 3 4" 4 ||
  { cat "$SCRATCH/joiner.txt" >&2; fail "the 4 members did not all admit the joiner on host 3"; }
grep -q "world rank(s) 4 joined (moed --join)" "$SCRATCH/joiner.txt" || { cat "$SCRATCH/joiner.txt" >&2; fail "the joiner did not log its join"; }
wait_until 30 migration_committed "$admin" || fail "the migration to the joiner did not commit"
wait_until 30 test -s "$sock/moed-ingress-4.ucx" || fail "the joiner's front door did not open"
islands=$("$MOECTL" --dir "$admin" --rank 4 --json status | python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['survivors']['members'])")
[ "$islands" = "[0, 1, 2, 3, 4]" ] || fail "the joiner's status shows members $islands"
echo "ok: moed --join on host 3 took world rank 4 (epoch 2) over the emulated network, and its share of the slots"

clients joined 5 >/dev/null || fail "the clients on host 4 after the join"
same_bits "$SCRATCH/reference.bin" "$SCRATCH/joined.bin" "5 clients on host 4 with the joiner on host 3 among their homes"

"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
rc=0
wait "$joiner" || rc=$?
joiner=""
[ "$rc" = 0 ] || { tail -20 "$SCRATCH/joiner.txt" >&2; fail "the joiner exited $rc at the job's end"; }
wait_until 60 logged_times "leaving without MPI_Finalize" 4 || fail "the 4 members did not leave"
echo "ok: the members drained and left, the joiner with them (exit code 0)"
