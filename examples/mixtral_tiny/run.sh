#!/usr/bin/env bash
# The front door end to end: a tiny Mixtral-shaped model in PyTorch generates
# text greedily with its MoE blocks served by moed on 4 ranks, and again with
# them in torch; the tokens must be the same.
#   examples/mixtral_tiny/run.sh [BUILD_DIR]
# 1. model.py writes a seeded checkpoint with Mixtral's tensor names (one
#    file, the shape in its metadata and in moed.toml);
# 2. moed loads its MoE tensors on 4 ranks (mpirun) and opens its front door;
# 3. common/compare.py generates through the client library (two
#    micro-batches in flight, clients on every rank) and with torch, and
#    compares;
# 4. moectl shuts the daemons down; their report shows what they served.
# The steps are examples/common/run_example.sh's.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
exec bash "$here/../common/run_example.sh" "$here" tiny-mixtral.safetensors "$@"
