#include "kernels/cpu/quant_weights.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "common/error.h"
#include "kernels/cpu/amx_gemm.h"
#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/int8_dot_gemm.h"
#include "kernels/cpu/quant_decode_body.h"
#include "kernels/cpu/quant_tile.h"
#include "kernels/cpu/row_probe.h"

namespace moed::kernels {

namespace {

constexpr std::size_t kP = QuantWeights::kPanel;
constexpr std::size_t kTile = std::size_t(kFp8Tile), kBlock = std::size_t(kMxBlock);
std::size_t ceil_div(std::size_t a, std::size_t b) { return (a + b - 1) / b; }

// Bytes a panel's k step of codes takes.
std::size_t bytes_per_step(WeightDtype dtype) {
  switch (dtype) {
    case WeightDtype::f32:
      return 4 * kP;
    case WeightDtype::bf16:
      return 2 * kP;
    case WeightDtype::fp8:
    case WeightDtype::int8:
      return kP;
    case WeightDtype::mxfp4:
      return kP / 2;
  }
  return 0;
}

// The decoders of the GEMM's instruction set (all give the same bits).
const detail::PanelDecoders& decoders() {
  static const detail::PanelDecoders portable = detail::decoders_built_here();
#if MOED_X86_TILES
  static const detail::PanelDecoders avx2 = detail::avx2_decoders();
  static const detail::PanelDecoders avx512 = cpu_has_avx512bw() ? detail::avx512_decoders() : avx2;
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      return avx512;
    case GemmIsa::avx2:
      return avx2;
    case GemmIsa::portable:
      break;
  }
#endif
  return portable;
}

std::uint8_t* allocate_bytes(std::size_t count) {
  if (count == 0) return nullptr;
  void* p = std::aligned_alloc(64, (count + 63) / 64 * 64);
  if (!p) throw std::bad_alloc();
  return static_cast<std::uint8_t*>(p);
}

}  // namespace

void QuantWeights::Free::operator()(std::uint8_t* p) const { std::free(p); }

std::size_t QuantWeights::panel_code_bytes() const { return k_ * bytes_per_step(dtype_); }

std::size_t QuantWeights::panel_scale_bytes() const {
  switch (dtype_) {
    case WeightDtype::fp8:
      return 4 * ceil_div(k_, kTile);  // the scale of the tile holding the panel's rows, per 128 steps
    case WeightDtype::int8:
      return 4 * kP;  // a scale per lane
    case WeightDtype::mxfp4:
      return kP * (k_ / kBlock);  // a lane's e8m0 per 32 steps, lanes side by side
    case WeightDtype::f32:
    case WeightDtype::bf16:
      return 0;
  }
  return 0;
}

