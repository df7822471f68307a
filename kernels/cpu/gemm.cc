#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <cstring>
#include <map>
#include <mutex>

#include "common/error.h"
#include "common/rng.h"

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
              std::size_t lda) {
  if (m == 0 || n == 0) return;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, int(m), int(n), int(k), 1.0f, a,
              int(lda ? lda : k), w, int(k), 0.0f, c, int(n));
}

std::size_t probe_invariant_tile(std::size_t k, std::size_t n, int probe_rows) {
  CounterRng rng(hash_name("invariant-tile-probe"));
  std::uint64_t counter = 0;
  auto fill = [&](float* dst, std::size_t count) {
    for (std::size_t i = 0; i < count; ++i) dst[i] = rng.symmetric(counter++);
  };
  std::vector<float> w(n * k), row(k), first(n);
  fill(w.data(), w.size());
  for (std::size_t tile : {8, 4, 2}) {
    std::vector<float> a(tile * k), c(tile * n);
    bool uniform = true;
    for (int r = 0; r < probe_rows && uniform; ++r) {
      fill(row.data(), k);
      // The same row at every position of the tile, among other random rows:
      // every call has the tile's shape, so only the position may vary.
      for (std::size_t pos = 0; pos < tile && uniform; ++pos) {
        fill(a.data(), a.size());
        std::memcpy(a.data() + pos * k, row.data(), k * sizeof(float));
        gemm_xwt(a.data(), tile, k, w.data(), n, c.data());
        if (pos == 0)
          std::memcpy(first.data(), c.data(), n * sizeof(float));
        else
          uniform = std::memcmp(c.data() + pos * n, first.data(), n * sizeof(float)) == 0;
      }
    }
    if (uniform) return tile;
  }
  return 1;
}

InvariantRowGemm::InvariantRowGemm(const float* w, std::size_t n, std::size_t k)
    : w_(w), n_(n), k_(k) {
  // Probing costs a few small sgemm calls; cache by shape (thread count is fixed per run).
  static std::mutex mu;
  static std::map<std::pair<std::size_t, std::size_t>, std::size_t> cache;
  std::lock_guard lock(mu);
  auto [it, inserted] = cache.try_emplace({k, n}, 0);
  if (inserted) it->second = probe_invariant_tile(k, n);
  tile_ = it->second;
  pad_in_.assign(tile_ * k_, 0.0f);
  pad_out_.assign(tile_ * n_, 0.0f);
}

void InvariantRowGemm::operator()(const float* a, std::size_t m, float* c) const {
  std::size_t full = m - m % tile_;
  for (std::size_t r = 0; r < full; r += tile_) gemm_xwt(a + r * k_, tile_, k_, w_, n_, c + r * n_);
  if (std::size_t rest = m - full) {  // the last tile, padded with zero rows
    std::memcpy(pad_in_.data(), a + full * k_, rest * k_ * sizeof(float));
    std::memset(pad_in_.data() + rest * k_, 0, (tile_ - rest) * k_ * sizeof(float));
    gemm_xwt(pad_in_.data(), tile_, k_, w_, n_, pad_out_.data());
    std::memcpy(c + full * n_, pad_out_.data(), rest * n_ * sizeof(float));
  }
}

}  // namespace moed::kernels
