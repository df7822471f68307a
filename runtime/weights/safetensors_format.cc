#include "runtime/weights/safetensors_format.h"

#include <bit>
#include <utility>

#include "kernels/cpu/weight_codes.h"

namespace moed::weights {

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  if (name == "F32" || name == "f32") return DType::F32;
  if (name == "BF16" || name == "bf16") return DType::BF16;
  return std::nullopt;
}

std::uint64_t element_size(DType dtype) { return dtype == DType::F32 ? 4 : 2; }

std::optional<std::uint64_t> stored_dtype_size(std::string_view dtype) {
  // F8_E4M3: DeepSeek-V3/R1's fp8 expert weights; U8: gpt-oss's MXFP4 blocks and scales.
  static constexpr std::pair<std::string_view, std::uint64_t> kSizes[] = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F8_E4M3", 1}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},  {"U8", 1},   {"BOOL", 1}};
  for (const auto& [name, size] : kSizes)
    if (name == dtype) return size;
  return std::nullopt;
}

// One conversion in the project: the expert formats' (kernels/cpu/weight_codes.h).
float bf16_to_f32(std::uint16_t bits) { return kernels::bf16_value(bits); }

std::uint16_t f32_to_bf16(float value) { return kernels::bf16_code(value); }

std::optional<std::uint64_t> checked_numel(const std::vector<std::int64_t>& shape) {
  std::uint64_t n = 1;
  for (std::int64_t d : shape)
    if (__builtin_mul_overflow(n, static_cast<std::uint64_t>(d), &n)) return std::nullopt;
  return n;
}

std::string shape_str(const std::vector<std::int64_t>& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

}  // namespace moed::weights
