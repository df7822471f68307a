#!/usr/bin/env bash
# The Transport backends (comm/): transport_check's exact-bytes checks of
# exchange, exchange_sizes, all_gather and windows at 2 and 4 ranks, with
# UCX's default transports and with tcp alone (where a put completes only
# while its target progresses); moed's outputs bitwise identical over ucx and
# mpi; "auto" picks ucx here and falls back to mpi where UCX cannot start; an
# explicit backend that cannot run says why; and the UCX deadline fires with
# its diagnostic when a rank stalls.
source "$(dirname "$0")/lib.sh"
: "${TRANSPORT_CHECK:?}"
base=(--config "$SMALL")

# check N WHAT [ENV...] -- ARGS...: transport_check on N ranks passes.
check() {
  local n=$1 what=$2
  shift 2
  local envs=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  timeout 300 env "${envs[@]}" mpirun --bind-to none -np "$n" "$TRANSPORT_CHECK" "$@" \
    >"$SCRATCH/check.txt" 2>&1 || { cat "$SCRATCH/check.txt" >&2; fail "transport_check: $what"; }
  echo "ok: transport_check, $what: $(grep -c '^ok' "$SCRATCH/check.txt") backends pass"
}

for n in 2 4; do
  check "$n" "ucx and mpi on $n ranks" -- --backend ucx --backend mpi
  # tcp on loopback only: other interfaces may come and go on a shared machine.
  check "$n" "ucx over tcp on $n ranks" UCX_TLS=tcp,self UCX_NET_DEVICES=lo -- --backend ucx
done

moed_on 0 "${base[@]}" --dump-output "$SCRATCH/ref.bin" >"$SCRATCH/report.txt"
for n in 2 4; do
  for backend in mpi ucx; do
    moed_on "$n" "${base[@]}" --set comm.backend=$backend --dump-output "$SCRATCH/$backend$n.bin" \
      --report-json "$SCRATCH/$backend$n.json" >"$SCRATCH/report.txt"
    grep -Eq "\"transport\": *\"$backend\"" "$SCRATCH/$backend$n.json" ||
      fail "comm.backend=$backend: the report names another transport"
  done
  same_bits "$SCRATCH/mpi$n.bin" "$SCRATCH/ucx$n.bin" "ucx vs mpi backend, $n ranks"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/ucx$n.bin" "ucx backend, $n ranks vs 1"
done

# The default backend is "auto": ucx wherever UCX starts, else mpi.
moed_on 2 "${base[@]}" --report-json "$SCRATCH/auto.json" >/dev/null
grep -Eq '"transport": *"ucx"' "$SCRATCH/auto.json" || fail "the default backend is not ucx here"
echo "ok: the default backend (auto) is ucx"
UCX_TLS=no-such-transport moed_on 2 "${base[@]}" --report-json "$SCRATCH/fallback.json" \
  >/dev/null 2>&1 || fail "auto without a usable UCX transport did not run"
grep -Eq '"transport": *"mpi"' "$SCRATCH/fallback.json" || fail "auto did not fall back to mpi"
echo "ok: auto falls back to mpi where UCX cannot start"
expect_failure 2 '\[comm\]\.backend = "ucx" cannot run here: ucp_init' \
  "comm.backend=ucx where UCX cannot start says why" -- \
  env UCX_TLS=no-such-transport mpirun --bind-to none -np 2 "$MOED" "${base[@]}" --set comm.backend=ucx

# A stalled rank: the UCX exchange's deadline names it, and the job ends.
expect_failure 1 'rank [02]: .*deadline of 1500 ms expired; still waiting for data from ranks \[1\]' \
  "ucx: a stalled rank ends the job with a diagnostic" -- \
  env MOED_FAULT=stall:rank=1,step=1 \
  mpirun --bind-to none -np 3 "$MOED" "${base[@]}" --set comm.backend=ucx --set comm.timeout_ms=1500
deadline_soon_after_stall
