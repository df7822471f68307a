#include "kernels/cpu/bf16_dot_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/bf16_dot_tile.h"
#include "kernels/cpu/row_probe.h"
#include "kernels/cpu/weight_codes.h"

namespace moed::kernels {

namespace detail {

std::size_t block_steps(WeightDtype dtype) {
  return dtype == WeightDtype::fp8 ? std::size_t(kFp8Tile) : dtype == WeightDtype::mxfp4 ? std::size_t(kMxBlock) : 0;
}

std::size_t even_tile_rows(std::size_t i, std::size_t rows, std::size_t tile_rows) {
  const std::size_t tiles = (rows + tile_rows - 1) / tile_rows, base = rows / tiles, extra = rows % tiles;
  return i < extra * (base + 1) ? base + 1 : base;
}

namespace {
// Bytes of a panel's codes per k step (16 weights; mxfp4's on average).
std::size_t panel_step_bytes(WeightDtype dtype) {
  constexpr std::size_t kP = QuantWeights::kPanel;
  return dtype == WeightDtype::bf16 ? 2 * kP : dtype == WeightDtype::mxfp4 ? kP / 2 : kP;
}
}  // namespace

void prefetch_share(const QuantWeights& w, std::size_t p, std::size_t count, std::size_t k0, std::size_t kc,
                    std::size_t j, std::size_t shares) {
  const std::size_t step_bytes = panel_step_bytes(w.dtype()), bytes = kc * step_bytes;
  const std::size_t share = (bytes / shares + 64) / 64 * 64;
  for (std::size_t q = p; q < std::min(w.panels(), p + count); ++q) {
    const std::uint8_t* codes = w.panel(q).codes + k0 * step_bytes;
    for (std::size_t at = j * share; at < std::min(bytes, (j + 1) * share); at += 64) __builtin_prefetch(codes + at);
  }
}

void block_scales(const QuantWeights& w, std::size_t p, std::size_t k0, std::size_t kc, float* out) {
  const detail::QuantPanel panel = w.panel(p);
  const std::size_t steps = block_steps(w.dtype());
  constexpr std::size_t kP = QuantWeights::kPanel;
  for (std::size_t b = 0; b * steps < kc; ++b) {
    const std::size_t block = k0 / steps + b;
    if (w.dtype() == WeightDtype::fp8) {
      float scale;
      std::memcpy(&scale, panel.scales + 4 * block, 4);
      std::fill(out + 16 * b, out + 16 * b + kP, scale);
      continue;
    }
    e8m0_values(panel.scales + block * kP, kP, 1.0f, out + 16 * b);
  }
}

PanelGroup panel_group(const QuantWeights& w, std::size_t p, std::size_t count, std::size_t k0, std::size_t kc,
                       bool with_scales) {
  MOED_CHECK(count <= kMaxGroupPanels, "a group of {} panels, at most {}", count, kMaxGroupPanels);
  thread_local std::vector<float> storage[kMaxGroupPanels];  // grown, never shrunk
  const std::size_t steps = block_steps(w.dtype());
  PanelGroup group;
  for (std::size_t i = 0; i < count; ++i) {
    group.panels[i] = w.panel(p + i);
    if (!with_scales) continue;
    storage[i].resize((kc + steps - 1) / steps * QuantWeights::kPanel);
    block_scales(w, p + i, k0, kc, storage[i].data());
    group.scales[i] = storage[i].data();
  }
  return group;
}

const std::vector<float>& column_scales(const QuantWeights& w) {
  constexpr std::size_t kP = QuantWeights::kPanel;
  thread_local std::vector<float> scales;  // grown, never shrunk
  scales.resize(w.n());
  for (std::size_t j = 0; j < w.n(); ++j) std::memcpy(&scales[j], w.panel(j / kP).scales + 4 * (j % kP), 4);
  return scales;
}

void apply_row_scales(const QuantWeights& w, std::size_t m, float* c, std::size_t ldc) {
  const std::vector<float>& scales = column_scales(w);
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < w.n(); ++j) c[i * ldc + j] *= scales[j];
}

}  // namespace detail

