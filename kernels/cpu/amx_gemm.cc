#include "kernels/cpu/amx_gemm.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/aligned_scratch.h"
#include "kernels/cpu/amx_tile.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/row_probe.h"
#include "kernels/cpu/weight_codes.h"

namespace moed::kernels {

namespace {

constexpr std::size_t kP = QuantWeights::kPanel;
constexpr std::size_t kBlock = detail::kAmxBlock, kTileRows = detail::kAmxRows;
// Steps decoded at a time up to 16 rows (2 blocks, or one fp8 scale block:
// a chunk holds whole scale blocks); beyond, the whole range. Neither
// changes a bit.
constexpr std::size_t kSmallChunk = 64;

// ---- The definition: portable loops -----------------------------------

float daz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
float ftz(float x) { return daz(x); }

void portable_tile(const detail::AmxTileArgs& g) {
  const std::size_t group = g.group ? g.group : g.blocks;
  for (std::size_t r = 0; r < g.row_tiles * kTileRows; ++r) {
    const std::uint16_t* x = g.a + r / kTileRows * g.a_tile;  // the row tile's first block
    for (std::size_t q = 0; q < g.panels; ++q)
      for (std::size_t l = 0; l < kP; ++l) {
        float& c = g.c[r * g.ldc + q * kP + l];
        if (g.first) c = 0.0f;
        for (std::size_t b0 = 0, s = 0; b0 < g.blocks; b0 += group, ++s) {
          float sum = g.group ? 0.0f : c;
          for (std::size_t b = b0; b < std::min(g.blocks, b0 + group); ++b) {
            float even = 0.0f, odd = 0.0f;
            for (std::size_t t = 0; t < kBlock / 2; ++t) {
              const std::size_t step = b * kBlock + 2 * t, pair = (b * kBlock / 2 + t) * 2 * kP + 2 * l;
              const std::size_t at = detail::amx_packed_at(r % kTileRows, step, 0);  // within the row tile
              even = ftz(std::fma(daz(bf16_value(x[at])), daz(bf16_value(g.b[q][pair])), even));
              odd = ftz(std::fma(daz(bf16_value(x[at + 1])), daz(bf16_value(g.b[q][pair + 1])), odd));
            }
            sum = ftz(daz(sum) + ftz(even + odd));
          }
          c = g.group ? std::fma(sum, g.scales[q][kP * s + l], c) : sum;
        }
      }
  }
}

void portable_pack(const float* a, std::size_t lda, std::size_t m, std::size_t k, std::size_t k_pad,
                   std::uint16_t* out) {
  for (std::size_t i = 0; i < m; ++i)
    for (std::size_t j = 0; j < k_pad; ++j)
      out[detail::amx_packed_at(i, j, k_pad)] = j < k ? bf16_code(a[i * lda + j]) : std::uint16_t(0);
}

void portable_scale_pairs(std::uint16_t* pairs, std::size_t npairs, const float* scales) {
  for (std::size_t t = 0; t < npairs; ++t)
    for (std::size_t e = 0; e < 2 * kP; ++e) {
      const std::size_t at = 2 * kP * t + e;
      const float scaled = bf16_value(pairs[at]) * scales[kP * (t / kP) + e / 2];
      pairs[at] = std::uint16_t(std::bit_cast<std::uint32_t>(scaled) >> 16);
    }
}

void no_tile_state() {}

// ---- The driver -----------------------------------------------------------

detail::AmxKernels kernels_here() {
#if MOED_X86_TILES
  if (gemm_isa() == GemmIsa::avx512 && cpu_has_amx()) return detail::amx_tile_kernels();
  if (gemm_isa() == GemmIsa::avx512 && cpu_has_bf16_dot()) {
    // No AMX (Zen 4): the tiles' portable loops, but the AVX-512 decoders
    // and decode tiles, which give the tiles' bits with fmas and run here,
    // so that this CPU's tests hold them to the definition too.
    detail::AmxKernels kernels = detail::portable_amx_kernels();
    kernels.decode = detail::avx512_bf16_dot_kernels().decode;
    kernels.fused = detail::avx512_amx_fused_tile(false);
    return kernels;
  }
#endif
  return detail::portable_amx_kernels();
}

// A panel pair's decoded chunk: pairs (zero past the range to the block's
// end) and scales.
struct Chunk {
  detail::AlignedScratch<std::uint16_t> pairs[2];
  std::vector<float> scales[2];  // grown, never shrunk
};

// Up to amx_fused_rows() rows (as AmxPack laid them out, k_pad steps): the
// whole panels in groups of amx_fused_panels(m), each over all of k, through
// the decode tiles (the tiles' bits, without the tiles). Returns the panels
// done.
std::size_t run_fused(const detail::AmxKernels& kern, const std::uint16_t* rows, std::size_t k_pad, std::size_t m,
                      const QuantWeights& w, std::size_t k_begin, std::size_t k, float* c, std::size_t ldc) {
  const std::size_t group_panels = detail::amx_fused_panels(m);
  const std::size_t panels = std::min(w.panels(), w.n() / kP) / group_panels * group_panels;
  if (panels == 0) return 0;
  // The rows as fp32, one 64-byte line further apart than a row: rows 4 KB
  // apart (k = 2048) would fall in one L1 set.
  const std::size_t stride = k_pad + kBlock;
  thread_local detail::AlignedScratch<float> scratch;
  float* values = scratch.get(m * stride);
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < k_pad; ++j)
      values[i * stride + j] = bf16_value(rows[detail::amx_packed_at(i, j, k_pad)]);
    std::fill_n(values + i * stride + k_pad, stride - k_pad, 0.0f);
  }
  const detail::ChainScales chain_scales = w.dtype() == WeightDtype::mxfp4
                                               ? detail::amx_chain_scales(values, m * stride)
                                               : detail::ChainScales{1, 0};
  // fp8's scales come as floats per scale block; mxfp4's e8m0 bytes the
  // tiles read from the panels themselves.
  const bool fp8 = w.dtype() == WeightDtype::fp8;
  static_assert(detail::kAmxFusedPanels <= detail::kMaxGroupPanels);
  for (std::size_t p = 0; p < panels; p += group_panels) {
    const detail::PanelGroup group = detail::panel_group(w, p, group_panels, k_begin, k, fp8);
    detail::AmxFusedArgs args{};
    args.x = values;
    args.x_stride = stride;
    args.rows = m;
    args.w = group.panels;
    args.k0 = k_begin;
    args.kc = k;
    args.group = fp8 ? detail::block_steps(w.dtype()) / kBlock : 0;
    args.scales = group.scales;
    args.c = c + p * kP;
    args.ldc = ldc;
    args.chain_scales_from = chain_scales.from;
    args.chain_scales_to = chain_scales.to;
    args.packed = rows;
    kern.fused(args);
  }
  return panels;
}

