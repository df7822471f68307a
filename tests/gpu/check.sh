#!/usr/bin/env bash
# The GPU machine's one call. On a bare machine with one GPU (nvcc, CMake and
# the CUDA toolkit, no registry): unpack the carried Debian packages
# (fetch-debs.sh) into a prefix, build moed against them, and run:
#   1. the CUDA unit tests (kernels/cuda against kernels/cpu and
#      runtime::route) and the CUDA executor's and router's tests (against
#      the CPU's): a test skipped for want of a GPU fails the check;
#   2. a 1-rank serve of a small model in each format with [experts].device =
#      cuda, one and two micro-batches, and in the DeepSeek-V3, gpt-oss and
#      Qwen3-MoE families, whose outputs must be bit-identical to the CPU's
#      with products = f32; with products = bf16 (the tensor cores), the
#      same bits in one and two micro-batches, near the CPU's outputs;
#   3. bench_gpu_kernels at Mixtral-8x7B's and DeepSeek-V3's expert shapes.
# Output goes to the terminal and to $OUT/gpu-check.txt (when $OUT is set).
#
# Here (once):  tests/gpu/fetch-debs.sh
# There:        tests/gpu/check.sh          (carry .gpu-debs)
# Environment:  MOED_GPU_DEBS (default .gpu-debs), MOED_GPU_BUILD (default
#               build-gpu), MOED_GPU_PREFIX (default /tmp/moed-gpu-prefix),
#               MOED_GPU_BENCH_REPS (default 10), MOED_GPU_SHAPES (default
#               "mixtral deepseek"), MOED_GPU_CMAKE_ARGS (more configure
#               arguments), MOED_GPU_REHEARSAL=1 on a host without a GPU:
#               everything but what needs one (the build, and the serve on
#               the CPU from the carried packages alone).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
debs=${MOED_GPU_DEBS:-$root/.gpu-debs}
build=${MOED_GPU_BUILD:-$root/build-gpu}
prefix=${MOED_GPU_PREFIX:-/tmp/moed-gpu-prefix}
reps=${MOED_GPU_BENCH_REPS:-10}
shapes=${MOED_GPU_SHAPES:-mixtral deepseek}
rehearsal=${MOED_GPU_REHEARSAL:-0}
log=${OUT:+$OUT/gpu-check.txt}
log=${log:-/dev/null}
say() { echo "gpu-check: $*" | tee -a "$log"; }
fail() { say "FAILED: $*"; exit 1; }

nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
[ -x "$nvcc" ] || fail "no nvcc on PATH or in /usr/local/cuda/bin"
say "$(date -u +%FT%TZ) on $(hostname); $("$nvcc" --version | tail -1)"
if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$log" || true
fi

# The packages, unpacked (no root, nothing installed): dpkg-deb where it is,
# else Python (a .deb is an ar archive holding data.tar.*).
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
say "unpacked $(find "$debs" -name '*.deb' | wc -l) packages into $prefix"

# Where the packages expect /usr, the prefix: Open MPI's wrapper and runtime
# (OPAL_PREFIX), pkg-config's files (their paths under the sysroot), the
# libraries, and UCX's modules. Debian makes some usual names (libopenblas.so,
# cblas.h, mpicxx) with update-alternatives, which dpkg-deb -x does not run:
# the files themselves are named.
lib=$prefix/usr/lib/x86_64-linux-gnu
export OPAL_PREFIX=$prefix/usr
export PKG_CONFIG_LIBDIR=$lib/pkgconfig:$prefix/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$prefix
export LD_LIBRARY_PATH=$lib:$lib/openblas-pthread:$lib/openmpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export UCX_MODULE_DIR=$lib/ucx PATH=$prefix/usr/bin:$PATH
cmake_args=(-DMOED_CUDA=ON -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_COMPILER="$nvcc"
            -DCMAKE_PREFIX_PATH="$prefix/usr" -DBLAS_LIBRARIES="$lib/openblas-pthread/libopenblas.so"
            -DCBLAS_INCLUDE_DIR="$prefix/usr/include/x86_64-linux-gnu/openblas-pthread"
            -DPKG_CONFIG_EXECUTABLE="$prefix/usr/bin/pkgconf" -DMPI_CXX_COMPILER="$prefix/usr/bin/mpicxx.openmpi"
            -DOPENSSL_ROOT_DIR="$prefix/usr")
