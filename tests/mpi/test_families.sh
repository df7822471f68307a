#!/usr/bin/env bash
# One model family served from its own checkpoint directory, as `moed
# --generate-weights DIR --family F` writes it (config.json and
# model.safetensors in the family's real names and layout):
#   - the built-in workload on 1, 2 and 4 ranks, with other batchings (tokens
#     per step, shuffled order, 2 islands): the same bits for every token;
#   - the plain-loop reference (moe_reference) agrees within its tolerance;
#   - the front door: one request at a time on 1 rank and all at once from 2
#     clients per rank on 4 ranks, after a live migration, give the same bits;
#     moectl placement names the format the slots hold.
# With DTYPE, the experts are held in that format ([experts].dtype): fp8 and
# mxfp4 from a checkpoint written in it (the format by default: auto), bf16
# from a bf16 checkpoint, int8 quantized at load from an f32 one.
# With PRODUCTS, [experts].products (the default, auto, takes AMX tiles
# where the CPU has them, else bf16 dot products where it has those).
# Usage: test_families.sh deepseek_v3|qwen3_moe|qwen2_moe|olmoe|gpt_oss [f32|bf16|fp8|mxfp4|int8 [auto|f32|bf16|int8|amx]]
source "$(dirname "$0")/lib.sh"
: "${FRONT_DOOR_CHECK:?}" "${MOECTL:?}"
family=${1:?family}
dtype=${2:-f32}
products=${3:-auto}
N=300  # tokens compared: the first N of every run
H=64   # tests/mpi/small.toml's hidden size

# Each family at a small shape that still exercises what it has: DeepSeek's
# groups (16 experts in 4 groups, 2 kept, top-4) and a dense first layer,
# gpt-oss's top-4 with biases and clamping, the shared experts. `shape` holds
# [model]'s shape keys, which the served config then cross-checks against
# config.json; `synthetic` the keys that only shape what the writer makes.
shape=()
synthetic=()
first_moe=0
case "$family" in
deepseek_v3)
  shape=(--set model.experts=16 --set model.top_k=4)
  synthetic=(--set model.groups=4 --set model.groups_kept=2 --set model.dense_layers=1)
  first_moe=1
  ;;
gpt_oss | qwen3_moe | olmoe) shape=(--set model.experts=16 --set model.top_k=4) ;;
qwen2_moe) ;;
*) fail "unknown family $family" ;;
esac
written=()  # how the checkpoint is written
served=()   # how it is served
case "$dtype" in
f32) ;;
fp8) shape+=(--set model.ffn=128) && written=(--set experts.dtype=fp8) ;;  # 128 x 128 scale tiles
mxfp4) written=(--set experts.dtype=mxfp4) ;;
bf16) written=(--set model.dtype=bf16) ;;
int8) served=(--set experts.dtype=int8) ;;
*) fail "unknown dtype $dtype" ;;
esac
ck=$SCRATCH/checkpoint
"$MOED" --config "$SMALL" --family "$family" "${shape[@]}" "${synthetic[@]}" "${written[@]}" --generate-weights "$ck" \
  >/dev/null || fail "--generate-weights --family $family ${written[*]}"
[ -f "$ck/config.json" ] && [ -f "$ck/model.safetensors" ] || fail "no config.json and model.safetensors in $ck"
grep -q "\"model_type\": \"$family\"" "$ck/config.json" || fail "config.json does not say model_type $family"
served+=(--set experts.products="$products")
base=(--config "$SMALL" "${shape[@]}" "${served[@]}" --set "model.weights=\"$ck\"")
# The plain-loop reference reads fp8 and mxfp4 through the synthetic model in
# memory, whose values the checkpoint holds (test_expert_formats).
reference=("${base[@]}")
case "$dtype" in fp8 | mxfp4)
  reference=(--config "$SMALL" "${shape[@]}" "${synthetic[@]}" --set model.family="$family" --set experts.dtype="$dtype"
    --set experts.products="$products") ;;
esac
family="$family${2:+ in $dtype}${3:+ with $products products}"  # in messages; the DeepSeek-only checks below run without DTYPE

