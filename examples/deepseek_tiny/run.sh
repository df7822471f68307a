#!/usr/bin/env bash
# The front door with a DeepSeek-V3-shaped model: a tiny DeepSeek-V3 in
# PyTorch (sigmoid router with the selection-only correction bias, 4 groups of
# which 2 are kept, top-4 of 16, weights scaled by 2.5, a shared expert; layer
# 0 dense) generates greedily with its MoE layers 1-3 served by moed on 4
# ranks, and again with them in torch; the tokens must be the same.
#   examples/deepseek_tiny/run.sh [BUILD_DIR]
# 1. model.py writes a seeded checkpoint directory: config.json (model_type
#    deepseek_v3) and model.safetensors in DeepSeek's tensor names;
# 2. moed takes the family and shape from config.json, loads the MoE layers'
#    tensors on 4 ranks (mpirun) and opens its front door;
# 3. common/compare.py generates through the client library (two
#    micro-batches in flight, clients on every rank; the dense layer in
#    torch) and with torch, and compares;
# 4. moectl shuts the daemons down; their report shows what they served.
# The steps are examples/common/run_example.sh's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../common/run_example.sh" "$here" tiny-deepseek "$@"
