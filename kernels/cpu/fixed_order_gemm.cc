#include "kernels/cpu/fixed_order_gemm.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "common/rng.h"
#include "kernels/cpu/fixed_order_tile.h"
#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/int8_dot_gemm.h"
#include "kernels/cpu/quant_weights.h"

namespace moed::kernels {

namespace {

constexpr std::size_t kP = PackedWeights::kPanel;
// Cache blocking (it changes no bit): kKBlock steps of a panel (16 KB; 32 KB
// for a kernel's pair of panels) stay near L1, while a kRowBlock x kKBlock
// block of A (packed, up to 288 KB) stays in L2 and meets every panel. On
// Zen 4, 256 measured faster than 128 or 192 with pairs too (tests/bench/gemm.sh).
// The columns go kPanelBlock panels at a time through all of k, so that
// their block of C (up to 288 rows x 256 columns, 288 KB) stays in L2 from
// one k block to the next: swept whole (5.8 MB for an expert's W1|W3 at 256
// rows), C came back from L3 at every k block, and the serving benchmark's
// prefill step ran 3-4% slower (docs/benchmarks.md, 2026-12-02).
constexpr std::size_t kKBlock = 256;
constexpr std::size_t kRowBlock = 288;
constexpr std::size_t kPanelBlock = 16;
constexpr std::size_t kMaxTileRows = 12;  // the largest tile_rows of a kernel
// The register-decoding tiles read A as the AVX-512 kernel packs it.
static_assert(detail::kQuantTileRows == kMaxTileRows);

float* allocate_floats(std::size_t count) {
  if (count == 0) return nullptr;
  const std::size_t bytes = (count * sizeof(float) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes);
  if (!p) throw std::bad_alloc();
  return static_cast<float*>(p);
}

bool cpu_has(GemmIsa isa) {
#if MOED_X86_TILES
  switch (isa) {
    case GemmIsa::portable:
      return true;
    case GemmIsa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemmIsa::avx512:
      return __builtin_cpu_supports("avx512f");
  }
  return false;
#else
  return isa == GemmIsa::portable;
#endif
}

detail::FixedOrderKernel kernel_of(GemmIsa isa) {
#if MOED_X86_TILES
  if (isa == GemmIsa::avx512) return detail::avx512_kernel();
  if (isa == GemmIsa::avx2) return detail::avx2_kernel();
#endif
  return detail::portable_kernel();
}

std::atomic<GemmIsa> g_isa{best_gemm_isa()};

// The portable kernel: the definition itself, one std::fma at a time.
void portable_tile(const float* a, std::size_t rows, const float* panel, std::size_t kc, float* c,
                   std::size_t ldc, bool first) {
  for (std::size_t r = 0; r < rows; ++r) {
    float acc[kP];
    for (std::size_t j = 0; j < kP; ++j) acc[j] = first ? 0.0f : c[r * ldc + j];
    for (std::size_t kk = 0; kk < kc; ++kk)
      for (std::size_t j = 0; j < kP; ++j) acc[j] = std::fma(a[kk * rows + r], panel[kk * kP + j], acc[j]);
    for (std::size_t j = 0; j < kP; ++j) c[r * ldc + j] = acc[j];
  }
}

// A's rows [0, rows) packed for the kernel: for each k block, each tile's
// rows k-major (dst[kk * tile + r]), the blocks one after the other.
void pack_row_block(const float* a, std::size_t lda, std::size_t rows, std::size_t k, std::size_t tile_rows,
                    float* dst) {
  for (std::size_t k0 = 0; k0 < k; k0 += kKBlock) {
    const std::size_t kc = std::min(kKBlock, k - k0);
    for (std::size_t i = 0; i < rows; i += tile_rows) {
      const std::size_t tile = std::min(tile_rows, rows - i);
      for (std::size_t r = 0; r < tile; ++r) {
        const float* src = a + (i + r) * lda + k0;
        for (std::size_t kk = 0; kk < kc; ++kk) dst[kk * tile + r] = src[kk];
      }
      dst += tile * kc;
    }
  }
}

// Panels [p_begin, p_end) over the kc steps of k from k0 (W's own column),
// continuing C's chains or (first) starting them.
struct PanelBlock {
  std::size_t p_begin, p_end, k0, kc;
  bool first;
};

// Where the tiles find a panel's fp32 steps: packed fp32 weights in place;
// compact ones (quant_weights.h) decoded into a buffer, slot 0 or 1 (the
// two panels of a pair), just before the tiles use them.
struct F32Panels {
  const PackedWeights& w;
  std::size_t n() const { return w.n(); }
  std::size_t panels() const { return w.panels(); }
  const float* steps(std::size_t p, std::size_t k0, std::size_t, int) const { return w.panel(p) + k0 * kP; }
};
struct DecodedPanels {
  const QuantWeights& w;
  // Set where each step is decoded in registers instead (few rows, AVX-512).
  detail::QuantTileKernel fused = nullptr;
  detail::QuantTile4Kernel fused4 = nullptr;
  std::size_t n() const { return w.n(); }
  std::size_t panels() const { return w.panels(); }
  const float* steps(std::size_t p, std::size_t k0, std::size_t kc, int slot) const {
    // 64-byte aligned: the AVX-512 tiles load panels with aligned loads.
    alignas(64) thread_local float buffer[2 * kKBlock * kP];
    float* out = buffer + std::size_t(slot) * kKBlock * kP;
    w.decode_panel(p, k0, kc, out);
    return out;
  }
};

// Runs `tile(a, rows, c, ldc)` for each tile of the row block against panel
// p: in C itself, or for a panel running past n in a buffer that holds the
// chains' state, then copied.
template <class Tile>
void each_tile(std::size_t tile_rows, const float* a_block, std::size_t rows_in_block, std::size_t p, std::size_t n,
               const PanelBlock& b, float* c, std::size_t ldc, Tile&& tile) {
  const std::size_t j0 = p * kP, cols = std::min(kP, n - j0);
  float edge[kMaxTileRows * kP];
  for (std::size_t i = 0; i < rows_in_block; i += tile_rows) {
    const std::size_t rows = std::min(tile_rows, rows_in_block - i);
    const float* at = a_block + i * b.kc;
    float* ct = c + i * ldc + j0;
    if (cols == kP) {
      tile(at, rows, ct, ldc);
      continue;
    }
    if (!b.first)
      for (std::size_t r = 0; r < rows; ++r) std::copy(ct + r * ldc, ct + r * ldc + cols, edge + r * kP);
    tile(at, rows, edge, kP);
    for (std::size_t r = 0; r < rows; ++r) std::copy(edge + r * kP, edge + r * kP + cols, ct + r * ldc);
  }
}

// One row block's tiles against one block of panels and k: C[rows, those
// panels' columns] (c points at the row block's first row).
template <class Panels>
void run_panel_block(const detail::FixedOrderKernel& kernel, const float* a_block, std::size_t rows_in_block,
                     const Panels& w, const PanelBlock& b, float* c, std::size_t ldc) {
  const std::size_t n = w.n();
  std::size_t p = b.p_begin;
  if (kernel.pair)  // pairs of whole panels first
    for (; p + 2 <= b.p_end && (p + 2) * kP <= n; p += 2) {
      const float* panel0 = w.steps(p, b.k0, b.kc, 0);
      const float* panel1 = w.steps(p + 1, b.k0, b.kc, 1);
      for (std::size_t i = 0; i < rows_in_block; i += kernel.tile_rows) {
        const std::size_t rows = std::min(kernel.tile_rows, rows_in_block - i);
        kernel.pair(a_block + i * b.kc, rows, panel0, panel1, b.kc, c + i * ldc + p * kP, ldc, b.first);
      }
    }
  for (; p < b.p_end; ++p) {
    const float* panel = w.steps(p, b.k0, b.kc, 0);
    each_tile(kernel.tile_rows, a_block, rows_in_block, p, n, b, c, ldc,
              [&](const float* at, std::size_t rows, float* ct, std::size_t ldc_t) {
                kernel.tile(at, rows, panel, b.kc, ct, ldc_t, b.first);
              });
  }
}

// The same with compact weights decoded in the tiles' registers.
void run_fused_panel_block(const DecodedPanels& w, const float* a_block, std::size_t rows_in_block,
                           const PanelBlock& b, float* c, std::size_t ldc) {
  std::size_t p = b.p_begin;
  if (rows_in_block <= detail::kQuantTile4Rows)  // fours of whole panels first
    for (; p + 4 <= b.p_end && (p + 4) * kP <= w.n(); p += 4) {
      const detail::QuantPanel four[4] = {w.w.panel(p), w.w.panel(p + 1), w.w.panel(p + 2), w.w.panel(p + 3)};
      w.fused4(four, b.k0, a_block, rows_in_block, b.kc, c + p * kP, ldc, b.first);
    }
  for (; p < b.p_end; ++p) {
    const detail::QuantPanel panel = w.w.panel(p);
    each_tile(detail::kQuantTileRows, a_block, rows_in_block, p, w.n(), b, c, ldc,
              [&](const float* at, std::size_t rows, float* ct, std::size_t ldc_t) {
                w.fused(panel, b.k0, at, rows, b.kc, ct, ldc_t, b.first);
              });
  }
}

}  // namespace

void PackedWeights::Free::operator()(float* p) const { std::free(p); }

PackedWeights::PackedWeights(const float* w, std::size_t n, std::size_t k)
    : n_(n), k_(k), data_(allocate_floats(panels() * k * kP)) {
  for (std::size_t p = 0; p < panels(); ++p) {
    float* dst = data_.get() + p * k * kP;
    for (std::size_t kk = 0; kk < k; ++kk)
      for (std::size_t r = 0; r < kP; ++r) {
        const std::size_t row = p * kP + r;
        dst[kk * kP + r] = row < n ? w[row * k + kk] : 0.0f;
      }
  }
}

PackedWeights::PackedWeights(const PackedWeights& other)
    : n_(other.n_), k_(other.k_), data_(allocate_floats(other.floats())) {
  if (other.floats()) std::memcpy(data_.get(), other.data_.get(), other.floats() * sizeof(float));
}

PackedWeights& PackedWeights::operator=(const PackedWeights& other) {
  if (this != &other) *this = PackedWeights(other);
  return *this;
}

void PackedWeights::unpack(float* w) const {
  for (std::size_t row = 0; row < n_; ++row) {
    const float* src = panel(row / kP) + row % kP;
    for (std::size_t kk = 0; kk < k_; ++kk) w[row * k_ + kk] = src[kk * kP];
  }
}

std::string to_string(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::portable:
      return "portable";
    case GemmIsa::avx2:
      return "avx2";
    case GemmIsa::avx512:
      return "avx512";
  }
  return "?";
}

