// The SwiGLU expert FFN on CPU: y = W2 · (silu(W1 x) ⊙ (W3 x)), and its
// variants (model families, runtime/config/model_family.h): biases after
// each projection, y = W2 · act(W1 x + b1, W3 x + b3) + b2, and gpt-oss's
// clamped SwiGLU, act(g, u) = min(g, L) σ(α min(g, L)) (clamp(u, -L, L) + 1).
// A checkpoint's interleaved gate/up rows are split at load, so the kernel
// always sees W1 above W3.
//
// Canonical F-chunks. The down-projection sums over F; to let an expert be
// split over ranks (tensor sharding) without changing a bit, F is cut into
// `chunks` equal canonical chunks ([experts].ffn_chunks), the down-projection
// runs per chunk (each y_c its own fma chain from +0), and the expert's
// gate-weighted output is the sum over chunks of round(w · y_c · 2^32) on the
// fixed grid (kernels/cpu/fixed_combine.h). Integers add in any grouping, so
// a shard holding whole chunks contributes exactly its chunks' integers, and
// the shards' sum is the unsharded expert's. A shard's own columns give the
// same bits as those columns of the whole expert: every output column of the
// up-projection is its own chain (fixed_order_gemm.h), silu_mul works element
// by element, and a chunk's chain reads only that chunk's columns.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/fixed_order_gemm.h"
#include "kernels/cpu/quant_weights.h"

namespace moed::kernels {

// The gated activation of an expert (Activation::swiglu: silu(g) u).
struct ExpertActivation {
  bool clamped = false;  // gpt-oss's clamped SwiGLU
  float alpha = 1.702f, limit = 7.0f;
};

// One expert's weights. W1 and W3 are stacked into one [2F, H] matrix
// (rows [0, F) are W1, rows [F, 2F) are W3) so the up-projection is a single
// GEMM. Either packed for the fixed-order GEMM (the default: a row's bits do
// not depend on its batch), in fp32 or in a compact format
// ([experts].dtype: quant_weights.h), or in fp32 torch Linear layout for OpenBLAS.
struct ExpertView {
  const PackedWeights* w13_packed = nullptr;  // [2F, H]
  const PackedWeights* w2_packed = nullptr;   // [H, F]
  const float* w13 = nullptr;                 // [2F, H], row-major (OpenBLAS)
  const float* w2 = nullptr;                  // [H, F], row-major (OpenBLAS)
  std::size_t hidden = 0;                     // H
  std::size_t ffn = 0;                        // F of this view (a shard's: F / S)
  std::size_t chunks = 1;                     // canonical F-chunks in this view
  // Biases (gpt-oss), or null: b13 [2F] (b1 then b3, this view's rows), added
  // to the up-projection; b2 [H], added to the down-projection of chunk 0
  // (only the view holding the expert's first chunk has it, so shards' sums
  // add it once).
  const float* b13 = nullptr;
  const float* b2 = nullptr;
  ExpertActivation activation;
  // Compact weights (either both or neither), used in place of the packed fp32 ones.
  const QuantWeights* w13_quant = nullptr;  // [2F, H]
  const QuantWeights* w2_quant = nullptr;   // [H, F]
  // Which held weights these are: the expert store numbers every slot it
  // makes, never twice (0: not numbered), so that a copy of them elsewhere
  // (a GPU's) is known for theirs even when a slot made again sits at the
  // same address.
  std::uint64_t serial = 0;
};

// Scratch floats expert_ffn needs for m rows.
inline std::size_t expert_ffn_scratch(const ExpertView& e, std::size_t m) { return m * 2 * e.ffn; }

// y[m, H] for x[m, H]: two GEMM calls (w13, then w2) and the gated activation;
// fixed-order GEMMs when the view holds packed weights, else OpenBLAS. The
// down-projection runs over the whole F: with one chunk this is the
// canonical output, with more use the two halves below.
void expert_ffn(const ExpertView& e, const float* x, std::size_t m, float* y, float* scratch);

// The up-projection and the gate: for each row, columns [0, F) of h13 (rows
// 2F apart; expert_ffn_scratch floats) become act(W1 x + b1, W3 x + b3).
void expert_ffn_up(const ExpertView& e, const float* x, std::size_t m, float* h13);
// y[m, H] = the down-projection of chunk `chunk` of this view alone: columns
// [chunk F/chunks, (chunk + 1) F/chunks) of the activation and of W2.
void expert_ffn_down_chunk(const ExpertView& e, const float* h13, std::size_t m, std::size_t chunk, float* y);

// Shard `shard` of `shards` of one expert's weights, as a rank holding it
// keeps them: rows [a, b) of W1 then of W3 (a = shard F/S, b = a + F/S) as a
// [2F/S, H] matrix, and columns [a, b) of W2 as [H, F/S]; w13 and w2 are the
// whole expert's, laid out as in ExpertView.
void shard_expert_weights(const float* w13, const float* w2, std::size_t hidden, std::size_t ffn, std::size_t shard,
                          std::size_t shards, float* shard_w13, float* shard_w2);

// out[i] = silu(gate[i]) * up[i], with a fixed-sequence exp (same bits on every run).
void silu_mul(const float* gate, const float* up, std::size_t n, float* out);
// gpt-oss's: g = min(gate[i], limit), u = clamp(up[i], -limit, limit),
// out[i] = g σ(alpha g) (u + 1), with the same exp; one IEEE operation per step.
void clamped_swiglu(const float* gate, const float* up, std::size_t n, float alpha, float limit, float* out);

// exp(x) for the activation: Cody-Waite range reduction and a degree-7
// polynomial, relative error < 2e-7 where exp is a normal float (inf above,
// 0 below); plain arithmetic the compiler can vectorise.
float fast_exp(float x);

}  // namespace moed::kernels
