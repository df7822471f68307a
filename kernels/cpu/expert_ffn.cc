#include "kernels/cpu/expert_ffn.h"

#include <cstdint>
#include <cstring>

#include "common/error.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/silu_body.h"

namespace moed::kernels {

float fast_exp(float x) { return detail::fast_exp_body(x); }

void silu_mul(const float* gate, const float* up, std::size_t n, float* out) {
  // The widest loop the fixed-order GEMM uses: all give the same bits.
#if MOED_X86_TILES
  switch (gemm_isa()) {
    case GemmIsa::avx512:
      return detail::silu_mul_avx512(gate, up, n, out);
    case GemmIsa::avx2:
      return detail::silu_mul_avx2(gate, up, n, out);
    case GemmIsa::portable:
      break;
  }
#endif
  detail::silu_mul_body(gate, up, n, out);
}

void clamped_swiglu(const float* gate, const float* up, std::size_t n, float alpha, float limit, float* out) {
  for (std::size_t i = 0; i < n; ++i) out[i] = detail::clamped_swiglu_element(gate[i], up[i], alpha, limit);
}

namespace {
void add_bias(float* rows, std::size_t m, std::size_t width, std::size_t stride, const float* bias) {
  for (std::size_t r = 0; r < m; ++r)
    for (std::size_t j = 0; j < width; ++j) rows[r * stride + j] += bias[j];
}
}  // namespace

void expert_ffn_up(const ExpertView& e, const float* x, std::size_t m, float* h13) {
  const std::size_t F = e.ffn, H = e.hidden;
  // [m, 2F]: W1 x in columns [0, F), W3 x in [F, 2F)
  if (e.w13_quant)
    gemm_fixed_order(x, m, *e.w13_quant, h13);
  else if (e.w13_packed)
    gemm_fixed_order(x, m, *e.w13_packed, h13);
  else
    gemm_xwt(x, m, H, e.w13, 2 * F, h13);
  if (e.b13) add_bias(h13, m, 2 * F, 2 * F, e.b13);
  // Gate in place: the first F columns of each row become act(W1 x, W3 x).
  for (std::size_t r = 0; r < m; ++r) {
    float* row = h13 + r * 2 * F;
    if (e.activation.clamped)
      clamped_swiglu(row, row + F, F, e.activation.alpha, e.activation.limit, row);
    else
      silu_mul(row, row + F, F, row);
  }
}

void expert_ffn(const ExpertView& e, const float* x, std::size_t m, float* y, float* scratch) {
  const std::size_t F = e.ffn, H = e.hidden;
  expert_ffn_up(e, x, m, scratch);
  // y = act · W2ᵀ reading act with a row stride of 2F.
  if (e.w2_quant)
    gemm_fixed_order(scratch, m, *e.w2_quant, y, /*lda=*/2 * F);
  else if (e.w2_packed)
    gemm_fixed_order(scratch, m, *e.w2_packed, y, /*lda=*/2 * F);
  else
    gemm_xwt(scratch, m, F, e.w2, H, y, /*lda=*/2 * F);
  if (e.b2) add_bias(y, m, H, H, e.b2);
}

void expert_ffn_down_chunk(const ExpertView& e, const float* h13, std::size_t m, std::size_t chunk, float* y) {
  const std::size_t F = e.ffn, H = e.hidden;
  MOED_CHECK(e.chunks >= 1 && F % e.chunks == 0 && chunk < e.chunks, "chunk {} of {} over an F of {}", chunk,
             e.chunks, F);
  const std::size_t width = F / e.chunks, first = chunk * width;
  if (e.w2_quant)
    gemm_fixed_order_range(h13 + first, m, *e.w2_quant, first, first + width, y, /*lda=*/2 * F);
  else if (e.w2_packed)
    gemm_fixed_order_range(h13 + first, m, *e.w2_packed, first, first + width, y, /*lda=*/2 * F);
  else
    gemm_xwt(h13 + first, m, width, e.w2 + first, H, y, /*lda=*/2 * F, /*ldw=*/F);
  if (e.b2 && chunk == 0) add_bias(y, m, H, H, e.b2);
}

void shard_expert_weights(const float* w13, const float* w2, std::size_t hidden, std::size_t ffn, std::size_t shard,
                          std::size_t shards, float* shard_w13, float* shard_w2) {
  MOED_CHECK(shards >= 1 && ffn % shards == 0 && shard < shards, "shard {} of {} over an F of {}", shard, shards,
             ffn);
  const std::size_t H = hidden, F = ffn, width = F / shards, first = shard * width;
  std::memcpy(shard_w13, w13 + first * H, width * H * sizeof(float));                   // W1 rows
  std::memcpy(shard_w13 + width * H, w13 + (F + first) * H, width * H * sizeof(float));  // W3 rows
  for (std::size_t h = 0; h < H; ++h) std::memcpy(shard_w2 + h * width, w2 + h * F + first, width * sizeof(float));
}

}  // namespace moed::kernels
