// The load-time check that weights hold only finite values ([model].check_finite):
// a NaN or inf in a gate or an expert would otherwise serve quietly wrong answers.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moed::weights {

// Throws an Input error naming `where` (the file, or what made the values), the
// tensor, the first bad element (flat and per dimension) and its value (nan, inf
// or -inf) when `data` (the tensor's elements, fp32) holds NaN or inf.
void check_finite(const std::string& where, const std::string& tensor, const std::vector<std::int64_t>& shape,
                  const float* data);

}  // namespace moed::weights