command -v ninja >/dev/null && cmake_args+=(-G Ninja)
# NCCL for the nccl transport: nccl.h to build it, libnccl.so.2 to load it. The
# toolkit's where it has one; else torch's pip package (nvidia-nccl-*).
nccl_dir=$(python3 -c 'import nvidia.nccl as n; print(list(n.__path__)[0])' 2>/dev/null || true)
if [ -n "$nccl_dir" ] && [ -f "$nccl_dir/include/nccl.h" ]; then
  cmake_args+=(-DNCCL_INCLUDE_DIR="$nccl_dir/include")
  export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$nccl_dir/lib
fi
# Extra configure arguments, e.g. a CPU host's rehearsal without its own packages:
# MOED_GPU_CMAKE_ARGS="-DCMAKE_IGNORE_PREFIX_PATH=/usr"
read -r -a extra <<<"${MOED_GPU_CMAKE_ARGS:-}"
cmake_args+=("${extra[@]}")

mkdir -p "$build"
start=$SECONDS
cmake -S "$root" -B "$build" "${cmake_args[@]}" >"$build/configure.log" 2>&1 ||
  { tail -40 "$build/configure.log"; fail "configure (log: $build/configure.log)"; }
cmake --build "$build" -j "$(nproc)" --target moed moed_kernels_cuda_tests moed_runtime_engine_tests bench_gpu_kernels \
  >"$build/build.log" 2>&1 || { grep -E "error|Error" "$build/build.log" | head -40; fail "build (log: $build/build.log)"; }
say "configured and built in $((SECONDS - start)) s"

# 1. The GPU tests: every one must run (a skip means no usable GPU).
run_tests() {  # run_tests WHAT BINARY [FILTER]
  local what=$1 binary=$2 filter=${3:-*} out
  out=$(mktemp)
  "$binary" --gtest_filter="$filter" 2>&1 | tee "$out" >>"$log" || true
  tail -5 "$out"
  grep -Eq "^\[  PASSED  \] [1-9][0-9]* test" "$out" || fail "$what: none passed"
  ! grep -q "^\[  FAILED  \]" "$out" || { grep "^\[  FAILED  \]" "$out"; fail "$what"; }
  ! grep -q "^\[  SKIPPED \]" "$out" || fail "$what: a test skipped: is the GPU usable?"
  say "$what passed"
}
if [ "$rehearsal" != 1 ]; then
  run_tests "CUDA kernel tests" "$build/tests/moed_kernels_cuda_tests"
  run_tests "CUDA executor and router tests" "$build/tests/moed_runtime_engine_tests" "*CudaExpertExecutor*:*CudaRouter*"
fi

# 2. One rank serving a small model in each format: on the GPU, in one and two
# micro-batches, bit for bit what the CPU gives with fp32 products.
serve() {  # serve OUTPUT SETTINGS...
  local output=$1
  shift
  "$build/apps/moed" --config "$root/tests/mpi/small.toml" --set model.ffn=128 --set experts.products=\"f32\" \
    --dump-output "$output" "$@" >"$output.log" 2>&1 || { tail -20 "$output.log"; fail "serve $*"; }
}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT
for dtype in f32 bf16 fp8 mxfp4 int8; do
  serve "$scratch/cpu-$dtype" --set experts.dtype=\"$dtype\"
  [ "$rehearsal" = 1 ] && { say "served $dtype on the CPU from the carried packages"; continue; }
  for microbatches in 1 2; do
    serve "$scratch/gpu-$dtype-$microbatches" --set experts.dtype=\"$dtype\" --set experts.device=\"cuda\" \
      --set engine.microbatches=$microbatches
    grep -q "experts on the cuda" "$scratch/gpu-$dtype-$microbatches.log" ||
      fail "$dtype: the serve's report does not say the experts ran on the GPU"
    cmp -s "$scratch/cpu-$dtype" "$scratch/gpu-$dtype-$microbatches" ||
      fail "$dtype, $microbatches micro-batches: the GPU's outputs differ from the CPU's"
  done
  say "$dtype: the GPU's outputs are the CPU's, bit for bit, in 1 and 2 micro-batches"
