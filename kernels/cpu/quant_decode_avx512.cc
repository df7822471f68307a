// quant_decode_body.h's loops built for AVX512; see there.
#include "kernels/cpu/quant_decode_body.h"

namespace moed::kernels::detail {
PanelDecoders avx512_decoders() { return decoders_built_here(); }
}  // namespace moed::kernels::detail
