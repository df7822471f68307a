#!/usr/bin/env bash
# The emulated cluster (launch/emulated-cluster): moed on 2 hosts x 2 ranks,
# each host a network namespace with its own host name, linked through a
# rate-limited bridge. The outputs are bit-identical to a single process, the
# islands come from the host names, bytes cross between them, and nothing of
# the cluster is left behind: after a good run, a failing run, a setup that
# fails halfway, and a run stopped with SIGTERM.
# Skipped (exit 77) only where network namespaces cannot be created.
source "$(dirname "$0")/lib.sh"
emu="$MOED_SOURCE_DIR/launch/emulated-cluster"
cluster=(--hosts 2 --ranks-per-host 2)

need_emulated_cluster "$emu"

# no_residue OUT WHAT: none of the namespaces, links or temporary files named in
# the launcher's output OUT exists any more.
no_residue() {
  local out=$1 what=$2 names name dir
  names=$(grep -oE '\b(moed[0-9]+-[0-9]+-h[0-9]+|moebr[0-9]+|moe[0-9]+h[0-9]+)\b' "$out" | sort -u)
  [ -n "$names" ] || { cat "$out" >&2; fail "$what: the launcher named no namespace or link"; }
  for name in $names; do
    case "$name" in
    moed*)
      if [ -e "/run/netns/$name" ] || ip netns list | grep -qE "^$name( |$)"; then
        fail "$what: namespace $name is left behind"
      fi
      ;;
    *) ! ip link show dev "$name" >/dev/null 2>&1 || fail "$what: link $name is left behind" ;;
    esac
  done
  while read -r dir; do
    [ -z "$dir" ] || [ ! -e "$dir" ] || fail "$what: temporary directory $dir is left behind"
  done < <(grep -oE '/tmp/moed-emu\.[A-Za-z0-9]+' "$out" | sort -u)
  echo "ok: $what: nothing left behind ($(echo "$names" | wc -l) namespaces and links checked)"
}

# emulated OUT -- MOED_ARGS...: moed on the emulated cluster; returns its exit code.
emulated() {
  local out=$1
  shift 2
  timeout 120 "$emu" "${cluster[@]}" -- "$MOED" "$@" >"$out" 2>&1
}

# 1. A good run: bit-exact, 2 islands by host name, bytes between them.
moed_on 0 --config "$SMALL" --dump-output "$SCRATCH/ref.bin" >/dev/null
start=$SECONDS
rc=0
emulated "$SCRATCH/run.txt" -- --config "$SMALL" --log-level info \
  --dump-output "$SCRATCH/emu.bin" --report-json "$SCRATCH/emu.json" || rc=$?
[ "$rc" = 0 ] || { cat "$SCRATCH/run.txt" >&2; fail "moed on the emulated cluster: exit code $rc"; }
echo "ok: moed on 2 emulated hosts x 2 ranks ran in $((SECONDS - start)) s"
same_bits "$SCRATCH/ref.bin" "$SCRATCH/emu.bin" "emulated 2 hosts x 2 ranks vs 1 process"
for h in 1 2; do
  grep -qE "\] info on moed2-[0-9]+-h$h \(local rank 1 of 2" "$SCRATCH/run.txt" ||
    { cat "$SCRATCH/run.txt" >&2; fail "no rank says it runs on host h$h (local rank 1 of 2)"; }
done
echo "ok: ranks see their namespace's host name"
python3 - "$SCRATCH/emu.json" <<'EOF' || fail "the report of the emulated run is wrong"
import json, sys
r = json.load(open(sys.argv[1]))
errors = []
if r["ranks"] != 4: errors.append(f"ranks {r['ranks']}, expected 4")
if r["islands"] != 2: errors.append(f"islands {r['islands']}, expected 2 (one per host)")
if not r["bytes_sent"]["cross_island"] > 0: errors.append(f"cross_island bytes {r['bytes_sent']['cross_island']}")
for e in errors: print("report:", e, file=sys.stderr)
if not errors: print(f"ok: report: 4 ranks, 2 islands, {r['bytes_sent']['cross_island']} cross-island bytes")
sys.exit(1 if errors else 0)
EOF
no_residue "$SCRATCH/run.txt" "after a good run"

# Both dispatch routes, where moed has the choice ([comm].hierarchical): the
# run above took the default; the other one must give the same bits too.
"$MOED" --print-config >"$SCRATCH/print-config.toml"
if grep -q '^hierarchical' "$SCRATCH/print-config.toml"; then
  default=$(sed -n 's/^hierarchical = //p' "$SCRATCH/print-config.toml")
  other=$([ "$default" = true ] && echo false || echo true)
  rc=0
  emulated "$SCRATCH/other.txt" -- --config "$SMALL" --set "comm.hierarchical=$other" \
    --dump-output "$SCRATCH/other.bin" --report-json "$SCRATCH/other.json" || rc=$?
  [ "$rc" = 0 ] || { cat "$SCRATCH/other.txt" >&2; fail "moed with comm.hierarchical=$other: exit code $rc"; }
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/other.bin" "emulated 2 hosts x 2 ranks, comm.hierarchical=$other vs 1 process"
  python3 - "$SCRATCH/emu.json" "$SCRATCH/other.json" "$default" <<'EOF' ||
