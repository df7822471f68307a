#!/usr/bin/env bash
# Configures and builds moed in ./build (RelWithDebInfo): every target, or
# the targets named as arguments. CUDA kernels are compiled when nvcc is
# found (/usr/local/cuda/bin/nvcc or on PATH). It exports
# build/compile_commands.json for clang-tidy (ci/lint.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_EXPORT_COMPILE_COMMANDS=ON
targets=()
for t in "$@"; do targets+=(--target "$t"); done
cmake --build build -j "$(nproc)" "${targets[@]}"
