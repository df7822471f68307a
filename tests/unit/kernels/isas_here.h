// The fixed-order kernels this CPU runs, for the kernels' tests.
#pragma once

#include <exception>
#include <vector>

#include "kernels/cpu/fixed_order_gemm.h"

namespace moed::test {

// Every GemmIsa set_gemm_isa accepts here, portable first; leaves the best set.
inline std::vector<kernels::GemmIsa> isas_here() {
  using kernels::GemmIsa;
  std::vector<GemmIsa> out{GemmIsa::portable};
  for (GemmIsa isa : {GemmIsa::avx2, GemmIsa::avx512}) {
    try {
      kernels::set_gemm_isa(isa);
      out.push_back(isa);
    } catch (const std::exception&) {
    }
  }
  kernels::set_gemm_isa(kernels::best_gemm_isa());
  return out;
}

}  // namespace moed::test
