#include "kernels/cpu/int8_dot_gemm.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/int8_dot_tile.h"
#include "kernels/cpu/quant_tile.h"
#include "kernels/cpu/row_probe.h"
#include "kernels/cpu/weight_codes.h"

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

// 2 x e2m1's value of a nibble (an integer in [-12, 12]).
int twice_fp4(unsigned nibble) {
  static constexpr int kTwice[8] = {0, 1, 2, 3, 4, 6, 8, 12};
  return nibble & 8 ? -kTwice[nibble & 7] : kTwice[nibble & 7];
}

void portable_prepare_fp4(const std::uint8_t* codes, std::size_t kc, std::uint8_t* out) {
  for (std::size_t s = 0; s < kc; ++s)
    for (std::size_t l = 0; l < kP; ++l)
      out[(s / 4) * 64 + 4 * l + s % 4] =
          std::uint8_t(twice_fp4(codes[detail::fp4_code_byte(s, l)] >> detail::fp4_code_shift(s) & 15) + 128);
}

void portable_fp4_tile(const detail::Fp4TileArgs& g) {
  for (std::size_t p = 0; p < detail::kInt8TilePanels; ++p)
    for (std::size_t r = 0; r < g.rows; ++r)
      for (std::size_t l = 0; l < kP; ++l) {
        float& out = g.out[r * g.ldc + 16 * p + l];
        for (std::size_t b = 0; b < g.blocks; ++b) {
          std::int32_t acc = 0;
          for (std::size_t s = 32 * b; s < 32 * b + 32; ++s)
            acc += std::int32_t(std::int8_t(g.a[(s / 4) * g.rows + r] >> (8 * (s % 4)) & 0xff)) *
                   g.panels[p][(s / 4) * 64 + 4 * l + s % 4];
          const float sum = float(acc - g.offsets[r * g.offsets_stride + b]);
          out = std::fma(sum, g.scales[p][16 * b + l], g.first && b == 0 ? 0.0f : out);
        }
      }
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

void finish_rows(const detail::Int8FinishArgs& g) {
  for (std::size_t r = 0; r < g.rows; ++r)
    for (std::size_t j = 0; j < g.cols; ++j) {
      const std::int32_t exact = g.sums[r * g.ld + j] - 128 * g.row_sum[r];
      g.c[r * g.ldc + j] = float(exact) * g.row_scale[r] * g.col_scale[j];
    }
}

// A row block's activations quantized and packed: per k block, tile after
// tile, quad-major inside a tile (a[t * tile + r]).
void pack_rows(const detail::Int8Kernels& kern, const float* a, std::size_t lda, std::size_t rows, std::size_t k,
               std::size_t tile_rows, std::uint32_t* dst, float* row_scale, std::int32_t* row_sum,
               std::int32_t* block_offsets = nullptr) {
  thread_local std::vector<std::int8_t> q;
  const std::size_t stride = (k + 3) / 4 * 4;
  q.resize(rows * stride);
  for (std::size_t r = 0; r < rows; ++r) {
    std::int8_t* row = q.data() + r * stride;
    row_scale[r] = (kern.quantize ? kern.quantize : quantize_row)(a + r * lda, k, row, &row_sum[r]);
    std::fill(row + k, row + stride, std::int8_t(0));
    if (block_offsets)  // 128 x each 32-step block's sum (mxfp4's scale blocks)
      for (std::size_t b = 0; b < k / 32; ++b) {
        std::int32_t sum = 0;
        for (std::size_t kk = 32 * b; kk < 32 * b + 32; ++kk) sum += row[kk];
        block_offsets[r * (k / 32) + b] = 128 * sum;
      }
  }
  for (std::size_t k0 = 0; k0 < k; k0 += kKBlock) {
    const std::size_t quads = (std::min(kKBlock, k - k0) + 3) / 4;
    for (std::size_t i = 0, tile = 0; i < rows; i += tile) {
      tile = detail::even_tile_rows(i, rows, tile_rows);
      for (std::size_t t = 0; t < quads; ++t)
        for (std::size_t r = 0; r < tile; ++r) std::memcpy(dst + t * tile + r, q.data() + (i + r) * stride + k0 + 4 * t, 4);
      dst += tile * quads;
    }
  }
}

#if MOED_X86_TILES
// AMX-INT8's tiles: the same exact sums, so the same bits, at any batch; used
// from kAmxInt8Rows rows, where they beat VNNI's tiles.
constexpr std::size_t kAmxInt8Rows = 16;
bool amx_int8_here() {
  static const bool has = cpu_has_amx() && detail::cpu_reports_amx_int8();
  return has && gemm_isa() == GemmIsa::avx512;
}

// Rows quantized and laid out as the tiles read them (amx_int8_packed_at);
// a pair of panels at a time, through the whole range at once from two row
// tiles on (each accumulator stored once: measured faster, as for the amx
// products), in chunks of 256 steps at one.
void run_amx(const detail::Int8Kernels& kern, const float* a, std::size_t m, const QuantWeights& w,
             std::size_t k_begin, std::size_t k, float* c, std::size_t lda, std::size_t ldc) {
  constexpr std::size_t kBlock = detail::kAmxInt8Block, kRows = detail::kAmxRows, kLdc = detail::kAmxLdc;
  const std::size_t n = w.n(), k_pad = (k + kBlock - 1) / kBlock * kBlock, rows_pad = (m + kRows - 1) / kRows * kRows;
  const std::size_t chunk = rows_pad <= kRows ? kKBlock : k_pad;
  thread_local detail::AlignedScratch<std::int8_t> rows_scratch, row_scratch;
  thread_local detail::AlignedScratch<std::int32_t> sums_scratch;
  thread_local detail::AlignedScratch<std::uint8_t> prepared_scratch[2];
  thread_local std::vector<std::int32_t> row_sum;  // grown, never shrunk, as the buffers below
  thread_local std::vector<float> row_scale;
  std::int8_t* const rows = rows_scratch.get(rows_pad * k_pad);
  std::int8_t* const row = row_scratch.get(k_pad);
  std::int32_t* const sums = sums_scratch.get(rows_pad * kLdc);
  std::uint8_t* const prepared[2] = {prepared_scratch[0].get(chunk * kP), prepared_scratch[1].get(chunk * kP)};
  row_sum.resize(m);
  row_scale.resize(m);
  for (std::size_t r = 0; r < m; ++r) {
    row_scale[r] = (kern.quantize ? kern.quantize : quantize_row)(a + r * lda, k, row, &row_sum[r]);
    std::fill(row + k, row + k_pad, std::int8_t(0));
    for (std::size_t s = 0; s < k_pad; s += kBlock)
      std::memcpy(rows + detail::amx_int8_packed_at(r, s, k_pad), row + s, kBlock);
  }
  const std::vector<float>& sw = detail::column_scales(w);
  const detail::AmxKernels tiles = detail::amx_tile_kernels();
  const detail::AmxInt8Tile tile = detail::amx_int8_tile();
  tiles.enter();
  for (std::size_t p = 0; p < w.panels(); p += 2) {
    const std::size_t panels = std::min<std::size_t>(2, w.panels() - p);
    const std::size_t j0 = p * kP, cols = std::min(n, (p + panels) * kP) - j0;
    for (std::size_t k0 = 0; k0 < k; k0 += chunk) {
      const std::size_t kc = std::min(chunk, k - k0), blocks = (kc + kBlock - 1) / kBlock;
      for (std::size_t q = 0; q < panels; ++q) {
        kern.prepare(w.panel(p + q).codes + (k_begin + k0) * kP, kc, prepared[q]);
        std::fill(prepared[q] + (kc + 3) / 4 * 64, prepared[q] + blocks * kBlock * kP, std::uint8_t(0));
      }
      // The next chunk's codes, a share with each row group's tiles: they
      // stream in while the tiles run.
      const std::size_t next = k0 + chunk < k ? std::min(chunk, k - k0 - chunk) : 0;
      const std::size_t groups = (rows_pad + 2 * kRows - 1) / (2 * kRows);
      for (std::size_t i = 0, g = 0; i < rows_pad; i += 2 * kRows, ++g) {
        detail::prefetch_share(w, p, panels, k_begin + k0 + chunk, next, g, groups);
        const std::size_t row_tiles = std::min<std::size_t>(2, (rows_pad - i) / kRows);
        tile({rows + detail::amx_int8_packed_at(i, k0, k_pad), kRows * k_pad, row_tiles, {prepared[0], prepared[1]},
              panels, blocks, sums + i * kLdc, k0 == 0});
        if (k0 + kc < k) continue;
        // The row group's outputs while its sums are in L1 (all rows' at
        // once, each on a page of its own, measured slower).
        const std::size_t group_rows = std::min(m, i + row_tiles * kRows) - i;
        (kern.finish ? kern.finish : finish_rows)({sums + i * kLdc, kLdc, group_rows, cols, row_sum.data() + i,
                                                   row_scale.data() + i, sw.data() + j0, c + i * ldc + j0, ldc});
      }
    }
  }
  tiles.leave();
}
#endif

void run(const detail::Int8Kernels& kern, const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
         std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  MOED_CHECK(w.dtype() == WeightDtype::int8, "int8 products over {} weights", to_string(w.dtype()));
  MOED_CHECK(k_begin <= k_end && k_end <= w.k(), "k range [{}, {}) of a matrix with k {}", k_begin, k_end, w.k());
  const std::size_t n = w.n(), k = k_end - k_begin;
  lda = lda ? lda : k;
  ldc = ldc ? ldc : n;
  if (m == 0 || n == 0) return;
#if MOED_X86_TILES
  if (m >= kAmxInt8Rows && k > 0 && kern.tile != detail::portable_int8_kernels().tile && amx_int8_here())
    return run_amx(kern, a, m, w, k_begin, k, c, lda, ldc);
#endif
  constexpr std::size_t kTilePanels = detail::kInt8TilePanels;
  const std::size_t panels = w.panels(), cols = (panels + kTilePanels - 1) / kTilePanels * kTilePanels * kP;
  const std::vector<float>& sw = detail::column_scales(w);
  // Up to 4 tiles of rows (decode), row blocks of one tile, each through all
  // of k in long streams of weights; beyond, the blocking above.
  const std::size_t tiles = (m + kern.tile_rows - 1) / kern.tile_rows;
  const bool streaming = tiles <= 4;
  const std::size_t row_block = streaming ? (m + tiles - 1) / tiles : kRowBlock / kern.tile_rows * kern.tile_rows;
  const std::size_t k_block = streaming ? std::max<std::size_t>(k, 1) : kKBlock;
  thread_local std::vector<std::uint32_t> packed;  // grown, never shrunk, as the buffers below
  thread_local std::vector<std::int32_t> acc, row_sum;
  thread_local std::vector<float> row_scale;
  alignas(64) thread_local std::uint8_t prepared_steps[detail::kInt8TilePanels][kKBlock * kP];
  packed.resize(std::min(row_block, m) * ((k + 3) / 4 + k / kKBlock + 1));
  acc.resize(std::min(row_block, m) * cols);
  row_scale.resize(std::min(row_block, m));
  row_sum.resize(std::min(row_block, m));
  for (std::size_t i0 = 0; i0 < m; i0 += row_block) {
    const std::size_t rows_in_block = std::min(row_block, m - i0);
    const std::size_t tiles_in_block = (rows_in_block + kern.tile_rows - 1) / kern.tile_rows;
    pack_rows(kern, a + i0 * lda, lda, rows_in_block, k, kern.tile_rows, packed.data(), row_scale.data(),
              row_sum.data());
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
          for (std::size_t i = 0, rows = 0, j = 0; i < rows_in_block; i += rows, ++j) {
            rows = detail::even_tile_rows(i, rows_in_block, kern.tile_rows);
            kern.tile({four, kc, prepared, a_block + i * quads, rows, acc.data() + i * cols + p * kP, cols, false});
            if (prepared) detail::prefetch_share(w, p + kTilePanels, kTilePanels, k_begin + k0, kc, j, tiles_in_block);
          }
        }
      }
    (kern.finish ? kern.finish : finish_rows)(
        {acc.data(), cols, rows_in_block, n, row_sum.data(), row_scale.data(), sw.data(), c + i0 * ldc, ldc});
  }
}