# serve NAME RANKS TOKENS_PER_STEP [FLAGS...]: enough steps to cover N tokens.
serve() {
  local name=$1 ranks=$2 per_step=$3
  shift 3
  moed_on "$ranks" "${base[@]}" --set workload.tokens_per_step="$per_step" \
    --set workload.steps=$(((N + per_step - 1) / per_step)) --dump-output "$SCRATCH/$name.bin" "$@" >/dev/null
}
same_tokens() {  # same_tokens NAME WHAT: NAME's first N token rows equal ref's
  cmp -s -i 32:32 -n $((N * H * 4)) "$SCRATCH/ref.bin" "$SCRATCH/$1.bin" ||
    fail "$family, $2: token outputs differ from 100 per step on 1 rank"
  echo "ok: $family, $2"
}

serve ref 0 100
"$MOE_REFERENCE" "${reference[@]}" --set workload.tokens_per_step=100 --set workload.steps=3 --dump "$SCRATCH/ref.bin" ||
  fail "$family: moed's outputs are not within the plain-loop reference's tolerance"
serve two 2 100
same_tokens two "2 ranks"
serve four 4 37 --set workload.order=shuffled --set cluster.ranks_per_island=2
same_tokens four "4 ranks in 2 islands, 37 tokens per step, shuffled"
serve one-by-one 0 1 --set workload.steps=$N
same_tokens one-by-one "one token per step"

# The front door: clients send the model's own layer numbers, its MoE layers.
daemon=""
trap '[ -n "$daemon" ] && end_daemon $daemon; rm -rf "$SCRATCH"' EXIT
start() {  # start NAME RANKS: a front-door daemon; returns once every socket is there
  run=$SCRATCH/$1
  mkdir -p "$run"
  local launch=("$MOED")
  [ "$2" != 0 ] && launch=(mpirun --bind-to none -np "$2" "$MOED")
  "${launch[@]}" "${base[@]}" --set workload.kind=ingress --set "ingress.dir=\"$run/sock\"" \
    --set "admin.dir=\"$run/admin\"" >"$run/out.txt" 2>"$run/err.txt" &
  daemon=$!
  local ranks=$(($2 == 0 ? 1 : $2))
  sockets_up() {
    for r in $(seq 0 $((ranks - 1))); do [ -S "$run/sock/moed-ingress-$r.sock" ] || return 1; done
  }
  wait_until 120 sockets_up || { cat "$run/err.txt" >&2; fail "$family: the front-door sockets did not appear"; }
}
stop() {
  "$MOECTL" --dir "$run/admin" shutdown >/dev/null
  wait $daemon || { cat "$run/err.txt" >&2; fail "$family: moed exited with code $?"; }
  daemon=""
}
start fd1 0
"$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 1 --mode serial --requests 24 --first-layer $first_moe \
  --out "$SCRATCH/fd-ref.bin" >/dev/null
stop
start fd4 4
# A live migration while the front door is idle (model layer numbers: the
# first MoE layer's expert 3, to rank 2): it commits without any request.
timeout 60 "$MOECTL" --dir "$run/admin" migrate $first_moe 3 2 >"$run/migrate.txt" 2>&1 && grep -q committed "$run/migrate.txt" ||
  { cat "$run/migrate.txt" "$run/err.txt" >&2; fail "$family: migrating layer $first_moe expert 3 on an idle front door did not commit"; }
echo "ok: $family: $(grep committed "$run/migrate.txt")"
# Another while requests come, pass after pass until it has committed (expert
# 5 to rank 3): every pass gives the same bits as 1 rank one request at a time.
"$MOECTL" --dir "$run/admin" migrate $first_moe 5 3 >"$run/migrate.txt" 2>&1 &
mover=$!
passes=0
while :; do
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 4 --mode concurrent --requests 24 --first-layer $first_moe \
    --out "$SCRATCH/fd-four.bin" >/dev/null
  passes=$((passes + 1))
  same_bits "$SCRATCH/fd-ref.bin" "$SCRATCH/fd-four.bin" "$family, front door pass $passes: 4 ranks, 2 clients each, vs 1 rank one at a time" >/dev/null
  kill -0 $mover 2>/dev/null || break
  [ $passes -lt 100 ] || { cat "$run/migrate.txt" >&2; fail "$family: the migration did not end within 100 passes"; }
