#!/usr/bin/env bash
# Supervised recovery: the time from SIGKILL of one rank to the job serving
# again under `moed-mpirun --restart` (mpirun tears the job down, the launcher
# relaunches it, every rank loads its weights and the committed placement,
# and rank 0's admin socket reports `serving` with a fresh step count).
# Prints each shape's median of 3 kills against the 10 s aim; asserts nothing.
#   tests/bench/recovery.sh [BUILD_DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
moed=$build/apps/moed moectl=$build/apps/moectl
[ -x "$moed" ] || { echo "build first: $moed is missing (ci/build.sh)" >&2; exit 2; }
[ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OPENBLAS_NUM_THREADS=1
work=$(mktemp -d /tmp/moed-recovery.XXXXXX)
pid=""
trap '[ -z "$pid" ] || kill "$pid" 2>/dev/null; pkill -9 -f -- "$work/" 2>/dev/null; rm -rf "$work"' EXIT
status() { "$moectl" --dir "$work/admin" --json status 2>/dev/null |
  python3 -c "import json,sys; d=json.loads(sys.stdin.readline()); print(d.get('state'), d.get('step'))" 2>/dev/null || true; }

echo "cores: $(nproc); $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
for shape in "demo:$root/configs/demo.toml" "decode layer:$root/configs/bench-decode.toml"; do
  name=${shape%%:*} config=${shape#*:}
  "$root/launch/moed-mpirun" --restart 5 --hosts localhost --gpus-per-host 4 --moed "$moed" -- --config "$config" \
    --set workload.steps=100000000 --set log.per_step=false --set "admin.dir=\"$work/admin\"" \
    --set "placement.committed=\"$work/committed.toml\"" >"$work/log" 2>&1 &
  pid=$!
  times=()
  for kill in 1 2 3; do
    for _ in $(seq 1200); do s=$(status); [ "${s%% *}" = serving ] && [ "${s#* }" -gt 3 ] && break; sleep 0.05; done
    before=${s#* }
    victim=$(pgrep -f -- "moed --config .*$work/admin" | sed -n 3p)
    t0=$(date +%s.%N)
    kill -9 "$victim"
    for _ in $(seq 2400); do
      s=$(status)
      [ "${s%% *}" = serving ] && [ "${s#* }" -lt "$before" ] && ! kill -0 "$victim" 2>/dev/null && break
      sleep 0.02
    done
    times+=("$(python3 -c "import time; print(f'{time.time() - $t0:.2f}')")")
  done
  "$moectl" --dir "$work/admin" shutdown >/dev/null; wait "$pid" || true; pid=""
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 2p)
  printf '%-14s kill -> serving again: %s s (median of 3: %s s; %.2f of the 10 s aim)\n' "$name" \
    "${times[*]}" "$median" "$(python3 -c "print($median / 10)")"
done