// mxfp4's scales are halved (e8m0_values' factor 0.5), as its codes are
// doubled: 2^(e - 128), exact, 2^-128 included (a subnormal).
// A few rows of mxfp4: fours of panels decoded in registers, each over all
// of k (the packed rows of one tile, k-major over the whole range).
void fused_fp4(const detail::Int8Kernels& kern, const QuantWeights& w, std::size_t k_begin, std::size_t k,
               std::size_t rows, const std::uint32_t* a, const std::int32_t* offsets, float* totals,
               std::size_t cols) {
  constexpr std::size_t kTilePanels = detail::kInt8TilePanels;
  const std::size_t blocks = k / 32;
  for (std::size_t p = 0; p < w.panels(); p += kTilePanels) {
    const std::uint8_t* four[kTilePanels];
    const std::uint8_t* four_exps[kTilePanels];  // the tile widens them: a pass here cost a quarter of its time
    for (std::size_t i = 0; i < kTilePanels; ++i) {
      const detail::QuantPanel panel = w.panel(std::min(p + i, w.panels() - 1));  // past the last: padding
      four[i] = panel.codes + k_begin * kP / 2;
      four_exps[i] = panel.scales + (k_begin / 32) * kP;
    }
    kern.fp4_fused({four, nullptr, blocks, a, offsets, blocks, rows, totals + p * kP, cols, true, four_exps});
  }
}

