// Routing jitter, measured: how often a token's chosen set of experts changes
// when its hidden state gets a relative noise of eps (x_i (1 + eps z_i), z
// about N(0, 1), drawn from the token's key and the layer, so the same token
// gets the same noise whatever rank serves it). The engine routes the noisy
// rows as it routed the real ones (the same selection adjustments) and counts
// the tokens whose set differs; the noisy routing is never served.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "runtime/router/router.h"

namespace moed::runtime {

inline constexpr std::array<double, 2> kJitterEps = {1e-4, 1e-3};

// out[t * hidden + i] = x[t * hidden + i] * (1 + eps z), z from (keys[t], layer, i).
void perturb_rows(const float* x, std::size_t rows, std::size_t hidden, const std::uint64_t* keys, int layer,
                  double eps, float* out);

// Tokens whose chosen set differs between two rankings of the same tokens.
std::uint64_t changed_choices(const Ranked& a, const Ranked& b);

}  // namespace moed::runtime
