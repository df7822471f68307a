#!/usr/bin/env bash
# The install and the Debian package:
#   - `cmake --install` into a temporary prefix gives the documented layout
#     (docs/install.md), RPATHs that lead to the install's lib/ and never into
#     the build tree, and a moed-mpirun that finds the installed moed;
#   - `cpack -G DEB` gives moed_<version>_amd64.deb; extracted with
#     `dpkg-deb -x` (no root, nothing installed on this machine) it has the
#     same layout under opt/moed, its moed answers --version and runs the demo
#     config on 2 ranks through the installed launcher, bit-identical to the
#     build tree's moed, and its moectl and moe-place link neither MPI, UCX
#     nor OpenBLAS.
# Everything is made under $SCRATCH, which lib.sh's trap removes on any exit.
source "$(dirname "$0")/lib.sh"
: "${MOED_BUILD_DIR:?}"

STEPS=6

# check_layout PREFIX WHAT: the installed tree's files, and nothing of the tests.
check_layout() {
  local prefix=$1 what=$2 f
  for f in bin/moed bin/moectl bin/moe-place launch/moed-mpirun launch/moed-rank \
    launch/moed.sbatch launch/emulated-cluster; do
    [ -f "$prefix/$f" ] && [ -x "$prefix/$f" ] || fail "$what: $f is missing or not executable"
  done
  for f in lib/libmoed_client.so.0 lib/libmoed_client.so include/client/moed_client.h \
    include/client/client.h include/client/protocol.h python/moed_client.py launch/README.md configs/demo.toml; do
    [ -e "$prefix/$f" ] || fail "$what: $f is missing"
  done
  [ -L "$prefix/bin/moed-mpirun" ] && [ "$(readlink -f "$prefix/bin/moed-mpirun")" = "$(readlink -f "$prefix/launch/moed-mpirun")" ] ||
    fail "$what: bin/moed-mpirun is not a link to launch/moed-mpirun"
  local bins
  bins=$(cd "$prefix/bin" && ls | tr '\n' ' ')
  [ "$bins" = "moe-place moectl moed moed-mpirun " ] || fail "$what: bin/ holds '$bins'"
  # Installed binaries find libmoed_client in ../lib; no RPATH leads into the build tree.
  for f in bin/moed bin/moectl bin/moe-place lib/libmoed_client.so.0; do
    ! readelf -d "$prefix/$f" | grep -E 'R(UN)?PATH' | grep -qF "$MOED_BUILD_DIR" ||
      fail "$what: $f has an RPATH into the build tree: $(readelf -d "$prefix/$f" | grep -E 'R(UN)?PATH')"
    ! ldd "$prefix/$f" | grep -q 'not found' || fail "$what: $f: $(ldd "$prefix/$f" | grep 'not found')"
  done
  readelf -d "$prefix/bin/moed" | grep -E 'R(UN)?PATH' | grep -qF '$ORIGIN/../lib' ||
    fail "$what: bin/moed's RPATH is not \$ORIGIN/../lib"
  echo "ok: $what: layout, RPATHs"
}

# --- cmake --install -------------------------------------------------------------

SCRATCH=$(readlink -f "$SCRATCH")  # the launcher prints resolved paths
prefix=$SCRATCH/prefix
cmake --install "$MOED_BUILD_DIR" --prefix "$prefix" >"$SCRATCH/install.log" ||
  { cat "$SCRATCH/install.log" >&2; fail "cmake --install"; }
check_layout "$prefix" "cmake --install"

# Without --moed or $MOED, the installed launcher (also through bin/'s link)
# runs the moed and moed-rank of its own install.
dry=$(env -u MOED "$prefix/bin/moed-mpirun" --hosts localhost --gpus-per-host 2 --dry-run -- \
  --config "$prefix/configs/demo.toml")
