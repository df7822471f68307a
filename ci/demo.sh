#!/usr/bin/env bash
# Command one of the README: install, build, and run the demo: 4 ranks under
# mpirun serving the embedded default config (4 MoE layers x 8 experts, top-2)
# from a synthetic safetensors checkpoint, as 2 islands of 2 ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
./ci/install-deps.sh
./ci/build.sh moed moe-place moectl >/dev/null
echo "demo: built moed in ./build"

out=build/demo
mkdir -p "$out"
./build/runtime/moed --generate-weights "$out/model.safetensors"

mpirun_flags=(--oversubscribe --bind-to none)
if [ "$(id -u)" = 0 ]; then mpirun_flags+=(--allow-run-as-root); fi
export OPENBLAS_NUM_THREADS=1
mpirun "${mpirun_flags[@]}" -np 4 ./build/runtime/moed \
  --config configs/demo.toml \
  --weights "$out/model.safetensors" \
  --report-json "$out/report.json" \
  --dump-output "$out/output.bin" 2>"$out/moed.log"

echo
echo "demo: logs in $out/moed.log, figures in $out/report.json, outputs in $out/output.bin"