QuantWeights::QuantWeights(const EncodedMatrix& m) : dtype_(m.dtype), n_(m.n), k_(m.k) {
  MOED_CHECK(m.dtype != WeightDtype::f32, "f32 weights are packed as PackedWeights");
  MOED_CHECK(m.codes.size() == EncodedMatrix::code_bytes(m.dtype, m.n, m.k) &&
                 m.scales.size() == EncodedMatrix::scale_bytes(m.dtype, m.n, m.k),
             "{} matrix [{}, {}] of {} code and {} scale bytes", to_string(m.dtype), m.n, m.k, m.codes.size(),
             m.scales.size());
  // moed's int8 codes are symmetric, [-127, 127]; the bf16 products' decoders rely on it.
  MOED_CHECK(m.dtype != WeightDtype::int8 || std::find(m.codes.begin(), m.codes.end(), 0x80) == m.codes.end(),
             "int8 matrix [{}, {}] holds the code -128", m.n, m.k);
  code_bytes_ = panels() * panel_code_bytes();
  scale_bytes_ = panels() * panel_scale_bytes();
  data_.reset(allocate_bytes(bytes()));
  std::memset(data_.get(), 0, bytes());  // rows past n: code 0, scale 0 (mxfp4: e8m0 0), value 0
  const std::size_t step = bytes_per_step(dtype_), tiles_k = ceil_div(k_, kTile);
  for (std::size_t p = 0; p < panels(); ++p) {
    std::uint8_t* codes = data_.get() + p * panel_code_bytes();
    std::uint8_t* scales = data_.get() + code_bytes_ + p * panel_scale_bytes();
    for (std::size_t r = 0; r < kP && p * kP + r < n_; ++r) {
      const std::size_t row = p * kP + r;
      for (std::size_t kk = 0; kk < k_; ++kk) {
        std::uint8_t* step_codes = codes + kk * step;
        switch (dtype_) {
          case WeightDtype::bf16:
            std::memcpy(step_codes + 2 * r, m.codes.data() + 2 * (row * k_ + kk), 2);
            break;
          case WeightDtype::fp8:
          case WeightDtype::int8:
            step_codes[r] = m.codes[row * k_ + kk];
            break;
          case WeightDtype::mxfp4:
            codes[detail::fp4_code_byte(kk, r)] |=
                std::uint8_t((m.codes[(row * k_ + kk) / 2] >> (4 * (kk % 2)) & 15) << detail::fp4_code_shift(kk));
            break;
          case WeightDtype::f32:
            break;
        }
      }
      if (dtype_ == WeightDtype::int8) std::memcpy(scales + 4 * r, m.scales.data() + 4 * row, 4);
      if (dtype_ == WeightDtype::mxfp4)
        for (std::size_t b = 0; b < k_ / kBlock; ++b) scales[b * kP + r] = m.scales[row * (k_ / kBlock) + b];
    }
    if (dtype_ == WeightDtype::fp8)  // a panel's 16 rows lie in one 128-row tile
      std::memcpy(scales, m.scales.data() + 4 * (p * kP / kTile) * tiles_k, 4 * tiles_k);
  }
}

QuantWeights::QuantWeights(const QuantWeights& other)
    : dtype_(other.dtype_),
      n_(other.n_),
      k_(other.k_),
      code_bytes_(other.code_bytes_),
      scale_bytes_(other.scale_bytes_),
      data_(allocate_bytes(other.bytes())) {
  if (bytes()) std::memcpy(data_.get(), other.data_.get(), bytes());
}

QuantWeights& QuantWeights::operator=(const QuantWeights& other) {
  if (this != &other) *this = QuantWeights(other);
  return *this;
}

EncodedMatrix QuantWeights::encoded() const {
  EncodedMatrix m{dtype_, n_, k_, std::vector<std::uint8_t>(EncodedMatrix::code_bytes(dtype_, n_, k_)),
                  std::vector<std::uint8_t>(EncodedMatrix::scale_bytes(dtype_, n_, k_))};
  const std::size_t step = bytes_per_step(dtype_), tiles_k = ceil_div(k_, kTile);
  for (std::size_t row = 0; row < n_; ++row) {
    const std::size_t p = row / kP, r = row % kP;
    for (std::size_t kk = 0; kk < k_; ++kk) {
      const std::uint8_t* step_codes = codes(p) + kk * step;
      switch (dtype_) {
        case WeightDtype::bf16:
          std::memcpy(m.codes.data() + 2 * (row * k_ + kk), step_codes + 2 * r, 2);
          break;
        case WeightDtype::fp8:
        case WeightDtype::int8:
          m.codes[row * k_ + kk] = step_codes[r];
          break;
        case WeightDtype::mxfp4: {
          const unsigned nibble = codes(p)[detail::fp4_code_byte(kk, r)] >> detail::fp4_code_shift(kk) & 15;
          m.codes[(row * k_ + kk) / 2] |= std::uint8_t(nibble << (4 * (kk % 2)));
          break;
        }
        case WeightDtype::f32:
          break;
      }
    }
    if (dtype_ == WeightDtype::int8) std::memcpy(m.scales.data() + 4 * row, scales(p) + 4 * r, 4);
    if (dtype_ == WeightDtype::mxfp4)
      for (std::size_t b = 0; b < k_ / kBlock; ++b) m.scales[row * (k_ / kBlock) + b] = scales(p)[b * kP + r];
    if (dtype_ == WeightDtype::fp8 && row % kTile == 0)
      std::memcpy(m.scales.data() + 4 * (row / kTile) * tiles_k, scales(p), 4 * tiles_k);
  }
  return m;
}

