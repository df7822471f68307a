#!/usr/bin/env bash
# A daemon runs for months: its cost and memory per step must not grow with
# the steps it has served. One rank serves a tiny shape (8 layers x 64
# experts, H=16, 64 tokens per step) for 1,000 and then 10,000 steps, with
# the admin socket and the statistics on. The longer run must take at most
# 1.6x the time per step of the shorter one (whose time also holds the
# start-up), and peak memory must grow by less than 2 MB. Before the report
# was bounded, the 10,000-step run took 3.7x per step and grew by 40 MB.
source "$(dirname "$0")/lib.sh"

run() {  # run STEPS: prints "seconds max_rss_kb" of one whole moed process
  rm -rf "$SCRATCH/admin" && mkdir -p "$SCRATCH/admin"
  python3 - "$MOED" "$1" "$SCRATCH" <<'PY'
import resource, subprocess, sys, time
moed, steps, scratch = sys.argv[1], sys.argv[2], sys.argv[3]
sets = ["model.layers=8", "model.experts=64", "model.hidden=16", "model.ffn=16",
        "workload.tokens_per_step=64", "workload.warmup_steps=1", f"workload.steps={steps}",
        'log.level="warn"', f'admin.dir="{scratch}/admin"', f'stats.file="{scratch}/stats.json"']
args = [moed] + [x for s in sets for x in ("--set", s)]
start = time.monotonic()
subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
print(time.monotonic() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
PY
}
read -r short_s short_kb < <(run 1000)
read -r long_s long_kb < <(run 10000)
python3 - "$short_s" "$short_kb" "$long_s" "$long_kb" <<'PY' || fail "cost or memory per step grows"
import sys
short_s, short_kb, long_s, long_kb = map(float, sys.argv[1:])
per_step = (long_s / 10000) / (short_s / 1000)
grown_mb = (long_kb - short_kb) / 1024
print(f"1,000 steps: {short_s:.2f} s, {short_kb / 1024:.1f} MB; 10,000 steps: {long_s:.2f} s, "
      f"{long_kb / 1024:.1f} MB; time per step {per_step:.2f}x, memory +{grown_mb:.1f} MB")
sys.exit(0 if per_step <= 1.6 and grown_mb < 2 else 1)
PY
echo "ok: cost and memory per step stay flat over 10,000 steps"
