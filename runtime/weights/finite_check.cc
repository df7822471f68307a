#include "runtime/weights/finite_check.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>

#include "common/error.h"
#include "kernels/cpu/finite_scan.h"
#include "runtime/weights/safetensors_format.h"

namespace moed::weights {

void check_finite(const std::string& where, const std::string& tensor, const std::vector<std::int64_t>& shape,
                  const float* data) {
  const std::uint64_t n = checked_numel(shape).value_or(0);
  const std::size_t bad = kernels::first_nonfinite(data, n);
  if (bad == n) return;
  std::vector<std::uint64_t> index(shape.size());
  for (std::size_t d = shape.size(), rest = bad; d-- > 0;) {
    index[d] = rest % std::uint64_t(shape[d]);
    rest /= std::uint64_t(shape[d]);
  }
  const float v = data[bad];
  const char* value = std::isnan(v) ? "nan" : v > 0 ? "inf" : "-inf";
  MOED_THROW(Input, "{}: tensor '{}' holds {} at element {} (index [{}] of shape {}), expected finite values "
             "(damaged weights? [model].check_finite = false skips this check)",
             where, tensor, value, bad, fmt::join(index, ", "), shape_str(shape));
}

}  // namespace moed::weights
