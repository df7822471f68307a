#!/usr/bin/env bash
# The router policies' benchmark (docs/router-policies.md): prints figures,
# asserts nothing (the machines are shared and noisy; compare within a run).
#   tests/bench/router_policies.sh [BUILD_DIR] [RANKS]
# (a) the skewed synthetic workload (hottest expert 2.75x the mean, OLMoE's
#     skew) on the default model (8 experts, top-2), requests of 8 positions
#     (drift 0.62: about 1 in 8 tokens flips from its previous position), on
#     RANKS ranks (default 2): each policy against none: expert load std/mean
#     and max/mean (the report's window), step p99, the router's own pairs
#     changed (changed_rate), pairs moved or dropped and their gate-weight
#     mass, the jitter (noise 1e-4 and 1e-3, and across a request's
#     positions), how far the outputs move from none's (per token,
#     ||h - h_none|| / ||h_none|| of the final hidden state: mean and max),
#     and the lower bound: the fewest pairs ANY re-routing of none's window
#     loads must move to reach that row's std/mean (bench_router_policies
#     --bound-of; the header gives it for the aim, 0.10);
# (b) smoothing at several betas: the jitter against that output change;
# (c) the same workload OLMoE-shaped: 64 experts, top-8 (H=256, F=512 to
#     keep the run short);
# (a) and (c) include demotion to a target spread (demotion_target), the
#     policy that meets the aim: std/mean 0.10 within 1.25x of the bound;
# (d) the Mixtral trace's expert popularity, offline (bench_router_policies);
#     and the trace replayed in the daemon: none against drop (the only
#     policy that applies to replayed routing).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
ranks=${2:-2}
moed=$build/apps/moed
offline=$build/tests/bench_router_policies
for b in "$moed" "$offline"; do [ -x "$b" ] || { echo "build first: $b is missing" >&2; exit 2; }; done
flags=(--bind-to none --oversubscribe)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
export OPENBLAS_NUM_THREADS=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); load $(cut -d' ' -f1-3 /proc/loadavg)"

base=(--set workload.steps=40 --set workload.warmup_steps=8 --set workload.positions_per_request=8 --set workload.position_drift=0.62
      --set log.level=warn --set log.per_step=false --set metrics.load_window_steps=32 --set router.measure_jitter=true)
# run NAME SETTINGS...: one daemon run; its report and outputs under $work/NAME.
run() {
  local name=$1; shift
  mpirun "${flags[@]}" -np "$ranks" "$moed" "${base[@]}" "$@" --report-json "$work/$name.json" \
    --dump-output "$work/$name.bin" >/dev/null
}
table() {
  /usr/bin/python3 - "$work" "$offline" "$@" <<'PY'
import json, subprocess, sys, numpy as np
work, offline, names = sys.argv[1], sys.argv[2], sys.argv[3:]
def bound(*args):  # bench_router_policies --bound-of on the first run (none)
    return float(subprocess.check_output([offline, "--bound-of", f"{work}/{names[0]}.json", *args]))
print(f"lower bound on none's loads: std/mean 0.10 needs {100*bound('--target', '0.1'):.2f}% of pairs moved; "
      f"moving 5% reaches {bound('--at-share', '0.05'):.3f} at best")
def rows(name):
    b = open(f"{work}/{name}.bin", "rb").read()
    h = np.frombuffer(b[8:32], "<u8")
    return np.frombuffer(b[32:], "<f4").reshape(-1, int(h[0]))
ref = rows(names[0])
print(f"{'policy':<34}{'std/mean':>9}{'max/mean':>9}{'p99 ms':>8}{'changed':>8}{'bound':>8}{'moved':>8}"
      f"{'dropped':>8}{'w moved':>8}{'w drop':>8}{'jit 1e-4':>9}{'jit 1e-3':>9}{'flips':>7}{'dh mean':>9}{'dh max':>9}")
for n in names:
    j = json.load(open(f"{work}/{n}.json")); r = j["router_policies"]
    h = rows(n)
    d = np.linalg.norm(h - ref, axis=1) / np.linalg.norm(ref, axis=1)
    print(f"{n:<34}{j['expert_load_std_over_mean']:>9.3f}{j['expert_load_max_over_mean']:>9.2f}"
          f"{j['step_latency_ms']['p99']:>8.1f}{100*r['changed_rate']:>7.2f}%"
          f"{100*bound('--target', repr(j['expert_load_std_over_mean'])):>7.2f}%"
          f"{100*r['moved_rate']:>7.2f}%{100*r['dropped_rate']:>7.2f}%"
          f"{100*r['weight_moved']:>7.2f}%{100*r['weight_dropped']:>7.2f}%{100*r['jitter_rate']['1e-4']:>8.2f}%"
          f"{100*r['jitter_rate']['1e-3']:>8.2f}%{100*r['flip_rate']:>6.1f}%{d.mean():>9.2e}{d.max():>9.2e}")
PY
}

