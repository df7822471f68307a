#!/usr/bin/env bash
# Downloads the packages of tests/gpu/debs.txt (Debian 12, amd64) into DIR
# (default .gpu-debs in the repository root, which git ignores), for
# tests/gpu/check.sh to unpack on a GPU machine that reaches no registry.
# Run it here, where Debian's registry is reachable; then carry DIR.
# Usage: tests/gpu/fetch-debs.sh [DIR]
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
dir=${1:-$root/.gpu-debs}
mkdir -p "$dir"
mapfile -t packages < <(grep -Ev '^[[:space:]]*(#|$)' "$here/debs.txt")
# A private package list, so that neither root nor the host's own lists are needed.
state=$(mktemp -d)
trap 'rm -rf "$state"' EXIT
mkdir -p "$state/lists/partial"
apt_opts=(-o "Dir::State::Lists=$state/lists" -o APT::Architecture=amd64 -o APT::Sandbox::User=root)
apt-get "${apt_opts[@]}" update >/dev/null
(cd "$dir" && apt-get "${apt_opts[@]}" download "${packages[@]}" >/dev/null)
count=$(ls "$dir"/*.deb | wc -l)
[ "$count" -ge "${#packages[@]}" ] || { echo "fetch-debs: got $count packages of ${#packages[@]}" >&2; exit 1; }
echo "fetch-debs: ${#packages[@]} packages, $(du -sh "$dir" | cut -f1), in $dir"
