#!/usr/bin/env bash
# The front door end to end: a tiny Mixtral-shaped model in PyTorch generates
# text greedily with its MoE blocks served by moed on 4 ranks, and again with
# them in torch; the tokens must be the same.
#   examples/mixtral_tiny/run.sh [BUILD_DIR]
# 1. model.py writes a seeded checkpoint with Mixtral's tensor names;
# 2. moed loads its MoE tensors on 4 ranks (mpirun) and opens its front door;
# 3. compare.py generates through the client library (two micro-batches in
#    flight, clients on every rank) and with torch, and compares;
# 4. moectl shuts the daemons down; their report shows what they served.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
build=${1:-$root/build}
for bin in apps/moed apps/moectl client/libmoed_client.so; do
  [ -e "$build/$bin" ] || { echo "build first: $build/$bin is missing (ci/build.sh)" >&2; exit 2; }
done
python=/usr/bin/python3  # Debian's, with python3-torch
"$python" -c "import torch, numpy" 2>/dev/null || { echo "needs Debian's python3-torch and python3-numpy (ci/install-deps.sh)" >&2; exit 2; }
export MOED_CLIENT_LIB=$build/client/libmoed_client.so OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

work=$(mktemp -d "${TMPDIR:-/tmp}/moed-example.XXXXXX")
daemon=""
# On any exit: no daemon left behind (SIGKILL if SIGTERM is not enough).
end_daemon() { kill "$1" 2>/dev/null || return 0; for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -9 "$1" 2>/dev/null || true; }
trap '[ -n "$daemon" ] && end_daemon $daemon; rm -rf "$work"' EXIT
"$python" "$here/model.py" write-checkpoint "$work/tiny-mixtral.safetensors" --seed 1

flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
mpirun "${flags[@]}" -np 4 "$build/apps/moed" --config "$here/moed.toml" \
  --weights "$work/tiny-mixtral.safetensors" --set "ingress.dir=\"$work/sock\"" \
  --set "admin.dir=\"$work/admin\"" >"$work/report.txt" 2>"$work/moed.log" &
daemon=$!
sockets() { ls "$work/sock" 2>/dev/null | grep -c 'moed-ingress-.*\.sock' || true; }
for _ in $(seq 1200); do
  [ "$(sockets)" = 4 ] && break
  kill -0 $daemon 2>/dev/null || { cat "$work/moed.log" >&2; echo "moed stopped" >&2; exit 1; }
  sleep 0.1
done
[ "$(sockets)" = 4 ] || { cat "$work/moed.log" >&2; echo "the 4 front-door sockets did not appear within 120 s" >&2; exit 1; }
echo "moed: 4 ranks serving the checkpoint's MoE layers, front door at $work/sock"
rc=0
(cd "$here" && "$python" compare.py --checkpoint "$work/tiny-mixtral.safetensors" --sockets "$work/sock" --ranks 4) || rc=$?
"$build/apps/moectl" --dir "$work/admin" shutdown >/dev/null
wait $daemon
daemon=""
echo
grep -E "steps of|tokens/s|activation rate|numerics" "$work/report.txt" | sed 's/^/  /'
exit $rc
