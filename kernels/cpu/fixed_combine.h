// The combine in exact fixed point.
//
// A token's MoE output is the gate-weighted sum of its experts' outputs. The
// experts of one token sit on different ranks and islands, and partial sums
// are formed where they sit before travelling back; in floating point the
// grouping would change the bits with the placement. So each weighted term is
// rounded once to a 64-bit integer on a grid of 2^-32 (range ±2^30 per term,
// step 2.3e-10), and integers add associatively: any grouping, any order, the
// same bits. The rounding costs up to 2^-33 per term, below half an fp32 ulp
// of the output only for outputs of magnitude 2^-9 (2e-3) and up; smaller
// ones carry it above fp32's own error (docs/bit-exactness.md, rule 2).
// Terms beyond the range saturate and are counted; a run with saturation is no
// longer guaranteed order-independent and says so in its report.
//
// A non-finite term (a NaN or inf expert output or gate weight) has no place
// on the grid: it makes that element of the sum kFixedNaN, which stays so
// whatever is added to it and becomes NaN in the residual, so the token's
// output says it was poisoned instead of quietly dropping the term. (A sum of
// finite terms lands exactly on kFixedNaN only by wrapping past -2^63, which
// saturated terms alone come near.)
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>

namespace moed::kernels {

inline constexpr double kFixedOne = 0x1p32;
inline constexpr std::int64_t kFixedNaN = std::numeric_limits<std::int64_t>::min();

// acc[i] += round(weight * y[i] * 2^32); returns the number of saturated terms
// (a non-finite term is not one: it makes acc[i] kFixedNaN).
std::size_t add_weighted_fixed(std::int64_t* acc, const float* y, float weight, std::size_t h);

// acc[i] += partial[i] (wrapping, which keeps the sum exact when it ends in
// range); kFixedNaN on either side gives kFixedNaN.
void add_fixed(std::int64_t* acc, const std::int64_t* partial, std::size_t h);

// out[i] = fp32(x[i] + acc[i] * 2^-32), the residual add, rounded once; NaN
// where acc[i] is kFixedNaN.
void residual_from_fixed(const float* x, const std::int64_t* acc, std::size_t h, float* out);

// Narrow fixed-point rows, for the wire. A partial sum spends most of its 64
// bits on the sign (a term of magnitude below 2^7 needs 40 bits), so a row
// travels as each element's low `width` bytes, little-endian two's
// complement, with `width` the fewest bytes that hold every element of the
// row: the same integers, in 5/8 of the bytes for typical activations.
// kFixedNaN needs all 8.
//
// The fewest bytes, 1 to 8, that hold each of v[0..h) (1 for an empty row).
int fixed_width_bytes(const std::int64_t* v, std::size_t h);
// Writes the h int64 values at `in` as `width` bytes each to `out`, which
// may be `in` itself or start before it (rows narrow in place, front to
// back). Every value must fit (fixed_width_bytes).
void narrow_fixed(const std::byte* in, std::size_t h, int width, std::byte* out);
// acc[i] += the sign-extended width-byte value i of `in`, by add_fixed's rule.
void add_narrow_fixed(std::int64_t* acc, const std::byte* in, int width, std::size_t h);

}  // namespace moed::kernels
