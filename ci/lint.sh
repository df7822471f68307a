#!/usr/bin/env bash
# The lint step of ci/test.sh, after the build: the Markdown's relative links
# (ci/check_links.py), then clang-tidy with the root's .clang-tidy on the C++
# files the commit under test changed. Needs build/compile_commands.json
# (ci/build.sh exports it).
#
#   ci/lint.sh            the files changed since the merge base with origin/main
#                         when HEAD is not on it, else since HEAD's first parent
#                         (a clone of a single commit has nothing to check)
#   ci/lint.sh REV        the files changed between REV and HEAD
#   ci/lint.sh FILE...    those files
#
# A header is checked through a source file that includes it (its own .cc
# first). CUDA files are left out (no clang-tidy for nvcc's flags). At most
# MOED_LINT_MAX_FILES (default 10) files are checked, $(nproc) at a time.
set -euo pipefail
cd "$(dirname "$0")/.."

python3 ci/check_links.py

tidy=${CLANG_TIDY:-clang-tidy}
db=build/compile_commands.json
command -v "$tidy" >/dev/null || { echo "lint: $tidy not found (Debian: apt-get install clang-tidy)" >&2; exit 2; }
[ -f "$db" ] || { echo "lint: no $db: build first (ci/build.sh)" >&2; exit 2; }

if [ $# -gt 0 ] && [ -f "$1" ]; then
  changed=("$@")
  since="the command line"
else
  git rev-parse --git-dir >/dev/null 2>&1 || { echo "lint: not a git checkout: no changed files to check"; exit 0; }
  base=${1:-}
  if [ -z "$base" ]; then
    if git rev-parse -q --verify origin/main >/dev/null && ! git merge-base --is-ancestor HEAD origin/main; then
      base=$(git merge-base HEAD origin/main)
    elif git rev-parse -q --verify 'HEAD^' >/dev/null; then
      base='HEAD^'
    else
      echo "lint: HEAD has no parent: no changed files to check"
      exit 0
    fi
  fi
  mapfile -t changed < <(git diff --name-only --diff-filter=d "$base" HEAD -- '*.h' '*.cc')
  since="since $base"
fi

# Each file as a source file of the compile database: a .cc as it is, a header
# through the .cc beside it, else through the first source that includes it.
mapfile -t sources < <(python3 - "$db" "${changed[@]}" <<'EOF'
import json, pathlib, re, sys
root = pathlib.Path.cwd()
db = {pathlib.Path(e["file"]).resolve() for e in json.load(open(sys.argv[1]))}
db = sorted(p for p in db if p.suffix == ".cc" and root in p.parents)
picked = []
for name in sys.argv[2:]:
    path = (root / name).resolve()
    rel = path.relative_to(root).as_posix()
    if path.suffix == ".cc":
        pick = path if path in db else None
    else:
        include = re.compile(r'^#include "' + re.escape(rel) + '"', re.M)
        twin = path.with_suffix(".cc")
        candidates = ([twin] if twin in db else []) + db
        pick = next((p for p in candidates if include.search(p.read_text(encoding="utf-8"))), None)
    if pick is None:
        print(f"lint: {rel}: no source file of the build compiles it; not checked", file=sys.stderr)
    elif pick not in picked:
        picked.append(pick)
for p in picked:
    print(p.relative_to(root))
EOF
)

if [ ${#sources[@]} -eq 0 ]; then
  echo "lint: no C++ file to check ($since)"
  exit 0
fi
max=${MOED_LINT_MAX_FILES:-10}
if [ ${#sources[@]} -gt "$max" ]; then
  echo "lint: ${#sources[@]} source files to check ($since); checking the first $max (MOED_LINT_MAX_FILES)"
  sources=("${sources[@]:0:$max}")
fi
echo "lint: clang-tidy on ${#sources[@]} file(s) ($since)"

# One file: its diagnostics in one piece, without clang-tidy's counts of what
# it generated. Any warning of .clang-tidy's checks is an error.
tidy_one() {
  local out rc=0
  out=$("$tidy" -p build --quiet --extra-arg=-include --extra-arg="$shim" "$1" 2>&1) || rc=$?
  out=$(grep -Ev '^[0-9]+ (warnings?|errors?)( and [0-9]+ errors?)? generated\.$' <<<"$out" || true)
  if [ -n "$out" ]; then printf '%s\n' "$out"; fi
  return $rc
}
export -f tidy_one
export tidy shim=$PWD/ci/source_location_shim.h
start=$SECONDS
if printf '%s\n' "${sources[@]}" | xargs -P "$(nproc)" -I{} bash -c 'tidy_one "$1"' _ {}; then
  echo "lint: clean ($((SECONDS - start)) s)"
else
  echo "lint: clang-tidy found problems (above); one file: ci/lint.sh FILE" >&2
  exit 1
fi
