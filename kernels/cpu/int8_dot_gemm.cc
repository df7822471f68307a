#include "kernels/cpu/int8_dot_gemm.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/int8_dot_tile.h"
#include "kernels/cpu/row_probe.h"

namespace moed::kernels {

namespace {

constexpr std::size_t kP = QuantWeights::kPanel;
// Blocking (it changes no bit): 256 steps of 16 panels (64 KB of codes) stay
// in L2 while every tile of a row block of up to 288 rows meets them; at one
// tile of rows, each four panels go through all of k at once.
constexpr std::size_t kKBlock = 256, kRowBlock = 288, kPanelBlock = 16;

// ---- The portable tile ----------------------------------------------------

void portable_prepare(const std::uint8_t* codes, std::size_t kc, std::uint8_t* out) {
  for (std::size_t s = 0; s < (kc + 3) / 4 * 4; ++s)
    for (std::size_t l = 0; l < kP; ++l)
      out[(s / 4) * 64 + 4 * l + s % 4] = s < kc ? std::uint8_t(codes[s * kP + l] ^ 0x80) : 0;
}

void portable_tile(const detail::Int8TileArgs& g) {
  for (std::size_t p = 0; p < detail::kInt8TilePanels; ++p) {
    const std::uint8_t* codes = g.panels[p];
    if (!codes) continue;
    for (std::size_t l = 0; l < kP; ++l) {
      const std::size_t col = 16 * p + l;
      for (std::size_t r = 0; r < g.rows; ++r) {
        std::int32_t acc = g.first ? 0 : g.c[r * g.ldc + col];
        for (std::size_t s = 0; s < g.kc; ++s) {
          const std::int32_t w = g.prepared ? codes[(s / 4) * 64 + 4 * l + s % 4]
                                            : std::int32_t(std::int8_t(codes[s * kP + l])) + 128;
          acc += std::int32_t(std::int8_t(g.a[(s / 4) * g.rows + r] >> (8 * (s % 4)) & 0xff)) * w;
        }
        g.c[r * g.ldc + col] = acc;
      }
    }
  }
}

// ---- The driver -----------------------------------------------------------

detail::Int8Kernels kernels_here() {
#if MOED_X86_TILES
  if (gemm_isa() == GemmIsa::avx512 && cpu_has_int8_dot()) return detail::avx512_vnni_int8_kernels();
#endif
  return detail::portable_int8_kernels();
}

// A row's quantization (int8_dot_gemm.h): its s8 codes q, their sum, and
// amax / 127 (NaN when the row holds a NaN or an infinity).
float quantize_row(const float* x, std::size_t k, std::int8_t* q, std::int32_t* sum) {
  *sum = 0;
  float amax = 0;
  for (std::size_t kk = 0; kk < k; ++kk) {
    if (!std::isfinite(x[kk])) return std::numeric_limits<float>::quiet_NaN();
    amax = std::max(amax, std::fabs(x[kk]));
  }
  const float inv = amax > 0 ? 127.0f / amax : 0.0f;
  for (std::size_t kk = 0; kk < k; ++kk) {
    q[kk] = std::int8_t(std::nearbyint(x[kk] * inv));
    *sum += q[kk];
  }
  return amax / 127.0f;
}

// A row block's activations quantized and packed: per k block, tile after
// tile, quad-major inside a tile (a[t * tile + r]).
void pack_rows(const float* a, std::size_t lda, std::size_t rows, std::size_t k, std::size_t tile_rows,
               std::uint32_t* dst, float* row_scale, std::int32_t* row_sum) {
  thread_local std::vector<std::int8_t> q;
  const std::size_t stride = (k + 3) / 4 * 4;
  q.resize(rows * stride);
  for (std::size_t r = 0; r < rows; ++r) {
    std::int8_t* row = q.data() + r * stride;
    row_scale[r] = quantize_row(a + r * lda, k, row, &row_sum[r]);
    std::fill(row + k, row + stride, std::int8_t(0));
  }
  for (std::size_t k0 = 0; k0 < k; k0 += kKBlock) {
    const std::size_t quads = (std::min(kKBlock, k - k0) + 3) / 4;
    for (std::size_t i = 0; i < rows; i += tile_rows) {
      const std::size_t tile = std::min(tile_rows, rows - i);
      for (std::size_t t = 0; t < quads; ++t)
        for (std::size_t r = 0; r < tile; ++r) std::memcpy(dst + t * tile + r, q.data() + (i + r) * stride + k0 + 4 * t, 4);
      dst += tile * quads;
    }
  }
}

void run(const detail::Int8Kernels& kern, const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
         std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  MOED_CHECK(w.dtype() == WeightDtype::int8, "int8 products over {} weights", to_string(w.dtype()));
  MOED_CHECK(k_begin <= k_end && k_end <= w.k(), "k range [{}, {}) of a matrix with k {}", k_begin, k_end, w.k());
  const std::size_t n = w.n(), k = k_end - k_begin;
  lda = lda ? lda : k;
  ldc = ldc ? ldc : n;
  if (m == 0 || n == 0) return;
  constexpr std::size_t kTilePanels = detail::kInt8TilePanels;
  const std::size_t panels = w.panels(), cols = (panels + kTilePanels - 1) / kTilePanels * kTilePanels * kP;
  thread_local std::vector<float> sw;  // grown, never shrunk, as the buffers below
  sw.resize(n);
  for (std::size_t j = 0; j < n; ++j) std::memcpy(&sw[j], w.panel(j / kP).scales + 4 * (j % kP), 4);
  // Up to 4 tiles of rows (decode), row blocks of one tile, each through all
  // of k in long streams of weights; beyond, the blocking above.
  const std::size_t tiles = (m + kern.tile_rows - 1) / kern.tile_rows;
  const bool streaming = tiles <= 4;
  const std::size_t row_block = streaming ? (m + tiles - 1) / tiles : kRowBlock / kern.tile_rows * kern.tile_rows;
  const std::size_t k_block = streaming ? std::max<std::size_t>(k, 1) : kKBlock;
  thread_local std::vector<std::uint32_t> packed;
  thread_local std::vector<std::int32_t> acc, row_sum;
  thread_local std::vector<float> row_scale;
  alignas(64) thread_local std::uint8_t prepared_steps[detail::kInt8TilePanels][kKBlock * kP];
  packed.resize(std::min(row_block, m) * ((k + 3) / 4 + k / kKBlock + 1));
  acc.resize(std::min(row_block, m) * cols);
  row_scale.resize(std::min(row_block, m));
  row_sum.resize(std::min(row_block, m));
  for (std::size_t i0 = 0; i0 < m; i0 += row_block) {
    const std::size_t rows_in_block = std::min(row_block, m - i0);
    pack_rows(a + i0 * lda, lda, rows_in_block, k, kern.tile_rows, packed.data(), row_scale.data(), row_sum.data());
    std::fill(acc.begin(), acc.begin() + std::ptrdiff_t(rows_in_block * cols), 0);
    for (std::size_t p_begin = 0; p_begin < panels; p_begin += kPanelBlock)
      for (std::size_t k0 = 0; k0 < k; k0 += k_block) {
        const std::size_t kc = std::min(k_block, k - k0), quads = (kc + 3) / 4;
        // Packed A of this k block: the blocks before it are full (kKBlock steps).
        const std::uint32_t* a_block = packed.data() + (k0 / 4) * rows_in_block;
        for (std::size_t p = p_begin; p < std::min(panels, p_begin + kPanelBlock); p += kTilePanels) {
          const std::uint8_t* four[kTilePanels];
          for (std::size_t i = 0; i < kTilePanels; ++i)
            four[i] = p + i < panels ? w.panel(p + i).codes + (k_begin + k0) * kP : nullptr;
          // Several tiles of rows: the panels laid out once for all of them.
          const bool prepared = rows_in_block > kern.tile_rows;
          if (prepared)
            for (std::size_t i = 0; i < kTilePanels && four[i]; ++i) {
              kern.prepare(four[i], kc, prepared_steps[i]);
              four[i] = prepared_steps[i];
            }
          for (std::size_t i = 0; i < rows_in_block; i += kern.tile_rows) {
            const std::size_t rows = std::min(kern.tile_rows, rows_in_block - i);
            kern.tile({four, kc, prepared, a_block + i * quads, rows, acc.data() + i * cols + p * kP, cols, false});
          }
        }
      }
    for (std::size_t r = 0; r < rows_in_block; ++r)
      for (std::size_t j = 0; j < n; ++j) {
        const std::int32_t exact = acc[r * cols + j] - 128 * row_sum[r];
        c[(i0 + r) * ldc + j] = float(exact) * row_scale[r] * sw[j];
      }
  }
}

}  // namespace

namespace detail {
Int8Kernels portable_int8_kernels() { return {portable_tile, portable_prepare, 4}; }
}  // namespace detail

bool cpu_has_int8_dot() {
#if MOED_X86_TILES
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512vnni");
  return has;
#else
  return false;
#endif
}

void gemm_int8_dot_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
                         std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  run(kernels_here(), a, m, w, k_begin, k_end, c, lda, ldc);
}

InvarianceProbe probe_int8_dot_invariance(std::size_t n, std::size_t k) {
  detail::ProbeValues random("int8-dot-probe");
  const QuantWeights w(encode(WeightDtype::int8, random(n * k).data(), n, k));
  const std::vector<float> row = random(k);
  std::vector<float> want(n);
  run(detail::portable_int8_kernels(), row.data(), 1, w, 0, k, want.data(), k, n);
  const detail::Int8Kernels here = kernels_here();
  return detail::probe_row_positions(
      random, row, want, [&](const float* a, std::size_t m, float* c) { run(here, a, m, w, 0, k, c, k, n); },
      "the portable loops on the row alone (int8 weights, int8 products)");
}

}  // namespace moed::kernels
