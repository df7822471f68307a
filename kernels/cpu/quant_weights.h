// Expert weights held in a compact format (bf16, fp8, mxfp4, int8) and the
// fixed-order GEMM over them.
//
// The codes are packed in PackedWeights' panels (16 rows of W, k-major), in
// their own width: 32 bytes a k step for bf16, 16 for fp8 and int8, 8 for
// mxfp4 (64 bytes per 8 steps, as quant_tile.h lays them). The GEMM decodes each panel's block of k
// steps into fp32 beside the kernel (16 KB, in L1) just before the tiles
// run over it, with the vector width the CPU has, and the fp32 tiles of
// fixed_order_gemm.h then run unchanged. At a few rows (decode: up to 24
// rows a call on AVX-512), tiles that decode each k step in registers run
// instead (quant_tile.h): same operations, so the same bits.
//
// So the bits: C[i][j] is the fma chain of fixed_order_gemm.h over the
// weights' values (EncodedMatrix::value: one exact conversion and at most
// one fp32 multiply), the activations in fp32, never rounded to a narrower
// type. gemm_fixed_order on PackedWeights of the values gives the same
// bits, whatever the batch, the row's position, the vector width or the k
// range; the tests hold every dtype to it. The cost of this choice: the
// products run at fp32 FMA rate, not bf16 dot-product or int8 rate; decode
// reads 2-8x fewer bytes, and that is where an expert's time goes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_tile.h"

namespace moed::kernels {

class QuantWeights {
 public:
  static constexpr std::size_t kPanel = PackedWeights::kPanel;

  QuantWeights() = default;
  explicit QuantWeights(const EncodedMatrix& m);  // any dtype but f32
  QuantWeights(const QuantWeights& other);
  QuantWeights& operator=(const QuantWeights& other);
  QuantWeights(QuantWeights&&) noexcept = default;
  QuantWeights& operator=(QuantWeights&&) noexcept = default;

  WeightDtype dtype() const { return dtype_; }
  std::size_t n() const { return n_; }
  std::size_t k() const { return k_; }
  std::size_t panels() const { return (n_ + kPanel - 1) / kPanel; }
  std::size_t bytes() const { return code_bytes_ + scale_bytes_; }  // padding included
  // The matrix back as it was encoded.
  EncodedMatrix encoded() const;

  // out[kk * 16 + r] = the value of W[16 p + r][k0 + kk] for kk < kc (0
  // past row n), decoded with the widest loop gemm_isa() allows.
  void decode_panel(std::size_t p, std::size_t k0, std::size_t kc, float* out) const;
  // Panel p as the register-decoding tiles read it (quant_tile.h).
  detail::QuantPanel panel(std::size_t p) const;

 private:
  struct Free {
    void operator()(std::uint8_t* p) const;
  };
  std::size_t panel_code_bytes() const;   // one panel's codes
  std::size_t panel_scale_bytes() const;  // one panel's scales
  const std::uint8_t* codes(std::size_t p) const { return data_.get() + p * panel_code_bytes(); }
  const std::uint8_t* scales(std::size_t p) const { return data_.get() + code_bytes_ + p * panel_scale_bytes(); }

  WeightDtype dtype_ = WeightDtype::bf16;
  std::size_t n_ = 0, k_ = 0, code_bytes_ = 0, scale_bytes_ = 0;
  std::unique_ptr<std::uint8_t[], Free> data_;  // the panels' codes, then their scales; 64-byte aligned
};

// C[m, n] = A[m, k] · Wᵀ over W's values, bit for bit what gemm_fixed_order
// gives on PackedWeights of EncodedMatrix::values().
void gemm_fixed_order(const float* a, std::size_t m, const QuantWeights& w, float* c, std::size_t lda = 0,
                      std::size_t ldc = 0);
void gemm_fixed_order_range(const float* a, std::size_t m, const QuantWeights& w, std::size_t k_begin,
                            std::size_t k_end, float* c, std::size_t lda = 0, std::size_t ldc = 0);

// The start-up probe for a dtype: a row's bits at every position and batch
// size tried, against gemm_fixed_order on the values (itself probed against
// the plain fma chain).
InvarianceProbe probe_row_invariance(WeightDtype dtype, std::size_t n, std::size_t k);

}  // namespace moed::kernels