case "$dry" in
*" $prefix/launch/moed-rank --ranks 2 "*" -- $prefix/bin/moed --config "*) ;;
*) fail "installed moed-mpirun does not run the installed moed-rank and moed: $dry" ;;
esac
echo "ok: installed moed-mpirun finds the installed moed"

# The Python client finds the installed library (PREFIX/python -> PREFIX/lib);
# Debian's python3 has numpy, which it imports.
loaded=$(cd "$SCRATCH" && env -u MOED_CLIENT_LIB /usr/bin/python3 -c \
  'import sys; sys.path.insert(0, sys.argv[1]); import moed_client; print(moed_client._find_library()._name)' \
  "$prefix/python")
[ "$(readlink -f "$loaded")" = "$(readlink -f "$prefix/lib/libmoed_client.so.0")" ] ||
  fail "installed moed_client.py loaded '$loaded', not the installed library"
echo "ok: installed moed_client.py loads the installed libmoed_client"

# --- the Debian package -------------------------------------------------------------

cpack -G DEB --config "$MOED_BUILD_DIR/CPackConfig.cmake" -B "$SCRATCH/package" >"$SCRATCH/cpack.log" 2>&1 ||
  { cat "$SCRATCH/cpack.log" >&2; fail "cpack -G DEB"; }
version=$("$MOED" --version | grep -Eo '[0-9]+\.[0-9]+\.[0-9]+' | head -1)
deb=$SCRATCH/package/moed_${version}_amd64.deb
[ -f "$deb" ] || fail "cpack made $(cd "$SCRATCH/package" && ls ./*.deb 2>/dev/null), not $(basename "$deb")"
[ "$(dpkg-deb -f "$deb" Package)" = moed ] || fail "package name: $(dpkg-deb -f "$deb" Package)"
depends=$(dpkg-deb -f "$deb" Depends)
for dep in openmpi-bin libopenmpi libucx libhwloc libmetis libopenblas; do
  grep -q "$dep" <<<"$depends" || fail "the package's Depends lacks $dep: $depends"
done
echo "ok: $(basename "$deb"), Depends: $depends"

root=$SCRATCH/root
dpkg-deb -x "$deb" "$root"
[ "$(ls "$root")" = opt ] && [ "$(ls "$root/opt")" = moed ] || fail "the package installs outside /opt/moed: $(dpkg-deb -c "$deb" | head)"
installed=$root/opt/moed
check_layout "$installed" "the package"

"$installed/bin/moed" --version | grep -qF "$version" || fail "installed moed --version"
echo "ok: installed moed --version: $("$installed/bin/moed" --version | head -1)"

# The demo config on 2 ranks: installed launcher, moed and config.
env -u MOED timeout 60 "$installed/bin/moed-mpirun" --hosts localhost --gpus-per-host 2 -- \
  --config "$installed/configs/demo.toml" --set workload.steps=$STEPS \
  --dump-output "$SCRATCH/installed.bin" >"$SCRATCH/demo.txt" 2>"$SCRATCH/demo.log" ||
  { cat "$SCRATCH/demo.log" >&2; fail "the demo on 2 ranks from the package"; }
grep -q 'tokens/s' "$SCRATCH/demo.txt" || { cat "$SCRATCH/demo.txt" >&2; fail "the demo printed no report"; }
"$MOED" --config "$installed/configs/demo.toml" --set workload.steps=$STEPS \
  --dump-output "$SCRATCH/build.bin" >/dev/null 2>&1 || fail "the build tree's moed on the demo config"
same_bits "$SCRATCH/build.bin" "$SCRATCH/installed.bin" "the package's demo on 2 ranks vs the build tree's moed"

# The operator's tools stay off the serving stack's libraries.
for tool in moectl moe-place; do
  linked=$(ldd "$installed/bin/$tool" | grep -Eo 'lib(mpi|ucp|openblas)[^ ]*' || true)
  [ -z "$linked" ] || fail "installed $tool links $linked"
done
echo "ok: installed moectl and moe-place link neither libmpi, libucp nor libopenblas"
