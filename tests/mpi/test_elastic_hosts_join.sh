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
source "$(dirname "$0")/elastic_hosts_lib.sh"

join_args=(--set comm.join_slots=1 --set 'comm.join_listen="0.0.0.0:17500"')
ranks=4
start_hosts 4 "${join_args[@]}"
h1=$(ns_of 1) h3=$(ns_of 3)
[ -n "$h1" ] && [ -n "$h3" ] || { cat "$SCRATCH/cluster.txt" >&2; fail "cannot find hosts 1 and 3"; }
h1_address=$(ip -n "$h1" -4 -o addr show veth0 | awk '{print $4}' | cut -d/ -f1)
[ -n "$h1_address" ] || fail "host 1 has no address"
clients reference >/dev/null || fail "the undisturbed clients on host 4"

# Host 3, in a UTS namespace of its own as the launcher's hosts are (its hostname names its island).
ip netns exec "$h3" unshare --uts bash -c 'hostname "$0" && exec "$@"' "$h3" \
  env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "$MOED" "${hosts_args[@]}" "${join_args[@]}" --join "$h1_address:17500" >"$SCRATCH/joiner.txt" 2>&1 &
joiner=$!
wait_until 60 logged_times "world rank(s) 4 joined (moed --join) at step .*epoch 2 serves on world ranks 0 1 2 3 4" 4 ||
  { cat "$SCRATCH/joiner.txt" >&2; fail "the 4 members did not all admit the joiner on host 3"; }
grep -q "world rank(s) 4 joined (moed --join)" "$SCRATCH/joiner.txt" || { cat "$SCRATCH/joiner.txt" >&2; fail "the joiner did not log its join"; }
wait_until 30 migration_committed "$admin" || fail "the migration to the joiner did not commit"
wait_until 30 test -s "$sock/moed-ingress-4.ucx" || fail "the joiner's front door did not open"
members=$("$MOECTL" --dir "$admin" --rank 4 --json status | python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['survivors']['members'])")
[ "$members" = "[0, 1, 2, 3, 4]" ] || fail "the joiner's status shows members $members"
echo "ok: moed --join on host 3 took world rank 4 (epoch 2) over the emulated network, and its share of the slots"

ranks=5
clients joined >/dev/null || fail "the clients on host 4 after the join"
same_bits "$SCRATCH/reference.bin" "$SCRATCH/joined.bin" "5 clients on host 4 with the joiner on host 3 among their homes"

"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
rc=0
wait "$joiner" || rc=$?
joiner=""
[ "$rc" = 0 ] || { tail -20 "$SCRATCH/joiner.txt" >&2; fail "the joiner exited $rc at the job's end"; }
wait_until 60 logged_times "leaving without MPI_Finalize" 4 || fail "the 4 members did not leave"
echo "ok: the members drained and left, the joiner with them (exit code 0)"
