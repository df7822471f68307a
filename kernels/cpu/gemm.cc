#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include "common/error.h"

namespace moed::kernels {

namespace {
int g_blas_threads = 1;
}

void set_blas_threads(int threads) {
  MOED_CHECK(threads >= 1, "blas threads {}", threads);
  g_blas_threads = threads;
  openblas_set_num_threads(threads);
}

std::string blas_description() {
  return fmt::format("OpenBLAS ({}; {}), {} thread{}", openblas_get_corename(), openblas_get_config(),
                     g_blas_threads, g_blas_threads == 1 ? "" : "s");
}

void gemm_xwt(const float* a, std::size_t m, std::size_t k, const float* w, std::size_t n, float* c,
              std::size_t lda, std::size_t ldw) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, a,
              int(lda ? lda : k), w, int(ldw ? ldw : k), 0.0f, c, int(n));
}

}  // namespace moed::kernels
