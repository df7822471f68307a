#!/usr/bin/env bash
# Topology discovery end to end: each rank reads its host with hwloc (here a
# test XML per emulated host, through HWLOC_XMLFILE), and the job's islands
# come from the NVLink pairs: 2 hosts x 4 GPUs in two pairs -> 4 islands.
# Serving with those islands gives the same bits as serving without them.
source "$(dirname "$0")/lib.sh"
xml="$MOED_SOURCE_DIR/tests/data/topology"
# mpirun's app contexts take the moed flags per context: give them to both.
two_hosts() {
  mpirun --bind-to none \
    -np 4 -x "HWLOC_XMLFILE=$xml/2x4-nvlink-pairs-host1.xml" "$MOED" "$@" \
    : -np 4 -x "HWLOC_XMLFILE=$xml/2x4-nvlink-pairs-host2.xml" "$MOED" "$@"
}

two_hosts --print-topology >"$SCRATCH/topology.txt" 2>"$SCRATCH/topology.err" ||
  { cat "$SCRATCH/topology.err" >&2; fail "--print-topology failed"; }
grep -q '8 ranks on 2 hosts, 4 islands (from hwloc): {0,1} {2,3} {4,5} {6,7}' "$SCRATCH/topology.txt" ||
  { cat "$SCRATCH/topology.txt" >&2; fail "NVLink pairs did not give 4 islands"; }
echo "ok: --print-topology finds 4 NVLink islands on 2 hosts"

moed_on 0 --config "$SMALL" --dump-output "$SCRATCH/one.bin" >/dev/null
two_hosts --config "$SMALL" --dump-output "$SCRATCH/eight.bin" --report-json "$SCRATCH/eight.json" >/dev/null
same_bits "$SCRATCH/one.bin" "$SCRATCH/eight.bin" "8 ranks in hwloc's 4 NVLink islands vs 1 rank"
grep -q '"islands": 4' "$SCRATCH/eight.json" || fail "the report does not show 4 islands"
echo "ok: the report shows the 4 islands"

expect_failure 2 '\[cluster\]\.islands names 3 ranks, the job has 4' "explicit islands of the wrong length" -- \
  moed_on 4 --config "$SMALL" --set 'cluster.islands="0,0,1"'
expect_failure 2 'not an island number' "explicit islands that are not numbers" -- \
  moed_on 2 --config "$SMALL" --set 'cluster.islands="0,x"'
printf '<topology><broken' >"$SCRATCH/bad.xml"
expect_failure 2 'bad.xml' "an unreadable topology XML" -- \
  env HWLOC_XMLFILE="$SCRATCH/bad.xml" "$MOED" --config "$SMALL" --print-topology

# Flags given to one app context only: the ranks disagree at the first
# collective and say so, instead of waiting on different collectives.
expect_failure 2 'ranks were started differently.*rank 2 runs --print-topology' "ranks started with different flags" -- \
  mpirun --bind-to none -np 2 "$MOED" --config "$SMALL" : -np 2 "$MOED" --config "$SMALL" --print-topology
