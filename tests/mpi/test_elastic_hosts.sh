#!/usr/bin/env bash
# Elastic serving across emulated hosts (launch/emulated-cluster): a host's
# link set down. 4 hosts on a bridge; moed's 6 ranks on hosts 1-3 (2 each,
# one island per host, every expert on 2 islands: [placement].redundancy =
# 2), host 4 an attention host whose 6 clients have every rank as a home.
# With the clients paused mid-run, host 3's link goes down: no connection
# breaks, so the ranks of hosts 1-2 notice at their exchange's deadline
# ([comm].timeout_ms = 5 s) and agree on epoch 2 without world ranks 4 and 5,
# and the clients notice their silent homes (a ping unanswered for
# Options::home_silence_ms) and submit again to the others. Every call
# succeeds with the undisturbed run's bits (cmp). World rank 6, a spare on
# host 4 ([comm].spares = 1), is then admitted in place of the lost (epoch
# 3) and its share of the slots migrates to it over the emulated network;
# clients started after it get the same bits. Once the link is back, the
# cut-off ranks, which never had a majority, have given up and left.
# Skipped (exit 77) only where network namespaces cannot be created.
source "$(dirname "$0")/elastic_hosts_lib.sh"

start_hosts 7 --set placement.redundancy=2 --set comm.spares=1
h3=$(ns_of 3)
[ -n "$h3" ] || { cat "$SCRATCH/cluster.txt" >&2; fail "cannot find host 3"; }

# Host 3's daemons, found before its link goes down: once it is back up,
# they may learn they were left out and leave at once.
host_3_moeds=$(for p in $(ip netns pids "$h3"); do
  [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$(readlink -f "$MOED")" ] && echo "$p"
done)
[ -n "$host_3_moeds" ] || fail "no moed process found on host 3 (the check that they leave would pass for nothing)"

clients reference >/dev/null || fail "the undisturbed clients on host 4"
paused_clients down
ip -n "$h3" link set veth0 down
clients_done down "6 clients on host 4 across host 3's link set down"
# Epoch 1 is the serving ranks' from the start (the spare left out), epoch 2 the survivors'.
wait_until 30 logged_times "lost world rank(s) 4 5 at step .*epoch 2 serves on world ranks 0 1 2 3;" 4 ||
  fail_seeing "the 4 ranks of hosts 1 and 2 did not all go on without host 3's"
echo "ok: host 3's link down: world ranks 0-3 went on as epoch 2 (nothing loaded: every expert on 2 islands)"

# The spare on host 4 joins in place of the lost, and takes its share over the network.
wait_until 30 logged_times "world rank(s) 6 joined (spares) at step .*epoch 3 serves on world ranks 0 1 2 3 6" 5 ||
  fail_seeing "the spare on host 4 did not join the 4 survivors"
wait_until 30 migration_committed "$admin" || fail "the migration to the spare that joined did not commit"
echo "ok: spare world rank 6 (host 4) joined as epoch 3 and took its share of the slots over the network"

# The cut-off ranks never had a majority: they give up after 4 x
# timeout_ms, or, reached again once the link is back, learn that they were
# left out; either way they leave alone.
ip -n "$h3" link set veth0 up
host_3_left() {  # none of them runs (a zombie, not yet reaped, has no exe)
  local p
  for p in $host_3_moeds; do [ "$(readlink "/proc/$p/exe" 2>/dev/null)" = "$(readlink -f "$MOED")" ] && return 1; done
  return 0
}
wait_until 60 host_3_left || fail "host 3's ranks, cut off with no majority, are still running"
echo "ok: host 3's two ranks, cut off with no majority, left"

# New clients, whose homes on host 3 have closed, are served with the spare's slots.
clients joined >/dev/null || fail "the clients on host 4 after the spare joined"
same_bits "$SCRATCH/reference.bin" "$SCRATCH/joined.bin" "6 clients on host 4 after the spare on host 4 joined"

"$MOECTL" --dir "$admin" shutdown >/dev/null || fail "moectl shutdown"
wait_until 60 logged_times "leaving without MPI_Finalize" 5 || fail "the 4 survivors and the spare that joined did not leave"
echo "ok: the survivors drained and left"