void run(const detail::AmxKernels& kern, const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
         std::size_t k_end, float* c, std::size_t lda, std::size_t ldc) {
  MOED_CHECK(k_begin <= k_end && k_end <= w.k(), "k range [{}, {}) of a matrix with k {}", k_begin, k_end, w.k());
  const std::size_t steps = detail::block_steps(w.dtype()), n = w.n(), k = k_end - k_begin;
  MOED_CHECK(steps == 0 || k_begin % steps == 0, "a {} k range starts at {}, inside a {}-step scale block",
             to_string(w.dtype()), k_begin, steps);
  lda = lda ? lda : k;
  ldc = ldc ? ldc : n;
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (std::size_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    return;
  }
  const bool mxfp4 = w.dtype() == WeightDtype::mxfp4;  // its scales go into the weights
  const std::size_t group = mxfp4 ? 0 : steps / kBlock;
  const std::size_t k_pad = (k + kBlock - 1) / kBlock * kBlock, rows_pad = (m + kTileRows - 1) / kTileRows * kTileRows;
  // One row tile (decode): small chunks, so that the decode of the next
  // overlaps the tile products of the last (measured on DeepSeek's W1|W3 at
  // 1 to 16 rows: 0-25% faster than a panel pair's whole k at once, which
  // left memory idle while the tiles ran). More row tiles: the whole k
  // range, long streams of weights, and each accumulator loaded and stored
  // once (chunks of 256 steps measured 8% slower for fp8 at 32 rows, and
  // 5-15% slower in bf16 at 256 rows: a tile store waits for its last
  // product, and the next call's loads for the store).
  const std::size_t chunk = rows_pad <= kTileRows ? std::max(kSmallChunk, steps) : k_pad;
  // Grown, never shrunk. Rows past m are read by the last tile and their
  // sums dropped: a row's sums depend on that row alone.
  thread_local detail::AlignedScratch<std::uint16_t> rows_scratch;
  thread_local detail::AlignedScratch<float> sums_scratch;
  thread_local Chunk buffers;
  std::uint16_t* const rows = rows_scratch.get(rows_pad * k_pad);
  float* const sums = sums_scratch.get(rows_pad * detail::kAmxLdc);  // the accumulators of two panels' columns
  std::uint16_t* const pairs[2] = {buffers.pairs[0].get(chunk * kP), buffers.pairs[1].get(chunk * kP)};
  for (std::size_t q = 0; q < 2; ++q)
    if (buffers.scales[q].size() < chunk / kBlock * kP) buffers.scales[q].resize(chunk / kBlock * kP);
  kern.pack(a, lda, m, k, k_pad, rows);
  const bool fused = kern.fused && m <= detail::amx_fused_rows(w.panel(0).kind);
  const std::size_t fused_panels = fused ? run_fused(kern, rows, k_pad, m, w, k_begin, k, c, ldc) : 0;
  if (fused_panels == w.panels()) {
    if (w.dtype() == WeightDtype::int8) detail::apply_row_scales(w, m, c, ldc);
    return;
  }
  kern.enter();
  for (std::size_t p = fused_panels; p < w.panels(); p += 2) {
    const std::size_t panels = std::min<std::size_t>(2, w.panels() - p);
    const std::size_t j0 = p * kP, cols = std::min(n, (p + panels) * kP) - j0;
    for (std::size_t k0 = 0; k0 < k; k0 += chunk) {
      const std::size_t kc = std::min(chunk, k - k0), blocks = (kc + kBlock - 1) / kBlock;
      for (std::size_t q = 0; q < panels; ++q) {
        kern.decode(w.panel(p + q), k_begin + k0, kc, pairs[q]);
        std::fill(pairs[q] + (kc + 1) / 2 * 2 * kP, pairs[q] + blocks * kBlock * kP, std::uint16_t(0));
        if (steps) detail::block_scales(w, p + q, k_begin + k0, kc, buffers.scales[q].data());
        if (mxfp4) kern.scale_pairs(pairs[q], blocks * kBlock / 2, buffers.scales[q].data());
      }
      // The next chunk's codes, a share with each row group's tiles: they
      // stream in while the tiles run, not in a burst at the next decode.
      const std::size_t next = k0 + chunk < k ? std::min(chunk, k - k0 - chunk) : 0;
      const std::size_t groups = rows_pad / (2 * kTileRows) + (rows_pad % (2 * kTileRows) != 0);
      for (std::size_t i = 0, g = 0; i < rows_pad; i += 2 * kTileRows, ++g) {
        detail::prefetch_share(w, p, panels, k_begin + k0 + chunk, next, g, groups);
        const std::size_t row_tiles = std::min<std::size_t>(2, (rows_pad - i) / kTileRows);
        // The accumulators in a buffer of their own, not in C: C's rows, n
        // floats apart, fall in few cache sets, and fp8's scale fmas
        // revisit them every 128 steps.
        const detail::AmxTileArgs args{rows + detail::amx_packed_at(i, k0, k_pad),
                                       kTileRows * k_pad,
                                       row_tiles,
                                       {pairs[0], pairs[1]},
                                       panels,
                                       blocks,
                                       group,
                                       {buffers.scales[0].data(), buffers.scales[1].data()},
                                       sums + i * detail::kAmxLdc,
                                       detail::kAmxLdc,
                                       k0 == 0};
        kern.tile(args);
        if (k0 + kc == k)
          for (std::size_t r = i; r < std::min(m, i + row_tiles * kTileRows); ++r)
            std::copy_n(sums + r * detail::kAmxLdc, cols, c + r * ldc + j0);
      }
    }
  }
  kern.leave();
  if (w.dtype() == WeightDtype::int8) detail::apply_row_scales(w, m, c, ldc);
}

}  // namespace