done
wait $mover && grep -q committed "$run/migrate.txt" ||
  { cat "$run/migrate.txt" "$run/err.txt" >&2; fail "$family: migrating layer $first_moe expert 5 did not commit"; }
"$MOECTL" --dir "$run/admin" placement >"$run/placement.txt"
grep -q "slots hold experts in $dtype" "$run/placement.txt" ||
  { cat "$run/placement.txt" >&2; fail "$family: moectl placement does not say the slots hold $dtype"; }
echo "ok: $family, front door: 4 ranks, 2 clients each, vs 1 rank one at a time, $passes passes across a live migration and after one"
echo "ok: $family: $(grep 'slots hold' "$run/placement.txt")"
stop

# Bad checkpoints (DeepSeek's, which has every part to get wrong): each is
# refused with exit 2, naming the file, key or tensor. edit KEY=JSON...
# rewrites config.json's keys into a copy of the checkpoint.
if [ "$family" = deepseek_v3 ]; then
  bad=$SCRATCH/bad
  edit() {
    rm -rf "$bad" && mkdir -p "$bad" && ln -s "$ck/model.safetensors" "$bad/model.safetensors"
    python3 - "$ck/config.json" "$bad/config.json" "$@" <<'PY2'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[3:]:
    k, v = kv.split("=", 1)
    c[k] = json.loads(v)
json.dump(c, open(sys.argv[2], "w"))
PY2
  }
  # small.toml less its [model] keys, which would cross-check before config.json's own checks.
  awk '/^\[/ { skip = ($0 == "[model]") } !skip' "$SMALL" >"$SCRATCH/no-model.toml"
  serve_bad=(moed_on 0 --config "$SCRATCH/no-model.toml" --set "model.weights=\"$bad\"")
  edit hidden_size=32
  expect_failure 2 "model.safetensors: tensor 'model.layers.1.mlp.gate.weight' has shape \\[16, 64\\], expected \\[16, 32\\]" \
    "config.json's hidden_size disagrees with the tensors" -- "${serve_bad[@]}"
  edit model_type='"llama"'
  expect_failure 2 "config.json: \"model_type\" is \"llama\", which moed does not serve" "an unknown model_type" -- "${serve_bad[@]}"
  edit n_group=3
  expect_failure 2 "config.json: n_group .* = 3 does not divide the 16 experts" "n_group that does not divide the experts" -- \
    "${serve_bad[@]}"
  edit topk_group=1 num_experts_per_tok=5
  expect_failure 2 "config.json: top_k \(num_experts_per_tok\) 5 exceeds the 4 experts that topk_group = 1 groups" \
    "top_k larger than the kept groups hold" -- "${serve_bad[@]}"
  edit n_routed_experts=8
  expect_failure 2 "\[model\].experts = 16 disagrees with .*config.json, which gives 8" "[model].experts against config.json" -- \
    "${serve_bad[@]}" --set model.experts=16
  # An OLMoE checkpoint (no bias, no shared expert) that calls itself DeepSeek's.
  olmoe=$SCRATCH/olmoe
  "$MOED" --config "$SMALL" --family olmoe "${shape[@]}" --generate-weights "$olmoe" >/dev/null
  python3 - "$ck/config.json" "$olmoe/config.json" <<'PY2'
import json, sys
json.dump(json.load(open(sys.argv[1])) | {"first_k_dense_replace": 0, "num_hidden_layers": 3}, open(sys.argv[2], "w"))
PY2
  expect_failure 2 "no tensor named 'model.layers.0.mlp.gate.e_score_correction_bias'" "a missing selection bias" -- \
    moed_on 0 --config "$SCRATCH/no-model.toml" --set "model.weights=\"$olmoe\""
  python3 - "$olmoe/config.json" <<'PY2'
import json, sys
json.dump(json.load(open(sys.argv[1])) | {"topk_method": "group_limited_greedy"}, open(sys.argv[1], "w"))
PY2
  expect_failure 2 "no tensor named 'model.layers.0.mlp.shared_experts.gate_proj.weight'" "a missing shared expert" -- \
    moed_on 0 --config "$SCRATCH/no-model.toml" --set "model.weights=\"$olmoe\""
fi

