// A dense matmul by oneDNN (Debian's libdnnl-dev), for the benchmarks'
// bounds: C[m, n] = A[m, k] · Wᵀ with W [n, k] reordered once into the
// layout oneDNN prefers (as moed packs its weights once), in bf16 (bf16 A and
// W, fp32 C) or int8 (u8 A, s8 W, s32 C: what oneDNN's int8 GEMMs run). Built
// only where CMake found oneDNN (MOED_BENCH_ONEDNN); one thread (the caller
// sets OMP_NUM_THREADS=1, as Debian's oneDNN threads with OpenMP).
#pragma once

#include <oneapi/dnnl/dnnl.hpp>

#include <cstddef>
#include <cstdint>
#include <vector>

namespace moed::bench {

class OneDnnMatmul {
 public:
  enum class Kind { bf16, int8 };

  // W [n, k] row-major fp32, converted to the kind (int8: one scale for all,
  // max |w| / 127: the bound measures speed, not accuracy) and reordered.
  OneDnnMatmul(Kind kind, std::size_t m, std::size_t n, std::size_t k, const float* w)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_), kind_(kind) {
    using dt = dnnl::memory::data_type;
    using tag = dnnl::memory::format_tag;
    const auto M = dnnl::memory::dim(m), N = dnnl::memory::dim(n), K = dnnl::memory::dim(k);
    const dt a_type = kind == Kind::bf16 ? dt::bf16 : dt::u8, w_type = kind == Kind::bf16 ? dt::bf16 : dt::s8;
    const dt c_type = kind == Kind::bf16 ? dt::f32 : dt::s32;
    const dnnl::memory::desc a_md({M, K}, a_type, tag::ab), c_md({M, N}, c_type, tag::ab);
    const dnnl::memory::desc w_any({K, N}, w_type, tag::any), w_plain({K, N}, w_type, tag::ba);
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(a_md, w_any, c_md), engine_);
    matmul_ = dnnl::matmul(pd);
    a_ = dnnl::memory(a_md, engine_);
    c_ = dnnl::memory(c_md, engine_);
    w_ = dnnl::memory(pd.weights_desc(), engine_);
    dnnl::memory plain(w_plain, engine_);
    fill_weights(static_cast<std::uint8_t*>(plain.get_data_handle()), w, n * k);
    dnnl::reorder(plain, w_).execute(stream_, plain, w_);
    auto* a = static_cast<std::uint8_t*>(a_.get_data_handle());
    const std::size_t a_bytes = m * k * (kind == Kind::bf16 ? 2 : 1);
    for (std::size_t i = 0; i < a_bytes; ++i) a[i] = std::uint8_t(0x3c + i % 3);  // small bf16 values, or u8
    stream_.wait();
  }

  void run() {
    matmul_.execute(stream_, {{DNNL_ARG_SRC, a_}, {DNNL_ARG_WEIGHTS, w_}, {DNNL_ARG_DST, c_}});
    stream_.wait();
  }

 private:
  void fill_weights(std::uint8_t* out, const float* w, std::size_t count) const {
    if (kind_ == Kind::bf16) {
      for (std::size_t i = 0; i < count; ++i) {
        std::uint32_t bits;
        __builtin_memcpy(&bits, w + i, 4);
        const std::uint16_t top = std::uint16_t(bits >> 16);  // truncation: speed only
        __builtin_memcpy(out + 2 * i, &top, 2);
      }
      return;
    }
    float amax = 0;
    for (std::size_t i = 0; i < count; ++i) amax = w[i] > amax ? w[i] : -w[i] > amax ? -w[i] : amax;
    const float inv = amax > 0 ? 127 / amax : 1;
    for (std::size_t i = 0; i < count; ++i) out[i] = std::uint8_t(std::int8_t(__builtin_lrintf(w[i] * inv)));
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  Kind kind_;
  dnnl::matmul matmul_;
  dnnl::memory a_, w_, c_;
};

}  // namespace moed::bench
