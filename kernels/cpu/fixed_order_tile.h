// The tile kernels behind gemm_fixed_order (fixed_order_gemm.h), one per
// instruction set. The AVX2 and AVX-512 ones are compiled with their own
// -m flags; this header includes nothing but <cstddef>, so those files
// compile no inline function of a shared header that the linker could then
// pick for code running on a CPU without those instructions.
#pragma once

#include <cstddef>

namespace moed::kernels::detail {

// One tile of a fixed-order kernel: C[rows, 16] (rows ldc apart) continues or
// (first) starts the chain of A[rows, kc] with a panel's kc steps. A comes
// packed k-major: a[kk * rows + r]. rows is at most the kernel's tile_rows.
using TileKernel = void (*)(const float* a, std::size_t rows, const float* panel, std::size_t kc, float* c,
                            std::size_t ldc, bool first);
// The same over two panels side by side: C[rows, 32], panel0's 16 columns
// then panel1's.
using PairKernel = void (*)(const float* a, std::size_t rows, const float* panel0, const float* panel1,
                            std::size_t kc, float* c, std::size_t ldc, bool first);
struct FixedOrderKernel {
  TileKernel tile;
  std::size_t tile_rows;
  PairKernel pair = nullptr;  // where a kernel has one
};
FixedOrderKernel portable_kernel();
FixedOrderKernel avx2_kernel();    // only where the CPU has AVX2 and FMA
FixedOrderKernel avx512_kernel();  // only where the CPU has AVX-512F

// How far ahead of a stream of weight codes the decoding tiles prefetch.
// At decode the codes stream from DRAM once per step, a few panels side by
// side, and the work per byte is too small for the hardware prefetchers
// alone to keep enough lines in flight: on an Intel Xeon with AMX, 1 KB
// ahead per stream took fp8 and int8 at one row from 0.5 to 0.9 of the
// bandwidth bound (tests/bench/precision.sh). Prefetching changes no bit.
constexpr std::size_t kPrefetchBytes = 1024;

// Runs Tile<rows>::run(args...) for 1 <= rows <= Max: a tile's row count is
// a compile-time constant, so its accumulators live in registers. Tile is
// each file's own (internal) template, so no instantiation is shared across
// files built for other instruction sets.
template <template <int> class Tile, int Max, class... Args>
void run_rows(std::size_t rows, Args... args) {
  if constexpr (Max > 1)
    if (rows < std::size_t(Max)) return run_rows<Tile, Max - 1>(rows, args...);
  Tile<Max>::run(args...);
}

}  // namespace moed::kernels::detail
