// GEMMs on OpenBLAS, in the layout of torch Linear weights: W is [n, k]
// row-major and C = A · Wᵀ.
//
// OpenBLAS does not give a row the same bits whatever batch it sits in: its
// micro-kernels change with the matrix size and with a row's position (on Zen,
// rows 0-5 and 6-11 of a 12-row block round differently). With
// [experts].gemm = "openblas" the runtime therefore issues the same calls (the
// same rows, cut into the same chunks) wherever an expert runs, which keeps
// the bits across ranks and placements but not across batches. The default,
// fixed_order_gemm.h, holds across batches too.
#pragma once

#include <cstddef>
#include <string>

namespace moed::kernels {

// OpenBLAS's thread count for this process; the call shapes' bits depend on it,
// so every rank of a run must use the same value.
void set_blas_threads(int threads);
std::string blas_description();  // e.g. "OpenBLAS 0.3.21 (Zen), 1 thread"

// C[m, n] = A[m, k] · W[n, k]ᵀ, one sgemm call; A's rows are lda apart (0: k),
// W's ldw apart (0: k).
void gemm_xwt(const float* a, std::size_t m, std::size_t k, const float* w, std::size_t n, float* c,
              std::size_t lda = 0, std::size_t ldw = 0);

}  // namespace moed::kernels
