// The fixed-order GEMM against OpenBLAS's sgemm on the expert shapes, in the
// same run on the same core: the GEMM alone, in GFLOP/s, and the ratio.
// Usage: bench_gemm [--seconds S] [--isa avx512|avx2|portable]
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <vector>

#include "common/rng.h"
#include "common/summary_stats.h"
#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/gemm.h"
#include "tests/bench/bench_timing.h"

using namespace moed;

namespace {

double gflops_of(std::size_t m, std::size_t n, std::size_t k, double seconds_per_call) {
  return 2.0 * double(m) * double(n) * double(k) / seconds_per_call / 1e9;
}

// Warmed once, then bench::seconds_per_call.
template <class F>
double seconds_per_call(F&& call, double budget) {
  call();
  return bench::seconds_per_call(call, budget);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app("bench_gemm: the fixed-order GEMM against OpenBLAS sgemm");
  double budget = 1.0;
  std::string isa = kernels::to_string(kernels::best_gemm_isa());
  app.add_option("--seconds", budget, "time per measurement");
  app.add_option("--isa", isa, "fixed-order kernel: avx512, avx2 or portable");
  std::vector<std::string> shape_texts;
  app.add_option("--shape", shape_texts, "MxNxK instead of the default shapes (repeatable)");
  int repeat = 1;
  app.add_option("--repeat", repeat, "measurements per shape, alternating the two; medians printed")
      ->check(CLI::Range(1, 99));
  CLI11_PARSE(app, argc, argv);
  for (auto candidate : {kernels::GemmIsa::portable, kernels::GemmIsa::avx2, kernels::GemmIsa::avx512})
    if (kernels::to_string(candidate) == isa) kernels::set_gemm_isa(candidate);
  kernels::set_blas_threads(1);
  fmt::print("fixed-order kernel {}; {}\n", kernels::to_string(kernels::gemm_isa()), kernels::blas_description());
  fmt::print("{:>6} {:>6} {:>6} {:>12} {:>12} {:>8}\n", "m", "n", "k", "openblas", "fixed-order", "ratio");
  struct Shape {
    std::size_t m, n, k;
  };
  // The serving benchmark's expert (H=1024, F=2816): W1|W3 then W2, at
  // prefill chunk sizes and at decode's few rows per expert.
  std::vector<Shape> shapes{{512, 5632, 1024}, {512, 1024, 2816}, {256, 5632, 1024}, {256, 1024, 2816},
                            {128, 5632, 1024}, {128, 1024, 2816}, {32, 5632, 1024},   {32, 1024, 2816},
                            {8, 5632, 1024},   {8, 1024, 2816},   {97, 5632, 1024},   {1, 5632, 1024}};
  if (!shape_texts.empty()) {
    shapes.clear();
    for (const std::string& text : shape_texts) {
      Shape s{};
      if (std::sscanf(text.c_str(), "%zux%zux%zu", &s.m, &s.n, &s.k) != 3 || !s.m || !s.n || !s.k) {
        fmt::print(stderr, "bench_gemm: --shape {}: expected MxNxK, three positive integers\n", text);
        return 2;
      }
      shapes.push_back(s);
    }
  }
  CounterRng rng(1);
  for (const Shape& s : shapes) {
    std::vector<float> a(s.m * s.k), w(s.n * s.k), c(s.m * s.n);
    for (std::size_t i = 0; i < a.size(); ++i) a[i] = rng.symmetric(i);
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = rng.symmetric(i + a.size());
    kernels::PackedWeights packed(w.data(), s.n, s.k);
    std::vector<double> blas_runs, fixed_runs;
    for (int r = 0; r < repeat; ++r) {
      blas_runs.push_back(
          seconds_per_call([&] { kernels::gemm_xwt(a.data(), s.m, s.k, w.data(), s.n, c.data()); }, budget));
      fixed_runs.push_back(seconds_per_call([&] { kernels::gemm_fixed_order(a.data(), s.m, packed, c.data()); }, budget));
    }
    const double blas = percentile(blas_runs, 0.5), fixed = percentile(fixed_runs, 0.5);
    fmt::print("{:>6} {:>6} {:>6} {:>12.1f} {:>12.1f} {:>8.2f}\n", s.m, s.n, s.k, gflops_of(s.m, s.n, s.k, blas),
               gflops_of(s.m, s.n, s.k, fixed), blas / fixed);
  }
}