void QuantWeights::decode_panel(std::size_t p, std::size_t k0, std::size_t kc, float* out) const {
  const detail::PanelDecoders& d = decoders();
  const std::uint8_t* c = codes(p) + k0 * bytes_per_step(dtype_);
  switch (dtype_) {
    case WeightDtype::bf16:
      return d.bf16(reinterpret_cast<const std::uint16_t*>(c), kc, out);
    case WeightDtype::int8:
      return d.int8(reinterpret_cast<const std::int8_t*>(c), kc, reinterpret_cast<const float*>(scales(p)), out);
    case WeightDtype::fp8:
    case WeightDtype::mxfp4: {
      // Scale groups along k: 128 steps (fp8) or 32 (mxfp4), each decoded with its own.
      const std::size_t group = dtype_ == WeightDtype::fp8 ? kTile : kBlock;
      for (std::size_t kk = 0; kk < kc;) {
        const std::size_t at = k0 + kk, g = at / group, steps = std::min(kc - kk, (g + 1) * group - at);
        const std::uint8_t* sc = c + kk * bytes_per_step(dtype_);
        if (dtype_ == WeightDtype::fp8)
          d.fp8(sc, steps, reinterpret_cast<const float*>(scales(p))[g], out + kk * kP);
        else
          d.mxfp4(codes(p), at, steps, scales(p) + g * kP, out + kk * kP);
        kk += steps;
      }
      return;
    }
    case WeightDtype::f32:
      break;
  }
  MOED_CHECK(false, "decode_panel of {} weights", to_string(dtype_));
}

detail::QuantPanel QuantWeights::panel(std::size_t p) const {
  auto kind = detail::QuantPanel::bf16;
  switch (dtype_) {
    case WeightDtype::fp8:
      kind = detail::QuantPanel::fp8;
      break;
    case WeightDtype::mxfp4:
      kind = detail::QuantPanel::mxfp4;
      break;
    case WeightDtype::int8:
      kind = detail::QuantPanel::int8;
      break;
    case WeightDtype::bf16:
    case WeightDtype::f32:
      break;
  }
  return {kind, codes(p), scales(p)};
}

InvarianceProbe probe_row_invariance(WeightDtype dtype, std::size_t n, std::size_t k) {
  if (compact_products() == CompactProducts::int8 && (dtype == WeightDtype::int8 || dtype == WeightDtype::mxfp4))
    return probe_int8_dot_invariance(dtype, n, k);
  if (compact_products() == CompactProducts::amx) return probe_amx_invariance(dtype, n, k);
  if (compact_products() != CompactProducts::f32) return probe_bf16_dot_invariance(dtype, n, k);
  detail::ProbeValues random(fmt::format("quant-gemm-probe-{}", to_string(dtype)));
  const EncodedMatrix encoded = encode(dtype, random(n * k).data(), n, k);
  const std::vector<float> values = encoded.values(), row = random(k);
  const QuantWeights quant(encoded);
  const PackedWeights packed(values.data(), n, k);
  std::vector<float> want(n);
  gemm_fixed_order(row.data(), 1, packed, want.data());
  return detail::probe_row_positions(
      random, row, want, [&](const float* a, std::size_t m, float* c) { gemm_fixed_order(a, m, quant, c); },
      fmt::format("the fp32 chain on their values ({} weights, {} kernel)", to_string(dtype), to_string(gemm_isa())));
}

}  // namespace moed::kernels