GemmIsa best_gemm_isa() {
  for (GemmIsa isa : {GemmIsa::avx512, GemmIsa::avx2})
    if (cpu_has(isa)) return isa;
  return GemmIsa::portable;
}

void set_gemm_isa(GemmIsa isa) {
  MOED_CHECK(cpu_has(isa), "this CPU cannot run the {} GEMM kernel", to_string(isa));
  g_isa = isa;
}

GemmIsa gemm_isa() { return g_isa; }

bool cpu_has_avx512dq() {
#if MOED_X86_TILES
  static const bool has = __builtin_cpu_supports("avx512dq");
  return has;
#else
  return false;
#endif
}

bool cpu_has_avx512bw() {
#if MOED_X86_TILES
  static const bool has = __builtin_cpu_supports("avx512bw");
  return has;
#else
  return false;
#endif
}

void gemm_fixed_order(const float* a, std::size_t m, const PackedWeights& w, float* c, std::size_t lda,
                      std::size_t ldc) {
  gemm_fixed_order_range(a, m, w, 0, w.k(), c, lda, ldc);
}

namespace {

// The GEMM over any panels: see gemm_fixed_order_range.
template <class Panels>
void run_gemm(const float* a, std::size_t m, const Panels& w, std::size_t k_begin, std::size_t k_end, float* c,
              std::size_t lda, std::size_t ldc, std::size_t w_k) {
  MOED_CHECK(k_begin <= k_end && k_end <= w_k, "k range [{}, {}) of a matrix with k {}", k_begin, k_end, w_k);
  const std::size_t n = w.n(), k = k_end - k_begin;
  lda = lda ? lda : k;
  ldc = ldc ? ldc : n;
  if (m == 0 || n == 0) return;
  if (k == 0) {  // the empty chain: +0
    for (std::size_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  const detail::FixedOrderKernel kernel = kernel_of(g_isa);
  const std::size_t row_block = kRowBlock / kernel.tile_rows * kernel.tile_rows;
  // A's row block, packed once for all of k: k block after k block, tile by
  // tile inside one, k-major inside a tile. The kernel reads it in order
  // instead of from rows lda apart (which collide in L1 when lda is a
  // multiple of 4 KB). At most kRowBlock x the largest k (3.2 MB at k 2816).
  thread_local std::vector<float> packed_a;
  // Grown, never shrunk: resizing up within the capacity would zero it again.
  const std::size_t packed_floats = std::min(row_block, m) * k;
  if (packed_a.size() < packed_floats) packed_a.resize(packed_floats);
  for (std::size_t i0 = 0; i0 < m; i0 += row_block) {
    const std::size_t rows_in_block = std::min(row_block, m - i0);
    pack_row_block(a + i0 * lda, lda, rows_in_block, k, kernel.tile_rows, packed_a.data());
    for (std::size_t p_begin = 0; p_begin < w.panels(); p_begin += kPanelBlock)
      for (std::size_t k0 = 0; k0 < k; k0 += kKBlock) {
        const PanelBlock block{p_begin, std::min(w.panels(), p_begin + kPanelBlock), k_begin + k0,
                               std::min(kKBlock, k - k0), k0 == 0};
        if constexpr (std::is_same_v<Panels, DecodedPanels>)
          if (w.fused) {
            run_fused_panel_block(w, packed_a.data() + k0 * rows_in_block, rows_in_block, block, c + i0 * ldc, ldc);
            continue;
          }
        run_panel_block(kernel, packed_a.data() + k0 * rows_in_block, rows_in_block, w, block, c + i0 * ldc, ldc);
      }
  }
}

}  // namespace

void gemm_fixed_order_range(const float* a, std::size_t m, const PackedWeights& w, std::size_t k_begin,
                            std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  run_gemm(a, m, F32Panels{w}, k_begin, k_end, c, lda, ldc, w.k());
}

void gemm_fixed_order(const float* a, std::size_t m, const QuantWeights& w, float* c, std::size_t lda,
                      std::size_t ldc) {
  gemm_fixed_order_range(a, m, w, 0, w.k(), c, lda, ldc);
}

void gemm_fixed_order_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
                            std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  switch (compact_products()) {
    case CompactProducts::int8:
      if (w.dtype() == WeightDtype::int8 || w.dtype() == WeightDtype::mxfp4)
        return gemm_int8_dot_range(a, m, w, k_begin, k_end, c, lda, ldc);
      [[fallthrough]];
    case CompactProducts::bf16:
      return gemm_bf16_dot_range(a, m, w, k_begin, k_end, c, lda, ldc);
    case CompactProducts::amx:
      return gemm_amx_range(a, m, w, k_begin, k_end, c, lda, ldc);
    case CompactProducts::f32:
      break;
  }
  DecodedPanels panels{w};
#if MOED_X86_TILES
  // Up to two tiles of rows: decoding in registers per tile beats decoding
  // once to memory; beyond, the decoded panel is shared by more tiles.
  if (g_isa == GemmIsa::avx512 && cpu_has_avx512bw() && m <= 2 * detail::kQuantTileRows) {
    panels.fused = detail::avx512_quant_tile();
    panels.fused4 = detail::avx512_quant_tile4();
  }
#endif
  run_gemm(a, m, panels, k_begin, k_end, c, lda, ldc, w.k());
}

namespace detail {
FixedOrderKernel portable_kernel() { return {portable_tile, 4}; }
}  // namespace detail

InvarianceProbe probe_row_invariance(std::size_t n, std::size_t k) {
  CounterRng rng(hash_name("fixed-order-gemm-probe"));
  std::uint64_t counter = 0;
  auto random = [&](std::size_t count) {
    std::vector<float> v(count);
    for (float& x : v) x = rng.symmetric(counter++);
    return v;
  };
  const std::vector<float> w = random(n * k), row = random(k);
  const PackedWeights packed(w.data(), n, k);
  // The definition, one fma at a time.
  std::vector<float> want(n);
  for (std::size_t j = 0; j < n; ++j) {
    float acc = 0.0f;
    for (std::size_t kk = 0; kk < k; ++kk) acc = std::fma(row[kk], w[j * k + kk], acc);
    want[j] = acc;
  }
  // The row alone, and at every position of batches around the tile sizes
  // and the row blocking, among random rows.
  for (std::size_t m : {1, 2, 5, 6, 7, 12, 13, 31, 145}) {
    std::vector<float> a = random(m * k), c(m * n);
    for (std::size_t pos = 0; pos < m; pos += (m > 16 ? 7 : 1)) {
      std::vector<float> batch = a;
      std::copy(row.begin(), row.end(), batch.begin() + std::ptrdiff_t(pos * k));
      gemm_fixed_order(batch.data(), m, packed, c.data());
      if (std::memcmp(c.data() + pos * n, want.data(), n * sizeof(float)) != 0)
        return {false, fmt::format("a row at position {} of {} rows differs from the fma chain "
                                   "({} kernel, n {} k {})",
                                   pos, m, to_string(gemm_isa()), n, k)};
    }
  }
  return {true, ""};
}

}  // namespace moed::kernels
