// kernels/cpu's fixed-order GEMM with fp32 products over an encoded
// matrix's values, for a k range: what the GPU's fixed-order GEMM is held to
// (test_cuda_kernels.cc on a GPU, test_gemm_emulated.cc on the host).
#pragma once

#include <cstddef>
#include <vector>

#include "kernels/cpu/bf16_dot_gemm.h"
#include "kernels/cpu/encoded_matrix.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_weights.h"

namespace moed::test {

inline std::vector<float> cpu_gemm(const kernels::EncodedMatrix& m, const std::vector<float>& a, std::size_t rows,
                                   std::size_t k_begin, std::size_t k_end) {
  kernels::set_compact_products(kernels::CompactProducts::f32);
  std::vector<float> c(rows * m.n);
  const std::size_t lda = k_end - k_begin;
  if (m.dtype == kernels::WeightDtype::f32) {
    const std::vector<float> values = m.values();
    kernels::gemm_fixed_order_range(a.data(), rows, kernels::PackedWeights(values.data(), m.n, m.k), k_begin, k_end,
                                    c.data(), lda);
  } else {
    kernels::gemm_fixed_order_range(a.data(), rows, kernels::QuantWeights(m), k_begin, k_end, c.data(), lda);
  }
  return c;
}

}  // namespace moed::test