# DeepSeek-V3's own router shape: 256 experts in 8 groups of 32, 4 kept,
# top-8 (at H=64, F=32), on 4 ranks in 2 islands against 1 rank and the reference.
if [ "$family" = deepseek_v3 ]; then
  big=$SCRATCH/v3-router
  "$MOED" --config "$SMALL" --family deepseek_v3 --set model.layers=2 --set model.experts=256 --set model.top_k=8 \
    --set model.ffn=32 --set model.groups=8 --set model.groups_kept=4 --generate-weights "$big" >/dev/null
  v3=(--config "$SMALL" --set model.layers=2 --set model.experts=256 --set model.top_k=8 --set model.ffn=32
    --set "model.weights=\"$big\"" --set workload.steps=2)
  moed_on 0 "${v3[@]}" --dump-output "$SCRATCH/v3-one.bin" >/dev/null
  moed_on 4 "${v3[@]}" --set cluster.ranks_per_island=2 --dump-output "$SCRATCH/v3-four.bin" >/dev/null
  same_bits "$SCRATCH/v3-one.bin" "$SCRATCH/v3-four.bin" "deepseek_v3 at 256 experts, 8 groups, 4 kept, top-8: 4 ranks vs 1"
  "$MOE_REFERENCE" "${v3[@]}" --dump "$SCRATCH/v3-one.bin" ||
    fail "deepseek_v3 at 256 experts: moed's outputs are not within the plain-loop reference's tolerance"
fi

# [model].serve_dense: the dense first layer served too, held whole by every
# rank and run on its own rows: the built-in workload then passes through the
# model's every layer (the reference with it), and the front door takes the
# dense layer's number.
if [ "$first_moe" != 0 ]; then
  base+=(--set model.serve_dense=true)
  reference+=(--set model.serve_dense=true)
  serve dense-ref 0 100
  "$MOE_REFERENCE" "${reference[@]}" --set workload.tokens_per_step=100 --set workload.steps=3 --dump "$SCRATCH/dense-ref.bin" ||
    fail "$family, serve_dense: moed's outputs are not within the plain-loop reference's tolerance"
  cmp -s "$SCRATCH/ref.bin" "$SCRATCH/dense-ref.bin" && fail "$family, serve_dense: the dense layer changed nothing"
  serve dense-four 4 37 --set workload.order=shuffled --set cluster.ranks_per_island=2
  cmp -s -i 32:32 -n $((N * H * 4)) "$SCRATCH/dense-ref.bin" "$SCRATCH/dense-four.bin" ||
    fail "$family, serve_dense: 4 ranks, 37 tokens per step, shuffled differ from 100 per step on 1 rank"
  echo "ok: $family, serve_dense: 4 ranks in 2 islands, 37 tokens per step, shuffled"
  start dense1 0
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 1 --mode serial --requests 24 --out "$SCRATCH/fd-dense-ref.bin" >/dev/null
  stop
  start dense4 4
  "$FRONT_DOOR_CHECK" --dir "$run/sock" --ranks 4 --mode concurrent --requests 24 --out "$SCRATCH/fd-dense-four.bin" >/dev/null
  stop
  same_bits "$SCRATCH/fd-dense-ref.bin" "$SCRATCH/fd-dense-four.bin" \
    "$family, serve_dense, front door with the dense layer: 4 ranks vs 1 rank one at a time"
fi

