// The bytes a number of weights takes in a storage format: plain floats, or
// block-scaled formats whose blocks carry a scale beside the values (fp8
// with a float scale per 128x128 tile, as DeepSeek-V3 ships; MXFP4 with an
// 8-bit scale per 32 values, as gpt-oss ships its experts).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace moed::placement {

struct WeightFormat {
  std::string name;
  std::uint64_t block_elements = 1;  // values sharing one scale (1: no scale)
  std::uint64_t block_bytes = 4;     // the values' bytes plus the scale's
  // Whole blocks: a tensor's last partial block takes a whole one. Saturates.
  std::uint64_t bytes(std::uint64_t elements) const;
};

// "f32", "bf16", "f16", "fp8" (e4m3, f32 scale per 128x128), "mxfp4", "int8". A
// Usage error naming `what` (e.g. "--dtype") and the names known otherwise.
WeightFormat weight_format(const std::string& name, const std::string& what);
const std::vector<std::string>& weight_format_names();

}  // namespace moed::placement
