#!/usr/bin/env bash
# Builds the admin protocol's libFuzzer target with Debian's clang and runs it
# for SECONDS (default 20). Exit 0: no crash, leak or undefined behaviour
# found; 1: found one (the reproducer is printed) or the build failed; 77: no
# clang++ with libFuzzer here (CTest counts that as skipped).
#
#   tests/fuzz/run.sh [SECONDS]
#
# MOED_FUZZ_WORK: where the binary, the growing corpus and any crash artifacts
# go (default ${TMPDIR:-/tmp}/moed-fuzz-$UID). Seeds: tests/fuzz/corpus/.
# Reproduce a crash: $MOED_FUZZ_WORK/fuzz_admin_protocol <artifact>.
set -euo pipefail

seconds=${1:-20}
case $seconds in '' | *[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;; esac
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
work=${MOED_FUZZ_WORK:-${TMPDIR:-/tmp}/moed-fuzz-$(id -u)}
mkdir -p "$work/corpus" "$work/artifacts"

cxx=""
for candidate in clang++ clang++-14 clang++-15 clang++-16; do
  if command -v "$candidate" >/dev/null; then cxx=$candidate; break; fi
done
if [ -z "$cxx" ]; then
  echo "fuzz: no clang++ found: install Debian's clang and libclang-rt-14-dev" >&2
  exit 77
fi

bin=$work/fuzz_admin_protocol
sources=("$here/fuzz_admin_protocol.cc" "$root/runtime/admin/protocol.cc")
stale=0
[ -x "$bin" ] || stale=1
for s in "${sources[@]}" "$root/runtime/admin/protocol.h"; do
  [ "$s" -nt "$bin" ] && stale=1
done
if [ $stale = 1 ]; then
  echo "fuzz: building $bin with $cxx"
  if ! "$cxx" -std=c++20 -g -O1 -fno-omit-frame-pointer \
      -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
      -I"$root" "${sources[@]}" -o "$bin.tmp" 2>"$work/build.log"; then
    cat "$work/build.log" >&2
    if grep -q "libclang_rt.fuzzer\|cannot find.*fuzzer" "$work/build.log"; then
      echo "fuzz: $cxx cannot link -fsanitize=fuzzer: install libclang-rt-14-dev" >&2
      exit 77
    fi
    echo "fuzz: build failed" >&2
    exit 1
  fi
  mv "$bin.tmp" "$bin"
fi

echo "fuzz: running $bin for ${seconds} s (corpus $work/corpus, seeds $here/corpus)"
# -error_exitcode=1: libFuzzer's default, 77, would read as "skipped" to CTest.
set +e
UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
"$bin" -max_total_time="$seconds" -error_exitcode=1 -timeout=10 -rss_limit_mb=2048 \
  -max_len=8192 -dict="$here/admin_protocol.dict" -artifact_prefix="$work/artifacts/" \
  -print_final_stats=1 "$work/corpus" "$here/corpus" 2>"$work/fuzz.log"
rc=$?
set -e
tail -n 25 "$work/fuzz.log"
if [ $rc != 0 ]; then
  echo "fuzz: FAILED (exit $rc); artifacts:" >&2
  ls -1 "$work/artifacts" >&2 || true
  exit 1
fi
echo "fuzz: ok"
