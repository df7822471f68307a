#!/usr/bin/env bash
# Shared by the elastic-serving tests across emulated hosts
# (test_elastic_hosts*.sh): launch/emulated-cluster with 4 hosts of 2 ranks'
# room each, moed's ranks on the first hosts, and host 4 an attention host
# whose front-door clients have every rank as a home. Skips (exit 77) where
# network namespaces cannot be created.
source "$(dirname "$0")/lib.sh"
: "${FRONT_DOOR_CHECK:?}" "${MOECTL:?}"
emu="$MOED_SOURCE_DIR/launch/emulated-cluster"

need_emulated_cluster "$emu"

head -c 32 /dev/urandom >"$SCRATCH/key" && chmod 600 "$SCRATCH/key"
sock=$SCRATCH/sock admin=$SCRATCH/admin
launcher="" joiner=""  # the emulated cluster's launcher; a process started outside it (moed --join)
cleanup() {
  [ -z "$joiner" ] || kill -KILL "$joiner" 2>/dev/null || true
  if [ -n "$launcher" ]; then
    kill -TERM "$launcher" 2>/dev/null || true
    wait "$launcher" 2>/dev/null || true
  fi
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

# moed's arguments on every host (a test adds its own after them).
hosts_args=(--config "$SMALL" --set workload.kind=ingress --set "ingress.dir=\"$sock\"" --set "admin.dir=\"$admin\""
  --set 'ingress.listen="*:17400"' --set "ingress.key_file=\"$SCRATCH/key\"" --set 'ingress.transports="tcp"'
  --set 'comm.backend="ucx"' --set 'comm.control="transport"' --set comm.timeout_ms=5000 --set comm.elastic=true
  --set 'log.level="info"')

# start_hosts NP [MOED ARGS...]: NP ranks under mpirun --enable-recovery
# (2 per host from host 1) in the background, their log in cluster.txt, once
# the first `ranks` front doors are open; then a4 names host 4's namespace.
ranks=6
start_hosts() {
  local np=$1
  shift
  "$emu" --hosts 4 --ranks-per-host 2 -- --enable-recovery "${mpirun_extra[@]}" -np "$np" "$MOED" "${hosts_args[@]}" \
    "$@" >"$SCRATCH/cluster.txt" 2>&1 &
  launcher=$!
  wait_until 120 doors_open || { cat "$SCRATCH/cluster.txt" >&2; fail "the $ranks ranks' front doors did not open within 120 s"; }
  a4=$(ns_of 4)
  [ -n "$a4" ] || { cat "$SCRATCH/cluster.txt" >&2; fail "cannot find host 4"; }
}
mpirun_extra=()  # mpirun's own arguments (-x VAR)
doors_open() { for ((r = 0; r < ranks; r++)); do [ -s "$sock/moed-ingress-$r.ucx" ] || return 1; done; }
ns_of() { grep -oE "\bmoed4-[0-9]+-h$1\b" "$SCRATCH/cluster.txt" | head -1; }  # ns_of HOST: its namespace
logged_times() { [ "$(grep -c -- "$1" "$SCRATCH/cluster.txt")" = "$2" ]; }  # logged_times TEXT N
fail_seeing() {  # fail_seeing WHAT: fails, showing what the ranks said of losses and errors first
  grep -E "lost|epoch|fenced|went on|error|critical" "$SCRATCH/cluster.txt" | tail -40 >&2 || true
  fail "$1"
}
pid_of() {  # pid_of WORLD_RANK: its daemon (the namespaces share the process table)
  local p
  for p in $(pgrep -f -- "^$MOED .*$sock"); do
    tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=$1" && { echo "$p"; return; }
  done
}
clients() {  # clients OUT [front_door_check args]: on host 4, one per rank, the first `ranks` ranks all homes
  local out=$1
  shift
  ip netns exec "$a4" env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "$FRONT_DOOR_CHECK" --dir "$sock" --ranks "$ranks" \
    --mode concurrent --clients-per-rank 1 --key-file "$SCRATCH/key" --all-homes --out "$SCRATCH/$out.bin" "$@"
}
paused_clients() {  # paused_clients NAME: in the background, paused with submits in flight
  rm -f "$SCRATCH/resume-$1"
  clients "$1" --pause-after 12 --resume-file "$SCRATCH/resume-$1" >"$SCRATCH/$1.txt" 2>&1 &
  client_pid=$!
  wait_until 60 grep -q paused "$SCRATCH/$1.txt" || { cat "$SCRATCH/$1.txt" >&2; fail "$1: the clients did not pause"; }
}
clients_done() {  # clients_done NAME WHAT: let go, all calls succeeded, the undisturbed run's bits
  touch "$SCRATCH/resume-$1"
  wait "$client_pid" || { cat "$SCRATCH/$1.txt" >&2; fail_seeing "$2: a client call failed"; }
  same_bits "$SCRATCH/reference.bin" "$SCRATCH/$1.bin" "$2"
}
