# Shared by the integration tests (sourced). The binaries come from CTest:
# MOED, MOE_PLACE, MOE_REFERENCE; MOED_SOURCE_DIR is the source tree.
set -euo pipefail
: "${MOED:?}" "${MOE_PLACE:?}" "${MOE_REFERENCE:?}" "${MOED_SOURCE_DIR:?}"
SMALL="$MOED_SOURCE_DIR/tests/mpi/small.toml"
SCRATCH=$(mktemp -d "${TMPDIR:-/tmp}/moed-test.XXXXXX")
trap 'rm -rf "$SCRATCH"' EXIT
if [ "$(id -u)" = 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
export OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# moed on N ranks (N = 0: a singleton process without mpirun).
moed_on() {
  local n=$1
  shift
  if [ "$n" = 0 ]; then
    "$MOED" "$@"
  else
    mpirun --bind-to none -np "$n" "$MOED" "$@"
  fi
}
export -f moed_on  # for `timeout bash -c` below

# end_daemon PID: SIGTERM, then SIGKILL if it is still there after 5 s (a
# daemon still in MPI_Init may not act on SIGTERM; a test must leave none).
end_daemon() {
  kill "$1" 2>/dev/null || return 0
  for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done
  kill -9 "$1" 2>/dev/null || true
}

# wait_until SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds;
# returns 1 when SECONDS pass first. Tests wait for states this way, with
# deadlines that a loaded machine cannot reach where nothing is wrong.
wait_until() {
  local deadline=$((SECONDS + $1))
  shift
  until "$@"; do
    [ "$SECONDS" -lt "$deadline" ] || return 1
    sleep 0.1
  done
}

# deadline_soon_after_stall: in the last expect_failure's output, a deadline
# fired within 30 s of the stalled rank's "MOED_FAULT: rank R stalls" line,
# by the HH:MM:SS.mmm stamps that moed's log lines start with (the start-up,
# however slow, is not in it; expect_failure bounds the whole run).
deadline_soon_after_stall() {
  local out="$SCRATCH/last-failure.txt" gap
  gap=$(python3 - "$out" <<'PY'
import re, sys
stamp = re.compile(r"^(\d\d):(\d\d):(\d\d\.\d+) ")
stalled = None
for line in open(sys.argv[1], errors="replace"):
    m = stamp.match(line)
    if not m:
        continue
    t = int(m[1]) * 3600 + int(m[2]) * 60 + float(m[3])
    if stalled is None and "MOED_FAULT: rank" in line and "stalls" in line:
        stalled = t
    elif stalled is not None and "deadline of" in line:
        print(f"{(t - stalled) % 86400:.1f}")  # across midnight too
        sys.exit(0)
sys.exit(f"{sys.argv[1]}: no stamped stall line followed by a deadline line")
PY
  ) || { cat "$out" >&2; fail "no stall, then a deadline, in the log"; }
  awk -v gap="$gap" 'BEGIN { exit !(gap < 30) }' || fail "the deadline fired ${gap} s after the stall"
  echo "ok: the deadline fired ${gap} s after the stall"
}

# same_bits A B WHAT: the two output dumps are identical byte for byte.
# need_emulated_cluster LAUNCHER: exits 77 (skipped) where the emulated
# cluster cannot run (no network namespaces), fails if its check breaks.
need_emulated_cluster() {
  local rc=0
  "$1" --check >"$SCRATCH/check.txt" 2>&1 || rc=$?
  if [ "$rc" = 2 ]; then
    echo "SKIP: the emulated cluster cannot run here: $(cat "$SCRATCH/check.txt")"
    exit 77
  fi
  [ "$rc" = 0 ] || { cat "$SCRATCH/check.txt" >&2; fail "emulated-cluster --check: exit code $rc"; }
}

same_bits() {
  cmp -s "$1" "$2" || fail "$3: outputs differ ($(cmp "$1" "$2" 2>&1 | head -1))"
  echo "ok: $3"
}

# expect_failure CODE PATTERN WHAT -- COMMAND...: exits with CODE and says PATTERN
# (an extended regex) on stderr or stdout, within 60 s.
expect_failure() {
  local code=$1 pattern=$2 what=$3
  shift 4
  local out="$SCRATCH/last-failure.txt" rc=0
  timeout 60 bash -c '"$@"' _ "$@" >"$out" 2>&1 || rc=$?
  [ "$rc" = "$code" ] || { cat "$out" >&2; fail "$what: exit code $rc, expected $code"; }
  grep -Eq -- "$pattern" "$out" || { cat "$out" >&2; fail "$what: output lacks /$pattern/"; }
  echo "ok: $what -> exit $code: $(grep -Em1 -- "$pattern" "$out" | cut -c1-160)"
}

# migration_committed ADMIN_DIR: the coordinator's last migration has
# committed (moectl migration; answered while the daemon is idle too).
migration_committed() {
  [ "$("$MOECTL" --dir "$1" --json migration | python3 -c "import json, sys; \
print((json.loads(sys.stdin.readline()).get('migration') or {}).get('state'))")" = committed ]
}
