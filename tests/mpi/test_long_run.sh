#!/usr/bin/env bash
# A daemon runs for months: what it keeps and its memory must not grow with
# the steps it has served. One rank serves a tiny shape (8 layers x 64
# experts, H=16, 64 tokens per step) for 1,000 and then 10,000 steps, with
# the admin socket and the statistics on. The report must hold as many
# samples after 10,000 steps as after 1,000 (retained_samples in its JSON),
# and peak memory must grow by less than 2 MB. Before the report was
# bounded, the 10,000-step run grew by 40 MB (and took 3.7x the time per
# step). The time per step is printed, not checked: two runs on a shared
# machine see different loads (bench/long_run.sh measures it).
source "$(dirname "$0")/lib.sh"

run() {  # run STEPS: prints "seconds max_rss_kb retained_samples" of one whole moed process
  rm -rf "$SCRATCH/admin" && mkdir -p "$SCRATCH/admin"
  python3 - "$MOED" "$1" "$SCRATCH" <<'PY'
import json, resource, subprocess, sys, time
moed, steps, scratch = sys.argv[1], sys.argv[2], sys.argv[3]
sets = ["model.layers=8", "model.experts=64", "model.hidden=16", "model.ffn=16",
        "workload.tokens_per_step=64", "workload.warmup_steps=1", f"workload.steps={steps}",
        'log.level="warn"', f'admin.dir="{scratch}/admin"', f'stats.file="{scratch}/stats.json"']
args = [moed] + [x for s in sets for x in ("--set", s)] + ["--report-json", f"{scratch}/report.json"]
start = time.monotonic()
subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
seconds = time.monotonic() - start
retained = json.load(open(f"{scratch}/report.json"))["retained_samples"]
print(seconds, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss, retained)
PY
}
read -r short_s short_kb short_kept < <(run 1000)
read -r long_s long_kb long_kept < <(run 10000)
python3 - "$short_s" "$short_kb" "$short_kept" "$long_s" "$long_kb" "$long_kept" <<'PY' || fail "what the report keeps or the memory grows with the steps"
import sys
short_s, short_kb, short_kept, long_s, long_kb, long_kept = map(float, sys.argv[1:])
per_step = (long_s / 10000) / (short_s / 1000)
grown_mb = (long_kb - short_kb) / 1024
print(f"1,000 steps: {short_s:.2f} s, {short_kb / 1024:.1f} MB, {short_kept:.0f} samples kept; 10,000 steps: "
      f"{long_s:.2f} s, {long_kb / 1024:.1f} MB, {long_kept:.0f} samples kept; memory +{grown_mb:.1f} MB "
      f"(time per step {per_step:.2f}x, not checked)")
sys.exit(0 if long_kept == short_kept and grown_mb < 2 else 1)
PY
echo "ok: what the report keeps and the memory stay flat over 10,000 steps"
