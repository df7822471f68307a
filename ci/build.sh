#!/usr/bin/env bash
# Configures and builds moed in ./build (RelWithDebInfo). CUDA kernels are
# compiled when nvcc is found (/usr/local/cuda/bin/nvcc or on PATH).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@"
cmake --build build -j "$(nproc)"
