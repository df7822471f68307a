// GEMMs on OpenBLAS, in the layout of torch Linear weights: W is [n, k]
// row-major and C = A · Wᵀ.
//
// Bit-exactness across rank counts and placements needs a row's result not to
// depend on the batch it sits in. OpenBLAS does not promise that: its
// micro-kernels change with the matrix size and with a row's position (on Zen,
// rows 0-5 and 6-11 of a 12-row block round differently). Two ways around it:
//  - expert GEMMs: the runtime always issues the same calls (the same rows, cut
//    into the same chunks) wherever an expert runs, so the bits match;
//  - router GEMM (rows are a rank's tokens, a batch that changes with the rank
//    count): InvariantRowGemm issues fixed tiles of rows whose every position
//    has been checked, at construction, to give the same bits.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace moed::kernels {

// OpenBLAS's thread count for this process; the call shapes' bits depend on it,
// so every rank of a run must use the same value.
void set_blas_threads(int threads);
std::string blas_description();  // e.g. "OpenBLAS 0.3.21 (Zen), 1 thread"

// C[m, n] = A[m, k] · W[n, k]ᵀ, one sgemm call; A's rows are lda apart (0: k).
void gemm_xwt(const float* a, std::size_t m, std::size_t k, const float* w, std::size_t n, float* c,
              std::size_t lda = 0);

// Row-batch-invariant C = A · Wᵀ for a fixed W (the router's gate matrix).
class InvariantRowGemm {
 public:
  // Probes tiles of 8, 4, 2 rows for (k, n) and keeps the largest in which a
  // row gives the same bits at every position; 1 row is invariant by definition.
  InvariantRowGemm(const float* w, std::size_t n, std::size_t k);
  void operator()(const float* a, std::size_t m, float* c) const;
  std::size_t tile_rows() const { return tile_; }

 private:
  const float* w_;
  std::size_t n_, k_, tile_;
  mutable std::vector<float> pad_in_, pad_out_;
};

// Largest tile in {8, 4, 2, 1} for which a row's bits are the same at every
// position of a (tile x k) · (k x n) sgemm, tested on `probe_rows` random rows.
// Every call then uses that one shape (the last tile padded), so a row's bits
// depend on nothing but the row.
std::size_t probe_invariant_tile(std::size_t k, std::size_t n, int probe_rows = 4);

}  // namespace moed::kernels
