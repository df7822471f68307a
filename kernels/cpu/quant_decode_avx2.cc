// quant_decode_body.h's loops built for AVX2; see there.
#include "kernels/cpu/quant_decode_body.h"

namespace moed::kernels::detail {
PanelDecoders avx2_decoders() { return decoders_built_here(); }
}  // namespace moed::kernels::detail
