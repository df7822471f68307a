#!/usr/bin/env bash
# An example across hosts (launch/emulated-cluster): the model's attention on
# an attention host, its MoE blocks on moed's 4 ranks on two expert hosts,
# each MoE layer crossing a 1 Gbit/s link through the ranks' network doors.
#   examples/common/run_across_hosts.sh EXAMPLE_DIR CHECKPOINT_NAME [BUILD_DIR]
# The same steps as run_example.sh, with the tokens checked against the
# model with its MoE blocks in torch (the all-in-one run's tokens):
# 1. EXAMPLE_DIR/model.py writes a seeded checkpoint;
# 2. moed (EXAMPLE_DIR/moed.toml) loads it on 3 emulated hosts x 2 slots,
#    ranks 0-1 on host 1 and 2-3 on host 2, its network doors on every
#    interface with a fresh key;
# 3. common/compare.py runs on host 3 (a network namespace whose only way to
#    the ranks is the emulated link), its clients on ucx:// addresses;
# 4. moectl shuts the daemons down.
# Needs root (network namespaces): exits 77 where they cannot be made.
set -euo pipefail
example=$(cd "$1" && pwd)
name=$2
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${3:-$root/build}
emu=$root/launch/emulated-cluster
for bin in apps/moed apps/moectl client/libmoed_client.so; do
  [ -e "$build/$bin" ] || { echo "build first: $build/$bin is missing (ci/build.sh)" >&2; exit 2; }
done
python=/usr/bin/python3
"$python" -c "import torch, numpy" 2>/dev/null || { echo "needs Debian's python3-torch and python3-numpy (ci/install-deps.sh)" >&2; exit 2; }
"$emu" --check >/dev/null 2>&1 || { echo "SKIP: the emulated cluster cannot run here (network namespaces)"; exit 77; }
export MOED_CLIENT_LIB=$build/client/libmoed_client.so OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
export PYTHONDONTWRITEBYTECODE=1

work=$(mktemp -d "${TMPDIR:-/tmp}/moed-example.XXXXXX")
launcher=""
trap '[ -n "$launcher" ] && kill -TERM $launcher 2>/dev/null && wait $launcher 2>/dev/null; rm -rf "$work"' EXIT
"$python" "$example/model.py" write-checkpoint "$work/$name" --seed 1
head -c 32 /dev/urandom >"$work/key" && chmod 600 "$work/key"

"$emu" --hosts 3 --ranks-per-host 2 --rate 1gbit -- -np 4 "$build/apps/moed" --config "$example/moed.toml" \
  --weights "$work/$name" --set "ingress.dir=\"$work/sock\"" --set "admin.dir=\"$work/admin\"" \
  --set 'ingress.listen="*:0"' --set "ingress.key_file=\"$work/key\"" --set 'ingress.transports="tcp"' \
  >"$work/cluster.txt" 2>&1 &
launcher=$!
up() { for r in 0 1 2 3; do [ -S "$work/sock/moed-ingress-$r.sock" ] && [ -s "$work/sock/moed-ingress-$r.ucx" ] || return 1; done; }
for _ in $(seq 1200); do
  up && break
  kill -0 $launcher 2>/dev/null || { cat "$work/cluster.txt" >&2; echo "moed stopped" >&2; exit 1; }
  sleep 0.1
done
up || { cat "$work/cluster.txt" >&2; echo "the 4 network doors did not open within 120 s" >&2; exit 1; }
attention=$(grep -oE '\bmoed3-[0-9]+-h3\b' "$work/cluster.txt" | head -1)
echo "moed: 4 ranks on 2 expert hosts; the model on attention host $attention, through the network doors:"
sed 's/^/  /' "$work"/sock/moed-ingress-*.ucx | grep -v 127.0.0.1
rc=0
ip netns exec "$attention" env UCX_TLS=tcp,self UCX_NET_DEVICES=veth0 "$python" "$root/examples/common/compare.py" \
  --example "$example" --checkpoint "$work/$name" --sockets "$work/sock" --ranks 4 --key-file "$work/key" || rc=$?
"$build/apps/moectl" --dir "$work/admin" shutdown >/dev/null
wait $launcher || true
launcher=""
exit $rc
