#!/usr/bin/env bash
# Command one of the README: install, build, and run the demo: 4 ranks under
# mpirun serving the embedded default config (4 MoE layers x 8 experts, top-2)
# from a synthetic safetensors checkpoint, as 2 islands of 2 ranks; while it
# serves, `moectl reoptimize --apply` moves experts live, and the outputs are
# compared with a run without migration.
#
# ci/demo.sh --dashboard: the same with the dashboard on
# (http://127.0.0.1:9464/, [metrics].listen): it serves ~20 s before the
# re-optimisation, moves the weights in small chunks so that the migration's
# progress shows, then serves on until Enter (or 60 s without a terminal).
# The bit-for-bit comparison is left out (it would replay every step).
#
# ci/demo.sh --family F: the same shape in model family F (mixtral,
# deepseek_v3, qwen3_moe, qwen2_moe, olmoe, gpt_oss), from a checkpoint
# directory in F's names with its config.json (docs/model-families.md).
#
# ci/demo.sh --set KEY=VALUE (repeatable): a config key for every moed run,
# e.g. --set experts.dtype=fp8 (the checkpoint is then written in fp8) or
# --family gpt_oss --set experts.dtype=mxfp4 (docs/weight-formats.md).
set -euo pipefail
cd "$(dirname "$0")/.."
dashboard="" family=""
sets=()
usage() { echo "usage: ci/demo.sh [--dashboard] [--family F] [--set KEY=VALUE]..." >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --dashboard) dashboard=127.0.0.1:9464 ;;
    --family)
      [ $# -ge 2 ] || usage
      family=$2
      shift
      ;;
    --set)
      [ $# -ge 2 ] || usage
      sets+=(--set "$2")
      shift
      ;;
    *) usage ;;
  esac
  shift
done
./ci/install-deps.sh
./ci/build.sh moed moe-place moectl >/dev/null
echo "demo: built moed in ./build"

out=build/demo
mkdir -p "$out"
weights=$out/model.safetensors
if [ -n "$family" ]; then
  weights=$out/$family
  ./build/apps/moed --config configs/demo.toml --family "$family" "${sets[@]}" --generate-weights "$weights"
else
  ./build/apps/moed --config configs/demo.toml "${sets[@]}" --generate-weights "$weights"
fi

mpirun_flags=(--oversubscribe --bind-to none)
if [ "$(id -u)" = 0 ]; then mpirun_flags+=(--allow-run-as-root); fi
export OPENBLAS_NUM_THREADS=1

# The daemons serve until moectl shuts them down; meanwhile moectl asks them
# to re-optimise their placement from the routing they have seen, and they
# migrate expert weights to it while serving.
run=$out/run
rm -rf "$run" && mkdir -p "$run"
extra=(--dump-output "$out/output.bin")
if [ -n "$dashboard" ]; then
  # Statistics every 50 steps feed the co-activation; 1 MB per step boundary
  # spreads each expert's 6.3 MB over several steps.
  extra=(--set "metrics.listen=\"$dashboard\"" --set "stats.file=\"$PWD/$out/stats.bin\"" --set stats.every_steps=50
         --set migration.chunk_mb=1)
fi
mpirun "${mpirun_flags[@]}" -np 4 ./build/apps/moed \
  --config configs/demo.toml \
  --weights "$weights" \
  --set workload.steps=100000 --set "admin.dir=\"$PWD/$run\"" \
  --set "placement.committed=\"$PWD/$out/committed.toml\"" \
  --report-json "$out/report.json" \
  "${sets[@]}" "${extra[@]}" 2>"$out/moed.log" &
daemon=$!
trap 'kill $daemon 2>/dev/null || true' EXIT
moectl() { ./build/apps/moectl --dir "$run" "$@"; }
step() { moectl --json status 2>/dev/null | python3 -c 'import json,sys; print(json.loads(sys.stdin.readline()).get("step", 0))' 2>/dev/null || echo 0; }
wait_for_step() {
  while [ "$(step)" -lt "$1" ]; do
    kill -0 $daemon 2>/dev/null || { tail -20 "$out/moed.log" >&2; echo "demo: moed stopped" >&2; exit 1; }
    sleep 0.2
  done
}
wait_for_step 12
if [ -n "$dashboard" ]; then
  echo "demo: the dashboard is at http://$dashboard/ (open it now; the re-optimisation starts in 20 s)"
  sleep 20
fi
echo "\$ moectl status"
moectl status
echo
echo "\$ moectl reoptimize --apply --max-moves 4"
moectl reoptimize --apply --max-moves 4
echo
echo "\$ moectl placement"
moectl placement
wait_for_step $(($(step) + 8))
if [ -n "$dashboard" ]; then
  if [ -t 0 ]; then
    read -rp "demo: serving on; the dashboard is at http://$dashboard/ -- press Enter to stop " _
  else
    sleep 60
  fi
  moectl shutdown >/dev/null
  trap - EXIT
  wait $daemon
  echo "demo: logs in $out/moed.log, figures in $out/report.json"
  exit 0
fi
moectl shutdown >/dev/null
trap - EXIT
wait $daemon

# The same steps without any migration, in one process: the bits must match.
steps=$(od -An -tu8 -j24 -N8 "$out/output.bin" | tr -d ' ')
./build/apps/moed --config configs/demo.toml --weights "$weights" "${sets[@]}" \
  --set workload.steps="$steps" --dump-output "$out/reference.bin" >/dev/null 2>>"$out/moed.log"
if cmp -s "$out/output.bin" "$out/reference.bin"; then
  echo "outputs: bit-identical to the same $steps steps served by one process without migration"
else
  echo "outputs: DIFFER from the run without migration ($(cmp "$out/output.bin" "$out/reference.bin" 2>&1 | head -1))" >&2
  exit 1
fi

echo
echo "demo: logs in $out/moed.log, figures in $out/report.json, outputs in $out/output.bin,"
echo "      the committed placement in $out/committed.toml"