echo; echo "(a) synthetic, hot expert 2.75x mean, $ranks ranks: each policy against none"
run none
run drop-1.0 --set router.load_policy=drop --set router.capacity_factor=1.0
run drop-1.25 --set router.load_policy=drop --set router.capacity_factor=1.25
run demote-0.85x1.25 --set router.load_policy=demote --set router.capacity_factor=1.25
run demote-0.85x1.5 --set router.load_policy=demote --set router.capacity_factor=1.5
demote_at_mean=(--set router.load_policy=demote --set router.capacity_factor=1.0 --set router.demotion_threshold=1.0)
run demote-1.0x1.0 "${demote_at_mean[@]}"
run demote-1.0x1.0-c6 "${demote_at_mean[@]}" --set router.demotion_candidates=6
run bias-0.01 --set router.bias_gamma=0.01
run bias-0.05 --set router.bias_gamma=0.05
run bias-0.2 --set router.bias_gamma=0.2
run bias-0.05+demote-1.0x1.0 --set router.bias_gamma=0.05 "${demote_at_mean[@]}"
# Demotion to a target spread: each step's excess over the level that brings
# its loads to the target (the bound's own clipping), to the needy first.
run demote-to-0.10-c6 --set router.load_policy=demote --set router.demotion_target=0.10 --set router.demotion_candidates=6
run demote-to-0.15-c6 --set router.load_policy=demote --set router.demotion_target=0.15 --set router.demotion_candidates=6
table none drop-1.0 drop-1.25 demote-0.85x1.25 demote-0.85x1.5 demote-1.0x1.0 demote-1.0x1.0-c6 bias-0.01 bias-0.05 bias-0.2 \
  bias-0.05+demote-1.0x1.0 demote-to-0.10-c6 demote-to-0.15-c6

echo; echo "(b) smoothing: jitter against the output change, per beta"
for beta in 0.1 0.3 1 3; do run "smoothing-$beta" --set router.smoothing_beta=$beta; done
table none smoothing-0.1 smoothing-0.3 smoothing-1 smoothing-3

echo; echo "(c) synthetic, OLMoE-shaped: 64 experts, top-8 (H=256, F=512), hot expert 2.75x mean"
base+=(--set model.experts=64 --set model.top_k=8 --set model.hidden=256 --set model.ffn=512)
run olmoe-none
run olmoe-demote-0.85x1.25 --set router.load_policy=demote --set router.capacity_factor=1.25
run olmoe-demote-1.0x1.0 "${demote_at_mean[@]}"
run olmoe-demote-1.0x1.0-c16 "${demote_at_mean[@]}" --set router.demotion_candidates=16
run olmoe-bias-0.01 --set router.bias_gamma=0.01
run olmoe-bias-0.05 --set router.bias_gamma=0.05
run olmoe-bias-0.05+demote-1.0x1.0 --set router.bias_gamma=0.05 "${demote_at_mean[@]}"
run olmoe-demote-to-0.06-c16 --set router.load_policy=demote --set router.demotion_target=0.06 --set router.demotion_candidates=16
run olmoe-demote-to-0.10-c32 --set router.load_policy=demote --set router.demotion_target=0.10 --set router.demotion_candidates=32
table olmoe-none olmoe-demote-0.85x1.25 olmoe-demote-1.0x1.0 olmoe-demote-1.0x1.0-c16 olmoe-bias-0.01 olmoe-bias-0.05 \
  olmoe-bias-0.05+demote-1.0x1.0 olmoe-demote-to-0.06-c16 olmoe-demote-to-0.10-c32

echo; echo "(d) the Mixtral trace's expert popularity, offline (per step and layer loads)"
"$offline" "$root/tests/data/mixtral-humaneval.trace"
echo; echo "    the Mixtral trace replayed in the daemon (8 experts, top-2): none against drop"
base=(--set workload.steps=40 --set workload.warmup_steps=8 --set log.level=warn --set log.per_step=false
      --set metrics.load_window_steps=32 --set workload.kind=trace
      --set "workload.trace=$root/tests/data/mixtral-humaneval.trace")
run trace-none
run trace-drop-1.0 --set router.load_policy=drop --set router.capacity_factor=1.0
run trace-drop-1.25 --set router.load_policy=drop --set router.capacity_factor=1.25
table trace-none trace-drop-1.0 trace-drop-1.25
