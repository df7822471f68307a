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
for _ in $(seq 600); do [ -s "$disk/stats.bin" ] && break; kill -0 "$pid" || fail "moed exited at start"; sleep 0.1; done
[ -s "$disk/stats.bin" ] || { cat "$run/log" >&2; fail "no statistics file written"; }

# Fill the disk: the next writes fail.
dd if=/dev/zero of="$disk/fill" bs=64k >/dev/null 2>&1 || true
for _ in $(seq 300); do grep -q "cannot write the statistics file" "$run/log" && break; sleep 0.1; done
grep -q "cannot write the statistics file.*the last good file is kept, serving goes on" "$run/log" ||
  { cat "$run/log" >&2; fail "no log of the failed statistics write"; }
good=$(md5sum <"$disk/stats.bin")  # the last good file, from before the failures
step1=$(field '["step"]')
sleep 1
step2=$(field '["step"]')
[ "$step2" -gt "$step1" ] || fail "serving stopped on a full disk (step $step1 -> $step2)"
[ "$(md5sum <"$disk/stats.bin")" = "$good" ] || fail "the last good statistics file changed"
for _ in $(seq 100); do field '["alerts"]' | grep -q "cannot write the statistics file" && break; sleep 0.1; done
field '["alerts"]' | grep -q "cannot write the statistics file" || { ctl status; fail "no alert in status"; }
ctl metrics | grep -Eq '^moed_file_write_failures_total\{file="stats"\} [1-9]' ||
  { ctl metrics | grep write_failures; fail "the metrics do not count the failed writes"; }
echo "ok: a full disk: serving goes on (step $step1 -> $step2), alert: $(field '["alerts"][0]' | cut -c1-100)"

# Room again: the next try (backoff 1, 2, 4 s ...) writes it.
rm -f "$disk/fill"
for _ in $(seq 150); do grep -q "written again after" "$run/log" && break; sleep 0.1; done
grep -q "the statistics file .* written again after" "$run/log" || { tail -5 "$run/log" >&2; fail "not written again"; }
echo "ok: $(grep -m1 'written again' "$run/log" | cut -c1-140)"

# A read-only committed placement: the migration aborts before its switch.
mount -o remount,ro "$disk"
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