# Operations on the family's model (DeepSeek's, whose MoE layers are model
# layers 1-3, with online bias balancing on its selection bias; gpt-oss's,
# whose migrated slots carry their biases): 4 ranks serve the built-in
# workload while moectl migrates an expert and re-optimises from the live
# statistics. Answers, metrics, traces and the committed placement name the
# model's layers, and the outputs stay those of one process serving the same
# steps without any migration.
if [ "$family" = deepseek_v3 ] || [ "$family" = gpt_oss ]; then
  base=(--config "$SMALL" "${shape[@]}" "${served[@]}" --set "model.weights=\"$ck\"")
  [ "$family" = deepseek_v3 ] && base+=(--set router.bias_gamma=0.001)
  run=$SCRATCH/ops
  mkdir -p "$run"
  ctl() { "$MOECTL" --dir "$run" "$@"; }
  mpirun --bind-to none -np 4 "$MOED" "${base[@]}" --set workload.steps=1000000 --set "admin.dir=\"$run\"" \
    --set "placement.committed=\"$run/committed.toml\"" \
    --dump-output "$run/out.bin" >"$run/log" 2>&1 &
  daemon=$!
  answers() { ctl status >/dev/null 2>&1 && ctl --rank 3 status >/dev/null 2>&1; }
  wait_until 120 answers || { cat "$run/log" >&2; fail "$family: no admin socket answered"; }
  last=$((first_moe + 2))
  ctl migrate $last 9 0 >"$run/ctl.out" 2>&1 || { cat "$run/ctl.out" "$run/log" >&2; fail "$family: migrate $last 9 0"; }
  grep -q committed "$run/ctl.out" || fail "$family: the migration of model layer $last expert 9 did not commit"
  echo "ok: $family: model layer $last expert 9 migrated to rank 0"
  if [ "$first_moe" != 0 ]; then
    rc=0
    ctl migrate 0 9 0 >"$run/ctl.out" 2>&1 || rc=$?
    [ "$rc" = 1 ] && grep -q "layer 0 is not one of the model's MoE layers (1-3)" "$run/ctl.out" ||
      { cat "$run/ctl.out" >&2; fail "$family: migrate of the dense layer 0: exit $rc"; }
    echo "ok: $family: $(head -1 "$run/ctl.out" | cut -c1-120)"
  fi
  ctl reoptimize --apply --max-moves 2 >"$run/ctl.out" 2>&1 ||
    { cat "$run/ctl.out" "$run/log" >&2; fail "$family: reoptimize --apply"; }
  echo "ok: $family: reoptimize --apply: $(head -1 "$run/ctl.out")"
  ctl --json placement >"$run/placement.json"
  ctl --json stats >"$run/stats.json"
  ctl --json metrics >"$run/metrics.json"
  # A token a few steps ahead, followed (the daemon may pass its step first:
  # it then says already_served, and the next try looks twice as far ahead).
  step() { ctl --json status | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline()).get("step", 0))'; }
  ahead=20 rc=1
  for _ in 1 2 3 4 5 6 7 8; do
    id=$((($(step) + ahead) * 100 + 7))
    rc=0
    ctl --json trace --follow "$id" --timeout 120 >"$run/trace.json" 2>/dev/null || rc=$?
    [ "$rc" = 0 ] && break
    grep -q '"already_served"' "$run/trace.json" || { cat "$run/trace.json" >&2; fail "$family: trace --follow $id: exit $rc"; }
    ahead=$((ahead * 2))
  done
  [ "$rc" = 0 ] || fail "$family: trace --follow: every try came too late"
  python3 - "$run" "$first_moe" <<'PY' || fail "$family: answers do not name the model's layers"
import json, sys
run, first = sys.argv[1], int(sys.argv[2])
want = [first, first + 1, first + 2]
load = lambda name: json.loads(open(f"{run}/{name}.json").read().splitlines()[-1])
assert load("placement")["model_layers"] == want, load("placement")
assert [l["layer"] for l in load("stats")["per_layer"]] == want, load("stats")
text = load("metrics")["text"]
for l in want:
    assert f'moed_layer_activation_rate{{layer="{l}"}}' in text, f"no activation rate of layer {l}"
layers = [l["layer"] for t in load("trace")["tokens"] for l in t["layers"]]
assert layers and set(layers) == set(want), layers
print(f"ok: placement, stats, metrics and trace name model layers {want}")
PY
  if [ "$first_moe" != 0 ]; then
    grep -q "^model_layer = $last" "$run/committed.toml" || fail "$family: the committed placement names no model layer $last"
  fi
  ctl shutdown >/dev/null
  wait $daemon || { cat "$run/log" >&2; fail "$family: moed exited with $? after the operations"; }
  daemon=""
  steps=$(od -An -tu8 -j24 -N8 "$run/out.bin" | tr -d ' ')
  moed_on 0 "${base[@]}" --set workload.steps="$steps" --dump-output "$run/reference.bin" >/dev/null
  same_bits "$run/reference.bin" "$run/out.bin" "$family: 4 ranks across a migration and a re-optimisation vs 1 rank without ($steps steps)"
fi
