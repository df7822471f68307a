#!/usr/bin/env bash
# What every example's run.sh does (examples/*/run.sh call this):
#   common/run_example.sh EXAMPLE_DIR CHECKPOINT_NAME [BUILD_DIR]
# 1. EXAMPLE_DIR/model.py write-checkpoint writes a seeded checkpoint (a file
#    or a directory, CHECKPOINT_NAME) with the family's tensor names;
# 2. moed (EXAMPLE_DIR/moed.toml) loads its MoE tensors on 4 ranks (mpirun)
#    and opens its front door;
# 3. common/compare.py generates with EXAMPLE_DIR/model.py's model through
#    the client library (two micro-batches in flight, clients on every rank)
#    and with torch, and compares; its exit code is this script's;
# 4. moectl shuts the daemons down; their report shows what they served.
set -euo pipefail
example=$(cd "$1" && pwd)
name=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${3:-$root/build}
for bin in apps/moed apps/moectl client/libmoed_client.so; do
  [ -e "$build/$bin" ] || { echo "build first: $build/$bin is missing (ci/build.sh)" >&2; exit 2; }
done
python=/usr/bin/python3  # Debian's, with python3-torch
"$python" -c "import torch, numpy" 2>/dev/null || { echo "needs Debian's python3-torch and python3-numpy (ci/install-deps.sh)" >&2; exit 2; }
export MOED_CLIENT_LIB=$build/client/libmoed_client.so OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export PYTHONDONTWRITEBYTECODE=1  # no __pycache__ in the source tree

work=$(mktemp -d "${TMPDIR:-/tmp}/moed-example.XXXXXX")
daemon=""
# On any exit: no daemon left behind (SIGKILL if SIGTERM is not enough).
end_daemon() { kill "$1" 2>/dev/null || return 0; for _ in $(seq 50); do kill -0 "$1" 2>/dev/null || return 0; sleep 0.1; done; kill -9 "$1" 2>/dev/null || true; }
trap '[ -n "$daemon" ] && end_daemon $daemon; rm -rf "$work"' EXIT
"$python" "$example/model.py" write-checkpoint "$work/$name" --seed 1

flags=(--oversubscribe --bind-to none)
[ "$(id -u)" = 0 ] && flags+=(--allow-run-as-root)
mpirun "${flags[@]}" -np 4 "$build/apps/moed" --config "$example/moed.toml" \
  --weights "$work/$name" --set "ingress.dir=\"$work/sock\"" \
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
"$python" "$root/examples/common/compare.py" --example "$example" --checkpoint "$work/$name" \
  --sockets "$work/sock" --ranks 4 || rc=$?
"$build/apps/moectl" --dir "$work/admin" shutdown >/dev/null
wait $daemon
daemon=""
echo
grep -E "steps of|tokens/s|activation rate|numerics" "$work/report.txt" | sed 's/^/  /'
exit $rc
