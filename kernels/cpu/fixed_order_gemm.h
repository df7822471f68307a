// A GEMM whose every output element has one defined value: the batch it sits
// in, its position there, the CPU's vector width and the cache blocking do not
// change a bit.
//
// C[i][j] is the chain   acc = fma(A[i][kk], W[j][kk], acc)   for kk = 0, 1,
// ..., k - 1 in order, from acc = +0, each fma rounded once. Vector kernels
// compute 16 (or more) columns j side by side, each in its own lane, and split
// k into blocks by storing acc to C and loading it again, which continues the
// chain unchanged. Rows are never mixed. So a row's result is a pure function
// of that row and W: std::fma in a plain loop gives the same bits (the tests
// hold all kernels to it), the AVX2 and AVX-512 kernels agree with each other,
// and a token's output does not depend on which tokens share its step.
//
// OpenBLAS promises none of this: its micro-kernels change with the matrix
// size and a row's position (on Zen, rows 0-5 and 6-11 of a 12-row block
// round differently), and it packs W on every call. Here W is packed once,
// when the weights are loaded (PackedWeights).
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace moed::kernels {

// W [n, k] (torch Linear layout: one output per row) in panels of kPanel rows
// of W, each panel k-major: panel p holds, for kk = 0..k-1, the kPanel floats
// W[kPanel p + r][kk], r = 0..kPanel-1, zero past row n. 64-byte aligned.
class PackedWeights {
 public:
  static constexpr std::size_t kPanel = 16;

  PackedWeights() = default;
  PackedWeights(const float* w, std::size_t n, std::size_t k);
  PackedWeights(const PackedWeights& other);
  PackedWeights& operator=(const PackedWeights& other);
  PackedWeights(PackedWeights&&) noexcept = default;
  PackedWeights& operator=(PackedWeights&&) noexcept = default;

  std::size_t n() const { return n_; }
  std::size_t k() const { return k_; }
  std::size_t panels() const { return (n_ + kPanel - 1) / kPanel; }
  const float* panel(std::size_t p) const { return data_.get() + p * k_ * kPanel; }
  std::size_t floats() const { return panels() * k_ * kPanel; }  // padding included
  // W [n, k] back, as it was packed.
  void unpack(float* w) const;

 private:
  struct Free {
    void operator()(float* p) const;
  };
  std::size_t n_ = 0, k_ = 0;
  std::unique_ptr<float[], Free> data_;
};

// The instruction sets a fixed-order kernel exists for; all give the same bits.
enum class GemmIsa { portable, avx2, avx512 };
std::string to_string(GemmIsa isa);
// The widest this CPU runs.
GemmIsa best_gemm_isa();
// The kernel gemm_fixed_order uses from now on (tests and benchmarks pin one;
// the daemon keeps the best). Internal error if this CPU cannot run it.
void set_gemm_isa(GemmIsa isa);
GemmIsa gemm_isa();
// Whether the CPU has AVX-512 DQ (64-bit integer multiplies and conversions
// in vectors), which some elementwise AVX-512 loops need beyond the kernels' F.
bool cpu_has_avx512dq();
// Whether it has AVX-512 BW (byte and word vectors), which the compact
// weights' decoders need beyond F (quant_weights.h).
bool cpu_has_avx512bw();

// C[m, n] = A[m, k] · Wᵀ in the fixed order above. A's rows are lda apart
// (0: k), C's rows ldc apart (0: n). Only C[i][0..n) is written.
void gemm_fixed_order(const float* a, std::size_t m, const PackedWeights& w, float* c,
                      std::size_t lda = 0, std::size_t ldc = 0);

// The same over the k range [k_begin, k_end) of W only: each C[i][j] is the
// chain over those kk, from +0, with a[i * lda + (kk - k_begin)] as A's
// element (a points at the range's first column; lda 0: k_end - k_begin).
// A range of a matrix and a matrix packed from just those columns give the
// same bits (the chunks of an expert's down-projection; kernels/cpu/expert_ffn.h).
void gemm_fixed_order_range(const float* a, std::size_t m, const PackedWeights& w, std::size_t k_begin,
                            std::size_t k_end, float* c, std::size_t lda = 0, std::size_t ldc = 0);

// What a start-up probe found: whether a row's bits held at every position
// and batch size tried, and against the plain std::fma chain.
struct InvarianceProbe {
  bool invariant = false;
  std::string detail;  // what differed, when it failed
};
InvarianceProbe probe_row_invariance(std::size_t n, std::size_t k);

}  // namespace moed::kernels
