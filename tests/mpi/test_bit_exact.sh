#!/usr/bin/env bash
# Bit-exactness of moed's outputs across rank counts, placements, routing
# modes, workloads and weight sources; and agreement with the independent
# plain-loop reference (moe_reference) within its fp32 tolerance.
# Usage: test_bit_exact.sh contiguous|shuffled|topp|trace|weights|engine|policies|sharded [DTYPE]
# DTYPE: the experts held in that format ([experts].dtype; small.toml's F of 96
# leaves bf16 and int8 for split experts, whose shards cut no scale block).
source "$(dirname "$0")/lib.sh"
mode=${1:?mode}
base=(--config "$SMALL")
[ -n "${2:-}" ] && base+=(--set experts.dtype="$2")

case "$mode" in
contiguous)
  moed_on 0 "${base[@]}" --dump-output "$SCRATCH/ref.bin"
  "$MOE_REFERENCE" "${base[@]}" --dump "$SCRATCH/ref.bin"
  for n in 1 2 4 8; do
    moed_on "$n" "${base[@]}" --dump-output "$SCRATCH/n$n.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/n$n.bin" "contiguous placement, $n ranks vs 1"
  done
  ;;
shuffled)
  moed_on 0 "${base[@]}" --dump-output "$SCRATCH/ref.bin"
  for n in 2 3 4 8; do
    "$MOE_PLACE" make --policy shuffled --ranks "$n" --layers 3 --experts 8 --seed "$n" \
      --replicas 3 --out "$SCRATCH/p$n.toml" >/dev/null
    # Islands of 2 ranks: replicas then serve chunks from their own island.
    moed_on "$n" "${base[@]}" --placement "$SCRATCH/p$n.toml" --set cluster.ranks_per_island=2 \
      --dump-output "$SCRATCH/n$n.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/n$n.bin" "shuffled placement with replicas, $n ranks in islands of 2 vs 1"
  done
  moed_on 4 "${base[@]}" --set placement.policy=round-robin --dump-output "$SCRATCH/rr.bin"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/rr.bin" "round-robin placement, 4 ranks vs 1"
  ;;
topp)
  topp=(--set router.mode=topp --set router.top_p=0.6 --set router.max_k=3)
  moed_on 0 "${base[@]}" "${topp[@]}" --dump-output "$SCRATCH/ref.bin"
  "$MOE_REFERENCE" "${base[@]}" "${topp[@]}" --dump "$SCRATCH/ref.bin"
  for n in 3 4; do
    moed_on "$n" "${base[@]}" "${topp[@]}" --dump-output "$SCRATCH/n$n.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/n$n.bin" "top-p routing, $n ranks vs 1"
  done
  ;;
trace)
  trace=(--set workload.kind=trace --set "workload.trace=$MOED_SOURCE_DIR/tests/data/mixtral-humaneval.trace")
  moed_on 0 "${base[@]}" "${trace[@]}" --dump-output "$SCRATCH/ref.bin"
  "$MOE_REFERENCE" "${base[@]}" "${trace[@]}" --dump "$SCRATCH/ref.bin"
  "$MOE_PLACE" make --policy shuffled --ranks 4 --layers 3 --experts 8 --replicas 2 \
    --out "$SCRATCH/p4.toml" >/dev/null
  moed_on 4 "${base[@]}" "${trace[@]}" --placement "$SCRATCH/p4.toml" --dump-output "$SCRATCH/n4.bin"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/n4.bin" "Mixtral trace replay, 4 ranks shuffled vs 1"
  ;;
weights)
  # The safetensors path and the in-memory synthetic model give the same values.
  for dtype in f32 bf16; do
    "$MOED" "${base[@]}" --set model.dtype=$dtype --generate-weights "$SCRATCH/$dtype.safetensors" >/dev/null
    moed_on 0 "${base[@]}" --set model.dtype=$dtype --dump-output "$SCRATCH/mem-$dtype.bin"
    moed_on 2 "${base[@]}" --set model.dtype=$dtype --weights "$SCRATCH/$dtype.safetensors" \
      --dump-output "$SCRATCH/file-$dtype.bin"
    same_bits "$SCRATCH/mem-$dtype.bin" "$SCRATCH/file-$dtype.bin" "$dtype weights file on 2 ranks vs in memory"
  done
  "$MOE_REFERENCE" "${base[@]}" --set model.dtype=bf16 --set "model.weights=$SCRATCH/bf16.safetensors" \
    --dump "$SCRATCH/file-bf16.bin"
  cmp -s "$SCRATCH/mem-f32.bin" "$SCRATCH/mem-bf16.bin" && fail "bf16 weights gave the f32 outputs"
  echo "ok: bf16 weights change the outputs"
  ;;