import json, sys
a, b = (json.load(open(f))["bytes_sent"]["cross_island"] for f in sys.argv[1:3])
hier, flat = (a, b) if sys.argv[3] == "true" else (b, a)
print(f"ok: cross-island bytes: hierarchical {hier}, flat {flat} ({hier / flat:.2f}x)")
sys.exit(0 if hier < flat else 1)
EOF
    fail "hierarchical dispatch does not send fewer cross-island bytes than flat"
  no_residue "$SCRATCH/other.txt" "after a run with comm.hierarchical=$other"
else
  echo "note: this moed has no [comm].hierarchical key: one dispatch route tested"
fi

# 2. A failing run (a flag moed refuses): moed's exit code comes back.
rc=0
emulated "$SCRATCH/bad.txt" -- --config "$SMALL" --no-such-flag || rc=$?
[ "$rc" = 2 ] || { cat "$SCRATCH/bad.txt" >&2; fail "moed with a bad flag on the emulated cluster: exit code $rc, expected 2"; }
grep -q 'no-such-flag' "$SCRATCH/bad.txt" || { cat "$SCRATCH/bad.txt" >&2; fail "moed did not name the bad flag"; }
echo "ok: a failing moed run returns its exit code 2"
no_residue "$SCRATCH/bad.txt" "after a failing run"

# 3. A setup that fails halfway (test hook): exit 3, what was made is removed.
rc=0
MOED_EMU_FAULT=setup timeout 60 "$emu" --hosts 3 -- "$MOED" --version >"$SCRATCH/setup.txt" 2>&1 || rc=$?
[ "$rc" = 3 ] || { cat "$SCRATCH/setup.txt" >&2; fail "a setup failing halfway: exit code $rc, expected 3"; }
grep -q 'setup failed' "$SCRATCH/setup.txt" || fail "a setup failing halfway did not say so"
echo "ok: a setup failing halfway exits with 3"
no_residue "$SCRATCH/setup.txt" "after a setup that failed halfway"

# 4. SIGTERM while moed serves: mpirun is stopped, everything is removed.
"$emu" "${cluster[@]}" -- "$MOED" --config "$SMALL" --set workload.steps=1000000 >"$SCRATCH/term.txt" 2>&1 &
pid=$!
# Until a process runs in the second host's namespace (the remote launch
# done), up to 60 s.
ns=""
h2_runs() {
  [ -n "$ns" ] || ns=$(grep -oE '\bmoed2-[0-9]+-h2\b' "$SCRATCH/term.txt" | head -1) || true
  [ -n "$ns" ] && [ -n "$(ip netns pids "$ns" 2>/dev/null)" ]
}
wait_until 60 h2_runs ||
  { kill -TERM "$pid"; cat "$SCRATCH/term.txt" >&2; fail "no process runs in the second host's namespace within 60 s"; }
kill -TERM "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" = 143 ] || { cat "$SCRATCH/term.txt" >&2; fail "the launcher stopped by SIGTERM: exit code $rc, expected 143"; }
echo "ok: SIGTERM during a run exits with 143"
no_residue "$SCRATCH/term.txt" "after SIGTERM during a run"

# 5. Usage: a dry run creates nothing; bad options are refused with 2.
"$emu" "${cluster[@]}" --rate 100mbit --dry-run -- "$MOED" --config "$SMALL" >"$SCRATCH/dry.txt" ||
  fail "--dry-run failed"
grep -qE '^mpirun .*--host moed2-[0-9]+-h1:2,moed2-[0-9]+-h2:2 .*--mca btl_tcp_if_include 10\.211\.[0-9]+\.0/24 ' "$SCRATCH/dry.txt" ||
  { cat "$SCRATCH/dry.txt" >&2; fail "--dry-run does not print the mpirun command"; }
grep -q '100mbit each way' "$SCRATCH/dry.txt" || fail "--dry-run does not print the rate"
no_residue "$SCRATCH/dry.txt" "after a dry run"
expect_failure 2 'hosts must be an integer' "--hosts 0" -- "$emu" --hosts 0 -- true
expect_failure 2 'rate must be' "a bad rate" -- "$emu" --hosts 2 --rate fast -- true
expect_failure 2 'nothing to run' "no program" -- "$emu" --hosts 2
