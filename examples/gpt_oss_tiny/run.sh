#!/usr/bin/env bash
# The front door with a gpt-oss-shaped model: a tiny gpt-oss in PyTorch
# (router with a bias, softmax over the top-4 of 16 logits; fused experts with
# biases, gate and up interleaved, clamped at swiglu_limit 7) generates
# greedily with its MoE blocks served by moed on 4 ranks, and again with them
# in torch; the tokens must be the same.
#   examples/gpt_oss_tiny/run.sh [BUILD_DIR]
# 1. model.py writes a seeded checkpoint directory: config.json (model_type
#    gpt_oss) and model.safetensors in gpt-oss's tensor names and layout;
# 2. moed takes the family and shape from config.json, loads the MoE tensors
#    on 4 ranks (mpirun) and opens its front door;
# 3. common/compare.py generates through the client library (two
#    micro-batches in flight, clients on every rank) and with torch, and
#    compares;
# 4. moectl shuts the daemons down; their report shows what they served.
# The steps are examples/common/run_example.sh's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../common/run_example.sh" "$here" tiny-gpt-oss "$@"