// mxfp4 (int8_dot_gemm.h): the int8 products per 32-step scale block, each
// block's exact sum scaled into an fp32 total, times the row's scale.
void run_fp4(const detail::Int8Kernels& kern, const float* a, std::size_t m, const QuantWeights& w,
             std::size_t k_begin, std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  constexpr std::size_t kBlock = 32, kTilePanels = detail::kInt8TilePanels;
  MOED_CHECK(k_begin <= k_end && k_end <= w.k() && k_begin % kBlock == 0 && k_end % kBlock == 0,
             "mxfp4 k range [{}, {}) of a matrix with k {}: not on its 32-step blocks", k_begin, k_end, w.k());
  const std::size_t n = w.n(), k = k_end - k_begin, blocks = k / kBlock;
  lda = lda ? lda : k;
  ldc = ldc ? ldc : n;
  if (m == 0 || n == 0) return;
  const std::size_t panels = w.panels(), cols = (panels + kTilePanels - 1) / kTilePanels * kTilePanels * kP;
  // Up to 4 tiles of rows (decode): one row block, whose tiles share each
  // prepared block of four panels, going through all of k before the next
  // four (long streams of weights); more: the blocking above.
  // Up to 12 rows: row blocks of at most 3, each through the fused tiles
  // (weights decoded in registers, once per block: cheaper here than
  // preparing them once for all).
  const bool streaming = m <= 4 * kern.tile_rows;
  const bool fused = kern.fp4_fused && m <= 4 * detail::kFp4FusedRows;
  const std::size_t fused_blocks = (m + detail::kFp4FusedRows - 1) / detail::kFp4FusedRows;
  const std::size_t row_block = fused       ? (m + fused_blocks - 1) / fused_blocks
                                : streaming ? m
                                            : kRowBlock / kern.tile_rows * kern.tile_rows;
  thread_local std::vector<std::uint32_t> packed;
  thread_local std::vector<std::int32_t> row_sum, offsets;
  thread_local std::vector<float> row_scale, totals;
  alignas(64) thread_local std::uint8_t prepared[kTilePanels][kKBlock * kP];
  thread_local float scales[kTilePanels][kKBlock / kBlock * kP];
  const std::size_t rows_max = std::min(row_block, m);
  packed.resize(rows_max * ((k + 3) / 4 + 1));
  row_sum.resize(rows_max);
  row_scale.resize(rows_max);
  offsets.resize(rows_max * std::max<std::size_t>(blocks, 1));
  totals.resize(rows_max * cols);
  for (std::size_t i0 = 0; i0 < m; i0 += row_block) {
    const std::size_t rows_in_block = std::min(row_block, m - i0);
    const std::size_t tiles_in_block = (rows_in_block + kern.tile_rows - 1) / kern.tile_rows;
    pack_rows(kern, a + i0 * lda, lda, rows_in_block, k, kern.tile_rows, packed.data(), row_scale.data(),
              row_sum.data(), offsets.data());
    std::fill(totals.begin(), totals.begin() + std::ptrdiff_t(rows_in_block * cols), 0.0f);
    if (fused) {
      fused_fp4(kern, w, k_begin, k, rows_in_block, packed.data(), offsets.data(), totals.data(), cols);
      for (std::size_t r = 0; r < rows_in_block; ++r)
        for (std::size_t j = 0; j < n; ++j) c[(i0 + r) * ldc + j] = totals[r * cols + j] * row_scale[r];
      continue;
    }
    const std::size_t panel_block = streaming ? kTilePanels : kPanelBlock;
    for (std::size_t p_begin = 0; p_begin < panels; p_begin += panel_block)
      for (std::size_t k0 = 0; k0 < k; k0 += kKBlock) {
        const std::size_t kc = std::min(kKBlock, k - k0), quads = kc / 4;
        const std::uint32_t* a_block = packed.data() + (k0 / 4) * rows_in_block;
        for (std::size_t p = p_begin; p < std::min(panels, p_begin + panel_block); p += kTilePanels) {
          const std::uint8_t* four[kTilePanels];
          const float* four_scales[kTilePanels];
          for (std::size_t i = 0; i < kTilePanels; ++i) {
            four[i] = prepared[0];  // a missing panel's columns are padding
            four_scales[i] = scales[0];
            if (p + i >= panels) continue;
            const detail::QuantPanel panel = w.panel(p + i);
            kern.prepare_fp4(panel.codes + (k_begin + k0) * kP / 2, kc, prepared[i]);
            e8m0_values(panel.scales + ((k_begin + k0) / kBlock) * kP, kc / kBlock * kP, 0.5f, scales[i]);
            four[i] = prepared[i];
            four_scales[i] = scales[i];
          }
          for (std::size_t i = 0, rows = 0, j = 0; i < rows_in_block; i += rows, ++j) {
            rows = detail::even_tile_rows(i, rows_in_block, kern.tile_rows);
            detail::prefetch_share(w, p + kTilePanels, kTilePanels, k_begin + k0, kc, j, tiles_in_block);
            kern.fp4_tile({four, four_scales, kc / kBlock, a_block + i * quads, offsets.data() + i * blocks + k0 / kBlock,
                           blocks, rows, totals.data() + i * cols + p * kP, cols, k0 == 0});
          }
        }
      }
    for (std::size_t r = 0; r < rows_in_block; ++r)
      for (std::size_t j = 0; j < n; ++j) c[(i0 + r) * ldc + j] = totals[r * cols + j] * row_scale[r];
  }
}

}  // namespace

