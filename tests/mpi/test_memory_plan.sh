#!/usr/bin/env bash
# The memory planner against moed itself (CPU path): for three configs whose
# expert weights or step buffers dominate the process (150-250 MB a rank), each rank's
# resident memory after the load, its peak while serving, and its peak while
# a migration brings it a slot (or takes one away) are within 10% of what
# `moe-place memory` predicts for that rank. moed reports them in each
# rank's admin status (memory: VmRSS and VmHWM, the peak reset after the
# load). Also: moe-place memory's bad flags exit 2.
source "$(dirname "$0")/lib.sh"
: "${MOECTL:?}"
RANKS=2
TOLERANCE=0.10

daemon_pid=""
cleanup() {
  [ -z "$daemon_pid" ] || end_daemon "$daemon_pid"
  rm -rf "$SCRATCH"
}
trap cleanup EXIT

ctl() { "$MOECTL" --dir "$run" "$@"; }

# status_of RANK FIELD: a field of the rank's status memory object.
status_of() {
  ctl --json --rank "$1" status | python3 -c "import json,sys; print(json.load(sys.stdin)['memory']['$2'])"
}

# wait_steps N: every rank has served N steps.
wait_steps() {
  for _ in $(seq 600); do
    local low=1000000000
    for r in $(seq 0 $((RANKS - 1))); do
      s=$(ctl --json --rank "$r" status 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin).get('step', 0))" 2>/dev/null || echo 0)
      [ "$s" -lt "$low" ] && low=$s
    done
    [ "$low" -ge "$1" ] && return 0
    kill -0 "$daemon_pid" 2>/dev/null || { cat "$run/log" >&2; fail "$name: moed exited"; }
    sleep 0.1
  done
  fail "$name: fewer than $1 steps within 60 s"
}

# within WHAT MEASURED PREDICTED
within() {
  python3 - "$@" "$TOLERANCE" <<'PY' || fail "$name: $1"
import sys
what, measured, predicted, tol = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
err = measured / predicted - 1
print(f"  {what}: measured {measured / 2**20:.1f} MiB, predicted {predicted / 2**20:.1f} MiB ({err:+.1%})")
sys.exit(0 if abs(err) <= tol else 1)
PY
}

# predicted CONFIG RANK FIELD [moe-place flags]: the planner's figure for a rank.
predicted() {
  local config=$1 rank=$2 field=$3
  shift 3
  "$MOE_PLACE" memory --config "$config" --ranks $RANKS --json "$@" |
    python3 -c "import json,sys; print(json.load(sys.stdin)['per_rank'][$rank]['$field'])"
}

# check NAME CONFIG-TEXT: serve, measure, migrate expert (0, E) from rank 1 to rank 0.
check() {
  name=$1
  run=$SCRATCH/$name
  mkdir -p "$run"
  local config=$run/config.toml
  printf '%s\n[admin]\ndir = "%s"\n[log]\nlevel = "warn"\nper_step = false\n' "$2" "$run" >"$config"
  mpirun --bind-to none -np $RANKS "$MOED" --config "$config" --set workload.steps=1000000 >"$run/log" 2>&1 &
  daemon_pid=$!
  wait_steps 5
  echo "$name:"
  for r in 0 1; do
    within "rank $r RSS after load" "$(status_of $r rss_after_load_bytes)" "$(predicted "$config" $r after_load_bytes)"
    within "rank $r peak serving" "$(status_of $r peak_rss_bytes)" "$(predicted "$config" $r serving_bytes)"
  done
  [ "$(status_of 0 peak_since)" = load ] || echo "  (the kernel kept the peak since the start: it includes the load)"
  # The last expert of layer 0 sits on rank 1 (contiguous): move it to rank 0.
  local experts
  experts=$(python3 -c "import tomllib; print(tomllib.load(open('$config','rb'))['model']['experts'])")
  ctl migrate 0 $((experts - 1)) 0 >"$run/migrate.txt" || { cat "$run/migrate.txt" "$run/log" >&2; fail "$name: migrate"; }
  wait_steps 8
  within "rank 0 peak migrating (1 slot in)" "$(status_of 0 peak_rss_bytes)" \
    "$(predicted "$config" 0 migrating_bytes --migration-in 1 --migration-out 0)"
  within "rank 1 peak migrating (1 slot out)" "$(status_of 1 peak_rss_bytes)" \
    "$(predicted "$config" 1 migrating_bytes --migration-in 0 --migration-out 1)"
  ctl shutdown >/dev/null
  for _ in $(seq 300); do kill -0 "$daemon_pid" 2>/dev/null || break; sleep 0.1; done
  end_daemon "$daemon_pid"
  daemon_pid=""
}

# Fixed-order experts (packed), 8 slots of 25 MB a rank.
check packed '[model]
layers = 2
experts = 8
hidden = 1024
ffn = 2048
[workload]
tokens_per_step = 32'

# OpenBLAS experts (row-major), a wider FFN, more experts.
check openblas '[model]
layers = 2
experts = 8
hidden = 768
ffn = 3072
[experts]
gemm = "openblas"
[workload]
tokens_per_step = 64'

# Step buffers that dominate: a wide hidden size, narrow experts, 1024 tokens.
check buffers '[model]
layers = 2
experts = 8
hidden = 4096
ffn = 128
[workload]
tokens_per_step = 1024'

expect_failure 2 "--gpu-memory" "memory: a bad size" -- "$MOE_PLACE" memory --ranks 2 --gpu-memory 80XB
expect_failure 2 "how many ranks" "memory: no rank count" -- "$MOE_PLACE" memory
expect_failure 2 "needs --gpu-memory" "memory: --fewest-gpus without a size" -- "$MOE_PLACE" memory --fewest-gpus
expect_failure 2 "cannot read it" "memory: a missing card" -- "$MOE_PLACE" memory --card "$SCRATCH/none.toml" --ranks 2
# fp8 experts (a byte a weight, a scale per 128 x 128 tile): 8 slots of 6.3 MB a rank.
check fp8 '[model]
layers = 2
experts = 8
hidden = 1024
ffn = 2048
[experts]
dtype = "fp8"
[workload]
tokens_per_step = 32'

# On the CPU path --dtype prices the experts in that format: fp8 a quarter of f32.
plan_bytes() { "$MOE_PLACE" memory --ranks 2 --target cpu --json "$@" |
  python3 -c "import json,sys; print(json.load(sys.stdin)['per_rank'][0]['after_load_bytes'])"; }
f32=$(plan_bytes --set model.hidden=1024 --set model.ffn=2048 --dtype f32)
fp8=$(plan_bytes --set model.hidden=1024 --set model.ffn=2048 --dtype fp8)
# (the experts are 302 MB a rank in f32: 3/4 of them go, the rest of the rank stays)
python3 -c "import sys; f, q = int(sys.argv[1]), int(sys.argv[2]); sys.exit(0 if 0 < q < 0.35 * f else 1)" "$f32" "$fp8" ||
  fail "moe-place memory --dtype fp8 does not price the experts at a quarter of f32 ($fp8 vs $f32 bytes)"
echo "ok: moe-place memory --target cpu --dtype fp8: $fp8 bytes a rank against $f32 for f32"
echo "PASS"