done
# The nccl transport, as far as one GPU allows (NCCL takes one rank per GPU):
# its lanes made, started and closed around a serve, which gives the CPU's bits.
if [ "$rehearsal" != 1 ]; then
  serve "$scratch/gpu-nccl" --set experts.dtype=\"f32\" --set experts.device=\"cuda\" --set comm.backend=\"nccl\"
  grep -Eq "transport +nccl" "$scratch/gpu-nccl.log" || fail "nccl: the serve's report does not name the nccl transport"
  cmp -s "$scratch/cpu-f32" "$scratch/gpu-nccl" || fail "nccl: the outputs differ from the CPU's"
  say "nccl transport, one rank: started, served the CPU's bits, closed"
fi
# bf16 products on the tensor cores: bit for bit the same in 1 and 2
# micro-batches, and near the CPU's fp32 outputs (the rows rounded to bf16:
# within 2% of the largest output; the figure is printed).
near() {  # near A B: max |a - b| / max |b| over two dumps, at most 0.02
  python3 - "$1" "$2" <<'PY'
import struct, sys
def rows(path):
    data = open(path, "rb").read()
    assert data[:8] == b"MOEDOUT1", path + ": not an output dump"
    return struct.unpack("<%df" % ((len(data) - 32) // 4), data[32:])
a, b = rows(sys.argv[1]), rows(sys.argv[2])
assert len(a) == len(b), "dumps of different sizes"
assert all(x == x for x in a), "a NaN in the GPU's outputs"
top = max(abs(y) for y in b)
worst = max(abs(x - y) for x, y in zip(a, b)) / top
print("%.2e" % worst)
sys.exit(0 if worst <= 0.02 else 1)
PY
}
for dtype in bf16 fp8 mxfp4 int8; do
  [ "$rehearsal" = 1 ] && break
  for microbatches in 1 2; do
    serve "$scratch/tc-$dtype-$microbatches" --set experts.dtype=\"$dtype\" --set experts.device=\"cuda\" \
      --set experts.products=\"bf16\" --set engine.microbatches=$microbatches
    grep -q "bf16 products" "$scratch/tc-$dtype-$microbatches.log" ||
      fail "$dtype: the serve's report does not say bf16 products"
  done
  cmp -s "$scratch/tc-$dtype-1" "$scratch/tc-$dtype-2" ||
    fail "$dtype, tensor cores: 1 and 2 micro-batches give different outputs"
  worst=$(near "$scratch/tc-$dtype-1" "$scratch/cpu-$dtype") ||
    fail "$dtype, tensor cores: outputs off the CPU's fp32 ones by $worst of the largest"
  say "$dtype on the tensor cores: the same bits in 1 and 2 micro-batches, within $worst of the CPU's fp32 outputs"
done

# Every router on the GPU (the route stage runs there too): sigmoid with a
# selection bias and groups, a router bias, softmax.
for family in deepseek_v3 gpt_oss qwen3_moe; do
  serve "$scratch/cpu-$family" --set model.family=\"$family\"
  [ "$rehearsal" = 1 ] && { say "served $family on the CPU from the carried packages"; continue; }
  serve "$scratch/gpu-$family" --set model.family=\"$family\" --set experts.device=\"cuda\"
  cmp -s "$scratch/cpu-$family" "$scratch/gpu-$family" || fail "$family: the GPU's outputs differ from the CPU's"
  say "$family: the GPU's outputs are the CPU's, bit for bit"
done

# 3. The benchmark.
if [ "$rehearsal" != 1 ]; then
  for shape in $shapes; do
    "$build/tests/bench_gpu_kernels" --shape "$shape" --reps "$reps" 2>&1 | tee -a "$log" ||
      fail "benchmark at the $shape shape"
  done
fi
say "done in $((SECONDS - start)) s$([ "$rehearsal" = 1 ] && echo ' (a rehearsal: nothing ran on a GPU)')"