namespace {

constexpr std::size_t kP = QuantWeights::kPanel;
// Blocking as in fixed_order_gemm.cc (it changes no bit): 256 steps (128
// pairs, 8 KB of a panel's bf16 pairs) at a time, row blocks of up to 288.
constexpr std::size_t kKBlock = 256, kPairsBlock = kKBlock / 2;
constexpr std::size_t kRowBlock = 288, kPanelBlock = 16;
// fp8 and mxfp4 run tiles of at most 6 rows, whose totals stay in registers
// between scale blocks (bf16_dot_avx512.cc's TilePair): mxfp4 at 256 rows
// went from 78 to 93 G weight-rows/s on Zen 4, fp8 stayed at 93-95.
constexpr std::size_t kTileScaled = 6;
constexpr std::size_t kMaxBlocks = kKBlock / std::size_t(kMxBlock);  // scale blocks in a k block

std::atomic<CompactProducts> g_products{CompactProducts::f32};

// ---- The definition: portable loops -----------------------------------

float daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float ftz(float x) { return daz(x); }
float bf16_float(std::uint32_t pair, int half) { return bf16_value(std::uint16_t(pair >> (16 * half))); }

std::uint16_t code_value_bf16(const detail::QuantPanel& w, std::size_t kk, std::size_t lane) {
  switch (w.kind) {
    case detail::QuantPanel::bf16: {
      std::uint16_t code;
      std::memcpy(&code, w.codes + 2 * (kk * kP + lane), 2);
      return code;
    }
    case detail::QuantPanel::fp8:
      return bf16_code(fp8_value(w.codes[kk * kP + lane]));
    case detail::QuantPanel::int8:
      return bf16_code(float(std::int8_t(w.codes[kk * kP + lane])));
    case detail::QuantPanel::mxfp4:
      return bf16_code(
          fp4_value(std::uint8_t(w.codes[detail::fp4_code_byte(kk, lane)] >> detail::fp4_code_shift(kk) & 15)));
  }
  return 0;
}

void portable_decode(const detail::QuantPanel& w, std::size_t k0, std::size_t kc, std::uint16_t* out) {
  for (std::size_t t = 0; 2 * t < kc; ++t)
    for (std::size_t l = 0; l < kP; ++l)
      for (std::size_t s = 0; s < 2; ++s)
        out[32 * t + 2 * l + s] = 2 * t + s < kc ? code_value_bf16(w, k0 + 2 * t + s, l) : 0;
}

// One lane's chain over pairs [t0, t1), as vdpbf16ps runs it.
float portable_chain(const std::uint32_t* a, std::size_t rows, std::size_t r, const std::uint16_t* w, std::size_t lane,
                     std::size_t t0, std::size_t t1, float acc) {
  for (std::size_t t = t0; t < t1; ++t) {
    const std::uint32_t x = a[t * rows + r];
    const float w0 = bf16_value(w[32 * t + 2 * lane]), w1 = bf16_value(w[32 * t + 2 * lane + 1]);
    acc = ftz(std::fma(daz(bf16_float(x, 1)), daz(w1), daz(acc)));
    acc = ftz(std::fma(daz(bf16_float(x, 0)), daz(w0), acc));
  }
  return acc;
}

void portable_tile(const detail::DotTileArgs& g, const std::uint16_t* w) {
  for (std::size_t r = 0; r < g.rows; ++r)
    for (std::size_t l = 0; l < kP; ++l) {
      float& out = g.c[r * g.ldc + l];
      if (g.block_pairs == 0) {
        out = portable_chain(g.a, g.rows, r, w, l, 0, g.npairs, g.first ? 0.0f : out);
        continue;
      }
      for (std::size_t t0 = 0, b = 0; t0 < g.npairs; t0 += g.block_pairs, ++b) {
        const float chain = portable_chain(g.a, g.rows, r, w, l, t0, std::min(g.npairs, t0 + g.block_pairs), 0.0f);
        out = std::fma(chain, g.scales[16 * b + l], g.first && b == 0 ? 0.0f : out);
      }
    }
}

// ---- The driver -----------------------------------------------------------

detail::DotKernels kernels_here() {
#if MOED_X86_TILES
  if (gemm_isa() == GemmIsa::avx512 && cpu_has_bf16_dot()) return detail::avx512_bf16_dot_kernels();
#endif
  return detail::portable_dot_kernels();
}

using detail::block_scales;
using detail::block_steps;

// A's rows packed as the tiles read them: per k block, tile after tile,
// pair-major inside a tile, each activation rounded to bf16 (bf16_code,
// inline: a call per activation was 3-4% of a prefill's time).
void pack_rows_bf16(const float* a, std::size_t lda, std::size_t rows, std::size_t k, std::size_t tile_rows,
                    std::uint32_t* dst) {
  std::uint32_t row_pairs[kPairsBlock];
  for (std::size_t k0 = 0; k0 < k; k0 += kKBlock) {
    const std::size_t kc = std::min(kKBlock, k - k0), pairs = (kc + 1) / 2, whole = kc / 2;
    for (std::size_t i = 0; i < rows;) {
      const std::size_t tile = detail::even_tile_rows(i, rows, tile_rows);
      for (std::size_t r = 0; r < tile; ++r) {
        const float* src = a + (i + r) * lda + k0;
        for (std::size_t t = 0; t < whole; ++t)
          row_pairs[t] = std::uint32_t(bf16_code(src[2 * t])) | std::uint32_t(bf16_code(src[2 * t + 1])) << 16;
        if (whole < pairs) row_pairs[whole] = bf16_code(src[2 * whole]);
        for (std::size_t t = 0; t < pairs; ++t) dst[t * tile + r] = row_pairs[t];
      }
      dst += tile * pairs;
      i += tile;
    }
  }
}

struct PanelSteps {
  alignas(64) std::uint16_t pairs[kPairsBlock * 32];
  float scales[kMaxBlocks * 16];
};

void run(const detail::DotKernels& kern, const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
         std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  MOED_CHECK(k_begin <= k_end && k_end <= w.k(), "k range [{}, {}) of a matrix with k {}", k_begin, k_end, w.k());
  const std::size_t steps = block_steps(w.dtype()), n = w.n(), k = k_end - k_begin;
  MOED_CHECK(steps == 0 || k_begin % steps == 0, "a {} k range starts at {}, inside a {}-step scale block",
             to_string(w.dtype()), k_begin, steps);
  lda = lda ? lda : k;
  ldc = ldc ? ldc : n;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  // Up to 24 rows: row blocks of at most 12 rows, each through the fused
  // tiles below (their weights read once per block: at these sizes the
  // decoded buffer's tiles, sharing one decode, ran slower).
  const std::size_t fused_blocks = (m + detail::kDotFusedRows - 1) / detail::kDotFusedRows;
  const bool fused = kern.fused && fused_blocks <= 2;
  const std::size_t scaled_rows = steps != 0 ? std::min<std::size_t>(kern.tile_rows, kTileScaled) : kern.tile_rows;
  const std::size_t row_block = fused ? (m + fused_blocks - 1) / fused_blocks : kRowBlock / scaled_rows * scaled_rows;
  thread_local std::vector<std::uint32_t> packed;  // grown, never shrunk
  const std::size_t packed_words = std::min(row_block, m) * ((k + 1) / 2);
  if (packed.size() < packed_words) packed.resize(packed_words);
  thread_local PanelSteps buffers[2];
  for (std::size_t i0 = 0; i0 < m; i0 += row_block) {
    const std::size_t rows_in_block = std::min(row_block, m - i0);
    // The buffered tiles' rows: fp8's and mxfp4's at most kTileScaled, but
    // where the fused tiles run, which read the block as one tile, the
    // leftover panels' tiles share their packing.
    const bool fused_block = kern.fused && rows_in_block <= detail::kDotFusedRows;
    const std::size_t tile_rows = fused_block ? kern.tile_rows : scaled_rows;
    pack_rows_bf16(a + i0 * lda, lda, rows_in_block, k, tile_rows, packed.data());
    float* c_block = c + i0 * ldc;
    // Up to 12 rows (decode): whole panels, 4, 2 or 1 at a time, decoded in
    // registers, each over all of k at once: long streams of weights, which
    // the hardware prefetchers follow (k blocks of 256 cut them into 4 KB
    // pieces), and no decoded buffer to write and read back.
    std::size_t fused_panels = 0;
    if (fused_block) {
      const std::size_t group = detail::dot_fused_panels(rows_in_block);
      fused_panels = std::min(w.panels(), n / kP) / group * group;
      static_assert(detail::kDotFusedPanels <= detail::kMaxGroupPanels);
      for (std::size_t p = 0; p < fused_panels; p += group) {
        const detail::PanelGroup panels = detail::panel_group(w, p, group, k_begin, k, w.dtype() == WeightDtype::fp8);
        const detail::DotTileArgs args{packed.data(), rows_in_block, (k + 1) / 2, steps / 2, nullptr,
                                       c_block + p * kP, ldc, true};
        kern.fused(args, panels.panels, k_begin, k, panels.scales);
      }
    }
    for (std::size_t p_begin = fused_panels; p_begin < w.panels(); p_begin += kPanelBlock) {
      const std::size_t p_end = std::min(w.panels(), p_begin + kPanelBlock);
      for (std::size_t k0 = 0; k0 < k; k0 += kKBlock) {
        const std::size_t kc = std::min(kKBlock, k - k0), npairs = (kc + 1) / 2;
        const std::uint32_t* a_block = packed.data() + (k0 / 2) * rows_in_block;
        const auto decode = [&](std::size_t p, PanelSteps& into) {
          kern.decode(w.panel(p), k_begin + k0, kc, into.pairs);
          if (steps) block_scales(w, p, k_begin + k0, kc, into.scales);
        };
        detail::DotTileArgs args{nullptr, 0, npairs, steps / 2, buffers[0].scales, nullptr, ldc, k0 == 0};
        std::size_t p = p_begin;
        if (kern.pair)
          for (; p + 2 <= p_end && (p + 2) * kP <= n; p += 2) {
            decode(p, buffers[0]);
            decode(p + 1, buffers[1]);
            // The next pair's codes are fetched during these tiles, so that
            // its decode finds them in cache (from DRAM or L3 it was 8% of a
            // prefill's time, the tiles waiting).
            const std::size_t next = p + 4 <= p_end && (p + 4) * kP <= n ? 2 : 0;
            const std::size_t tiles = (rows_in_block + tile_rows - 1) / tile_rows;
            for (std::size_t i = 0, j = 0; i < rows_in_block; i += args.rows, ++j) {
              args.rows = detail::even_tile_rows(i, rows_in_block, tile_rows);
              args.a = a_block + i * npairs;
              args.c = c_block + i * ldc + p * kP;
              kern.pair(args, buffers[0].pairs, buffers[1].pairs, buffers[1].scales);
              detail::prefetch_share(w, p + 2, next, k_begin + k0, kc, j, tiles);
            }
          }
        for (; p < p_end; ++p) {
          decode(p, buffers[0]);
          const std::size_t cols = std::min(kP, n - p * kP);
          for (std::size_t i = 0; i < rows_in_block; i += args.rows) {
            args.rows = detail::even_tile_rows(i, rows_in_block, tile_rows);
            args.a = a_block + i * npairs;
            float* ct = c_block + i * ldc + p * kP;
            if (cols == kP) {
              args.c = ct;
              args.ldc = ldc;
              kern.tile(args, buffers[0].pairs);
              continue;
            }
            // A panel past n: the chains' state in a full-width buffer.
            float edge[detail::kQuantTileRows * kP] = {};
            for (std::size_t r = 0; r < args.rows && !args.first; ++r)
              std::copy(ct + r * ldc, ct + r * ldc + cols, edge + r * kP);
            args.c = edge;
            args.ldc = kP;
            kern.tile(args, buffers[0].pairs);
            args.ldc = ldc;
            for (std::size_t r = 0; r < args.rows; ++r) std::copy(edge + r * kP, edge + r * kP + cols, ct + r * ldc);
          }
        }
      }
    }
  }
  if (w.dtype() == WeightDtype::int8) detail::apply_row_scales(w, m, c, ldc);
}

}  // namespace

