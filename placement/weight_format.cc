#include "placement/weight_format.h"

#include "common/error.h"
#include "common/quote.h"
#include "common/saturating.h"

namespace moed::placement {

std::uint64_t WeightFormat::bytes(std::uint64_t elements) const {
  const std::uint64_t blocks = elements / block_elements + (elements % block_elements ? 1 : 0);
  return saturating_mul(blocks, block_bytes);
}

namespace {
const std::vector<WeightFormat>& formats() {
  static const std::vector<WeightFormat> all{
      {"f32", 1, 4},
      {"bf16", 1, 2},
      {"f16", 1, 2},
      {"fp8", 128 * 128, 128 * 128 + 4},  // one f32 scale per 128x128 tile
      {"mxfp4", 32, 16 + 1},              // 32 4-bit values and an 8-bit exponent
      // An fp32 scale per row besides (under 0.4% at rows of 1024 or more) is left out.
      {"int8", 1, 1},
  };
  return all;
}
}  // namespace

const std::vector<std::string>& weight_format_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> out;
    for (const WeightFormat& f : formats()) out.push_back(f.name);
    return out;
  }();
  return names;
}

WeightFormat weight_format(const std::string& name, const std::string& what) {
  for (const WeightFormat& f : formats())
    if (f.name == name) return f;
  std::string known;
  for (const std::string& n : weight_format_names()) known += (known.empty() ? "" : ", ") + n;
  MOED_THROW(Usage, "{}: unknown weight format {}; expected one of {}", what, quote_input(name), known);
}

}  // namespace moed::placement