namespace detail {
ChainScales amx_chain_scales(const float* x, std::size_t count) {
  constexpr ChainScales kNone{1, 0};
  float largest = 0.0f, smallest = 0.0f;  // of the nonzero normal |x|
  for (std::size_t i = 0; i < count; ++i) {
    const float v = std::fabs(x[i]);
    if (!(v <= std::numeric_limits<float>::max())) return kNone;  // NaN or infinity
    if (v < std::numeric_limits<float>::min()) continue;           // 0, or subnormal: read as 0
    largest = std::max(largest, v);
    smallest = smallest == 0.0f ? v : std::min(smallest, v);
  }
  int from = -125, to = 125;  // every scaled code normal
  if (largest > 0.0f) {
    const int quantum = std::ilogb(smallest) - 8;
    const double sum_bound = 192.0 * double(largest) * (1.0 + std::ldexp(1.0, -18));
    const double room = double(std::numeric_limits<float>::max()) / sum_bound;
    if (quantum < -126 || room < 1.0) return kNone;  // the unscaled sums themselves would leave the range
    from = std::max(from, -126 - quantum);
    to = std::min(to, int(std::floor(std::log2(room))));
  }
  if (from > to) return kNone;
  return {std::uint8_t(from + 127), std::uint8_t(to + 127)};
}

AmxKernels portable_amx_kernels() {
  return {
      portable_dot_kernels().decode, portable_scale_pairs, portable_pack, portable_tile, no_tile_state, no_tile_state};
}
}  // namespace detail

bool cpu_has_amx() {
#if MOED_X86_TILES
  static const bool has = cpu_has_bf16_dot() && detail::cpu_reports_amx() && detail::request_amx_state();
  return has;
#else
  return false;
#endif
}

void gemm_amx_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin, std::size_t k_end,
                    float* c, std::size_t lda, std::size_t ldc) {
  run(kernels_here(), a, m, w, k_begin, k_end, c, lda, ldc);
}

InvarianceProbe probe_amx_invariance(WeightDtype dtype, std::size_t n, std::size_t k) {
  return detail::probe_kernels(
      fmt::format("amx-probe-{}", to_string(dtype)), dtype, n, k, detail::portable_amx_kernels(), kernels_here(),
      [](const auto& kern, const float* a, std::size_t m, const QuantWeights& w, float* c) {
        run(kern, a, m, w, 0, w.k(), c, w.k(), w.n());
      },
      fmt::format("the portable loops on the row alone ({} weights, amx products)", to_string(dtype)));
}

}  // namespace moed::kernels