namespace detail {
DotKernels portable_dot_kernels() { return {portable_decode, portable_tile, 4}; }
}  // namespace detail

const char* to_string(CompactProducts products) {
  switch (products) {
    case CompactProducts::f32:
      return "f32";
    case CompactProducts::bf16:
      return "bf16";
    case CompactProducts::int8:
      return "int8";
    case CompactProducts::amx:
      return "amx";
  }
  return "?";
}

bool cpu_has_bf16_dot() {
#if MOED_X86_TILES
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl") &&
                          __builtin_cpu_supports("avx512vbmi") && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void set_compact_products(CompactProducts products) { g_products = products; }
CompactProducts compact_products() { return g_products; }

void gemm_bf16_dot_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
                         std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  run(kernels_here(), a, m, w, k_begin, k_end, c, lda, ldc);
}

InvarianceProbe probe_bf16_dot_invariance(WeightDtype dtype, std::size_t n, std::size_t k) {
  return detail::probe_kernels(
      fmt::format("bf16-dot-probe-{}", to_string(dtype)), dtype, n, k, detail::portable_dot_kernels(), kernels_here(),
      [](const auto& kern, const float* a, std::size_t m, const QuantWeights& w, float* c) {
        run(kern, a, m, w, 0, w.k(), c, w.k(), w.n());
      },
      fmt::format("the portable loops on the row alone ({} weights, bf16 products)", to_string(dtype)));
}

}  // namespace moed::kernels
