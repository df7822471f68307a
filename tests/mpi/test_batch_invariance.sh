#!/usr/bin/env bash
# Batch invariance: a token's output bits do not depend on which tokens share
# its step, how many there are, its position among them, its rank, the rank
# count, the chunking, the GEMM kernel's instruction set or the shuffling of
# a step. The same 1,152 global tokens are served in many ways, and every
# dump must hold the same bits for every token (dumps are in token order).
# Usage: test_batch_invariance.sh synthetic|trace
source "$(dirname "$0")/lib.sh"
mode=${1:?mode}
N=1152  # tokens compared: the first N of every run
H=64    # tests/mpi/small.toml's hidden size
base=(--config "$SMALL")
[ "$mode" = trace ] &&
  base+=(--set workload.kind=trace --set "workload.trace=$MOED_SOURCE_DIR/tests/data/mixtral-humaneval.trace")

# serve NAME RANKS TOKENS_PER_STEP [FLAGS...]: enough steps to cover N tokens.
serve() {
  local name=$1 ranks=$2 per_step=$3
  shift 3
  moed_on "$ranks" "${base[@]}" --set workload.tokens_per_step="$per_step" \
    --set workload.steps=$(((N + per_step - 1) / per_step)) --dump-output "$SCRATCH/$name.bin" "$@"
}
# same_tokens NAME WHAT: NAME's first N token rows equal the reference's (headers differ).
same_tokens() {
  cmp -s -i 32:32 -n $((N * H * 4)) "$SCRATCH/ref.bin" "$SCRATCH/$1.bin" ||
    fail "$2: token outputs differ from 512 per step on 1 rank ($(cmp -i 32:32 -n $((N * H * 4)) \
      "$SCRATCH/ref.bin" "$SCRATCH/$1.bin" 2>&1 | head -1))"
  echo "ok: $2"
}

serve ref 0 512
"$MOE_REFERENCE" "${base[@]}" --set workload.tokens_per_step=512 --set workload.steps=3 --dump "$SCRATCH/ref.bin"
serve t384 2 384
same_tokens t384 "384 tokens per step on 2 ranks"
serve t97 4 97
same_tokens t97 "97 tokens per step on 4 ranks"
serve t1 0 1
same_tokens t1 "one token per step"
serve t3 4 3
same_tokens t3 "3 tokens per step on 4 ranks (one rank has none)"
serve shuffled2 2 384 --set workload.order=shuffled
same_tokens shuffled2 "384 per step shuffled within each step, 2 ranks"
serve shuffled4 4 97 --set workload.order=shuffled --set cluster.ranks_per_island=2
same_tokens shuffled4 "97 per step shuffled, 4 ranks in 2 islands (hierarchical dispatch)"
"$MOE_PLACE" make --policy shuffled --ranks 4 --layers 3 --experts 8 --replicas 3 --seed 5 \
  --out "$SCRATCH/p4.toml" >/dev/null
serve replicas 4 200 --placement "$SCRATCH/p4.toml" --set experts.chunk_rows=7
same_tokens replicas "200 per step, 4 ranks, shuffled placement with replicas, 7-row chunks"
serve chunks 0 512 --set experts.chunk_rows=512
same_tokens chunks "512-row chunks instead of 16"
for isa in avx2 portable; do
  serve "isa-$isa" 2 256 --set experts.isa="$isa"
  same_tokens "isa-$isa" "the $isa GEMM kernel, 256 per step on 2 ranks"
done

# What the default buys: OpenBLAS's sgemm on canonical chunks keeps the bits
# across ranks, but a batch of another size may round a token differently.
serve blas512 0 512 --set experts.gemm=openblas
serve blas97 0 97 --set experts.gemm=openblas
if cmp -s -i 32:32 -n $((N * H * 4)) "$SCRATCH/blas512.bin" "$SCRATCH/blas97.bin"; then
  echo "note: with [experts].gemm = openblas this CPU happened to give the same bits at 512 and 97 per step"
else
  echo "note: with [experts].gemm = openblas the outputs at 512 and 97 per step differ on this CPU"
fi
grep -q "batch-invariant" < <(moed_on 0 "${base[@]}" --set workload.steps=1) || fail "the report does not state batch invariance"
echo "ok: the report states batch invariance"