sharded)
  # Experts split into shards over the ranks of an island (4 canonical
  # F-chunks) serve the bits of the unsplit 1-rank run: 2 shards on 2 ranks,
  # 2 shards per island on 4 ranks in 2 islands (flat and hierarchical, with a
  # replica across islands, and split experts held in a copy on each island),
  # 4 shards on 4 ranks; and refusals of placements
  # the run cannot serve.
  chunks=(--set experts.ffn_chunks=4)
  moed_on 0 "${base[@]}" "${chunks[@]}" --dump-output "$SCRATCH/ref.bin"
  "$MOE_REFERENCE" "${base[@]}" "${chunks[@]}" --dump "$SCRATCH/ref.bin"
  # placement FILE RANKS SLOTS: the same slots in each of the 3 layers.
  placement() {
    printf 'format = "moed-placement-v1"\nepoch = 0\nranks = %s\nlayers = 3\nexperts = 8\n' "$2" >"$1"
    for _ in 1 2 3; do printf '[[layer]]\nslots = %s\n' "$3" >>"$1"; done
  }
  placement "$SCRATCH/two.toml" 2 '[[0], {shards = [0, 1]}, [0], [0], [1], [1], {shards = [1, 0]}, [1]]'
  placement "$SCRATCH/islands.toml" 4 '[[0], {shards = [0, 1]}, [1], [1], [2], {shards = [3, 2]}, [3, 0], [3]]'
  placement "$SCRATCH/four.toml" 4 '[[0], [0], [1], {shards = [3, 1, 0, 2]}, [2], [2], [3], [3]]'
  # Split and replicated: a copy of 2 shards on each island.
  placement "$SCRATCH/copies.toml" 4 '[[0], {shards = [[0, 1], [3, 2]]}, [1], [1], [2], {shards = [[3, 2], [1, 0]]}, [3, 0], [3]]'
  moed_on 2 "${base[@]}" "${chunks[@]}" --placement "$SCRATCH/two.toml" --dump-output "$SCRATCH/two.bin"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/two.bin" "2 experts in 2 shards on 2 ranks vs unsplit on 1"
  for comm in "hierarchical=true" "hierarchical=false"; do
    moed_on 4 "${base[@]}" "${chunks[@]}" --placement "$SCRATCH/islands.toml" --set cluster.ranks_per_island=2 \
      --set "comm.$comm" --dump-output "$SCRATCH/islands.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/islands.bin" "shards in each of 2 islands of 2 ranks, [comm].$comm vs 1"
    moed_on 4 "${base[@]}" "${chunks[@]}" --placement "$SCRATCH/copies.toml" --set cluster.ranks_per_island=2 \
      --set "comm.$comm" --dump-output "$SCRATCH/copies.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/copies.bin" "split experts held on both islands, [comm].$comm vs 1"
  done
  moed_on 4 "${base[@]}" "${chunks[@]}" --placement "$SCRATCH/four.toml" --set engine.microbatches=2 \
    --dump-output "$SCRATCH/four.bin"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/four.bin" "an expert in 4 shards on 4 ranks, 2 micro-batches vs 1"
  expect_failure 2 'layer 0 expert 1 is split into 2 shards, which does not divide \[experts\].ffn_chunks = 1' \
    "a split expert without canonical chunks" -- mpirun --bind-to none -np 2 "$MOED" "${base[@]}" \
    --placement "$SCRATCH/two.toml"
  expect_failure 2 'layer 0 expert 1: shard 0 is on rank 0 \(island 0\) but a shard is on rank 1 \(island 1\)' \
    "shards on two islands" -- mpirun --bind-to none -np 2 "$MOED" "${base[@]}" "${chunks[@]}" \
    --placement "$SCRATCH/two.toml" --set cluster.ranks_per_island=1
  expect_failure 2 'needs \[experts\].gemm = "fixed-order"' "shards with OpenBLAS" -- \
    mpirun --bind-to none -np 2 "$MOED" "${base[@]}" "${chunks[@]}" --placement "$SCRATCH/two.toml" \
    --set experts.gemm=openblas
  ;;
engine)
  # The step loop's scheduling: every phase waiting for the previous one,
  # overlap with early partial expert calls, micro-batches, over both
  # transports and both routes, with replicas on 2 islands, the control
  # collectives over MPI or over the transport: the same bits.
  moed_on 0 "${base[@]}" --dump-output "$SCRATCH/ref.bin"
  "$MOE_PLACE" make --policy shuffled --ranks 4 --layers 3 --experts 8 --seed 4 --replicas 3 \
    --out "$SCRATCH/p4.toml" >/dev/null
  islands=(--placement "$SCRATCH/p4.toml" --set cluster.ranks_per_island=2)
  for engine in "overlap=false" "split_rows=1" "microbatches=2" "microbatches=3"; do
    for comm in "backend=ucx" "backend=mpi" "hierarchical=false"; do
      moed_on 4 "${base[@]}" "${islands[@]}" --set "engine.$engine" --set "comm.$comm" \
        --dump-output "$SCRATCH/n4.bin"
      same_bits "$SCRATCH/ref.bin" "$SCRATCH/n4.bin" "[engine].$engine, [comm].$comm, 4 ranks in 2 islands vs 1"
    done
  done
  # The control collectives over the transport after start-up ([comm].control):
  # over UCX and over the MPI backend's point-to-point messages.
  for backend in ucx mpi; do
    moed_on 4 "${base[@]}" "${islands[@]}" --set comm.control=transport --set comm.backend=$backend \
      --set engine.microbatches=2 --dump-output "$SCRATCH/n4.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/n4.bin" "[comm].control = transport over $backend, 4 ranks in 2 islands vs 1"
  done
  # Every run above narrows its answers on the wire (the default); at full width too.
  moed_on 4 "${base[@]}" "${islands[@]}" --set comm.narrow_answers=false --dump-output "$SCRATCH/n4.bin"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/n4.bin" "[comm].narrow_answers = false, 4 ranks in 2 islands vs 1"
  moed_on 3 "${base[@]}" --set engine.microbatches=4 --set workload.tokens_per_step=7 \
    --dump-output "$SCRATCH/few.bin"
  moed_on 0 "${base[@]}" --set workload.tokens_per_step=7 --dump-output "$SCRATCH/few-ref.bin"
  same_bits "$SCRATCH/few-ref.bin" "$SCRATCH/few.bin" "4 micro-batches of 7 tokens on 3 ranks (some empty) vs 1"
  ;;
