#!/usr/bin/env bash
# Every include of a moed header must point down the layers (or across a
# folder to itself), never up: a newcomer can then read the tree bottom-up.
#   common                                   the base
#   kernels comm routing launch client      one part each, on common only
#                                            (client on nothing: its library stays small)
#   placement                                on routing
#   runtime/admin (moed_admin)               on common only, except admin_server (runtime's)
#   runtime                                  on everything above
#   apps                                     the mains, on anything
# Prints each upward include with its file and line; exits 1 if there is one.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
cd "$root"

# The folders each folder may include from (besides itself).
allowed_for() {
  case "$1" in
    common) echo "" ;;
    kernels | comm | routing | launch) echo "common" ;;
    client) echo "" ;;
    placement) echo "common routing" ;;
    runtime/admin) echo "common" ;;
    runtime) echo "common kernels comm routing launch client placement runtime/admin" ;;
    apps) echo "common kernels comm routing launch client placement runtime runtime/admin" ;;
    *) echo "?" ;;
  esac
}

# The layer folder of a path: runtime/admin is its own, other subfolders
# (runtime/weights, comm/ucx, ...) belong to their top folder.
folder_of() {
  case "$1" in
    runtime/admin/*) echo runtime/admin ;;
    *) echo "${1%%/*}" ;;
  esac
}

bad=0 checked=0
while IFS= read -r file; do
  from=$(folder_of "$file")
  allowed=$(allowed_for "$from")
  [ "$allowed" = "?" ] && continue
  # admin_server.cc lives beside the protocol but is part of the daemon.
  [ "$file" = runtime/admin/admin_server.cc ] || [ "$file" = runtime/admin/admin_server.h ] && allowed="common"
  while IFS=: read -r line target; do
    checked=$((checked + 1))
    to=$(folder_of "$target")
    [ "$to" = "$from" ] && continue
    [ "$from" = runtime ] && [ "$to" = runtime/admin ] && continue
    [ "$from" = runtime/admin ] && [ "$to" = runtime ] && { echo "$file:$line: includes $target (runtime/admin sits below runtime)"; bad=1; continue; }
    case " $allowed " in
      *" $to "*) ;;
      *) echo "$file:$line: includes $target, but $from may include only from: ${allowed:-nothing else}"; bad=1 ;;
    esac
  done < <(grep -noE '^#include "[a-z_]+/[^"]+"' "$file" | sed -E 's/^([0-9]+):#include "([^"]+)"/\1:\2/')
done < <(find common kernels comm routing launch client placement runtime apps -name '*.h' -o -name '*.cc' -o -name '*.cu' -o -name '*.cuh' 2>/dev/null | sort)
[ "$checked" -gt 100 ] || { echo "only $checked includes found under $root: wrong folder?" >&2; exit 2; }
[ "$bad" = 0 ] && echo "ok: $checked includes, none runs upward"
exit "$bad"