namespace detail {
Int8Kernels portable_int8_kernels() {
  return {portable_tile, portable_prepare, 4, portable_prepare_fp4, portable_fp4_tile};
}
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
  if (w.dtype() == WeightDtype::mxfp4) return run_fp4(kernels_here(), a, m, w, k_begin, k_end, c, lda, ldc);
  run(kernels_here(), a, m, w, k_begin, k_end, c, lda, ldc);
}

InvarianceProbe probe_int8_dot_invariance(WeightDtype dtype, std::size_t n, std::size_t k) {
  detail::ProbeValues random(std::string("int8-dot-probe-") + to_string(dtype));
  const QuantWeights w(encode(dtype, random(n * k).data(), n, k));
  const std::vector<float> row = random(k);
  std::vector<float> want(n);
  const auto run_any = [&](const detail::Int8Kernels& kern, const float* a, std::size_t m, float* c) {
    if (dtype == WeightDtype::mxfp4) return run_fp4(kern, a, m, w, 0, k, c, k, n);
    run(kern, a, m, w, 0, k, c, k, n);
  };
  run_any(detail::portable_int8_kernels(), row.data(), 1, want.data());
  const detail::Int8Kernels here = kernels_here();
  return detail::probe_row_positions(
      random, row, want, [&](const float* a, std::size_t m, float* c) { run_any(here, a, m, c); },
      std::string("the portable loops on the row alone (") + to_string(dtype) + " weights, int8 products)");
}

}  // namespace moed::kernels