policies)
  # Router policies (docs/router-policies.md): a token's routing depends on
  # the step's other tokens, yet every rank decides alike, so each policy
  # gives the same bits at 1, 2 and 4 ranks, contiguous, round-robin and over
  # MPI; each must also change the outputs (or the test proves nothing).
  # The last one: bias balancing with demotion at the mean, together.
  seq=(--set workload.positions_per_request=3 --set workload.position_drift=0.5 --set workload.steps=4)
  moed_on 0 "${base[@]}" "${seq[@]}" --dump-output "$SCRATCH/plain.bin"
  for policy in router.smoothing_beta=1 router.load_policy=drop router.load_policy=demote router.bias_gamma=0.05 \
    "router.bias_gamma=0.05 router.load_policy=demote router.capacity_factor=1.0 router.demotion_threshold=1.0"; do
    on=("${seq[@]}")
    for setting in $policy; do on+=(--set "$setting"); done
    moed_on 0 "${base[@]}" "${on[@]}" --dump-output "$SCRATCH/ref.bin"
    cmp -s "$SCRATCH/plain.bin" "$SCRATCH/ref.bin" && fail "[router] $policy changed no output"
    moed_on 2 "${base[@]}" "${on[@]}" --dump-output "$SCRATCH/n2.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/n2.bin" "[router] $policy, 2 ranks vs 1"
    moed_on 4 "${base[@]}" "${on[@]}" --set placement.policy=round-robin --set comm.backend=mpi \
      --dump-output "$SCRATCH/n4.bin"
    same_bits "$SCRATCH/ref.bin" "$SCRATCH/n4.bin" "[router] $policy, 4 ranks round-robin over MPI vs 1"
  done
  # Replayed routing (some tokens have none at some layers): drop only.
  trace=(--set workload.kind=trace --set "workload.trace=$MOED_SOURCE_DIR/tests/data/mixtral-humaneval.trace"
         --set router.load_policy=drop --set router.capacity_factor=1.0)
  moed_on 0 "${base[@]}" "${trace[@]}" --dump-output "$SCRATCH/ref.bin"
  moed_on 3 "${base[@]}" "${trace[@]}" --dump-output "$SCRATCH/n3.bin"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/n3.bin" "[router] drop on the Mixtral trace, 3 ranks vs 1"
  # Everything at once, with the jitter measured: the report's figures.
  all=("${seq[@]}" --set router.smoothing_beta=0.5 --set router.load_policy=demote --set router.bias_gamma=0.01
       --set router.measure_jitter=true)
  moed_on 0 "${base[@]}" "${all[@]}" --dump-output "$SCRATCH/ref.bin" --report-json "$SCRATCH/one.json"
  moed_on 4 "${base[@]}" "${all[@]}" --dump-output "$SCRATCH/n4.bin" --report-json "$SCRATCH/four.json"
  same_bits "$SCRATCH/ref.bin" "$SCRATCH/n4.bin" "[router] every policy, 4 ranks vs 1"
  python3 - "$SCRATCH/one.json" "$SCRATCH/four.json" <<'PY' || fail "the router policies' figures"
import json, sys
one, four = (json.load(open(p))["router_policies"] for p in sys.argv[1:])
for k in ("pairs", "pairs_moved", "flip_tested", "jitter_tested", "moved_rate", "flip_rate", "jitter_rate",
          "pairs_selected", "pairs_changed", "changed_rate"):
    assert one[k] == four[k], f"{k}: {one[k]} on 1 rank, {four[k]} on 4"
assert one["pairs"] == 3 * 100 * 3 * 2, one  # 3 measured steps x 100 tokens x 3 layers x top-2
assert one["pairs_moved"] > 0 and one["jitter_tested"] == 3 * 100 * 3, one
assert one["pairs_selected"] == one["pairs"] and 0 < one["pairs_changed"] <= one["pairs_selected"], one
assert one["flip_tested"] > 0 and 0 <= one["flip_rate"] < 1, one
assert "demote" in one["policies"] and "jitter" in one["policies"], one
print("ok: the router policies' figures agree on 1 and 4 ranks:", one)
PY
  ;;
*) fail "unknown mode $mode" ;;
esac
