#!/usr/bin/env bash
# A full or read-only disk never stops serving (common/write_retry.h):
#   - an output folder that cannot be written is refused at start (exit 2);
#   - [stats].file on a full 1 MB tmpfs: the write fails, serving goes on,
#     the failure is logged, shown in status alerts and in the metrics, the
#     last good file stays, and the write succeeds again once there is room;
#   - [placement].committed on a read-only mount: the migration aborts before
#     its switch (every rank stays on epoch 0) and says why.
# Needs root for the tmpfs mount; skipped (77) without it.
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}"
disk=$SCRATCH/disk
mkdir -p "$disk"
mount -t tmpfs -o size=1m tmpfs "$disk" 2>/dev/null || { echo "skip: cannot mount a tmpfs (needs root)"; exit 77; }
pid=""
cleanup() {
  [ -z "$pid" ] || end_daemon "$pid"
  umount "$disk" 2>/dev/null || umount -l "$disk" 2>/dev/null || true
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

run=$SCRATCH/run
mkdir -p "$run"
ctl() { "$MOECTL" --dir "$run/admin" "$@"; }
field() { ctl --json status | python3 -c "import json,sys; print(json.loads(sys.stdin.readline())$1)"; }

mpirun --bind-to none -np 4 "$MOED" --config "$SMALL" --set workload.steps=1000000 --set metrics.load_window_steps=8 \
  --set "admin.dir=\"$run/admin\"" --set "stats.file=\"$disk/stats.bin\"" --set stats.every_steps=20 \
  --set "placement.committed=\"$disk/committed.toml\"" --log-level info >"$run/log" 2>&1 &
pid=$!
written() { kill -0 "$pid" || fail "moed exited at start"; [ -s "$disk/stats.bin" ]; }
wait_until 120 written || { cat "$run/log" >&2; fail "no statistics file written within 120 s"; }

# Fill the disk: the next writes fail.
dd if=/dev/zero of="$disk/fill" bs=64k >/dev/null 2>&1 || true
wait_until 120 grep -q "cannot write the statistics file.*the last good file is kept, serving goes on" "$run/log" ||
  { cat "$run/log" >&2; fail "no log of the failed statistics write"; }
good=$(md5sum <"$disk/stats.bin")  # the last good file, from before the failures
step1=$(field '["step"]')
served_on() { step2=$(field '["step"]') && [ "$step2" -gt "$step1" ]; }
wait_until 60 served_on || fail "serving stopped on a full disk (step $step1 -> $step2 in 60 s)"
[ "$(md5sum <"$disk/stats.bin")" = "$good" ] || fail "the last good statistics file changed"
alerted() { field '["alerts"]' | grep -q "cannot write the statistics file"; }
wait_until 60 alerted || { ctl status; fail "no alert in status"; }
ctl metrics | grep -Eq '^moed_file_write_failures_total\{file="stats"\} [1-9]' ||
  { ctl metrics | grep write_failures; fail "the metrics do not count the failed writes"; }
echo "ok: a full disk: serving goes on (step $step1 -> $step2), alert: $(field '["alerts"][0]' | cut -c1-100)"

# Room again: the next try (backoff 1, 2, 4 s ...) writes it. As long as
# the status alert names a next try, the wait lasts until 30 s after it.
rm -f "$disk/fill"
next_try_s() {
  ctl --json status | python3 -c 'import json, re, sys
alerts = " ".join(json.loads(sys.stdin.readline()).get("alerts") or [])
m = re.search(r"statistics file.*?next try in (\d+) s", alerts)
print(m.group(1) if m else "")'
}
deadline=$((SECONDS + 30))
until grep -q "written again after" "$run/log"; do
  next=$(next_try_s) || next=""
  [ -z "$next" ] || [ $((SECONDS + next + 30)) -le "$deadline" ] || deadline=$((SECONDS + next + 30))
  [ "$SECONDS" -lt "$deadline" ] || { tail -5 "$run/log" >&2; fail "not written again 30 s after its next try"; }
  sleep 0.2
done
grep -q "the statistics file .* written again after" "$run/log" || { tail -5 "$run/log" >&2; fail "not written again"; }
echo "ok: $(grep -m1 'written again' "$run/log" | cut -c1-140)"

# A read-only committed placement: the migration aborts before its switch.
# The remount is refused while a file on the mount is open for writing (the
# statistics, written every 20 steps): it is tried again until it takes.
wait_until 30 bash -c "mount -o remount,ro '$disk' 2>/dev/null" || fail "$disk could not be made read-only in 30 s"
rc=0
ctl migrate 1 3 0 >"$run/ctl.out" 2>&1 || rc=$?
[ "$rc" = 1 ] || { cat "$run/ctl.out" >&2; fail "migrate with a read-only committed file: exit $rc, expected 1"; }
grep -q "aborted.*before the switch: \[placement\].committed .* cannot be written" "$run/ctl.out" ||
  { cat "$run/ctl.out" >&2; fail "the abort does not say why"; }
[ "$(ctl --json placement | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["epoch"])')" = 0 ] ||
  fail "a rank switched although the committed file could not be written"
for r in 1 2 3; do
  [ "$(ctl --rank $r --json placement | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline())["epoch"])')" = 0 ] ||
    fail "rank $r switched"
done
echo "ok: a read-only committed file: $(grep -m1 aborted "$run/ctl.out" | cut -c1-140)"
ctl shutdown >/dev/null
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
rc=0
wait "$pid" || rc=$?
pid=""
[ "$rc" = 0 ] || { tail -20 "$run/log" >&2; fail "moed exited $rc after the disk faults"; }
mount -o remount,rw "$disk"

# At start, a folder that cannot be written is refused.
mkdir -p "$disk/ro" && mount -t tmpfs -o size=64k,ro tmpfs "$disk/ro"
expect_failure 2 "\[stats\]\.file .*/ro/stats.bin: cannot write into .*/ro: Read-only file system" \
  "a statistics file in a read-only folder" -- "$MOED" --config "$SMALL" --set "stats.file=\"$disk/ro/stats.bin\""
expect_failure 2 "\[placement\]\.committed .*: cannot write into" \
  "a committed placement in a read-only folder" -- "$MOED" --config "$SMALL" --set "placement.committed=\"$disk/ro/p.toml\""
umount "$disk/ro"
