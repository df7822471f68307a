#!/usr/bin/env bash
# The GPU machine's one call: on a bare machine with one GPU (nvcc, CMake and
# the CUDA toolkit, no registry), unpack the carried Debian packages
# (fetch-debs.sh) into a prefix, build the kernels alone (MOED_KERNELS_ONLY),
# run the CUDA unit tests (a test skipped for want of a GPU fails the check)
# and the GPU benchmark at Mixtral-8x7B's and DeepSeek-V3's expert shapes.
# Output goes to the terminal and to $OUT/gpu-check.txt (when $OUT is set).
#
# Here (once):  tests/gpu/fetch-debs.sh
# There:        tests/gpu/check.sh          (carry .gpu-debs)
# Environment:  MOED_GPU_DEBS (default .gpu-debs), MOED_GPU_BUILD (default
#               build-gpu), MOED_GPU_PREFIX (default /tmp/moed-gpu-prefix),
#               MOED_GPU_BENCH_REPS (default 10), MOED_GPU_SHAPES (default
#               "mixtral deepseek"), MOED_GPU_CMAKE_ARGS (more configure
#               arguments), MOED_GPU_USE_HOST_PACKAGES=1 to build against
#               this host's own packages instead.
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
debs=${MOED_GPU_DEBS:-$root/.gpu-debs}
build=${MOED_GPU_BUILD:-$root/build-gpu}
prefix=${MOED_GPU_PREFIX:-/tmp/moed-gpu-prefix}
reps=${MOED_GPU_BENCH_REPS:-10}
shapes=${MOED_GPU_SHAPES:-mixtral deepseek}
log=${OUT:+$OUT/gpu-check.txt}
log=${log:-/dev/null}
say() { echo "gpu-check: $*" | tee -a "$log"; }
fail() { say "FAILED: $*"; exit 1; }

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || fail "no nvcc on PATH or in /usr/local/cuda/bin"
say "$(date -u +%FT%TZ) on $(hostname); $("$nvcc" --version | tail -1)"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$log"

# The packages, unpacked (no root, nothing installed): dpkg-deb where it is,
# else Python (a .deb is an ar archive holding data.tar.*).
arch_lib=usr/lib/x86_64-linux-gnu
cmake_args=(-DMOED_KERNELS_ONLY=ON -DMOED_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc")
if [ "${MOED_GPU_USE_HOST_PACKAGES:-0}" != 1 ]; then
  compgen -G "$debs/*.deb" >/dev/null || fail "no .deb files in $debs: run tests/gpu/fetch-debs.sh here first, and carry it"
  rm -rf "$prefix" && mkdir -p "$prefix"
  for deb in "$debs"/*.deb; do
    if command -v dpkg-deb >/dev/null; then
      dpkg-deb -x "$deb" "$prefix"
    else
      python3 - "$deb" "$prefix" <<'PY'
import io, sys, tarfile
data = open(sys.argv[1], "rb").read()
assert data[:8] == b"!<arch>\n", "not a .deb"
at = 8
while at < len(data):
    name, size = data[at:at + 16].decode().strip().rstrip("/"), int(data[at + 48:at + 58])
    body = data[at + 60:at + 60 + size]
    if name.startswith("data.tar"):
        tarfile.open(fileobj=io.BytesIO(body)).extractall(sys.argv[2])
    at += 60 + size + (size & 1)
PY
    fi
  done
  blas_dir=$prefix/$arch_lib/openblas-pthread
  # Debian makes libopenblas.so's and cblas.h's usual names with update-alternatives, which
  # dpkg-deb -x does not run: name the files themselves.
  cmake_args+=(-DCMAKE_PREFIX_PATH="$prefix/usr" -DBLAS_LIBRARIES="$blas_dir/libopenblas.so"
               -DCBLAS_INCLUDE_DIR="$prefix/usr/include/x86_64-linux-gnu/openblas-pthread")
  export LD_LIBRARY_PATH="$prefix/$arch_lib:$blas_dir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  say "unpacked $(ls "$debs"/*.deb | wc -l) packages into $prefix"
fi
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
# Extra configure arguments, e.g. a CPU host's rehearsal without its own packages:
# MOED_GPU_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr"
read -r -a extra <<<"${MOED_GPU_CMAKE_ARGS:-}"
cmake_args+=("${extra[@]}")

mkdir -p "$build"
start=$SECONDS
cmake -S "$root" -B "$build" "${cmake_args[@]}" >"$build/configure.log" 2>&1 ||
  { tail -40 "$build/configure.log"; fail "configure (log: $build/configure.log)"; }
cmake --build "$build" -j "$(nproc)" --target moed_kernels_cuda_tests bench_gpu_kernels >"$build/build.log" 2>&1 ||
  { grep -E "error|Error" "$build/build.log" | head -40; fail "build (log: $build/build.log)"; }
say "configured and built in $((SECONDS - start)) s"

# The CUDA unit tests: every one must run (a skip means no usable GPU).
tests_out=$(mktemp)
"$build/tests/moed_kernels_cuda_tests" --gtest_brief=0 2>&1 | tee "$tests_out" | tee -a "$log" | tail -30 || true
grep -q "^\[  PASSED  \]" "$tests_out" || fail "CUDA unit tests"
! grep -q "^\[  FAILED  \]" "$tests_out" || fail "CUDA unit tests"
! grep -q "^\[  SKIPPED \]" "$tests_out" || fail "a CUDA unit test skipped: is the GPU usable?"
say "CUDA unit tests passed"

for shape in $shapes; do
  "$build/tests/bench_gpu_kernels" --shape "$shape" --reps "$reps" 2>&1 | tee -a "$log" ||
    fail "benchmark at the $shape shape"
done
say "done in $((SECONDS - start)) s"
